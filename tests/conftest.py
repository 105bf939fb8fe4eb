import pytest
import torch

# CI machines have 2 cores; one torch thread per test process is faster than two fighting.
torch.set_num_threads(1)


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

import os  # noqa: E402
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
