"""A real multi-node Ray on this machine (ray.cluster_utils.Cluster: a head and a worker raylet,
each with its own CPU), driven by `sweep run --address` in a separate process, as a user does:
trials spread over both nodes, a two-worker trial spanning both, a worker node lost mid-sweep.
One cluster serves the module (each test's driver is a job of its own); the lost-node test,
which removes the worker node, runs last."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from sweep.grid import expand
from sweep.spec import load_spec
from resultstore.writer import ResultsStore
from sweep.trainable import train_trial

pytestmark = pytest.mark.slow
SPEC = """name: nodes
data: {corpus: stdlib, seq_len: 16}
train: {steps: STEPS, batch_size: 4, eval_every: EVAL, checkpoint_every: 50, eval_batch: {sequences: 2}}
grid:
  model: [{d_model: 16, n_layers: 2, n_heads: 2}]
  optimizer: [{name: adam, lr: 3.0e-3}, {name: sgd, lr: 0.1}]
  norm: [rmsnorm_scalar]
  seed: [0]
resources: {cpu: 1}
retries: 1
"""


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                      "include_dashboard": False, "resources": {"head": 1}})
    worker = c.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"worker": 1})
    try:
        yield c, worker
    finally:
        c.shutdown()


def write_spec(tmp_path: Path, steps: int, eval_every: int = 50) -> Path:
    spec = tmp_path / "nodes.yaml"
    spec.write_text(SPEC.replace("STEPS", str(steps)).replace("EVAL", str(eval_every)))
    return spec


STARTED: list[subprocess.Popen] = []


def driver(spec: Path, address: str, results: Path, *extra) -> subprocess.Popen:
    """`sweep run` in its own process (and session, so a kill reaches only it and its children)."""
    proc = subprocess.Popen([sys.executable, "-m", "sweep.cli", "run", str(spec), "--address", address,
                             "--results", str(results), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def no_stray_drivers():
    yield
    while STARTED:  # a failed test must not leave its driver running
        proc = STARTED.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def node_ids(runs: pl.DataFrame) -> list[str]:
    return [n.split("/", 1)[1] for n in runs["node"].to_list()]


def test_trials_spread_over_both_nodes(tmp_path, cluster):
    c, worker = cluster
    proc = driver(write_spec(tmp_path, 8), c.address, tmp_path / "r")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    runs = ResultsStore(tmp_path / "r", "nodes").read("runs")
    assert set(runs["status"]) == {"done"}
    heads = {c.head_node.node_id[:12], worker.node_id[:12]}
    assert sorted(node_ids(runs)) == sorted(heads), runs.select("trial_id", "node")


DDP_SPEC = {
    "name": "ddp",
    "data": {"seq_len": 16},
    "train": {"steps": 12, "batch_size": 4, "eval_every": 4, "checkpoint_every": 0, "eval_batch": {"sequences": 2},
              "invariance_check": False},
    "grid": {"model": [{"d_model": 32, "n_layers": 2, "n_heads": 2}], "optimizer": [{"name": "adam", "lr": 3e-3}],
             "norm": ["rmsnorm_scalar"], "seed": [0]},
    "resources": {"cpu": 1, "workers": 2},
    "retries": 1,
}


def test_a_two_worker_trial_spans_both_nodes(tmp_path, cluster):
    """(From tests/test_distributed.py, to share this module's cluster.) A trial of two 1-CPU
    Ray Train workers on a head and a worker raylet with one CPU each can only run with one
    worker on each node, so finishing it is the proof that it spanned both."""
    c, _ = cluster
    spec = tmp_path / "ddp.yaml"
    spec.write_text(json.dumps(DDP_SPEC))
    proc = driver(spec, c.address, tmp_path / "r")
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    runs = ResultsStore(tmp_path / "r", "ddp").read("runs")
    assert runs["status"].to_list() == ["done"] and runs["steps"].to_list() == [12]


def test_a_lost_node_s_trial_resumes_on_the_survivor_exactly_once(tmp_path, cluster):
    """Last in the module: it removes the shared cluster's worker node once both trials have
    checkpointed (step 50). 1500 steps, because the two trials start seconds apart: with 300 the
    first was at step 100-200 when the second checkpointed, and on a faster machine (CI) it
    finished on the worker node before the node went. The test fails if either finished first."""
    c, worker = cluster
    spec_path = write_spec(tmp_path, 1500, eval_every=500)
    results = tmp_path / "r"
    proc = driver(spec_path, c.address, results)
    spec = load_spec(spec_path)
    trials = expand(spec)
    folder = results / "nodes"
    checkpoints = [folder / "trials" / t.trial_id / "checkpoint.pt" for t in trials]
    deadline = time.time() + 240
    while not all(p.exists() for p in checkpoints):  # both trials (one per node) have checkpointed
        assert time.time() < deadline and proc.poll() is None, "no checkpoints"
        time.sleep(0.1)
    first_parts = {p: p.stat().st_mtime_ns for p in (folder / "curves").glob("*.000000000-*.parquet")}
    assert len(first_parts) == 2
    assert not list((folder / "runs").glob("*.parquet")), "a trial finished before the node was removed"
    c.remove_node(worker, allow_graceful=False)
    output, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, output

    store = ResultsStore(results, "nodes")
    runs = store.read("runs")
    assert set(runs["status"]) == {"done"} and runs.height == 2
    assert set(node_ids(runs)) == {c.head_node.node_id[:12]}, "the lost node's trial did not move"
    # A retry from step 0 would have deleted and rewritten each trial's first part.
    assert {p: p.stat().st_mtime_ns for p in first_parts} == first_parts, "a trial restarted from step 0"

    key = ["trial_id", "step", "layer", "site", "basis", "metric"]
    reference = ResultsStore(tmp_path / "ref", "nodes")
    for cfg in trials:
        train_trial(cfg, reference, reference.sink(cfg.trial_id))
    for table, k in (("metrics", key), ("curves", ["trial_id", "step"])):
        got, want = store.read(table), reference.read(table)
        assert got.height == got.unique(k).height == want.height, table
        drop = ["tokens_per_s"] if table == "curves" else []
        assert got.drop(drop).sort(k).equals(want.drop(drop).sort(k)), table
