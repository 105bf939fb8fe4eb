"""Benchmark: optimiser step time of RotatedAdam vs torch AdamW, and of each rotated twin vs its
base, on the same model.

Run (from the repository root, venv active):

    python benchmarks/bench_optim.py                      # CPU, d_model 128 and 256, 4 layers
    python benchmarks/bench_optim.py --device cuda        # on a GPU (synchronised timing)
    python benchmarks/bench_optim.py --threads 1          # steadier on a busy shared machine
    python benchmarks/bench_optim.py --d-model 512 --layers 8 --repeats 15 --steps 10

The budget that matters is on the whole train step (benchmarks/bench_step.py); this one
isolates the optimiser step. For each width it builds one copy per variant of `study.model.Transformer` (4 blocks, 4 heads, d_mlp 4d, byte vocab 256,
seq_len 128), gives every parameter a fixed random gradient, builds each optimiser through
`build_optimizer` (adam, rotated_adam residual and all, soap, muon, adafactor, lion, signsgd and
the twins rotated_adafactor, rotated_lion, rotated_signsgd), and times `opt.step()` in one
process, the optimisers interleaved in every repeat so that machine noise hits all alike. It
prints the median ms per step and the ratio to AdamW, each twin's ratio to its base, and, for
scale, the median forward + backward time of one training batch (--batch sequences of seq_len
tokens). `--only adafactor rotated_adafactor ...` times a subset (adamw always runs, as the base).

RotatedAdam's extra cost is four (residual: about two) dense d x d basis changes per matrix:
O(d^3) FLOPs per layer against AdamW's O(d^2) memory traffic; soap adds its Shampoo factors,
muon its Newton-Schulz iterations. A twin (rules.rotated_basis.RotatedBasis) changes three
tensors' basis per matrix (G and W in, the update out): 1.5x rotated_adam's arithmetic. The
"dense GFLOP" column (bench_step.optimizer_flops) says how much; on a CPU that arithmetic, not
the bookkeeping, sets the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from study.config import TrialConfig
from study.model import Transformer
from bench_step import optimizer_flops  # benchmarks/ is on sys.path when run as a script
from study.optim import build_optimizer

VARIANTS = [("adamw", {"name": "adam"}), ("rotated residual", {"name": "rotated_adam", "rotate": "residual"}),
            ("rotated all", {"name": "rotated_adam", "rotate": "all"}), ("soap", {"name": "soap"}), ("muon", {"name": "muon"}),
            ("adafactor", {"name": "adafactor"}), ("lion", {"name": "lion"}), ("signsgd", {"name": "signsgd"}),
            ("rotated_adafactor", {"name": "rotated_adafactor"}), ("rotated_lion", {"name": "rotated_lion"}),
            ("rotated_signsgd", {"name": "rotated_signsgd"})]


def config(d_model: int, layers: int, opt: dict, seq_len: int) -> TrialConfig:
    return TrialConfig(model={"d_model": d_model, "n_layers": layers, "n_heads": 4}, data={"seq_len": seq_len},
                       optimizer={"lr": 1e-6, "weight_decay": 0.1, **opt}, train={"steps": 1})


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)




def time_steps(opt: torch.optim.Optimizer, steps: int, device: torch.device) -> float:
    """Milliseconds per opt.step(), averaged over `steps` back-to-back steps."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    sync(device)
    return (time.perf_counter() - t0) * 1e3 / steps


def bench_width(d_model: int, args: argparse.Namespace, device: torch.device) -> None:
    opts = {}
    for label, spec in VARIANTS:
        if args.only and label not in args.only and label != "adamw":
            continue
        cfg = config(d_model, args.layers, spec, args.seq_len)
        model = Transformer.from_config(cfg).to(device)
        g = torch.Generator(device="cpu").manual_seed(0)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g).to(device)
        opts[label] = build_optimizer(cfg, model)
    n_params = sum(p.numel() for p in model.parameters())
    for opt in opts.values():  # warm-up (allocator, kernels, lazy state)
        time_steps(opt, 2, device)
    times: dict[str, list[float]] = {label: [] for label in opts}
    for _ in range(args.repeats):
        for label, opt in opts.items():
            times[label].append(time_steps(opt, args.steps, device))

    # forward + backward of one batch, for scale
    x = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len), device=device)
    fb = []
    for _ in range(max(3, args.repeats // 3)):
        sync(device)
        t0 = time.perf_counter()
        model(x, x)[1].backward()
        sync(device)
        fb.append((time.perf_counter() - t0) * 1e3)

    base = statistics.median(times["adamw"])
    print(f"\nd_model {d_model}, {args.layers} layers, {n_params / 1e6:.2f}M params, device {device}, "
          f"threads {torch.get_num_threads()}, {args.repeats} x {args.steps} steps")
    print(f"  {'optimiser':<18} {'median ms/step':>15} {'min':>8} {'x adamw':>8} {'dense GFLOP':>15}")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"  {label:<18} {med:>15.3f} {min(ts):>8.3f} {med / base:>8.2f} {optimizer_flops(opts[label]) / 1e9:>15.2f}")
    for label in times:
        if label.startswith("rotated_") and (base := label.removeprefix("rotated_")) in times:
            print(f"  {label} / {base}: {statistics.median(times[label]) / statistics.median(times[base]):.2f}x step time")
    print(f"  (forward+backward, batch {args.batch} x {args.seq_len}: {statistics.median(fb):.1f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", nargs="+", default=None, help="variants to time (labels above), adamw always")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    for d in args.d_model:
        bench_width(d, args, device)


if __name__ == "__main__":
    main()
