"""tools/one_gpu.py: a spec's trials as processes without Ray, following each lr ladder
to the end, on a carried stdlib corpus (here on CPU, where it runs the same way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import ladder_spec

REPO = Path(__file__).resolve().parent.parent

SPEC = ladder_spec(steps=30, batch_size=8, lrs="1.0e-3, 3.0e-3, 1.0e-2")


def carried_corpus(folder: Path) -> str:
    """A stdlib cache folder as another machine would write it: this repo's Python sources as
    bytes, under a fingerprint no real corpus has."""
    text = b"\x1c".join(p.read_bytes() for p in sorted((REPO / "study").rglob("*.py")))
    data = np.frombuffer(text, dtype=np.uint8)
    cut = int(len(data) * 0.9)
    folder.mkdir()
    np.save(folder / "train.npy", data[:cut])
    np.save(folder / "val.npy", data[cut:])
    fingerprint = "0123456789abcdef"
    (folder / "meta.json").write_text(json.dumps({"vocab_size": 256, "fingerprint": fingerprint,
                                                  "description": "this repo's study/ sources"}))
    return fingerprint


@pytest.mark.slow
def test_runs_every_ladder_to_the_end_without_ray_on_the_carried_corpus(tmp_path: Path) -> None:
    from resultstore.writer import ResultsStore
    from sweep.grid import expand
    from sweep.ladder import plan_next
    from sweep.spec import load_spec

    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    fingerprint = carried_corpus(tmp_path / "stdlib")
    blocked = tmp_path / "blocked" / "ray"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('no Ray on this machine')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked.parent), str(REPO)])}
    out = subprocess.run(
        [sys.executable, str(REPO / "tools/one_gpu.py"), str(spec), "--results", str(tmp_path / "r"),
         "--procs", "2", "--device", "cpu", "--follow", "--stdlib-corpus", str(tmp_path / "stdlib")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    store = ResultsStore(tmp_path / "r", "tiny")
    runs = store.read("runs")
    assert set(runs["status"]) == {"done"} and set(runs["corpus_fingerprint"]) == {fingerprint}
    assert all(d.startswith("cpu") for d in runs["device"])
    grid = {t.trial_id for t in expand(load_spec(spec))}
    assert grid <= set(runs["trial_id"])  # the spec's own ids: runtime is not hashed
    ladders = plan_next(expand(load_spec(spec)), runs, [0], 3)
    assert [lad.verdict for lad in ladders] == ["complete"], [lad.why for lad in ladders]
    assert runs.filter(pl.col("lr") == ladders[0].best).height == 3  # seeds 0-2 at the best, inside the ladder
    assert "round" in out.stdout and f"{runs.height} ended ({runs.height} done)" in out.stdout
