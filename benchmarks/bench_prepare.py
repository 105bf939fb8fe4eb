"""Corpus preparation speed: tokens/s and bytes written, so a user can size a 10B-token prep.

    nice -n 10 python benchmarks/bench_prepare.py [--mb 32] [--workers 1 2] [--bpe 8192]

Generates a jsonl of Zipf-distributed pseudo-words (documents of 1-8 KB, `--mb` MB in all),
then runs `sweep.prepare.prepare` on it with the bytes tokenizer and with a byte-level BPE of
`--bpe` ids (trained on the same text; the training time is reported on its own line, the
tokenising rate excludes it). Reports per run: tokens/s, source MB/s, bytes written, bytes
per token, tokens per CPU-second (process + workers: what a busy shared machine does not
distort), and for a 10B-token prep the wall time at this rate, the CPU-hours, and the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import study.data  # noqa: F401  (prepare imports it for the manifest; keep torch's import out of the timings)
from sweep.prepare import iter_documents, prepare, train_bpe

TARGET = 10e9


def make_source(path: Path, mb: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    words = ["".join(rng.choice(letters, size=rng.integers(1, 10))) for _ in range(20000)]
    p = 1 / np.arange(1, len(words) + 1) ** 1.1
    p /= p.sum()
    written = 0
    with path.open("w") as fh:
        while written < mb * 1e6:
            n = int(rng.integers(200, 1500))
            text = " ".join(np.asarray(words, dtype=object)[rng.choice(len(words), size=n, p=p)]) + ".\n"
            line = json.dumps({"text": text}) + "\n"
            fh.write(line)
            written += len(line)
    return path.stat().st_size


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and its reaped children: robust to a busy machine."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def run(src: Path, out: Path, tokenizer: str, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    first: list[float] = []

    def on_progress(read, written):
        if not first:
            first.append(time.perf_counter())

    m = prepare(str(src), out, tokenizer=tokenizer, workers=workers, val_fraction=0.005, on_progress=on_progress)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    tokens = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
    written = sum(f.stat().st_size for f in out.iterdir())
    return {"tokens": tokens, "wall": wall, "cpu": cpu, "written": written, "source": m["source_bytes"], "vocab": m["vocab_size"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--bpe", type=int, default=8192)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        src = tmp / "source.jsonl"
        size = make_source(src, args.mb)
        print(f"source: {size / 1e6:.1f} MB jsonl, {os.cpu_count()} CPUs")
        t0 = time.perf_counter()
        tok_file = str(tmp / "tokenizer.json")
        train_bpe(iter_documents(str(src)), args.bpe, Path(tok_file), max_bytes=1 << 40)
        print(f"bpe:{args.bpe} training on the {size / 1e6:.0f} MB: {time.perf_counter() - t0:.1f} s")
        print(f"{'tokenizer':<12} {'workers':>7} {'tokens':>12} {'tok/s':>12} {'tok/CPU-s':>10} {'MB/s in':>8} "
              f"{'written':>10} {'B/token':>7} {'10B tokens: wall here, CPU-hours, disk':>40}")
        for name, tok in (("bytes", "bytes"), (f"bpe:{args.bpe}", tok_file)):
            for w in args.workers:
                r = run(src, tmp / "out", tok, w)
                rate = r["tokens"] / r["wall"]
                per_token = r["written"] / r["tokens"]
                per_cpu = r["tokens"] / r["cpu"]
                print(f"{name:<12} {w:>7} {r['tokens']:>12,} {rate:>12,.0f} {per_cpu:>10,.0f} "
                      f"{r['source'] / r['wall'] / 1e6:>8.1f} {r['written'] / 1e6:>8.1f}MB {per_token:>7.2f} "
                      f"{TARGET / rate / 3600:>13.1f} h {TARGET / per_cpu / 3600:>10.1f} CPU-h "
                      f"{TARGET * per_token / 1e9:>6.0f} GB", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
