"""A source's documents, streamed: text files and folders, .jsonl/.parquet files, `datasets`
save_to_disk folders and Hugging Face datasets (`hf:NAME[:CONFIG]`), each document with the key
the held-out rule hashes (sweep.prepare.encode.is_val), read in batches of about BATCH_BYTES."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from sweep.extras import need

__all__ = [
    "BATCH_BYTES", "CHUNK_BYTES", "TEXT_SUFFIXES", "Doc", "PrepareError", "batches", "hub_name", "iter_documents",
    "source_bytes",
]

BATCH_BYTES = 4 << 20
"""Text per tokenisation batch."""
CHUNK_BYTES = 1 << 20
"""Large text files are read in chunks of about this size, cut at a newline."""
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



def hub_name(source: str) -> tuple[str, str | None] | None:
    """(name, config) when `source` names a Hugging Face dataset rather than a local path. `hf:` may
    also name a local folder laid out as a Hub dataset repository (a snapshot from
    `huggingface-cli download`, or a test's): `hf:FOLDER[:CONFIG]`, loaded the same way."""
    if Path(source).expanduser().exists():
        return None
    s = source.removeprefix("hf:")
    if source.startswith("hf:"):
        folder, _, config = s.rpartition(":") if not Path(s).expanduser().is_dir() else (s, "", "")
        if folder and Path(folder).expanduser().is_dir():
            return str(Path(folder).expanduser()), config or None
    m = re.fullmatch(r"([\w.-]+/[\w.-]+|[\w-]+)(?::([\w.-]+))?", s)
    if source.startswith("hf:") and m:
        return m.group(1), m.group(2)
    if m and "/" in m.group(1) and not m.group(1).lower().endswith((".txt", ".md") + TEXT_SUFFIXES):
        return m.group(1), m.group(2)
    return None


def _is_saved_dataset(folder: Path) -> bool:
    return (folder / "dataset_info.json").exists() or (folder / "dataset_dict.json").exists() \
        or (folder / "state.json").exists()


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
        datasets = need("datasets", "data", PrepareError)
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
        pq = need("pyarrow.parquet", "data", PrepareError)
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
    datasets = need("datasets", "data", PrepareError)
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
