"""run.lock on a bucket (issue 34): created by a conditional write (PUT If-None-Match: *), taken
over and refreshed by If-Match on the version judged. Two writers race in real processes against
moto's S3 server on loopback, one of them through a slow link: exactly one holds the sweep. The
old write-then-read-back lock let both hold it when one writer's requests were slow."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from resultstore.lock import LockHeld, SweepLock
from resultstore.writer import ResultsStore

ROOT = Path(__file__).parent.parent
WRITER = """
import sys, time
from pathlib import Path
from resultstore.lock import LockHeld, SweepLock
from resultstore.writer import ResultsStore
go = Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.01)
time.sleep(float(sys.argv[3]))
lock = SweepLock(ResultsStore(sys.argv[1], "s"))
try:
    lock.acquire()
except LockHeld as exc:
    print("refused", exc, flush=True)
else:
    print("held", flush=True)
    time.sleep(4)
    lock.release()
"""


class SlowLink:
    """A loopback TCP proxy to `upstream` that holds each PUT of a run.lock for `delay` s (a slow
    network under one writer's lock writes; its reads and folder requests pass at once)."""

    def __init__(self, upstream: str, delay: float):
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream, self.delay = (host, int(port)), delay
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, self.delay), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, 0.0), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, delay: float) -> None:
        try:
            while data := source.recv(65536):
                first_line = data.split(b"\r\n", 1)[0]
                if delay and first_line.startswith(b"PUT ") and b"run.lock" in first_line:
                    time.sleep(delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.server.close()


def _writer(results: str, go: Path, wait: float, endpoint: str) -> subprocess.Popen:
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, results, str(go), str(wait)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("round_", [0, 1])
def test_two_writers_racing_on_a_bucket_one_holds_the_sweep(s3, tmp_path, round_):
    """The slow writer checks first and writes last (its PUT lands after the other's whole
    acquire): with a read-back lock both believed they held it at once; with a conditional
    create its PUT is refused (412) and it names the holder."""
    slow = SlowLink(s3, delay=2.0)
    results = f"s3://bars/race{round_}"
    go = tmp_path / "go"
    try:
        writers = [_writer(results, go, 0.0, slow.url), _writer(results, go, 0.5, s3)]
        go.touch()
        outputs = [w.communicate(timeout=120)[0] for w in writers]
    finally:
        slow.close()
    held = [o for o in outputs if o.startswith("held")]
    assert len(held) == 1, outputs
    refused = next(o for o in outputs if not o.startswith("held"))
    assert refused.startswith("refused") and "holds this sweep" in refused, outputs
    assert SweepLock(ResultsStore(results, "s")).holder() is None  # the holder released it


def test_a_stale_lease_on_a_bucket_is_taken_over_once(s3):
    """Two takers judge the same expired lease: the If-Match on its ETag lets one replace it."""
    import json

    store = ResultsStore("s3://bars/stale", "s")
    stale = SweepLock(store)
    stale.LEASE_S = -1.0  # written already expired
    stale.acquire()
    stale._stop.set()  # its holder is gone: no heartbeat, never released
    first, second = SweepLock(store, "sweep run"), SweepLock(store, "sweep train")
    snap = first._lock.read()
    assert json.loads(snap.data)["expires"] < time.time()
    assert first._lock.take_over(first._record(), snap.version) is not None
    assert second._lock.take_over(second._record(), snap.version) is None  # the version judged is gone
    assert SweepLock(store).holder()["token"] == first.token
    with pytest.raises(LockHeld, match="sweep run"):
        second.acquire()
    first._version = first._lock.read().version
    first.release()
    assert SweepLock(store).holder() is None


def test_a_refresh_never_overwrites_a_new_holder(s3):
    store = ResultsStore("s3://bars/refresh", "s")
    with SweepLock(store) as lock:
        mine = lock._version
        thief = SweepLock(store, "sweep train")
        assert thief._lock.take_over(thief._record(), mine) is not None  # presumed dead, taken over
        assert lock._lock.refresh(lock._record(), mine) is None  # our heartbeat sees it and stops
        assert SweepLock(store).holder()["token"] == thief.token
    assert SweepLock(store).holder()["token"] == thief.token  # our release left theirs alone
