"""Benchmark (not a timed test): does Adam's best lr transfer across widths under muP, and not under SP?

Run (from the repository root, venv active):

    python benchmarks/bench_mup_transfer.py                       # d 64/128/192, 2 layers, 5 rungs, 80 steps of 8 x 32
    python benchmarks/bench_mup_transfer.py --layers 4 --steps 400  # the studies' depth, longer

For each parameterisation (sp, mup with mup_base_width 64) and width, it trains the stdlib corpus
with Adam at every lr of a ladder of ratio sqrt(10) (one seed) and prints the final val loss of
each on the trial's fixed held-out batch, and each width's best lr. The loop is study.train's step
without its probes (too slow on a shared CPU): the trial's model, optimiser (build_optimizer),
data order, schedule (set_lr: cosine, warmup 2%, muP's per-group lr_scale) and grad clip 1. Under muP the best lr should stay on one rung across widths; under
SP it moves down as the width grows (a fixed Adam lr is a larger effective step at a larger width).
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import torch

from study.config import TrialConfig
from study.data import eval_batch, load_corpus, sample_batch
from study.model import Transformer
from study.optim import build_optimizer
from study.rotation import generator_for
from study.schedule import set_lr

corpus = functools.cache(load_corpus)


def run(param: str, width: int, lr: float, a: argparse.Namespace) -> float:
    """The final val loss of one trial (inf if it went non-finite)."""
    cfg = TrialConfig(model={"d_model": width, "n_layers": a.layers, "n_heads": a.heads, "parametrization": param},
                      norm=a.norm, optimizer={"name": "adam", "lr": lr}, data={"seq_len": a.seq_len},
                      train={"steps": a.steps, "batch_size": a.batch, "eval_batch": {"sequences": a.eval_sequences}},
                      seed=a.seed)
    data, cpu = corpus(cfg.data), torch.device("cpu")
    model = Transformer.from_config(cfg)
    optimizer, gen = build_optimizer(cfg, model), generator_for(cfg.seed, "data")
    for step in range(cfg.total_steps):
        set_lr(cfg, optimizer.param_groups, step)
        x, y = sample_batch(data.train, cfg.train.batch_size, cfg.data.seq_len, gen, cpu)
        model(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        loss = model(*eval_batch(data, cfg.train.eval_batch.sequences, cfg.eval_seq_len, cpu))[1].item()
    return loss if math.isfinite(loss) else float("inf")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=int, nargs="+", default=[64, 128, 192])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--norm", default="rmsnorm_scalar")
    p.add_argument("--lrs", type=float, nargs="+", default=[10 ** (-3 + k / 2) for k in range(5)],
                   help="the ladder (default 1e-3 .. 1e-1, ratio sqrt(10))")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--eval-sequences", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"adam, {a.layers} layers x {a.heads} heads, {a.norm}, {a.steps} steps of {a.batch} x {a.seq_len} tokens, "
          f"seed {a.seed}, mup_base_width 64; final val loss per lr")
    print(f"{'param':5} {'d':>4} " + " ".join(f"{lr:>8.2g}" for lr in a.lrs) + "   best lr")
    t0 = time.perf_counter()
    for param in ("sp", "mup"):
        for width in a.widths:
            losses = [run(param, width, lr, a) for lr in a.lrs]
            best = min(range(len(losses)), key=losses.__getitem__)
            cells = " ".join(f"{x:8.4f}" + ("*" if i == best else " ") for i, x in enumerate(losses))
            print(f"{param:5} {width:4d} {cells}  {a.lrs[best]:.2g}", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
