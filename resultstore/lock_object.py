"""The run.lock object itself, on each kind of storage: read it, create it only where none is,
replace it only while it is still the version judged (a takeover, a lease refresh), delete it
only while it is ours. resultstore.lock decides who holds the sweep; this says how, atomically.

    LocalLock        a hard link of a complete temporary file: created whole or not at all
                     (never a half-written lock to misread); a takeover renames the stale
                     lock aside first, so of two takers only one can win
    ConditionalLock  S3 conditional writes: PUT If-None-Match: * creates, PUT / DELETE
                     If-Match: <ETag> replaces or deletes only the version judged (S3 since
                     2024, MinIO, moto); through botocore, which s3fs and boto3 bring
    ReadBackLock     any other object store (gs:// through pyarrow): write, wait, read back
                     to see who won. Best effort: pyarrow has no conditional write for GCS

Each `version` is an opaque token: (inode, mtime, size) locally, the ETag on S3.
"""

from __future__ import annotations

import importlib.util
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from resultstore import uri
from resultstore.inputs import file_kind

__all__ = ["MAX_LOCK_BYTES", "ConditionalLock", "LocalLock", "ReadBackLock", "Snapshot", "SweepFolder", "lock_object"]

MAX_LOCK_BYTES = 64 << 10
"""A lock record is ~150 bytes; anything over this is not one (read no further)."""


class SweepFolder(Protocol):
    """Where a sweep's folder is, all the lock needs of a store (resultstore.writer.ResultsStore is one)."""

    uri: str
    """The folder as a path or URI, for messages."""
    path: str
    """The folder within `fs`."""
    fs: Any
    """Its pyarrow filesystem."""
    local: bool
    """A local path (not s3:// or gs://)."""


@dataclass(frozen=True)
class Snapshot:
    """What lies at the lock's path: its bytes (None when it is not a file: `kind` says what)."""

    data: bytes | None
    version: Any
    kind: str = "a file"


def lock_object(store: SweepFolder, path: str):
    """The lock object at `path` (within store.fs) for the store's kind of storage."""
    if store.local:
        return LocalLock(path)
    if uri.scheme(store.uri) == "s3" and importlib.util.find_spec("botocore") is not None:
        return ConditionalLock(path)
    return ReadBackLock(store.fs, path)


class LocalLock:
    atomic = True

    def __init__(self, path: str):
        self.path = path

    def read(self) -> Snapshot | None:
        kind = file_kind(self.path)
        if kind == "missing":
            return None
        if kind != "a file":
            return Snapshot(None, self._version(), kind)
        try:  # a regular file (checked above): at most one byte past the limit, so an oversized one is named
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                return Snapshot(f.read(MAX_LOCK_BYTES + 1), self._version())
        except FileNotFoundError:
            return None

    def _version(self, path: str | None = None) -> Any:
        try:
            st = os.stat(path or self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def create(self, data: bytes) -> Any:
        """The new version, or None when a lock is already there."""
        self._remove_leftovers()
        tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.path)  # atomic, whole: fails when the path exists
            except FileExistsError:
                return None
            except OSError:  # a file system without hard links: an exclusive create, then the bytes
                return self._create_exclusive(data)
            return self._version()
        finally:
            _remove(tmp)

    def _remove_leftovers(self, older_than_s: float = 60.0) -> None:
        """Temporary files a killed writer left beside the lock (a live one's are seconds old)."""
        import glob

        for path in glob.glob(glob.escape(self.path) + ".*.tmp") + glob.glob(glob.escape(self.path) + ".*.stale"):
            try:
                if time.time() - os.stat(path).st_mtime > older_than_s:
                    os.remove(path)
            except OSError:
                pass

    def _create_exclusive(self, data: bytes) -> Any:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return self._version()

    def take_over(self, data: bytes, stale: Any, set_aside: str | None = None) -> Any:
        """Replace the lock of version `stale` with `data`: the new version, or None when the lock
        changed meanwhile (another taker won). What was there is moved to `set_aside` when given
        (a folder named run.lock is never deleted), else deleted."""
        aside = set_aside or f"{self.path}.{uuid.uuid4().hex}.stale"
        try:
            os.rename(self.path, aside)  # atomic: of two takers, one moves it
        except FileNotFoundError:
            return None
        if self._version(aside) != stale:  # we moved a fresh lock: put it back, untouched
            try:
                os.link(aside, self.path)
            except OSError:
                pass
            _remove(aside)
            return None
        if set_aside is None:
            _remove(aside)
        return self.create(data)

    def refresh(self, data: bytes, mine: Any) -> Any:
        """Rewrite our own lock (a new lease) whole: the new version, or None when it is not ours."""
        if self._version() != mine:
            return None
        tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        finally:
            _remove(tmp)
        return self._version()

    def delete(self, mine: Any) -> None:
        if self._version() == mine:
            _remove(self.path)


class ConditionalLock:
    atomic = True

    def __init__(self, path: str):
        import botocore.session
        from botocore.config import Config

        self.bucket, self.key = path.split("/", 1)
        endpoint = uri.s3_endpoint()
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ("us-east-1" if endpoint else None)
        self.client = botocore.session.get_session().create_client(
            "s3", endpoint_url=endpoint, region_name=region,
            config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2}))

    def _call(self, op: str, **kw) -> dict | None:
        """The response, or None when a precondition failed (or the object is not there)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, op)(Bucket=self.bucket, Key=self.key, **kw)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404"):
                return None
            raise OSError(f"s3://{self.bucket}/{self.key}: {code or exc}") from None
        except BotoCoreError as exc:  # an endpoint gone, a timeout: an OSError as for any other store
            raise OSError(f"s3://{self.bucket}/{self.key}: {exc}") from None

    def read(self) -> Snapshot | None:
        got = self._call("get_object")
        if got is None:
            return None
        with got["Body"] as body:
            return Snapshot(body.read(MAX_LOCK_BYTES + 1), got["ETag"])

    def create(self, data: bytes) -> Any:
        put = self._call("put_object", Body=data, IfNoneMatch="*")
        return put and put["ETag"]

    def take_over(self, data: bytes, stale: Any, set_aside: str | None = None) -> Any:
        put = self._call("put_object", Body=data, IfMatch=stale)
        return put and put["ETag"]

    refresh = take_over

    def delete(self, mine: Any) -> None:
        self._call("delete_object", IfMatch=mine)


class ReadBackLock:
    atomic = False
    SETTLE_S = 0.5
    """How long a write is given to land before it is read back."""

    def __init__(self, fs: Any, path: str):
        self.fs, self.path = fs, path

    def read(self) -> Snapshot | None:
        try:
            with self.fs.open_input_stream(self.path) as f:
                data = f.read(MAX_LOCK_BYTES + 1)
        except FileNotFoundError:
            return None
        return Snapshot(data, data)

    def _put(self, data: bytes) -> Any:
        with self.fs.open_output_stream(self.path) as f:
            f.write(data)
        time.sleep(self.SETTLE_S)  # a racing writer's put lands too; the last one wins, and both read it back
        now = self.read()
        return data if now is not None and now.data == data else None

    def create(self, data: bytes) -> Any:
        return None if self.read() is not None else self._put(data)

    def take_over(self, data: bytes, stale: Any, set_aside: str | None = None) -> Any:
        now = self.read()
        return self._put(data) if now is not None and now.version == stale else None

    def refresh(self, data: bytes, mine: Any) -> Any:
        now = self.read()
        if now is None or now.version != mine:
            return None
        with self.fs.open_output_stream(self.path) as f:
            f.write(data)
        return data

    def delete(self, mine: Any) -> None:
        now = self.read()
        if now is not None and now.version == mine:
            self.fs.delete_file(self.path)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
