"""`sweep data prepare`: a text source -> token shards + manifest.json that `data: {tokens: DIR}` reads
(the format: study.corpus.format).

SOURCE is a text file, a folder (text files, .jsonl/.parquet files, or a `datasets`
save_to_disk folder), a .jsonl/.parquet file with a text column, or a Hugging Face dataset
(`hf:NAME[:CONFIG]` or `owner/name[:config]`, streamed; needs the network).

Layout of OUT (nanoGPT's convention, sharded):

    manifest.json            source, tokenizer, vocab_size, dtype, per-split tokens and shards
    tokenizer.json           (bpe / PATH tokenizers) the exact tokenizer used
    train_000000.bin ...     raw uint16 (vocab <= 65536) or uint32 token ids
    val_000000.bin ...       the held-out split

Documents are split, not the stream: a document is val when the first 8 bytes of
sha256(key) / 2^64 < val_fraction, where key is a file's relative path for folders of text
files and the document text otherwise, so duplicates land on one side and the split does not
depend on the order or the worker count. Each document ends with the end-of-text id (byte
0x1C for bytes, `<|endoftext|>` for bpe).

bpe:N streams the source twice: once (its first `bpe_train_bytes` characters) to train the
tokenizer, once to encode. Bounded memory: documents are read in batches of about BATCH_BYTES, at most 2 x workers
batches are in flight, shards are appended as they come. Atomic: everything is written into
`.OUT.partial/` beside OUT (with a pid file), the manifest last, every file fsynced, then the
folder is renamed to OUT. An interrupted run leaves only the partial folder, which the next
run names and removes; OUT never holds a manifest for an incomplete corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from resultstore.inputs import file_kind
from resultstore.paths import local_write_problem
from study.corpus.format import (
    BYTE_EOT, MANIFEST, TOKENS_FORMAT, TOKENS_FORMAT_VERSION, dtype_for, manifest_fingerprint,
)

__all__ = [
    "BATCH_BYTES", "CHUNK_BYTES", "EOT", "SHARD_TOKENS", "SPLIT_RULE", "TEXT_SUFFIXES", "TOKENIZER_FILE", "Doc",
    "PrepareError", "ShardWriter", "TokenizerSpec", "auto_workers", "batches", "finish", "hub_name", "is_val",
    "iter_documents", "partial_dir", "prepare", "source_bytes", "start_partial", "train_bpe", "write_corpus",
]

TOKENIZER_FILE = "tokenizer.json"
EOT = "<|endoftext|>"
BATCH_BYTES = 4 << 20
"""Text per tokenisation batch."""
CHUNK_BYTES = 1 << 20
"""Large text files are read in chunks of about this size, cut at a newline."""
SHARD_TOKENS = 1 << 28
"""Tokens per shard file (512 MiB of uint16)."""
SPLIT_RULE = "v1:sha256(document key)[:8]/2^64<val_fraction"
TEXT_SUFFIXES = (".jsonl", ".json", ".parquet")


class PrepareError(ValueError):
    """Bad input to prepare: one line, naming the place."""


@dataclass(frozen=True)
class Doc:
    key: str
    """What the held-out rule hashes (relative path for text files, else the text)."""
    text: str | bytes
    end: bool = True
    """Last chunk of its document: an end-of-text id follows."""


# ---- sources ----------------------------------------------------------------------------------


def hub_name(source: str) -> tuple[str, str | None] | None:
    """(name, config) when `source` names a Hugging Face dataset rather than a local path."""
    if Path(source).expanduser().exists():
        return None
    s = source.removeprefix("hf:")
    m = re.fullmatch(r"([\w.-]+/[\w.-]+|[\w-]+)(?::([\w.-]+))?", s)
    if source.startswith("hf:") and m:
        return m.group(1), m.group(2)
    if m and "/" in m.group(1) and not m.group(1).lower().endswith((".txt", ".md") + TEXT_SUFFIXES):
        return m.group(1), m.group(2)
    return None


def _is_saved_dataset(folder: Path) -> bool:
    return (folder / "dataset_info.json").exists() or (folder / "dataset_dict.json").exists() \
        or (folder / "state.json").exists()


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise PrepareError(f"`{module}` is not installed; pip install 'privileged-bases-sweep[data]' "
                           f"(or pip install {module})") from None


def source_bytes(source: str) -> int | None:
    """Size of a plain-text source (the progress bar's total: text bytes are what it counts);
    None for jsonl/parquet/datasets, whose file sizes are not their text's."""
    p = Path(source).expanduser()
    files = [p] if p.is_file() else ([f for f in p.rglob("*") if f.is_file() and not _hidden(f.relative_to(p))]
                                     if p.is_dir() and not _is_saved_dataset(p) else [])
    if not files or any(f.suffix.lower() in TEXT_SUFFIXES for f in files):
        return None
    return sum(f.stat().st_size for f in files)


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def iter_documents(source: str, text_column: str = "text", split: str = "train") -> Iterator[Doc]:
    """Every document of `source`, streamed (never the whole source in memory)."""
    hub = hub_name(source)
    if hub is not None:
        yield from _iter_rows(_hub_dataset(hub[0], hub[1], split), text_column, source)
        return
    p = Path(source).expanduser()
    if not p.exists():
        raise PrepareError(f"{source}: no such file or folder (a Hugging Face dataset is hf:NAME[:CONFIG])")
    if p.is_file():
        yield from _iter_file(p, p.name, text_column, whole_file_key=False)
        return
    if _is_saved_dataset(p):
        datasets = _need("datasets")
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise PrepareError(f"{source}: no split {split!r} (has {', '.join(ds)}); pass --split")
            ds = ds[split]
        yield from _iter_rows(ds.to_iterable_dataset(), text_column, source)
        return
    files = sorted(f for f in p.rglob("*") if f.is_file() and not _hidden(f.relative_to(p)))
    if not files:
        raise PrepareError(f"{source}: folder holds no files")
    files, skipped = _text_files(files)
    if not files:
        raise PrepareError(f"{source}: folder holds no text files ({_skipped_names(skipped, p)} not text)")
    for f in files:
        yield from _iter_file(f, f.relative_to(p).as_posix(), text_column, whole_file_key=True)


def _not_text(path: Path) -> str | None:
    """Why a plain-text source file is binary (a NUL byte, or mostly not UTF-8 in its first 8 KiB),
    or None for text (a stray bad byte in a text file is decoded as U+FFFD, as before)."""
    if path.suffix.lower() in (".jsonl", ".json", ".parquet"):
        return None
    try:
        with path.open("rb") as fh:
            head = fh.read(8192)
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    nul = head.find(b"\0")
    if nul >= 0:
        return f"a NUL byte at offset {nul}"
    text = head.decode("utf-8", "replace")
    bad = text.count("\ufffd") - (1 if len(head) == 8192 else 0)  # the last character may be cut in two
    if bad > len(text) // 10:
        return f"{bad} of its first {len(text)} characters are not UTF-8"
    return None


def _text_files(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(text files, binary files) of a folder source."""
    text, binary = [], []
    for f in files:
        (binary if _not_text(f) is not None else text).append(f)
    return text, binary


def _skipped_names(skipped: list[Path], folder: Path) -> str:
    names = ", ".join(f.relative_to(folder).as_posix() for f in skipped[:5])
    return f"{len(skipped)} file(s): {names}" + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")


def _iter_file(path: Path, rel: str, column: str, whole_file_key: bool) -> Iterator[Doc]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    reason = f"{e.msg.removesuffix(' at')} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else \
                        f"not UTF-8 at byte {e.start + 1}"
                    shown = line.decode("utf-8", "replace").rstrip("\r\n")
                    shown = shown if len(shown) <= 80 else shown[:77] + "..."
                    raise PrepareError(f"{path}:{lineno}: not a JSON line ({reason}): {shown!r}") from None
                text = row.get(column) if isinstance(row, dict) else None
                if not isinstance(text, str):
                    raise PrepareError(f"{path}:{lineno}: no text column {column!r} (pass --text-column)")
                yield Doc(text, text)
    elif suffix == ".parquet":
        pq = _need("pyarrow.parquet")
        pf = pq.ParquetFile(path)
        if column not in pf.schema_arrow.names:
            raise PrepareError(f"{path}: no text column {column!r} (has {', '.join(pf.schema_arrow.names)}; "
                               "pass --text-column)")
        for batch in pf.iter_batches(batch_size=1024, columns=[column]):
            for text in batch.column(0).to_pylist():
                if text:
                    yield Doc(text, text)
    else:  # plain text: chunks cut at a newline; in a folder the file is the document
        why = _not_text(path)
        if why is not None:  # a folder's binary files were skipped before this
            raise PrepareError(f"{path}: not text ({why}); give a text, .jsonl or .parquet file, or a folder of them")
        with path.open("rb") as fh:
            carry = b""
            while True:
                block = fh.read(CHUNK_BYTES)
                data = carry + block
                if not block:
                    if data or whole_file_key:
                        yield Doc(rel if whole_file_key else data.decode("utf-8", "replace"), data, end=True)
                    return
                cut = data.rfind(b"\n") + 1 or len(data)
                chunk, carry = data[:cut], data[cut:]
                if whole_file_key:
                    yield Doc(rel, chunk, end=False)
                else:  # one big text file: each chunk is a document of its own
                    yield Doc(chunk.decode("utf-8", "replace"), chunk, end=True)


def _hub_dataset(name: str, config: str | None, split: str, **kwargs: Any):
    """A streamed Hugging Face dataset (also any `datasets` builder, e.g. "json" with data_files)."""
    datasets = _need("datasets")
    datasets.logging.set_verbosity_error()
    try:  # the hub client's retry warnings would bury the one line below
        import huggingface_hub

        huggingface_hub.utils.logging.set_verbosity_error()
    except (ImportError, AttributeError):
        pass
    try:
        return datasets.load_dataset(name, config, split=split, streaming=True, **kwargs)
    except Exception as e:  # offline, unknown name, gated: one line, not a traceback
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PrepareError(f"{name}: no such local file or folder, and cannot stream it from the Hugging Face Hub "
                           f"(no network, or no such dataset/config/split): {type(e).__name__}: {first[:200]}") from None


def _iter_rows(ds, column: str, source: str) -> Iterator[Doc]:
    names = getattr(ds, "column_names", None)
    if names is not None and column not in names:
        raise PrepareError(f"{source}: no text column {column!r} (has {', '.join(names)}; pass --text-column)")
    for row in ds:
        text = row.get(column)
        if not isinstance(text, str):
            raise PrepareError(f"{source}: row without a text column {column!r} (pass --text-column)")
        yield Doc(text, text)


def batches(docs: Iterator[Doc], batch_bytes: int = BATCH_BYTES) -> Iterator[list[Doc]]:
    batch, size = [], 0
    for d in docs:
        batch.append(d)
        size += len(d.text)
        if size >= batch_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


# ---- tokenizers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizerSpec:
    kind: str  # bytes | bpe | file
    vocab_size: int | None = None  # bpe: the requested size
    path: Path | None = None  # file: an existing tokenizer.json

    @classmethod
    def parse(cls, text: str) -> TokenizerSpec:
        if text == "bytes":
            return cls("bytes")
        m = re.fullmatch(r"bpe:(\d+)", text)
        if m:
            n = int(m.group(1))
            if n < 257:
                raise PrepareError(f"--tokenizer {text}: a byte-level BPE needs N >= 257 (256 bytes + end-of-text)")
            if n > 1 << 32:
                raise PrepareError(f"--tokenizer {text}: N must be at most 2**32 = {1 << 32} (token ids are stored "
                                   "as uint32)")
            return cls("bpe", vocab_size=n)
        p = Path(text).expanduser()
        if p.is_dir():
            p = p / TOKENIZER_FILE
        if p.is_file():
            return cls("file", path=p.resolve())
        if p.name == TOKENIZER_FILE or p.suffix == ".json" or "/" in text:
            where = "folder holds no tokenizer.json" if p.parent.is_dir() and p.name == TOKENIZER_FILE and \
                Path(text).expanduser().is_dir() else "no such file"
            raise PrepareError(f"--tokenizer {text}: {where} (expected bytes, bpe:N or a tokenizer.json path)")
        raise PrepareError(f"--tokenizer {text}: expected bytes, bpe:N or a tokenizer.json path")


def train_bpe(docs: Iterator[Doc], vocab_size: int, out_file: Path, max_bytes: int) -> None:
    """Byte-level BPE (GPT-2 style pre-tokenisation) of `vocab_size` ids, trained on the first
    `max_bytes` of the documents; saved to `out_file`."""
    tk = _need("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())

    def texts():
        seen = 0
        for d in docs:
            text = d.text.decode("utf-8", "replace") if isinstance(d.text, bytes) else d.text
            yield text
            seen += len(text)
            if seen >= max_bytes:
                return

    tok.train_from_iterator(texts(), trainer=trainer)
    tok.save(str(out_file))


_TOKENIZER = None  # per worker process: (kind, tokenizers.Tokenizer | None, eot id)


def _init_worker(kind: str, path: str | None, eot: int | None) -> None:
    global _TOKENIZER
    tok = None
    if kind != "bytes":
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(path)
    _TOKENIZER = (kind, tok, eot)


def _encode(batch: list[Doc], val_fraction: float) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """(train ids, val ids, UTF-8 bytes read, train docs, val docs) of one batch, as uint32."""
    kind, tok, eot = _TOKENIZER
    raws = [d.text.encode() if isinstance(d.text, str) else d.text for d in batch]
    if kind == "bytes":
        arrays = [np.frombuffer(r, dtype=np.uint8).astype(np.uint32) for r in raws]
    else:
        texts = [d.text if isinstance(d.text, str) else d.text.decode("utf-8", "replace") for d in batch]
        arrays = [np.asarray(e.ids, dtype=np.uint32) for e in tok.encode_batch(texts, add_special_tokens=False)]
    sep = np.array([eot], dtype=np.uint32) if eot is not None else None
    pieces: dict[bool, list[np.ndarray]] = {False: [], True: []}
    docs = {False: 0, True: 0}
    for d, ids in zip(batch, arrays):
        v = is_val(d.key, val_fraction)
        pieces[v].append(ids)
        if d.end:
            docs[v] += 1
            if sep is not None:
                pieces[v].append(sep)
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.uint32)  # noqa: E731
    return cat(pieces[False]), cat(pieces[True]), sum(map(len, raws)), docs[False], docs[True]


def is_val(key: str, val_fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    return h / 2.0**64 < val_fraction


# ---- shards -----------------------------------------------------------------------------------


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


# ---- the partial folder -----------------------------------------------------------------------


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
        from resultstore.lock import pid_alive

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


# ---- prepare ----------------------------------------------------------------------------------


def prepare(
    source: str,
    out: str | Path,
    *,
    tokenizer: str = "bytes",
    tokens: int | None = None,
    val_fraction: float = 0.005,
    text_column: str = "text",
    split: str = "train",
    workers: int = 1,
    shard_tokens: int = SHARD_TOKENS,
    bpe_train_bytes: int = 1 << 30,
    force: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    on_event: Callable[[str], None] | None = None,
) -> dict:
    """Tokenise `source` into shards under `out`; returns the manifest. `on_progress(bytes read,
    tokens written)` is called after every batch; an exception from it aborts (and cleans up)."""
    out = Path(os.path.realpath(Path(out).expanduser()))  # not resolve(): a symlink loop is named below
    on_event = on_event or (lambda m: None)
    if not 0 < val_fraction < 1:
        raise PrepareError(f"--val-fraction {val_fraction}: must lie in (0, 1)")
    if tokens is not None and tokens <= 0:
        raise PrepareError(f"--tokens {tokens}: must be > 0")
    if workers < 1:
        raise PrepareError(f"--workers {workers}: must be >= 1")
    spec = TokenizerSpec.parse(tokenizer)
    if spec.kind != "bytes":
        _need("tokenizers")
    hub = hub_name(source)
    if hub is not None:  # fail fast (offline, bad name) before creating anything
        _hub_dataset(hub[0], hub[1], split)
    elif (kind := file_kind(Path(source).expanduser())) == "missing":
        raise PrepareError(f"{source}: no such file or folder (a Hugging Face dataset is hf:NAME[:CONFIG])")
    elif kind not in ("a file", "a folder"):  # a FIFO would block, /dev/zero never ends
        raise PrepareError(f"{source}: is {kind}, not a text file or folder")
    folder = Path(source).expanduser()
    if hub is None and folder.is_dir() and not _is_saved_dataset(folder):
        skipped = _text_files(sorted(f for f in folder.rglob("*") if f.is_file() and not _hidden(f.relative_to(folder))))[1]
        if skipped:
            on_event(f"skipped {_skipped_names(skipped, folder)}: not text")
    first_docs = iter_documents(source, text_column, split)
    first = next(first_docs, None)  # surfaces a missing column or an empty source before any write
    if first is None:
        raise PrepareError(f"{source}: holds no documents")

    tmp = start_partial(out, force, on_event)
    try:
        tok_info, vocab_size, eot, tok_path = _tokenizer(spec, source, text_column, split, tmp, bpe_train_bytes, on_event)
        dtype = dtype_for(vocab_size)
        writers = {s: ShardWriter(tmp, s, dtype, shard_tokens) for s in ("train", "val")}
        docs = {"train": 0, "val": 0}
        read = written = 0
        for train_ids, val_ids, nbytes, n_train, n_val in _encoded(source, text_column, split, spec.kind, tok_path,
                                                                     eot, val_fraction, workers):
            if tokens is not None and written + len(train_ids) + len(val_ids) > tokens:
                left = tokens - written  # stop at exactly `tokens` ids, the last batch cut pro rata
                val_ids = val_ids[: round(len(val_ids) * left / (len(train_ids) + len(val_ids)))]
                train_ids = train_ids[: left - len(val_ids)]
            writers["train"].write(train_ids)
            writers["val"].write(val_ids)
            docs["train"] += n_train
            docs["val"] += n_val
            read += nbytes
            written += len(train_ids) + len(val_ids)
            if on_progress is not None:
                on_progress(read, written)
            if tokens is not None and written >= tokens:
                break
        top = max(w.max_id for w in writers.values())
        splits = {s: {**w.close(), "documents": docs[s]} for s, w in writers.items()}
        if not splits["val"]["tokens"]:
            raise PrepareError(f"{source}: the held-out rule put none of {docs['train']} documents in val; "
                               "raise --val-fraction or give more documents")
        if not splits["train"]["tokens"]:
            raise PrepareError(f"{source}: every document went to val; lower --val-fraction")
        if top >= vocab_size:  # a tokenizer bug, never the user's input
            raise PrepareError(f"token id {top} >= vocab_size {vocab_size} from tokenizer {tokenizer}")
        manifest = _manifest(source if hub is None else f"hf:{hub[0]}" + (f":{hub[1]}" if hub[1] else ""),
                             tok_info, vocab_size, eot, dtype, splits, val_fraction,
                             {"source_bytes": read, "text_column": text_column, "max_token_id": top})
        finish(tmp, out, manifest)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a clean failure leaves nothing; a kill leaves the partial folder
        raise


def _tokenizer(spec: TokenizerSpec, source, text_column, split, tmp: Path, bpe_train_bytes: int, on_event):
    """(manifest entry, vocab size, end-of-text id, tokenizer.json path or None)."""
    if spec.kind == "bytes":
        return {"kind": "bytes"}, 256, BYTE_EOT, None
    target = tmp / TOKENIZER_FILE
    if spec.kind == "bpe":
        on_event(f"training a byte-level BPE of {spec.vocab_size} ids on up to {bpe_train_bytes:,} characters")
        train_bpe(iter_documents(source, text_column, split), spec.vocab_size, target, bpe_train_bytes)
    else:
        shutil.copyfile(spec.path, target)
    import tokenizers

    try:
        tok = tokenizers.Tokenizer.from_file(str(target))
    except Exception as e:
        raise PrepareError(f"--tokenizer {spec.path}: not a tokenizers JSON file ({str(e).splitlines()[0][:120]})") from None
    eot = next((tok.token_to_id(t) for t in (EOT, "</s>", "<eos>") if tok.token_to_id(t) is not None), None)
    info = {"kind": spec.kind, "file": TOKENIZER_FILE, "sha256": hashlib.sha256(target.read_bytes()).hexdigest(),
            "requested_vocab_size": spec.vocab_size, "from": str(spec.path) if spec.path else None,
            "trained_on_characters": bpe_train_bytes if spec.kind == "bpe" else None}
    if spec.kind == "bpe" and tok.get_vocab_size() < spec.vocab_size:  # BPE ran out of pairs to merge
        on_event(f"note: --tokenizer bpe:{spec.vocab_size} gave {tok.get_vocab_size()} ids: the text it trained on "
                 f"(up to {bpe_train_bytes:,} characters) has no more pairs to merge; vocab_size is "
                 f"{tok.get_vocab_size()}")
    return info, tok.get_vocab_size(), eot, str(target)


def auto_workers(tokenizer: str, cpus: int) -> int:
    """Processes for `--workers 0`. Bytes: 1 (encoding is a memcpy; shipping batches to workers
    costs more, benchmarks/bench_prepare.py). BPE: 1 up to 4 CPUs (encode_batch already
    threads; a pool measured 1.5x fewer tokens per CPU-second on 2 CPUs), else one per CPU up to
    16, since the one reading process (JSON parsing) then bounds a single tokenizer (unmeasured)."""
    if tokenizer == "bytes" or cpus <= 4:
        return 1
    return min(16, cpus)


def _encoded(source, text_column, split, kind, tok_path, eot, val_fraction, workers) -> Iterator[tuple]:
    """Encoded batches in source order; with workers > 1 a process pool keeps at most
    2 x workers batches in flight (bounded memory)."""
    stream = batches(iter_documents(source, text_column, split), BATCH_BYTES)
    if workers == 1:
        _init_worker(kind, tok_path, eot)
        for b in stream:
            yield _encode(b, val_fraction)
        return
    import multiprocessing as mp

    # fork where there is one: spawn would re-import the caller's __main__ (torch, typer) per worker.
    # Workers only tokenise, so the parent's threads (tokenizers, pyarrow) are never needed in them.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    context = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(kind, tok_path, eot)) as pool:
        pending: list[Future] = []
        for b in stream:
            pending.append(pool.submit(_encode, b, val_fraction))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).result()
        for f in pending:
            yield f.result()
