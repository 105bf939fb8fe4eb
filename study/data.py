"""Corpora and batches: `load_corpus(DataConfig) -> Corpus`, `sample_batch`, `eval_batch`.

Three sources, all ending as two 1-D token arrays (train, val):

- `stdlib` (the default): the running Python's standard-library `.py` sources, byte-level
  (vocab 256). Files in sorted relative-POSIX-path order, joined with FILE_SEP. Held out BY
  FILE: a file is val when a stable hash of its relative path falls below val_fraction, so a
  file never straddles the split and adding files does not move others between splits.
  Cached in-process and on disk (`~/.cache/privileged-bases/`, see `cache_dir`).
- `{text: PATH}`: one text file (memmapped; the tail val_fraction of the bytes is val) or a
  folder of text files (recursive, sorted, hidden entries skipped; split by file as above).
- `{tokens: PATH, vocab_size: N}`: a nanoGPT-style `.bin` (raw uint16, or uint32 when
  vocab_size > 65536) or a 1-D integer `.npy`, memmapped; the tail val_fraction is val.
- `{tokens: DIR}`: a folder written by `sweep data prepare` (the format: study.corpus.format),
  its shards memmapped and joined without a copy (`ShardedTokens`). The split and the
  fingerprint are the manifest's; val_fraction is unused.

A DataConfig holds values only. `check_corpus` is the one check of the corpus it names (the
path exists; a prepared folder's manifest, shards, checksums, id range and split sizes) and
fills in the vocab_size a prepared folder's manifest gives: the spec loader calls it (plan,
run) and each trial worker calls it once at its start. `check_data` then loads the corpus and
checks that a batch and an eval window fit, before anything starts.

The fingerprint is a short sha256 of the content and the split rule. Files up to
FULL_SCAN_BYTES are hashed (and, for tokens, range-checked against vocab_size) in full;
larger memmaps are hashed and range-checked on SCAN_BLOCKS evenly spaced blocks only, which
the description says ("sampled"). A token beyond a sampled check would only surface later as
an embedding index error. Corpora and shard checks are cached, so a process computes a
fingerprint once.

Only the batch functions import torch (inside them), so the corpus checks that `sweep plan`
and the spec loader run before anything starts stay numpy-only and fast.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from study.config import DataConfig, FieldError
from study.corpus.format import (
    BYTE_EOT, FULL_SCAN_BYTES, SCAN_BLOCK_BYTES, SCAN_BLOCKS, ShardedTokens, check_token_dir, dtype_for, read_manifest,
)

if TYPE_CHECKING:
    import torch

__all__ = ["FILE_SEP", "SPLIT_RULE", "Corpus", "cache_dir", "check_corpus", "check_data", "eval_batch",
           "load_corpus", "sample_batch"]

FILE_SEP = BYTE_EOT
"""Byte between files (ASCII 'file separator'; absent from the stdlib sources)."""
SPLIT_RULE = "v1:sha256(relpath)<val_fraction"
"""Identifies the by-file split rule; part of the fingerprint and of the disk-cache key."""


@dataclass(frozen=True, eq=False)
class Corpus:
    """A tokenised corpus split into train and held-out val streams."""

    train: np.ndarray
    """1-D tokens (uint8 for bytes; uint16/uint32 memmap for token files)."""
    val: np.ndarray
    """1-D held-out tokens, disjoint from train (by file where the source has files)."""
    vocab_size: int
    """Token ids lie in [0, vocab_size)."""
    fingerprint: str
    """16 hex digits of sha256 over the content and the split rule."""
    description: str
    """Human summary: source, sizes, split."""


# ---- public entry points ----------------------------------------------------------------------


def load_corpus(data: DataConfig) -> Corpus:
    """Load (cached) the corpus `data` names and check both splits fit one seq_len + 1 window."""
    if data.text is not None:
        corpus = _load_text(_existing(data.text, "data.text"), data.val_fraction)
    elif data.tokens is not None and Path(data.tokens).expanduser().is_dir():
        corpus = _load_token_dir(_existing(data.tokens, "data.tokens"))
    elif data.tokens is not None:
        corpus = _load_tokens(_existing(data.tokens, "data.tokens"), int(data.vocab_size), data.val_fraction)
    else:
        corpus = _load_stdlib(data.val_fraction)
    need = data.seq_len + 1
    for split in ("train", "val"):
        n = len(getattr(corpus, split))
        if n < need:
            raise ValueError(
                f"corpus {data.source}: the {split} split has {n} tokens, shorter than "
                f"data.seq_len + 1 = {need}; use a larger corpus, a shorter seq_len or another val_fraction"
            )
    return corpus


def sample_batch(
    tokens: np.ndarray, batch_size: int, seq_len: int, generator: torch.Generator, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: x (B, T) int64 and y = x shifted left by one, on `device`.

    Starts come from `generator` (a CPU torch.Generator), so the batch sequence is a function
    of its state alone. One vectorised gather (`starts[:, None] + arange(T + 1)`), no per-row
    loop; on CUDA the host tensor is pinned and copied non-blocking.
    """
    import torch

    n = len(tokens)
    if n < seq_len + 1:
        raise ValueError(f"token stream has {n} tokens, shorter than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(0, n - seq_len, (batch_size,), generator=generator).numpy()
    return _windows(tokens, starts, seq_len, device)


def eval_batch(corpus: Corpus, sequences: int, seq_len: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed held-out batch: `sequences` evenly spaced windows over the val split
    (first at 0, last ending at the split's end; they overlap if the split is short)."""
    n = len(corpus.val)
    if n < seq_len + 1:
        raise ValueError(f"val split has {n} tokens, shorter than seq_len + 1 = {seq_len + 1}")
    starts = np.linspace(0, n - seq_len - 1, sequences).round().astype(np.int64)
    return _windows(corpus.val, starts, seq_len, device)


def cache_dir() -> Path | None:
    """On-disk cache folder: $PRIVILEGED_BASES_CACHE (empty, 0 or off disables it), else
    $XDG_CACHE_HOME/privileged-bases, else ~/.cache/privileged-bases."""
    env = os.environ.get("PRIVILEGED_BASES_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "privileged-bases"


# ---- batches ----------------------------------------------------------------------------------


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    idx = starts[:, None] + np.arange(seq_len + 1)  # (B, T+1)
    chunk = torch.from_numpy(tokens[idx].astype(np.int64))  # one gather, one copy
    x, y = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()  # (B, T) each
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


# ---- sources ----------------------------------------------------------------------------------


def _existing(path: str, field: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        unprepared = field == "data.tokens" and p.suffix not in (".bin", ".npy")  # a folder `sweep data prepare` writes
        raise FileNotFoundError(f"{field}: no such file or folder: {path}"
                                + (" (not prepared yet: `sweep plan` of the spec names the command that prepares it)"
                                   if unprepared else ""))
    return p.resolve()


def _is_val(relpath: str, val_fraction: float) -> bool:
    """The by-file split rule: the first 8 bytes of sha256(relpath) as a fraction of 2^64."""
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
    return h / 2.0**64 < val_fraction


def _split_files(relpaths: list[str], val_fraction: float) -> list[bool]:
    """Per-file val flags; if the rule leaves a side empty, the file with the lowest (for val)
    or highest (for train) hash moves over, so tiny folders still get both splits."""
    flags = [_is_val(r, val_fraction) for r in relpaths]
    if len(relpaths) >= 2 and (all(flags) or not any(flags)):
        order = sorted(range(len(relpaths)), key=lambda i: hashlib.sha256(relpaths[i].encode()).digest())
        flags = [False] * len(relpaths)
        flags[order[0]] = True
    return flags


def _join(chunks: list[bytes]) -> np.ndarray:
    return np.frombuffer(bytes([FILE_SEP]).join(chunks), dtype=np.uint8)


def _fingerprint(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()[:16]


def _file_corpus(root: Path, relpaths: list[str], val_fraction: float, label: str) -> Corpus:
    """Byte-level corpus from files under `root`, split by file."""
    flags = _split_files(relpaths, val_fraction)
    train_chunks, val_chunks = [], []
    h = hashlib.sha256()
    for rel, is_val in zip(relpaths, flags):
        content = (root / rel).read_bytes()
        h.update(f"{rel}\0{len(content)}\0{int(is_val)}\0".encode())
        h.update(content)
        (val_chunks if is_val else train_chunks).append(content)
    train, val = _join(train_chunks), _join(val_chunks)
    n_val = sum(flags)
    return Corpus(
        train=train, val=val, vocab_size=256,
        fingerprint=_fingerprint(h.digest(), SPLIT_RULE, repr(val_fraction)),
        description=(f"{label}: {len(relpaths)} files, bytes, train {len(train):,} "
                     f"/ val {len(val):,} ({n_val} files held out by path hash)"),
    )


def _walk(root: Path, keep, prune) -> list[str]:
    """Sorted relative POSIX paths of files under root for which keep(name), not entering
    directories for which prune(name)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not prune(x)]
        rel = Path(d).relative_to(root)
        out += [(rel / f).as_posix() for f in files if keep(f) and os.path.isfile(os.path.join(d, f))]
    return sorted(out)


def _stdlib_files() -> tuple[Path, list[str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return root, _walk(root, lambda f: f.endswith(".py"), lambda d: d in ("site-packages", "dist-packages", "__pycache__"))


@functools.cache
def _load_stdlib(val_fraction: float) -> Corpus:
    root, relpaths = _stdlib_files()
    stats = [(r, *_stat(root / r)) for r in relpaths]
    key = _fingerprint(json.dumps([str(root), sys.version, SPLIT_RULE, val_fraction, stats]))
    label = f"stdlib (Python {sys.version.split()[0]})"
    cached = _cache_read(key)
    if cached is not None:
        return cached
    corpus = _file_corpus(root, relpaths, val_fraction, label)
    _cache_write(key, corpus)
    return corpus


def _stat(p: Path) -> tuple[int, int]:
    s = p.stat()
    return s.st_size, s.st_mtime_ns


@functools.cache
def _load_text(path: Path, val_fraction: float) -> Corpus:
    if path.is_dir():
        hidden = lambda name: name.startswith(".")  # noqa: E731
        relpaths = _walk(path, lambda f: not hidden(f), hidden)
        if not relpaths:
            raise ValueError(f"data.text: folder {path} holds no files")
        return _file_corpus(path, relpaths, val_fraction, f"text folder {path}")
    if path.stat().st_size == 0:
        raise ValueError(f"data.text: file {path} is empty")
    stream = np.memmap(path, dtype=np.uint8, mode="r")
    return _tail_split(stream, val_fraction, 256, f"text file {path}, bytes")


@functools.cache
def _load_tokens(path: Path, vocab_size: int, val_fraction: float) -> Corpus:
    if path.is_dir():
        raise ValueError(f"data.tokens: {path} is a folder; give a .bin or .npy file")
    if path.suffix == ".npy":
        stream = np.load(path, mmap_mode="r")
        if stream.ndim != 1 or stream.dtype.kind not in "ui":
            raise ValueError(f"data.tokens: {path} must hold a 1-D integer array, not {stream.ndim}-D {stream.dtype}")
    else:
        dtype = dtype_for(vocab_size)
        size = path.stat().st_size
        if size == 0 or size % dtype.itemsize:
            raise ValueError(f"data.tokens: {path} has {size} bytes, not a positive multiple of "
                             f"{dtype.itemsize} ({dtype} for vocab_size {vocab_size})")
        stream = np.memmap(path, dtype=dtype, mode="r")
    return _tail_split(stream, val_fraction, vocab_size, f"tokens {path} ({stream.dtype})")


def _tail_split(stream: np.ndarray, val_fraction: float, vocab_size: int, label: str) -> Corpus:
    """Hash (and range-check) the stream, then hold out its tail val_fraction."""
    digest, top, sampled = _scan(stream)
    if top >= vocab_size:
        raise ValueError(f"{label}: token id {top} >= vocab_size {vocab_size}"
                         + (" (found on a sample of the file)" if sampled else ""))
    if top < 0:
        raise ValueError(f"{label}: negative token id {top}")
    n = len(stream)
    n_val = min(n - 1, max(1, round(n * val_fraction))) if n > 1 else 0
    train, val = stream[: n - n_val], stream[n - n_val :]
    return Corpus(
        train=train, val=val, vocab_size=vocab_size,
        fingerprint=_fingerprint(digest, str(stream.dtype), "tail", repr(val_fraction)),
        description=(f"{label}: train {len(train):,} / val {len(val):,} tokens (tail {val_fraction:g})"
                     + ("; fingerprint and range check sampled" if sampled else "")),
    )


def _scan(stream: np.ndarray) -> tuple[bytes, int, bool]:
    """sha256 and max (min when negative) of a memmap, chunked so memory stays flat; on
    streams over FULL_SCAN_BYTES only SCAN_BLOCKS evenly spaced blocks (plus the length)."""
    h = hashlib.sha256(str(len(stream)).encode())
    per = max(1, SCAN_BLOCK_BYTES // stream.dtype.itemsize)
    sampled = stream.nbytes > FULL_SCAN_BYTES
    if sampled:
        starts = np.linspace(0, len(stream) - per, SCAN_BLOCKS).astype(np.int64)
    else:
        starts = np.arange(0, len(stream), per)
    top, bottom = 0, 0
    for s in starts:
        block = np.ascontiguousarray(stream[s : s + per])
        h.update(block.tobytes())
        if len(block):
            top, bottom = max(top, int(block.max())), min(bottom, int(block.min()))
    return h.digest(), (bottom if bottom < 0 else top), sampled


# ---- prepared token folders (sweep data prepare) ---------------------------------------------


@functools.cache
def _load_token_dir(folder: Path) -> Corpus:
    m = read_manifest(folder)
    dtype = np.dtype(m["dtype"])
    streams = {}
    for name in ("train", "val"):
        maps = [np.memmap(folder / sh["file"], dtype=dtype, mode="r") for sh in m["splits"][name]["shards"] if sh["tokens"]]
        if not maps:
            raise ValueError(f"tokens {folder}: the {name} split is empty")
        streams[name] = maps[0] if len(maps) == 1 else ShardedTokens(maps)
    tok = m["tokenizer"].get("kind", "?")
    return Corpus(
        train=streams["train"], val=streams["val"], vocab_size=int(m["vocab_size"]), fingerprint=m["fingerprint"],
        description=(f"prepared {folder} ({m.get('source')}, {tok} tokenizer, vocab {m['vocab_size']}, {dtype}): "
                     f"train {len(streams['train']):,} / val {len(streams['val']):,} tokens"),
    )


# ---- disk cache (stdlib) ----------------------------------------------------------------------


def _cache_read(key: str) -> Corpus | None:
    root = cache_dir()
    folder = root / f"stdlib-{key}" if root else None
    if folder is None or not (folder / "meta.json").exists():
        return None
    try:
        meta = json.loads((folder / "meta.json").read_text())
        train = np.load(folder / "train.npy", mmap_mode="r")
        val = np.load(folder / "val.npy", mmap_mode="r")
        return Corpus(train=train, val=val, vocab_size=meta["vocab_size"],
                      fingerprint=meta["fingerprint"], description=meta["description"])
    except (OSError, ValueError, KeyError) as e:
        warnings.warn(f"ignoring unreadable corpus cache {folder}: {e}", stacklevel=3)
        return None


def _cache_write(key: str, corpus: Corpus) -> None:
    """Write train/val/meta into a temp folder beside the target, then rename it into place
    (atomic; a concurrent writer that loses the race just drops its copy)."""
    root = cache_dir()
    if root is None:
        return
    folder = root / f"stdlib-{key}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".stdlib-{key}-", dir=root))
        np.save(tmp / "train.npy", corpus.train)
        np.save(tmp / "val.npy", corpus.val)
        meta = {"vocab_size": corpus.vocab_size, "fingerprint": corpus.fingerprint, "description": corpus.description}
        (tmp / "meta.json").write_text(json.dumps(meta))
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        try:
            os.rename(tmp, folder)
        except OSError:  # another process got there first
            _rmtree(tmp)
    except OSError as e:
        warnings.warn(f"could not write corpus cache under {root}: {e}", stacklevel=3)


def _rmtree(p: Path) -> None:
    for f in p.iterdir():
        f.unlink()
    p.rmdir()


# ---- checks before anything starts ------------------------------------------------------------


def check_corpus(data: DataConfig) -> DataConfig:
    """The corpus `data` names, checked before anything trains, or a FieldError at the data field
    at fault; returns `data` with the vocab_size a prepared folder's manifest gives (a config
    holds values only, so it cannot know it). A prepared folder is checked in full (manifest,
    shards, checksums, id range, a window of seq_len + 1 in each split), once per process and
    folder state. A token path that does not exist passes when vocab_size is given: `sweep plan`
    may size a corpus not prepared yet (check_data refuses it before a run)."""
    if data.tokens is None:
        return data
    path = Path(data.tokens).expanduser()
    if not path.is_dir():
        if data.vocab_size is not None:
            return data
        if not path.exists():
            raise FieldError("tokens", f"tokens {data.tokens}: no such folder (prepare one with `sweep data prepare "
                             "SOURCE --out DIR`; a .bin file also needs vocab_size)")
        raise FieldError("tokens", "tokens needs vocab_size")
    try:
        vocab = check_token_dir(path, data.seq_len)
    except ValueError as exc:  # located at the field that names the folder
        raise FieldError("tokens", str(exc)) from None
    if data.vocab_size not in (None, vocab):
        raise FieldError("vocab_size", f"vocab_size {data.vocab_size} disagrees with the manifest of {data.tokens} "
                         f"({vocab}); leave it out")
    return data if data.vocab_size == vocab else data.model_copy(update={"vocab_size": vocab})


def check_data(data: DataConfig, eval_sequences: int, eval_seq_len: int, batch_size: int) -> Corpus:
    """Everything about the corpus that can be known before training, or a FieldError naming
    the data field at fault: the source exists and loads (a text folder holds files; a tokens
    file is non-empty, a whole number of its dtype, with ids < vocab_size: a full scan up to
    FULL_SCAN_BYTES, a sample of SCAN_BLOCKS blocks beyond, as the corpus description says), the
    train split holds one batch of `batch_size` disjoint windows of seq_len + 1 tokens and the
    val split one eval window of eval_seq_len + 1 (eval windows may overlap). Loads the corpus
    as training will (cached), so the driver pays the first read."""
    field = "text" if data.text is not None else "tokens" if data.tokens is not None else "corpus"
    try:
        corpus = load_corpus(data)
    except (OSError, ValueError) as exc:
        msg = str(exc) if not isinstance(exc, OSError) or not exc.strerror else f"{exc.strerror}: {exc.filename}"
        raise FieldError(field, msg.removeprefix(f"data.{field}: ")) from None
    need_train = batch_size * data.seq_len + 1
    if len(corpus.train) < need_train:
        raise FieldError(field, f"{corpus.description}: the train split has {len(corpus.train):,} tokens, fewer than "
                                f"one batch (train.batch_size {batch_size} x data.seq_len {data.seq_len} + 1 = "
                                f"{need_train:,}); use a larger corpus or a smaller batch or seq_len")
    if len(corpus.val) < eval_seq_len + 1:
        raise FieldError(field, f"{corpus.description}: the val split has {len(corpus.val):,} tokens, fewer than one "
                                f"eval window of {eval_seq_len} + 1 (for {eval_sequences} eval sequences); use a "
                                "larger corpus, a larger data.val_fraction or a shorter eval seq_len")
    return corpus
