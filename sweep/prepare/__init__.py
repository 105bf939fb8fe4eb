"""`sweep data prepare`: a text source -> token shards + manifest.json that `data: {tokens: DIR}` reads
(the format: study.corpus.format, the leaf study reads corpora with). An offline tool: numpy and
the optional tokenizers / datasets packages, never torch or Ray.

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

    documents.py   the source's documents, streamed, and the batches they are read in
    encode.py      tokenizers (bytes, bpe:N, tokenizer.json), the encoder, the held-out rule
    shards.py      shards, the partial folder, the manifest, write_corpus (in-memory ids)
    pipeline.py    prepare(): the three above, in order
"""

from __future__ import annotations

from sweep.prepare.documents import (
    BATCH_BYTES, CHUNK_BYTES, TEXT_SUFFIXES, Doc, PrepareError, batches, hub_name, iter_documents, source_bytes,
)
from sweep.prepare.encode import EOT, SPLIT_RULE, TOKENIZER_FILE, TokenizerSpec, is_val, train_bpe
from sweep.prepare.pipeline import auto_workers, prepare
from sweep.prepare.shards import SHARD_TOKENS, ShardWriter, finish, partial_dir, start_partial, write_corpus

__all__ = [
    "BATCH_BYTES", "CHUNK_BYTES", "EOT", "SHARD_TOKENS", "SPLIT_RULE", "TEXT_SUFFIXES", "TOKENIZER_FILE", "Doc",
    "PrepareError", "ShardWriter", "TokenizerSpec", "auto_workers", "batches", "finish", "hub_name", "is_val",
    "iter_documents", "partial_dir", "prepare", "source_bytes", "start_partial", "train_bpe", "write_corpus",
]
