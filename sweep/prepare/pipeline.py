"""prepare(): a source -> a prepared corpus. Reads the source once (twice for bpe:N: once to
train the tokenizer), encodes it in batches (in a process pool for workers > 1, at most
2 x workers batches in flight) and writes the shards as they come (sweep.prepare.shards)."""

from __future__ import annotations

import hashlib
import os
import shutil
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

from resultstore.inputs import file_kind
from study.corpus.format import BYTE_EOT, dtype_for
from sweep.extras import need
from sweep.prepare.documents import (
    BATCH_BYTES, PrepareError, _hidden, _hub_dataset, _is_saved_dataset, _skipped_names, _text_files, batches,
    hub_name, iter_documents,
)
from sweep.prepare.encode import EOT, TOKENIZER_FILE, TokenizerSpec, _encode, _init_worker, train_bpe
from sweep.prepare.shards import SHARD_TOKENS, ShardWriter, _manifest, finish, start_partial

__all__ = ["auto_workers", "prepare"]


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
    expect_fingerprint: str | None = None,
) -> dict:
    """Tokenise `source` into shards under `out`; returns the manifest. `on_progress(bytes read,
    tokens written)` is called after every batch; an exception from it aborts (and cleans up).
    `expect_fingerprint`: refuse (nothing lands at `out`) a corpus whose fingerprint differs."""
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
        need("tokenizers", "data", PrepareError)
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
        if expect_fingerprint is not None and manifest["fingerprint"] != expect_fingerprint:
            raise PrepareError(f"{source}: prepared fingerprint {manifest['fingerprint']} is not the expected "
                               f"{expect_fingerprint}: these are not the bytes the spec was run on; nothing written")
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
