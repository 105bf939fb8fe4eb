"""Stand-in corpora for shipped specs that train on a prepared corpus (specs/scaling*.yaml).

Such a spec names a folder that `sweep data prepare` writes (the command is in its header);
validating it needs the manifest. The stand-in is a tiny prepared corpus at that path, with
the vocabulary the header's `--tokenizer bpe:N` will produce, written in a temp working
directory: the spec validates and plans exactly as it will on the real corpus (sizes and
FLOPs depend only on the vocabulary), and no stand-in ever lies where the real one goes.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import yaml

from sweep.prepare import write_corpus


def stand_in_corpus(spec_path: Path, workdir: Path, monkeypatch) -> Path | None:
    """chdir to `workdir` and write a stand-in for the spec's data.tokens folder if it is missing."""
    spec_path = Path(spec_path).resolve()
    data = (yaml.safe_load(spec_path.read_text()) or {}).get("data") or {}
    tokens = data.get("tokens")
    if tokens is None or Path(tokens).exists():
        return None
    m = re.search(r"sweep data prepare .*--tokenizer (?:bpe:(\d+)|bytes)", spec_path.read_text())
    assert m, (f"{spec_path.name}: data.tokens needs the `sweep data prepare ... --tokenizer bpe:N` (or bytes) "
               "command in its header")
    vocab = int(m.group(1)) if m.group(1) else 256
    monkeypatch.chdir(workdir)
    train = yaml.safe_load(spec_path.read_text()).get("train") or {}
    # One train batch and one eval batch must fit (the spec loader checks both).
    # With batch_scaling the largest batch is its cap (the shipped specs give one).
    n = max(int(train.get("batch_size", 32)), int((train.get("eval_batch") or {}).get("sequences", 16)),
            int((train.get("batch_scaling") or {}).get("max_batch_size", 0))) \
        * (int(data.get("seq_len", 128)) + 1) + 1
    write_corpus(Path(tokens), {"train": np.arange(n) % vocab, "val": np.arange(n) % vocab}, vocab, source="stand-in")
    return workdir / tokens
