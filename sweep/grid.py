"""expand(spec) -> [TrialConfig]: the cartesian product of the grid axes. Pure; no Ray."""

from __future__ import annotations

import itertools

from study.config import TrialConfig
from sweep.spec import SpecError, SweepSpec, trial_config


def expand(spec: SweepSpec) -> list[TrialConfig]:
    """Every grid point in a stable order (model, optimizer, norm, rotation, seed), each with its
    trial_id. Two axis entries that describe the same trial are an error, not a silent merge."""
    g = spec.grid
    trials: list[TrialConfig] = []
    seen: dict[str, int] = {}
    for i, point in enumerate(itertools.product(g.model, g.optimizer, g.norm, g.rotation, g.seed)):
        cfg = trial_config(spec, *point)
        if cfg.trial_id in seen:
            raise SpecError(f"grid: points {seen[cfg.trial_id]} and {i} are the same trial ({cfg.trial_id}); "
                            "remove the duplicate axis entry")
        seen[cfg.trial_id] = i
        trials.append(cfg)
    return trials


def select(trials: list[TrialConfig], key: str) -> TrialConfig:
    """A trial by id (or unique id prefix) or by 0-based index in the grid."""
    if key.isdigit() and len(key) < 6:
        index = int(key)
        if index >= len(trials):
            raise SpecError(f"--trial {key}: the grid has {len(trials)} trials (indices 0..{len(trials) - 1})")
        return trials[index]
    matches = [t for t in trials if t.trial_id.startswith(key)]
    if len(matches) != 1:
        found = "no trial" if not matches else f"{len(matches)} trials"
        raise SpecError(f"--trial {key}: {found} with that id in this spec (see `sweep plan`)")
    return matches[0]
