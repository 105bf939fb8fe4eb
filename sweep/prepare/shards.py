"""The prepared folder, written atomically: token ids appended to shards, everything into a
partial folder beside OUT (with a pid file), the manifest last, then a rename into place."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Callable

import numpy as np

from resultstore.inputs import file_kind
from resultstore.lock import pid_alive
from resultstore.paths import local_write_problem
from study.corpus.format import MANIFEST, TOKENS_FORMAT, TOKENS_FORMAT_VERSION, dtype_for, manifest_fingerprint
from sweep.prepare.documents import PrepareError
from sweep.prepare.encode import SPLIT_RULE

__all__ = ["SHARD_TOKENS", "ShardWriter", "finish", "partial_dir", "start_partial", "write_corpus"]

SHARD_TOKENS = 1 << 28
"""Tokens per shard file (512 MiB of uint16)."""


class ShardWriter:
    """Appends ids to <split>_NNNNNN.bin files of at most `shard_tokens`, hashing as it goes."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int = SHARD_TOKENS):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.shards: list[dict] = []
        self.fh = None
        self.tokens = 0
        self.max_id = -1

    def _open(self) -> None:
        name = f"{self.split}_{len(self.shards):06d}.bin"
        self.fh = open(self.folder / name, "wb")
        self.shards.append({"file": name, "tokens": 0, "bytes": 0})
        self.hash = hashlib.sha256()

    def write(self, ids: np.ndarray) -> None:
        if len(ids):
            self.max_id = max(self.max_id, int(ids.max()))
        ids = ids.astype(self.dtype, copy=False)
        while len(ids):
            if self.fh is None:
                self._open()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            part, ids = ids[:room], ids[room:]
            raw = part.tobytes()
            self.fh.write(raw)
            self.hash.update(raw)
            self.shards[-1]["tokens"] += len(part)
            self.shards[-1]["bytes"] += len(raw)
            self.tokens += len(part)
            if self.shards[-1]["tokens"] >= self.shard_tokens:
                self._close_shard()

    def _close_shard(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        self.fh = None
        self.shards[-1]["sha256"] = self.hash.hexdigest()

    def close(self) -> dict:
        if self.fh is not None:
            self._close_shard()
        return {"tokens": self.tokens, "shards": self.shards}


def partial_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.partial"


def start_partial(out: Path, force: bool, on_event: Callable[[str], None]) -> Path:
    """Check OUT, clear a stale partial folder (naming it), and create a fresh one with our pid."""
    kind = file_kind(out)
    if kind not in ("missing", "a folder"):  # a file, a FIFO, a device, a symlink loop
        raise PrepareError(f"--out {out}: is {kind}, not a folder")
    problem = local_write_problem(out)  # its parent is a file, /proc, a read-only mount
    if problem is not None:
        raise PrepareError(f"--out {problem}")
    if out.exists():
        if (out / MANIFEST).exists() and not force:
            raise PrepareError(f"--out {out}: already holds a prepared corpus (manifest.json); pass --force to replace it")
        if not (out / MANIFEST).exists() and out.is_dir() and any(out.iterdir()):
            raise PrepareError(f"--out {out}: exists and is not a prepared corpus; choose another folder or remove it")
    tmp = partial_dir(out)
    if tmp.exists():
        owner = (tmp / ".prepare.pid").read_text().split() if (tmp / ".prepare.pid").exists() else []
        if len(owner) == 2 and owner[0] == socket.gethostname() and owner[1].isdigit() and pid_alive(int(owner[1])) \
                and int(owner[1]) != os.getpid():
            raise PrepareError(f"--out {out}: another prepare (pid {owner[1]}) is writing {tmp}")
        on_event(f"removing an interrupted prepare: {tmp}")
        shutil.rmtree(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    (tmp / ".prepare.pid").write_text(f"{socket.gethostname()} {os.getpid()}")
    return tmp


def finish(tmp: Path, out: Path, manifest: dict) -> None:
    """Write the manifest last, fsync it and the folder, and rename the folder into place."""
    (tmp / ".prepare.pid").unlink()
    with open(tmp / MANIFEST, "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    os.rename(tmp, out)
    _fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest(source: str, tokenizer: dict, vocab_size: int, eot: int | None, dtype: np.dtype,
              splits: dict[str, dict], val_fraction: float | None, extra: dict) -> dict:
    m = {
        "format": TOKENS_FORMAT, "version": TOKENS_FORMAT_VERSION, "source": source, "tokenizer": tokenizer,
        "vocab_size": vocab_size, "eot_id": eot, "dtype": dtype.name, "split_rule": SPLIT_RULE,
        "val_fraction": val_fraction, "splits": splits,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra,
    }
    m["fingerprint"] = manifest_fingerprint(m)
    return m


def write_corpus(out: Path, splits: dict[str, np.ndarray], vocab_size: int, source: str = "arrays",
                 shard_tokens: int = SHARD_TOKENS, force: bool = False) -> dict:
    """A prepared corpus from in-memory id arrays (stand-ins for tests and specs), written
    through the same shard writer and atomic finish as `prepare`."""
    out = Path(out)
    tmp = start_partial(out, force, lambda m: None)
    dtype = dtype_for(vocab_size)
    result = {}
    for name in ("train", "val"):
        w = ShardWriter(tmp, name, dtype, shard_tokens)
        w.write(np.asarray(splits[name]))
        result[name] = {**w.close(), "documents": None}
    manifest = _manifest(source, {"kind": "ids"}, vocab_size, None, dtype, result, None, {})
    finish(tmp, out, manifest)
    return manifest
