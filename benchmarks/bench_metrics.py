"""Probe overhead: one ActivationProbe.run vs one training step, on the same model.

Budget (docs/architecture.md "Budgets"): the metric pass costs under 3% of training time at eval_every 100, i.e.
probe_time / (100 x step_time) < 0.03.

    python benchmarks/bench_metrics.py                 # d_model 128, 4 layers, CPU
    python benchmarks/bench_metrics.py --device cuda --d-model 512 --layers 8
    python benchmarks/bench_metrics.py --attention clipped   # any study.attention variant

Timings are medians over --reps, probe and step interleaved so that load from other
processes hits both alike. On CUDA the step runs under bf16 autocast as in study.train.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from study.config import TrialConfig
from study.metrics import ActivationProbe
from study.model import Transformer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--train-batch", type=int, default=32)
    ap.add_argument("--eval-batch", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 keeps torch's default")
    ap.add_argument("--attention", default="softmax", help="the model's attention (study.attention names)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    cfg = TrialConfig.model_validate({
        "model": {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads},
        "optimizer": {"name": "adam", "lr": 1e-3}, "train": {"steps": 1}, "data": {"seq_len": args.seq_len},
        "attention": args.attention,
    })
    model = Transformer.from_config(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    probe = ActivationProbe(model, seed=0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    g = torch.Generator().manual_seed(0)
    rand = lambda b: torch.randint(0, cfg.vocab_size, (b, args.seq_len), generator=g).to(device)  # noqa: E731
    xt, yt = rand(args.train_batch), rand(args.train_batch)
    xe, ye = rand(args.eval_batch), rand(args.eval_batch)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step() -> None:
        model.train()
        with autocast:
            _, loss = model(xt, yt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()

    def run_probe() -> None:
        with autocast:
            probe.run(xe, ye)  # ends in its one host transfer

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    for _ in range(2):  # warm-up: allocator, kernels, the probe's random basis
        step(), run_probe()
    steps, probes = [], []
    for _ in range(args.reps):
        steps.append(timed(step))
        probes.append(timed(run_probe))
    t_step, t_probe = statistics.median(steps), statistics.median(probes)
    share = t_probe / (args.eval_every * t_step)
    rows = len(probe.run(xe, ye).rows)
    print(f"model: d_model {args.d_model}, {args.layers} layers, {args.attention} attention, {model.num_params():,} params, "
          f"{device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"train step  (batch {args.train_batch} x {args.seq_len}, fwd+bwd+AdamW): {t_step * 1e3:8.1f} ms")
    print(f"probe.run   (batch {args.eval_batch} x {args.seq_len}, {rows} metric rows):   {t_probe * 1e3:8.1f} ms")
    print(f"probe / step = {t_probe / t_step:.3f}; probe / ({args.eval_every} x step) = {share:.4f} "
          f"({'within' if share < 0.03 else 'OVER'} the 0.03 budget)")


if __name__ == "__main__":
    main()
