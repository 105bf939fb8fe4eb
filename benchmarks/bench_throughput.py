"""Sustained training FLOP/s of whole trials at a few model sizes on this device, for `sweep plan`.

    nice -n 10 python benchmarks/bench_throughput.py [--device cpu|cuda] [--threads 1] [--write]
    python benchmarks/bench_throughput.py --dry-run          # tiny sizes, a few steps, prints only

Each size is one real trial (study.train.train, every metric on, evals every 25 steps), its
tokens/s from the trial's own clock (evals excluded), times TrialConfig.flops_per_token. With
--write the device's row of sweep/throughput.json is replaced (key: "cpu", or the CUDA device
name); sweep/estimate.py interpolates it log-log in parameters.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from study.config import TrialConfig
from study.device import mfu
from study.train import MemorySink, device_name, train
from sweep.estimate import TABLE

CPU_SIZES = [(64, 2), (128, 4), (256, 4)]  # (d_model, n_layers)
GPU_SIZES = [(256, 4), (512, 8), (768, 12), (1024, 16), (1280, 10)]


def measure(d: int, layers: int, device: str, threads: int, steps: int, seq_len: int, batch: int, compile_: bool | str) -> dict:
    cfg = TrialConfig(
        model={"d_model": d, "n_layers": layers, "n_heads": max(1, d // 64)}, norm="rmsnorm_scalar",
        rotation="shared", optimizer={"name": "adam", "lr": 1e-3}, data={"seq_len": seq_len},
        train={"steps": steps, "batch_size": batch, "eval_every": 25, "eval_batch": {"sequences": 8},
               "checkpoint_every": 0, "invariance_check": False},
        runtime={"device": device, "num_threads": threads, "compile": compile_},
    )
    summary = train(cfg, MemorySink())
    name = device_name(torch.device(device))
    return {"params": cfg.params, "d_model": d, "n_layers": layers, "tokens_per_s": round(summary.tokens_per_s, 1),
            "flops_per_s": cfg.flops_per_token * summary.tokens_per_s,
            "mfu": mfu(cfg.flops_per_token, summary.tokens_per_s, name)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--write", action="store_true", help="replace this device's row of sweep/throughput.json")
    ap.add_argument("--dry-run", action="store_true", help="two tiny sizes, a few steps; never writes")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    sizes = [(32, 2), (64, 2)] if args.dry_run else (GPU_SIZES if cuda else CPU_SIZES)
    steps = 6 if args.dry_run else args.steps
    seq_len, batch = (1024, 32) if cuda and not args.dry_run else (128, 16)
    points = []
    for d, layers in sizes:
        p = measure(d, layers, args.device, args.threads, steps, seq_len, batch, "auto" if cuda else False)
        points.append(p)
        eff = f"  MFU {p['mfu']:.1%}" if p["mfu"] is not None else ""
        print(f"d_model {d:5d} x {layers:2d} layers  {p['params'] / 1e6:8.2f}M params  "
              f"{p['tokens_per_s']:12,.0f} tok/s  {p['flops_per_s'] / 1e9:10.2f} GFLOP/s{eff}", flush=True)
    key = torch.cuda.get_device_name() if cuda else "cpu"
    row = {"threads": args.threads if not cuda else None, "seq_len": seq_len, "batch_size": batch,
           "machine": device_name(torch.device(args.device)) if cuda else f"{platform.processor() or platform.machine()}",
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "command": f"python benchmarks/bench_throughput.py --device {args.device} --threads {args.threads} "
                      f"--steps {args.steps} --write",
           "measured": points}
    if args.write and not args.dry_run:
        table = json.loads(TABLE.read_text())
        table["devices"][key] = row
        TABLE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote the {key!r} row of {TABLE}")
    else:
        print(json.dumps({key: row}, indent=1))


if __name__ == "__main__":
    main()
