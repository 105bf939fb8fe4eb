"""run.lock in a sweep's folder: one writer of trial rows at a time (see SweepLock)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from resultstore.layout import LOCK_FILE
from resultstore.lock_object import MAX_LOCK_BYTES, SweepFolder, lock_object
from resultstore.uri import StorageError

__all__ = ["HOLDING_ENV", "LockHeld", "LockLost", "SweepLock", "parse_record", "pid_alive", "pid_started"]

HOLDING_ENV = "SWEEP_LOCK_TOKEN"
"""Set (by sweep.launch) in a trial's worker to its driver's lock token: the worker's store then
checks, before each write, that the driver still holds the sweep (ResultsStore.holding)."""
LEASE_ENV = "SWEEP_LOCK_LEASE_S"
"""Overrides SweepLock.LEASE_S (seconds, >= 1): tests shorten it."""

_FIELDS = {"host": str, "pid": int, "start": (int, float), "expires": (int, float)}
"""A lock record's fields and their types (its token and command are read when present)."""


class LockHeld(StorageError):
    """Another writer holds the sweep's lock (one line, naming the holder)."""


class LockLost(LockHeld):
    """This writer's lock was taken over (its lease lapsed while it was paused, on another host's
    judgement): it must write nothing more."""


def parse_record(data: bytes | None, kind: str = "a file") -> dict:
    """A lock record (host, pid, start, expires, token, command), or one whose `problem` says
    why the bytes are none: such a lock is stale (SweepLock.stale) and is taken over."""
    problem = None
    rec: Any = None
    if data is None:
        problem = f"it is {kind}, not a lock file"
    elif len(data) > MAX_LOCK_BYTES:
        problem = f"it holds over {MAX_LOCK_BYTES} bytes"
    else:
        try:
            rec = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            problem = f"not JSON: {str(exc).splitlines()[0][:80]}" if data.strip() else "it is empty"
    if problem is None and not isinstance(rec, dict):
        problem = f"a JSON {type(rec).__name__}, not an object"
    if problem is None:
        bad = next((k for k, t in _FIELDS.items() if not isinstance(rec.get(k), t) or isinstance(rec.get(k), bool)), None)
        if bad is not None:
            problem = f"its {bad} is {json.dumps(rec.get(bad))[:40]}" if bad in rec else f"it has no {bad}"
        elif not 0 < rec["pid"] < 1 << 31:
            problem = f"its pid {rec['pid']} is no process id"
    if problem is None and not isinstance(rec.get("token", ""), str):
        problem = "its token is not a string"
    if problem is not None:
        return {"host": "?", "pid": -1, "start": 0.0, "expires": 0.0, "token": "", "problem": problem}
    return rec


class SweepLock:
    """run.lock in a sweep's folder: one writer of trial rows at a time (`sweep run`, `sweep
    train`, `sweep probe sae`). Created atomically where none is (resultstore.lock_object: a hard
    link locally, a conditional PUT on S3), with a lease the holder refreshes every LEASE_S / 3
    from a thread. A lock whose pid is dead on this host (or now a later process's), whose lease
    expired while held from another host, or that cannot be parsed (not JSON, a field of the wrong
    type, a folder) is stale: it is taken over with a warning, by a replacement that only one of
    two takers can win. A live holder on this host keeps the lock whatever its lease says (a
    process stopped by SIGSTOP, a debugger, a suspended laptop). A holder whose heartbeat finds
    the lock taken says so, and its writes stop (`check`, ResultsStore.holding). A folder named
    run.lock is moved to quarantine/, never deleted."""

    LEASE_S = 120.0

    def __init__(self, store: SweepFolder, command: str = "sweep run"):
        self.store = store
        self.command = command
        self.path = f"{store.path}/{LOCK_FILE}"
        self.token = uuid.uuid4().hex
        self.warning: str | None = None
        self._lock = lock_object(store, self.path)
        self._version: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._made: list = []
        self.lost: str | None = None
        """Why this writer no longer holds the lock (set by the heartbeat), or None."""

    @property
    def lease_s(self) -> float:
        """The lease: LEASE_S, or SWEEP_LOCK_LEASE_S where set (at least 1 s)."""
        try:
            return max(1.0, float(os.environ[LEASE_ENV]))
        except (KeyError, ValueError):
            return self.LEASE_S

    def _record(self) -> bytes:
        now = time.time()
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "start": getattr(self, "_start", now),
                           "expires": now + self.lease_s, "token": self.token, "command": self.command}).encode()

    def _snapshot(self):
        try:
            return self._lock.read()
        except IsADirectoryError:  # an object store's "folder" at the lock's key
            from resultstore.lock_object import Snapshot

            return Snapshot(None, None, "a folder")

    def holder(self) -> dict | None:
        """The current lock's record (see parse_record), or None when there is none."""
        snap = self._snapshot()
        return None if snap is None else parse_record(snap.data, snap.kind)

    @staticmethod
    def describe(rec: dict) -> str:
        if rec.get("problem"):
            return f"a run.lock that cannot be parsed: {rec['problem']}"
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.get("start", 0)))
        return f"{rec.get('command', 'sweep run')}: host {rec.get('host')} pid {rec.get('pid')} since {start}"

    @staticmethod
    def stale(rec: dict) -> str | None:
        """Why `rec` no longer holds the sweep (None while it does)."""
        if rec.get("problem"):
            return "a lock that cannot be parsed is treated as stale"
        if rec.get("host") == socket.gethostname():  # the pid says, not the lease
            if not pid_alive(rec["pid"]):
                return f"its process {rec['pid']} is gone"
            started = pid_started(rec["pid"])
            if started is not None and started > rec.get("start", 0) + 2:
                return f"its pid {rec['pid']} now belongs to a later process"
            return None
        if rec.get("expires", 0) < time.time():
            return "its lease expired"
        return None

    def acquire(self) -> str | None:
        """Take the lock or raise LockHeld naming the holder; returns a warning when a stale lock
        was taken over."""
        self._start = time.time()
        if self.store.local:  # folders made only for the lock go again on release (nothing written)
            from pathlib import Path

            path = Path(self.store.path)
            while not path.exists() and path != path.parent:
                self._made.append(path)
                path = path.parent
        try:
            self.store.fs.create_dir(self.store.path, recursive=True)
            return self._take()
        except OSError as exc:  # a full disk, a store gone read-only: nothing started
            self.release()
            raise StorageError(f"{self.store.uri}: cannot write {LOCK_FILE}: {exc.strerror or str(exc).splitlines()[0]}") from None

    def _take(self) -> str | None:
        warning = None
        for _ in range(3):
            self._version = self._lock.create(self._record())
            if self._version is not None:
                break
            snap = self._snapshot()
            if snap is None:
                continue  # released meanwhile: try again
            rec = parse_record(snap.data, snap.kind)
            why = self.stale(rec)
            if why is None:
                raise LockHeld(f"{self.store.uri}: another `{rec.get('command', 'sweep run')}` holds this sweep "
                               f"({self.describe(rec)}); wait for it, or remove {self.store.uri}/{LOCK_FILE} "
                               "if it is truly gone")
            aside = self._aside() if snap.data is None else None
            self._version = self._lock.take_over(self._record(), snap.version, aside)
            if self._version is not None:
                warning = f"took over a stale lock ({self.describe(rec)}): {why}"
                if aside is not None:
                    warning += f"; it was moved to {aside}"
                break
        else:
            raise LockHeld(f"{self.store.uri}: another writer took the lock first")
        self.warning = warning
        self._thread = threading.Thread(target=self._heartbeat, daemon=True, name="sweep-lock")
        self._thread.start()
        return warning

    def _aside(self) -> str:
        """Where a run.lock that is not a file goes: quarantine/, never deleted."""
        folder = f"{self.store.path}/quarantine"
        self.store.fs.create_dir(folder, recursive=True)
        return f"{folder}/{LOCK_FILE}.{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"

    def _heartbeat(self) -> None:
        import sys

        while not self._stop.wait(self.lease_s / 3):
            try:
                version = self._lock.refresh(self._record(), self._version)
            except OSError:
                continue  # a full disk or a lost connection: the lease may lapse; the next beat tries again
            if version is None:  # taken over (we were presumed dead): never overwrite the new holder
                holder = self.holder()
                self.lost = (f"{self.store.uri}/{LOCK_FILE} was taken over"
                             + (f" by {self.describe(holder)}" if holder else "")
                             + " while this run was paused past its lease; its trials stop before their next write")
                self._version = None
                print(f"warning: {self.lost}", file=sys.stderr, flush=True)
                return
            self._version = version

    @classmethod
    def check(cls, store: SweepFolder, token: str) -> None:
        """LockLost unless the sweep's lock is still the one with `token` (a write is about to be made)."""
        lock = cls(store)
        rec = lock.holder()
        if rec is None or rec.get("token") != token:
            who = "nobody" if rec is None else cls.describe(rec)
            raise LockLost(f"{store.uri}/{LOCK_FILE} is no longer this run's (now held by {who}): it was taken "
                           "over while this run was paused past its lease; nothing more is written")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._version is not None:
            try:
                self._lock.delete(self._version)
            except Exception:  # noqa: BLE001 - never raised from a `finally` over the error that ended the run
                pass  # the lease expires on its own
            self._version = None
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:  # something was written: keep it
                break

    def __enter__(self) -> SweepLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def pid_started(pid: int) -> float | None:
    """When process `pid` started (epoch seconds; Linux /proc), or None where it cannot be told."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def pid_alive(pid: int) -> bool:
    """Is process `pid` alive on this host (a stale lock's holder, a partial prepare's writer)?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
