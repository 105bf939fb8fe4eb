"""The python half of benchmarks/gpu_check.sh: the GPU path measured, one table.

    python benchmarks/gpu_check.py [--write]     # on a CUDA machine (< 8 min on one H200)
    python benchmarks/gpu_check.py --cpu-smoke   # the same pieces, tiny, on CPU: checks the plumbing only

Rows:
1. the CUDA-marked tests (pytest -m cuda);
2. MFU of a ~136M-parameter trial (d_model 768, 12 layers, vocab 32768, seq 1024, batch 64;
   bf16 autocast + torch.compile, every metric on, evals every 50 steps) over 150 steps, from the
   intervals after the first (which holds the compile), against the 45% target;
3. rotated_adam vs adam step time at d_model 768 and 1280 (eager bf16, 40 steps, the
   steady-state interval), against the 1.15x budget;
4. a 4-trial sweep of quarter-GPU trials (`gpu: 0.25`) through `sweep run` on one GPU: wall
   time, each trial's tokens/s and peak memory;
5. where the machine has two GPUs: one trial with `resources: {workers: 2, gpu: 1}` through
   `sweep run` (Ray Train, DDP over NCCL) against the same trial on one GPU: the final val loss
   agrees (same global batch) and tokens/s scales (the data-parallel efficiency `sweep plan`
   assumes, sweep.estimate.DATA_PARALLEL_EFFICIENCY). Skipped on one GPU; --cpu-smoke runs it
   with two gloo workers on CPU.
Throughput does not depend on the text, so the corpus is a random-token stand-in of the
flagship's vocabulary (32768). --write stores the compiled trial's sustained FLOP/s as the
device's row in sweep/throughput.json (what `sweep plan` estimates from).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

from study.config import DataConfig, TrialConfig
from sweep.prepare import write_corpus
from study.data import check_corpus
from study.device import peak_flops
from study.train import MemorySink, device_name, train
from sweep.estimate import DATA_PARALLEL_EFFICIENCY, TABLE

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 32768


def trial(corpus: Path, d: int, layers: int, heads: int, optimizer: str, steps: int, eval_every: int,
          batch: int, seq_len: int, device: str, compile_: bool) -> TrialConfig:
    return TrialConfig(
        model={"d_model": d, "n_layers": layers, "n_heads": heads}, norm="rmsnorm_scalar", rotation="shared",
        optimizer={"name": optimizer, "lr": 6e-4}, data=check_corpus(DataConfig(tokens=str(corpus), seq_len=seq_len)),
        train={"steps": steps, "batch_size": batch, "eval_every": eval_every, "eval_batch": {"sequences": 16},
               "checkpoint_every": 0, "invariance_check": False, "warmup": 10},
        runtime={"device": device, "compile": compile_},
    )


def steady_tokens_per_s(sink: MemorySink) -> float:
    """Median tokens/s of the eval intervals after the first (the first holds compile and warm-up)."""
    per_interval = [r["tokens_per_s"] for r in sink.tables["curves"] if r["val_loss"] is not None and r["tokens_per_s"]]
    later = per_interval[1:] or per_interval
    return statistics.median(later)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU: checks the plumbing, measures nothing")
    ap.add_argument("--write", action="store_true", help="store the measured FLOP/s in sweep/throughput.json")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device (torch.cuda.is_available() is False); --cpu-smoke checks the plumbing")
    device = "cpu" if smoke else "cuda"
    name = device_name(torch.device(device))
    t_all = time.perf_counter()
    rows: list[tuple[str, str, str, str]] = []

    def note(msg: str) -> None:
        print(f"[{time.perf_counter() - t_all:5.0f}s] {msg}", file=sys.stderr, flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    corpus = tmp / "corpus"
    rng = np.random.default_rng(0)
    n, vocab = (50_000, 512) if smoke else (4_000_000, VOCAB)  # the smoke's logits stay small
    write_corpus(corpus, {"train": rng.integers(0, vocab, n), "val": rng.integers(0, vocab, n // 20)}, vocab)

    note("1/5 CUDA-marked tests")
    if smoke:
        rows.append(("cuda tests", "pytest -m cuda", "skipped", "--cpu-smoke"))
    else:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "cuda", "-p", "no:cacheprovider",
                            str(ROOT / "tests")],
                           capture_output=True, text=True, cwd=ROOT, timeout=240)
        tail = (r.stdout.strip().splitlines() or ["no output"])[-1]
        rows.append(("cuda tests", "pytest -m cuda", tail, "pass" if r.returncode == 0 else f"FAIL rc={r.returncode}"))

    note("2/5 MFU trial")  # ~125M parameters, bf16 + compile, every metric on
    big = (64, 2, 2, 6, 3, 4, 64) if smoke else (768, 12, 12, 150, 50, 64, 1024)
    d, layers, heads, steps, every, batch, seq = big
    cfg = trial(corpus, d, layers, heads, "adam", steps, every, batch, seq, device, compile_=not smoke)
    sink = MemorySink()
    t0 = time.perf_counter()
    train(cfg, sink)
    tps = steady_tokens_per_s(sink)
    peak = peak_flops(name)
    mfu = cfg.flops_per_token * tps / peak if peak else None
    rows.append(("MFU", f"{cfg.params / 1e6:.3g}M params, d{d}x{layers}, {'fp32' if smoke else 'bf16+compile'}, "
                 f"{steps} steps", f"{mfu:.1%}" if mfu is not None else f"{tps:,.0f} tok/s (no peak)",
                 f">= 45% · {tps:,.0f} tok/s · peak mem {sink.run_row['peak_memory_bytes'] / 2**30:.1f} GiB · "
                 f"{time.perf_counter() - t0:.0f}s"))
    measured = {"params": cfg.params, "d_model": d, "n_layers": layers, "tokens_per_s": tps,
                "flops_per_s": cfg.flops_per_token * tps, "mfu": mfu, "compile": not smoke}

    note("3/5 rotated_adam vs adam step time")
    shapes = [(32, 2, 2), (48, 2, 2)] if smoke else [(768, 12, 12), (1280, 10, 10)]
    for d, layers, heads in shapes:
        rate = {}
        for opt in ("adam", "rotated_adam"):
            cfg = trial(corpus, d, layers, heads, opt, 6 if smoke else 40, 3 if smoke else 20, 4 if smoke else 32,
                        64 if smoke else 1024, device, compile_=False)
            s = MemorySink()
            train(cfg, s)
            rate[opt] = steady_tokens_per_s(s)
        ratio = rate["adam"] / rate["rotated_adam"]
        rows.append(("rotated_adam / adam", f"d_model {d}, {layers} layers, eager {'fp32' if smoke else 'bf16'}", f"{ratio:.3f}x step time",
                     f"<= 1.15x · adam {rate['adam']:,.0f} tok/s"))

    note("4/5 four quarter-GPU trials through sweep run")
    spec = tmp / "frac.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: frac
        data: {{tokens: {corpus}, seq_len: {64 if smoke else 512}}}
        train: {{steps: {6 if smoke else 200}, batch_size: {4 if smoke else 32}, eval_every: {3 if smoke else 100},
                 eval_batch: {{sequences: 8}}, checkpoint_every: 0, invariance_check: false}}
        grid:
          model: [{{d_model: {32 if smoke else 256}, n_layers: {2 if smoke else 4}, n_heads: {2 if smoke else 4}}}]
          optimizer: [{{name: adam, lr: 1.0e-3}}]
          seed: [0, 1, 2, 3]
        resources: {{cpu: 1, gpu: {0 if smoke else 0.25}}}
        device: {device}
        retries: 0
        """))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(tmp / "results")],
                       capture_output=True, text=True, cwd=ROOT, timeout=420)
    wall = time.perf_counter() - t0
    if r.returncode == 0:
        import polars as pl

        runs = pl.read_parquet(str(tmp / "results" / "frac" / "runs" / "*.parquet"))
        mem = runs["peak_memory_bytes"].max() / 2**30
        cap = json.loads(runs["config_json"][0])["runtime"].get("gpu_fraction")  # None until spec.py passes it
        rows.append(("fractional sweep", f"4 trials x gpu {0 if smoke else 0.25} on one device", f"{wall:.0f}s wall",
                     f"{runs.height} done · {runs['tokens_per_s'].median():,.0f} tok/s each · max peak mem {mem:.2f} GiB"
                     f" · memory cap {cap if cap is not None else 'not set'}"))
    else:
        rows.append(("fractional sweep", "4 trials x gpu 0.25", f"FAIL rc={r.returncode}",
                     (r.stderr.strip().splitlines() or ["?"])[-1][:80]))

    note("5/5 a two-worker (data-parallel) trial against one worker")
    if not smoke and torch.cuda.device_count() < 2:
        rows.append(("2-GPU data parallel", "workers: 2, gpu: 1", "skipped", f"{torch.cuda.device_count()} GPU here"))
    else:
        rows.append(two_workers(corpus, tmp, device, smoke))

    width = [max(len(row[i]) for row in rows + [("check", "config", "result", "target / notes")]) for i in range(4)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, width))  # noqa: E731
    print(f"\ngpu_check on {name} · torch {torch.__version__} · {time.perf_counter() - t_all:.0f}s"
          + (" · CPU SMOKE: plumbing only, no figure here is a measurement" if smoke else ""))
    print(line(("check", "config", "result", "target / notes")))
    print(line(tuple("-" * w for w in width)))
    for row in rows:
        print(line(row))
    if args.write and not smoke:
        table = json.loads(TABLE.read_text())
        table["devices"][torch.cuda.get_device_name()] = {
            "measured": [measured], "machine": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "command": "benchmarks/gpu_check.sh --write", "seq_len": 1024, "batch_size": 64}
        TABLE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote the {torch.cuda.get_device_name()!r} row of {TABLE}")
    if any(row[2].startswith("FAIL") or row[3].startswith("FAIL") for row in rows):
        sys.exit(1)


def two_workers(corpus: Path, tmp: Path, device: str, smoke: bool) -> tuple[str, str, str, str]:
    """The same trial on one device (study.train) and as 2 Ray Train workers (sweep run)."""
    d, layers, heads, steps, every, batch, seq = (32, 2, 2, 8, 4, 4, 64) if smoke else (768, 12, 12, 200, 100, 32, 1024)
    cfg = trial(corpus, d, layers, heads, "adam", steps, every, batch, seq, device, compile_=False)
    one = MemorySink()
    train(cfg, one)
    spec = tmp / "ddp.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: ddp
        data: {{tokens: {corpus}, seq_len: {seq}}}
        train: {{steps: {steps}, batch_size: {batch}, eval_every: {every}, eval_batch: {{sequences: 16}},
                 checkpoint_every: 0, invariance_check: false, warmup: 10}}
        grid:
          model: [{{d_model: {d}, n_layers: {layers}, n_heads: {heads}}}]
          optimizer: [{{name: adam, lr: 6.0e-4}}]
          norm: [rmsnorm_scalar]
          rotation: [shared]
          seed: [0]
        resources: {{cpu: 1, gpu: {0 if smoke else 1}, workers: 2}}
        device: {device}
        compile: false
        retries: 0
        """))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(tmp / "results")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        return ("2-GPU data parallel", "workers: 2", f"FAIL rc={r.returncode}", (r.stderr.strip().splitlines() or ["?"])[-1][:80])
    import polars as pl

    run = pl.read_parquet(str(tmp / "results" / "ddp" / "runs" / "*.parquet")).row(0, named=True)
    loss_1, loss_2 = one.run_row["final_val_loss"], run["final_val_loss"]
    efficiency = run["tokens_per_s"] / (2 * one.run_row["tokens_per_s"])
    agree = abs(loss_2 - loss_1) <= 0.02 * abs(loss_1)  # bf16 + NCCL sums in another order: not bitwise
    return ("2-GPU data parallel", f"d{d}x{layers}, batch {batch} = 2 x {batch // 2}, {steps} steps, eager",
            f"{efficiency:.0%} efficiency" if agree else f"FAIL val loss {loss_2:.4f} vs {loss_1:.4f}",
            f"val loss {loss_2:.4f} vs 1 GPU {loss_1:.4f} · {run['tokens_per_s']:,.0f} vs {one.run_row['tokens_per_s']:,.0f}"
            f" tok/s · {wall:.0f}s · assumed {DATA_PARALLEL_EFFICIENCY:.0%}")


if __name__ == "__main__":
    main()
