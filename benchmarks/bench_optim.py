"""Benchmark: optimiser step time of RotatedAdam vs torch AdamW on the same model.

Run (from the repository root, venv active):

    python benchmarks/bench_optim.py                      # CPU, d_model 128 and 256, 4 layers
    python benchmarks/bench_optim.py --device cuda        # on a GPU (synchronised timing)
    python benchmarks/bench_optim.py --threads 1          # steadier on a busy shared machine
    python benchmarks/bench_optim.py --d-model 512 --layers 8 --repeats 15 --steps 10

Budget (DESIGN.md): rotated_adam's step costs at most 1.5x AdamW's. For each width it builds
three copies of `study.model.Transformer` (4 blocks, 4 heads, d_mlp 4d, byte vocab 256,
seq_len 128), gives every parameter a fixed random gradient, builds each optimiser through
`build_optimizer` (adam, rotated_adam residual, rotated_adam all), and times `opt.step()` in
one process, the optimisers interleaved in every repeat so that machine noise hits all alike.
It prints the median ms per step and the ratio to AdamW, and, for scale, the median forward +
backward time of one training batch (--batch sequences of seq_len tokens).

RotatedAdam's extra cost is four (residual: about two) dense d x d basis changes per matrix:
O(d^3) FLOPs per layer against AdamW's O(d^2) memory traffic. The "rotation GFLOP" column
says how much; on a CPU that arithmetic, not the bookkeeping, sets the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from study.config import TrialConfig
from study.model import Transformer
from study.optim import RotatedAdam, build_optimizer

VARIANTS = [("adamw", {"name": "adam"}), ("rotated residual", {"name": "rotated_adam", "rotate": "residual"}),
            ("rotated all", {"name": "rotated_adam", "rotate": "all"})]


def config(d_model: int, layers: int, opt: dict, seq_len: int) -> TrialConfig:
    return TrialConfig(model={"d_model": d_model, "n_layers": layers, "n_heads": 4}, data={"seq_len": seq_len},
                       optimizer={"lr": 1e-6, "weight_decay": 0.1, **opt}, train={"steps": 1})


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rotation_flops(opt: torch.optim.Optimizer) -> float:
    """FLOPs of the basis changes in one RotatedAdam step (to and from the basis); 0 for others."""
    if not isinstance(opt, RotatedAdam):
        return 0.0
    total = 0.0
    for p in (p for g in opt.param_groups for p in g["params"]):
        qo, qi = opt.bases(p)
        o, i = (p.shape[0], p.numel() // p.shape[0]) if p.ndim >= 2 else (p.numel(), 1)
        total += 2 * (2 * o * o * i if qo is not None else 0) + 2 * (2 * o * i * i if qi is not None else 0)
    return total


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
    print(f"  {'optimiser':<18} {'median ms/step':>15} {'min':>8} {'x adamw':>8} {'rotation GFLOP':>15}")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"  {label:<18} {med:>15.3f} {min(ts):>8.3f} {med / base:>8.2f} {rotation_flops(opts[label]) / 1e9:>15.2f}")
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
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    for d in args.d_model:
        bench_width(d, args, device)


if __name__ == "__main__":
    main()
