"""Tokenizers and encoding: bytes, a byte-level BPE trained on the source (bpe:N) or a
tokenizer.json; the per-process encoder that turns a batch of documents into train and val ids
by the held-out rule (SPLIT_RULE)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from sweep.extras import need
from sweep.prepare.documents import Doc, PrepareError

__all__ = ["EOT", "SPLIT_RULE", "TOKENIZER_FILE", "TokenizerSpec", "is_val", "train_bpe"]

TOKENIZER_FILE = "tokenizer.json"
EOT = "<|endoftext|>"
SPLIT_RULE = "v1:sha256(document key)[:8]/2^64<val_fraction"


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
    tk = need("tokenizers", "data", PrepareError)
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
