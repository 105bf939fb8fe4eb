"""The prepared token-corpus format: what `sweep data prepare` writes and `data: {tokens: DIR}` reads.

A folder holds manifest.json (format, version, source, tokenizer, vocab_size, dtype, per-split
token counts and shards with their sizes and sha256, and a fingerprint over them) and the raw
shards (`train_000000.bin`, `val_000000.bin`, ...: uint16 when vocab_size <= 65536, else uint32).
The manifest is written last, so a folder without one is not a complete corpus.

A leaf: numpy and the standard library only, so the tokenising workers of the preparer and the
checks that run before training never import torch or the configs.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

__all__ = [
    "BYTE_EOT", "FULL_SCAN_BYTES", "MANIFEST", "SCAN_BLOCKS", "SCAN_BLOCK_BYTES", "TOKENS_FORMAT",
    "TOKENS_FORMAT_VERSION", "ShardedTokens", "check_token_dir", "dtype_for", "manifest_fingerprint",
    "read_manifest",
]

MANIFEST = "manifest.json"
"""The prepared corpus's manifest, written last by `sweep data prepare`."""
TOKENS_FORMAT, TOKENS_FORMAT_VERSION = "privileged-bases-tokens", 1
BYTE_EOT = 0x1C
"""Byte between documents: the bytes tokenizer's end of text and the byte-level sources' file
separator (ASCII 'file separator'; absent from the stdlib sources)."""
FULL_SCAN_BYTES = 1 << 30
"""Token data up to this size is hashed and range-checked in full."""
SCAN_BLOCKS = 256
"""Blocks sampled (each SCAN_BLOCK_BYTES) from larger token files."""
SCAN_BLOCK_BYTES = 1 << 20


def dtype_for(vocab_size: int) -> np.dtype:
    """The shard (and raw .bin) dtype for a vocabulary: uint16 up to 65536 ids, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class ShardedTokens:
    """Shards of one split as one 1-D read-only sequence (memmaps, never copied whole).

    Supports len, slices and integer-array indexing (the batch samplers' `tokens[idx]`); a
    window may straddle two shards."""

    def __init__(self, shards: list[np.ndarray]):
        self.shards = shards
        self.offsets = np.cumsum([0] + [len(s) for s in shards])
        self.dtype = shards[0].dtype
        self.ndim = 1

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def nbytes(self) -> int:
        return len(self) * self.dtype.itemsize

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise IndexError("ShardedTokens slices need step 1")
            return np.concatenate([np.asarray(s[max(0, start - o): max(0, stop - o)])
                                   for s, o in zip(self.shards, self.offsets)]).astype(self.dtype, copy=False)
        idx = np.asarray(idx)
        flat = idx.ravel()
        which = np.searchsorted(self.offsets, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=self.dtype)
        for k in np.unique(which):
            mask = which == k
            out[mask] = self.shards[k][flat[mask] - self.offsets[k]]
        return out.reshape(idx.shape)


def manifest_fingerprint(manifest: dict) -> str:
    """16 hex digits over the tokenizer, vocab size, dtype and every shard's sha256."""
    payload = [manifest["tokenizer"].get("sha256"), manifest["vocab_size"], manifest["dtype"],
               {s: [x["sha256"] for x in manifest["splits"][s]["shards"]] for s in ("train", "val")}]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def read_manifest(folder: str | Path) -> dict:
    """The manifest of a prepared folder, its shards present at their recorded sizes; ValueError
    (one line naming the folder and the problem) otherwise."""
    folder = Path(folder).expanduser()
    where = f"tokens {folder}"
    path = folder / MANIFEST
    if not path.is_file():
        partial = folder.parent / f".{folder.name}.partial"
        hint = (f" ({partial} is an interrupted prepare: rerun `sweep data prepare`)" if partial.exists()
                else " (write one with `sweep data prepare SOURCE --out DIR`, or give a .bin file and vocab_size)")
        raise ValueError(f"{where}: no {MANIFEST}, so not a complete prepared corpus{hint}")
    try:
        m = json.loads(path.read_text())
        if m.get("format") != TOKENS_FORMAT or m.get("version") != TOKENS_FORMAT_VERSION:
            raise ValueError(f"format {m.get('format')!r} version {m.get('version')!r}, expected "
                             f"{TOKENS_FORMAT!r} version {TOKENS_FORMAT_VERSION}")
        vocab, dtype = int(m["vocab_size"]), np.dtype(m["dtype"])
        splits = {s: m["splits"][s] for s in ("train", "val")}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{where}: unreadable {MANIFEST}: {e}") from None
    if dtype not in (np.uint16, np.uint32) or (dtype == np.uint16 and vocab > 1 << 16):
        raise ValueError(f"{where}: dtype {dtype} cannot hold vocab_size {vocab}")
    for name, split in splits.items():
        if sum(sh["tokens"] for sh in split["shards"]) != split["tokens"]:
            raise ValueError(f"{where}: {MANIFEST} {name} tokens {split['tokens']} != the sum over its shards")
        for sh in split["shards"]:
            f = folder / sh["file"]
            want = sh["tokens"] * dtype.itemsize
            if not f.is_file():
                raise ValueError(f"{where}: shard {sh['file']} named in {MANIFEST} is missing")
            if f.stat().st_size != want:
                raise ValueError(f"{where}: shard {sh['file']} has {f.stat().st_size} bytes, the manifest "
                                 f"says {sh['tokens']} {dtype} tokens = {want} bytes")
    if manifest_fingerprint(m) != m.get("fingerprint"):
        raise ValueError(f"{where}: {MANIFEST} fingerprint does not match its shard list (edited by hand?)")
    return m


def check_token_dir(folder: str | Path, seq_len: int) -> int:
    """Validate a prepared folder before training (manifest, shards, checksums, id range, split
    sizes); returns its vocab size. The shards are hashed once per process and folder state."""
    folder = Path(folder).expanduser().resolve()
    m = read_manifest(folder)
    stamp = tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))
    _verify_shards(folder, stamp)
    need = seq_len + 1
    for name in ("train", "val"):
        n = m["splits"][name]["tokens"]
        if n < need:
            raise ValueError(f"tokens {folder}: the {name} split has {n} tokens, fewer than one window of "
                             f"seq_len + 1 = {need}; prepare more tokens or shorten seq_len")
    return int(m["vocab_size"])


@functools.cache
def _verify_shards(folder: Path, stamp: tuple) -> None:
    """sha256 of every shard and max id < vocab_size, in full up to FULL_SCAN_BYTES of shards;
    above that only sampled blocks are range-checked (checksums need the full read)."""
    m = read_manifest(folder)
    dtype, vocab = np.dtype(m["dtype"]), int(m["vocab_size"])
    shards = [sh for s in ("train", "val") for sh in m["splits"][s]["shards"]]
    full = sum(sh["bytes"] for sh in shards) <= FULL_SCAN_BYTES
    for sh in shards:
        if not sh["tokens"]:
            continue
        stream = np.memmap(folder / sh["file"], dtype=dtype, mode="r")
        if full:
            h, top = hashlib.sha256(), 0
            for s in range(0, len(stream), SCAN_BLOCK_BYTES):
                block = np.asarray(stream[s : s + SCAN_BLOCK_BYTES])
                h.update(block.tobytes())
                top = max(top, int(block.max()))
            if h.hexdigest() != sh["sha256"]:
                raise ValueError(f"tokens {folder}: shard {sh['file']} does not match its sha256 in {MANIFEST} "
                                 "(modified or damaged; prepare again)")
        else:
            top = max(int(np.asarray(stream[s : s + SCAN_BLOCK_BYTES]).max())
                      for s in np.linspace(0, max(0, len(stream) - SCAN_BLOCK_BYTES), 16).astype(np.int64))
        if top >= vocab:
            raise ValueError(f"tokens {folder}: shard {sh['file']} holds token id {top} >= the manifest's "
                             f"vocab_size {vocab}" + ("" if full else " (found on a sample)"))
