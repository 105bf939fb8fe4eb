"""Fixtures and helpers shared by the test modules: one definition each (tests/test_conftest.py
fails if a module defines its own `invoke`, `chart_rows`/`_rows`, `batch`, `tiny` or `local_ray`).
Helpers are imported with `from conftest import ...`; fixtures are requested by name."""

import os
from typing import Any

import pytest
import torch

# CI machines have 2 cores; one torch thread per test process is faster than two fighting.
torch.set_num_threads(1)


def invoke(*args):
    """Run the `sweep` CLI in-process on `args` (each str()-ed); the click Result."""
    from typer.testing import CliRunner

    from sweep.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def chart_rows(chart: Any) -> list[dict[str, Any]]:
    """Every data row of an Altair chart (or of its spec dict), all datasets in order."""
    spec = chart if isinstance(chart, dict) else chart.to_dict(validate=False)
    return [row for rows in spec["datasets"].values() for row in rows]


def batch(generator: torch.Generator, B: int, T: int, vocab: int = 256, *, shifted: bool = True):
    """B token sequences of length T and their targets, drawn from `generator`: the next tokens of
    one (B, T + 1) draw, or (shifted=False) a second, independent (B, T) draw."""
    if not shifted:
        x = torch.randint(0, vocab, (B, T), generator=generator)
        return x, torch.randint(0, vocab, (B, T), generator=generator)
    x = torch.randint(0, vocab, (B, T + 1), generator=generator)
    return x[:, :-1], x[:, 1:]


def tiny(steps: int = 12, eval_every: int = 4, *, train: dict | None = None, **config):
    """A trial that trains in seconds on a CPU: d_model 32, 2 layers, 2 heads, seq_len 16, adam at
    3e-3, batch 4, `steps` steps evaluated every `eval_every`, no checkpoints, no invariance check.
    `train` updates the train section; other keywords replace whole top-level sections."""
    from study.config import TrialConfig

    train = {"steps": steps, "batch_size": 4, "eval_every": eval_every, "eval_batch": {"sequences": 2},
             "checkpoint_every": 0, "invariance_check": False, **(train or {})}
    base = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2}, "data": {"seq_len": 16},
            "optimizer": {"name": "adam", "lr": 3e-3}}
    return TrialConfig(**{**base, **config, "train": train})


def ladder_spec(*, steps: int, batch_size: int, lrs: str = "1.0e-2, 3.0e-2, 1.0e-1") -> str:
    """The YAML of a one-ladder sweep named `tiny` (adam, d_model 32, 2 layers, the stdlib corpus at
    seq_len 32) that trains in seconds: evaluated and checkpointed every 10 steps."""
    return f"""name: tiny
data: {{corpus: stdlib, seq_len: 32}}
train:
  steps: {steps}
  batch_size: {batch_size}
  eval_every: 10
  eval_batch: {{sequences: 4}}
  checkpoint_every: 10
grid:
  model: [{{d_model: 32, n_layers: 2, n_heads: 2}}]
  optimizer: [{{name: adam, lr: [{lrs}]}}]
  norm: [rmsnorm_scalar]
  rotation: [none]
  seed: [0]
"""


@pytest.fixture
def declared(monkeypatch):
    """`resultstore.schema.declare_runs_column`; the runs columns declared inside the test are gone
    after it."""
    from resultstore import schema

    monkeypatch.setattr(schema, "RUNS_COLUMNS", list(schema.RUNS_COLUMNS))
    monkeypatch.setattr(schema, "_ROLES", dict(schema._ROLES))
    monkeypatch.setitem(schema.ARROW, "runs", schema.ARROW["runs"])
    before = dict(schema.RUNS_SCHEMA)
    yield schema.declare_runs_column
    schema.RUNS_SCHEMA.clear()
    schema.RUNS_SCHEMA.update(before)


@pytest.fixture(scope="module")
def ray_env() -> dict[str, str]:
    """Environment set before the module's local Ray starts (its workers inherit it) and restored
    after it stops; a module overrides this fixture to add its own (and to start fixtures first)."""
    return {}


@pytest.fixture(scope="module")
def local_ray(ray_env):
    """A local Ray on loopback (2 CPUs, no dashboard), one per test module, stopped by handle."""
    import ray

    from sweep.launch import _loopback_only

    saved = {k: os.environ.get(k) for k in (*ray_env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}  # the last: _loopback_only's
    os.environ.update(ray_env)
    _loopback_only()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    try:
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture
def readbacks(monkeypatch):
    """Counts of Tensor.tolist/item/cpu/numpy calls from here on: host readbacks."""
    counts = {"tolist": 0, "item": 0, "cpu": 0, "numpy": 0}
    for name in counts:
        original = getattr(torch.Tensor, name)

        def counting(self, *a, _name=name, _orig=original, **k):
            counts[_name] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return counts


# ---- a real S3 API on loopback (moto's standalone server, in a subprocess we own by PID) ------

import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(**env) -> tuple[subprocess.Popen, str]:
    """moto's S3 server on a free loopback port; returns (process, endpoint URL)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not start")
            time.sleep(0.2)


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
          "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server with bucket `bars`; os.environ points AWS_ENDPOINT_URL at it (restored after).
    Yields the endpoint URL."""
    proc, url = start_moto()
    saved = {k: os.environ.get(k) for k in (*S3_ENV, "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
    os.environ.update(S3_ENV, AWS_ENDPOINT_URL=url)
    os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    import pyarrow.fs as pafs

    pafs.S3FileSystem(endpoint_override=url, region="us-east-1", allow_bucket_creation=True).create_dir("bars")
    try:
        yield url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.kill()
        proc.wait()


def kill_own_worker():
    """A Ray Tune callback that SIGKILLs the trial's own worker (the pid its results carry) at the
    first result after its first checkpoint (Tune registers a checkpoint only after the result that
    carries it), and records the steps the retry reports: `after` starts past `saved[0]` iff the
    retry resumed. Nothing else on the machine is touched."""
    import signal

    from ray.tune import Callback

    class KillOwnWorker(Callback):
        def __init__(self):
            self.saved, self.killed, self.after = [], [], []

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if not self.saved and "checkpoint_step" in result:
                self.saved.append(result["checkpoint_step"])
            elif self.saved and not self.killed:
                os.kill(result["pid"], signal.SIGKILL)
                self.killed.append(result["pid"])
            elif self.killed and result["pid"] != self.killed[0] and "step" in result:
                self.after.append(result["step"])

    return KillOwnWorker()


def kill_one_ray_train_worker() -> int | None:
    """SIGKILL one Ray Train worker of this test's own Ray (a descendant of this process, never
    anything else on the machine); returns its pid, or None when there is none."""
    import signal

    import psutil

    for proc in psutil.Process().children(recursive=True):
        try:
            if "RayTrainWorker" in " ".join(proc.cmdline()):
                os.kill(proc.pid, signal.SIGKILL)
                return proc.pid
        except psutil.Error:
            continue
    return None
