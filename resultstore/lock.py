"""run.lock in a sweep's folder: one `sweep run` at a time (see SweepLock)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from resultstore.layout import LOCK_FILE
from resultstore.uri import StorageError

if TYPE_CHECKING:
    from resultstore.writer import ResultsStore

__all__ = ["LockHeld", "SweepLock", "pid_alive"]


class LockHeld(StorageError):
    """Another `sweep run` holds the sweep's lock (one line, naming the holder)."""


class SweepLock:
    """run.lock in a sweep's folder: one `sweep run` at a time. Local: an atomic exclusive create;
    object stores (no conditional put in pyarrow): a lock object with a lease, written, then read
    back to see who won. The holder refreshes the lease every LEASE_S / 3 from a thread; a lock
    whose pid is dead on this host, or whose lease expired, is stale and taken over."""

    LEASE_S = 120.0

    def __init__(self, store: ResultsStore):
        self.store = store
        self.path = f"{store.path}/{LOCK_FILE}"
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> dict:
        now = time.time()
        return {"host": socket.gethostname(), "pid": os.getpid(), "start": getattr(self, "_start", now),
                "expires": now + self.LEASE_S, "token": self.token}

    def holder(self) -> dict | None:
        try:
            with self.store.fs.open_input_stream(self.path) as f:
                return json.loads(f.read().decode())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # half-written or unreadable: treat as an expired lease
            return {"host": "?", "pid": -1, "start": 0.0, "expires": 0.0, "token": ""}

    @staticmethod
    def describe(rec: dict) -> str:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.get("start", 0)))
        return f"host {rec.get('host')} pid {rec.get('pid')} since {start}"

    @staticmethod
    def stale(rec: dict) -> str | None:
        """Why `rec` no longer holds the sweep (None while it does)."""
        if rec.get("host") == socket.gethostname() and not pid_alive(int(rec.get("pid", -1))):
            return f"its process {rec.get('pid')} is gone"
        if rec.get("expires", 0) < time.time():
            return "its lease expired"
        return None

    def acquire(self) -> str | None:
        """Take the lock or raise LockHeld naming the holder; returns a warning when a stale lock
        was taken over."""
        self._start = time.time()
        warning = None
        if self.store.local:  # folders made only for the lock go again on release (nothing written)
            made, path = [], Path(self.store.path)
            while not path.exists() and path != path.parent:
                made.append(path)
                path = path.parent
            self._made = made
        self.store.fs.create_dir(self.store.path, recursive=True)
        for _ in range(2):
            if self._create():
                break
            rec = self.holder()
            if rec is None:
                continue
            why = self.stale(rec)
            if why is None:
                raise LockHeld(f"{self.store.uri}: another `sweep run` holds this sweep ({self.describe(rec)}); "
                               f"wait for it, or remove {self.store.uri}/run.lock if it is truly gone")
            warning = f"took over a stale lock of {self.describe(rec)}: {why}"
            self.store.fs.delete_file(self.path)
        else:
            raise LockHeld(f"{self.store.uri}: another `sweep run` took the lock first")
        self._thread = threading.Thread(target=self._heartbeat, daemon=True, name="sweep-lock")
        self._thread.start()
        return warning

    def _create(self) -> bool:
        data = json.dumps(self._record()).encode()
        if self.store.local:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        if self.holder() is not None:
            return False
        self._put(data)
        time.sleep(0.5)  # a racing writer's put lands too; the last one wins, and both read it back
        rec = self.holder()
        return rec is not None and rec.get("token") == self.token

    def _put(self, data: bytes) -> None:
        if self.store.local:  # refresh atomically: a reader never sees half a record
            tmp = f"{self.path}.{self.token}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        else:
            with self.store.fs.open_output_stream(self.path) as f:
                f.write(data)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.LEASE_S / 3):
            rec = self.holder()
            if rec is None or rec.get("token") != self.token:
                return  # taken over (we were presumed dead): never overwrite the new holder
            try:
                self._put(json.dumps(self._record()).encode())
            except OSError:
                pass

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        rec = self.holder()
        if rec is not None and rec.get("token") == self.token:
            self.store.fs.delete_file(self.path)
        for folder in getattr(self, "_made", []):
            try:
                folder.rmdir()
            except OSError:  # something was written: keep it
                break

    def __enter__(self) -> SweepLock:
        self.warning = self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


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


