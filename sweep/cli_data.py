"""`sweep data prepare`: tokenise a source into the shards that `data: {tokens: DIR}` reads."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from sweep.console import bad_input, duration, err, human, out, refuse

__all__ = ["data_app"]  # its typer app; sweep.cli adds it

data_app = typer.Typer(no_args_is_help=True, help="Corpora: tokenise a source into shards that `data: {tokens: DIR}` reads.")


@data_app.command("prepare")
def data_prepare(
    source: Annotated[str, typer.Argument(help="Text file or folder, .jsonl/.parquet file, a `datasets` save_to_disk "
                                               "folder, a Hugging Face dataset hf:NAME[:CONFIG] (streamed), or a "
                                               "named corpus (sweep.prepare.corpora: shakespeare, fineweb-edu-10bt, ...).",
                                          show_default=False)],
    out_dir: Annotated[Optional[str], typer.Option("--out", "-o", help="Folder to write (shards, manifest.json); a "
                                                   "named corpus: the folder its specs read.", show_default=False)] = None,
    tokenizer: Annotated[str, typer.Option(help="bytes, bpe:N (train a byte-level BPE of N ids), or a tokenizer.json path.")] = "bytes",
    tokens: Annotated[Optional[int], typer.Option(help="Stop after this many tokens (train + val).")] = None,
    val_fraction: Annotated[float, typer.Option(help="Share of documents held out (by a hash of each document).")] = 0.005,
    text_column: Annotated[str, typer.Option(help="Text column of jsonl/parquet/datasets sources.")] = "text",
    split: Annotated[str, typer.Option(help="Split of a Hugging Face / saved dataset.")] = "train",
    workers: Annotated[int, typer.Option(help="Tokenising processes (0: auto, see sweep.prepare.auto_workers).")] = 0,
    bpe_train_chars: Annotated[int, typer.Option(help="bpe:N trains on the source's first this many characters.")] = 1 << 30,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing prepared corpus at --out.")] = False,
) -> None:
    """Tokenise SOURCE into uint16/uint32 shards, a held-out split and manifest.json (atomically)."""
    import os

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from resultstore.paths import output_problem
    from sweep.bounds import WORKERS_PER_CORE, bounded, max_workers
    from sweep.prepare import PrepareError, auto_workers, prepare, source_bytes
    from sweep.prepare.corpora import named, option_problem, prepare_by_name

    corpus = named(source)  # a corpus a shipped spec trains on: its own recipe and folder
    refuse(option_problem(source, corpus, out_dir, tokenizer=tokenizer, tokens=tokens, val_fraction=val_fraction))
    if corpus is not None:
        out_dir, tokenizer, prepare = out_dir or corpus.folder, corpus.tokenizer, prepare_by_name
    refuse(bounded("--workers", workers, 0, max_workers(), why=f"{WORKERS_PER_CORE} per core; 0: auto"))
    refuse(output_problem("--out", out_dir, whole_folder=True))
    out_path = Path(out_dir)
    total = tokens or None
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[tok]}"),
                        TimeElapsedColumn(), console=err, transient=True)  # the summary line replaces it
    t0 = time.perf_counter()
    with progress:
        task = progress.add_task("read", total=total or source_bytes(source), tok="")

        def show(read: int, written: int) -> None:
            rate = written / max(1e-9, time.perf_counter() - t0)
            progress.update(task, completed=written if total else read,
                            tok=f"{human(written)} tokens · {human(rate, ' tok/s')}")

        try:
            manifest = prepare(source, out_path, tokenizer=tokenizer, tokens=tokens, val_fraction=val_fraction,
                               text_column=text_column, split=split,
                               workers=workers or auto_workers(tokenizer, os.cpu_count() or 1),
                               bpe_train_bytes=bpe_train_chars,
                               force=force, on_progress=show, on_event=lambda m: progress.console.print(m, markup=False, highlight=False))
        except PrepareError as exc:
            raise bad_input(str(exc)) from None
    s = manifest["splits"]
    out.print(f"{out_path}: vocab {manifest['vocab_size']} ({manifest['dtype']}), train {s['train']['tokens']:,} "
              f"/ val {s['val']['tokens']:,} tokens from {human(manifest['source_bytes'], 'B')} in "
              f"{duration(time.perf_counter() - t0)}; fingerprint {manifest['fingerprint']}\n"
              f"  use it with  data: {{tokens: {out_path}}}", highlight=False, markup=False)


