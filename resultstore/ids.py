"""Trial identities: 12-hex-digit sha256 hashes of a config's canonical JSON.

The one implementation. `study.config.TrialConfig` hashes its own JSON with these
(`trial_id` = digest of the science JSON, seed included; `config_id` = science_hash of the
config, seed excluded), and `analysis.identity` hashes the stored `config_json` column with
the same `science_hash`, so an id recomputed from a runs row equals the stored one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["NOT_SCIENCE", "canonical_json", "digest", "science_hash"]

NOT_SCIENCE = ("seed", "sweep", "runtime")
"""Top-level config keys a config_id leaves out: the seed (seeds of one config share it), the
sweep's name and the runtime (device, threads), which do not change a result."""


def canonical_json(payload: Any) -> str:
    """JSON with sorted keys and no spaces: one text per value, whatever the key order."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def digest(text: str) -> str:
    """sha256[:12] of `text`."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def science_hash(config: dict[str, Any], drop: Sequence[str] = ()) -> str:
    """sha256[:12] of ``config`` (a parsed ``config_json``) without the seed, ``sweep``,
    ``runtime`` and the keys in ``drop`` (top-level, e.g. ``"model"``, or one level down,
    e.g. ``"optimizer.lr"``). ``config`` is not modified."""
    payload = {k: v for k, v in config.items() if k not in NOT_SCIENCE}
    for key in drop:
        top, _, sub = key.partition(".")
        if not sub:
            payload.pop(top, None)
        elif isinstance(payload.get(top), dict):
            payload[top] = {k: v for k, v in payload[top].items() if k != sub}
    return digest(canonical_json(payload))
