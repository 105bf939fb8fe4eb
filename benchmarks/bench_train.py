"""Overhead of the instrumented trial vs a plain hand-written PyTorch loop (docs/architecture.md "Budgets":
within 10% per step; the metric pass under 3% of training time).

    python benchmarks/bench_train.py [--d-model 128] [--steps 200] [--threads 1] [--repeats 3]

Both loops train the same model on the same batches; they alternate within one process so
machine noise hits both. Prints median seconds per step of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from study.config import TrialConfig
from study.data import load_corpus, sample_batch
from study.model import Transformer
from study.rotation import generator_for
from study.train import MemorySink, train


def plain_loop(cfg: TrialConfig) -> float:
    """nanoGPT-style: sample, forward, backward, clip, step. Returns seconds per step."""
    corpus = load_corpus(cfg.data)
    model = Transformer.from_config(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr, betas=cfg.optimizer.betas)
    gen = generator_for(cfg.seed, "data")
    t0 = time.perf_counter()
    for _ in range(cfg.total_steps):
        x, y = sample_batch(corpus.train, cfg.train.batch_size, cfg.data.seq_len, gen, "cpu")
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    loss.item()
    return (time.perf_counter() - t0) / cfg.total_steps


def instrumented(cfg: TrialConfig) -> float:
    summary = train(cfg, MemorySink())
    return cfg.tokens_per_step / summary.tokens_per_s  # training time only, evals excluded


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TrialConfig(model={"d_model": args.d_model, "n_layers": 4, "n_heads": 4}, optimizer={"name": "adam", "lr": 3e-3},
                      data={"seq_len": 128}, train={"steps": args.steps, "batch_size": 32, "eval_every": 100,
                                                    "eval_batch": {"sequences": 16}, "invariance_check": False},
                      runtime={"num_threads": args.threads})
    plain, ours, total = [], [], []
    for _ in range(args.repeats):
        plain.append(plain_loop(cfg))
        t0 = time.perf_counter()
        ours.append(instrumented(cfg))
        total.append((time.perf_counter() - t0) / args.steps)
    p, o, t = statistics.median(plain), statistics.median(ours), statistics.median(total)
    print(f"d_model {args.d_model}, 4 layers, batch 32x128, {args.steps} steps, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(f"plain loop        {1000 * p:8.1f} ms/step")
    print(f"train() steps     {1000 * o:8.1f} ms/step   ratio {o / p:.3f}  (budget <= 1.10)")
    print(f"train() all-in    {1000 * t:8.1f} ms/step   ratio {t / p:.3f}  (evals every 100 steps, corpus load, setup)")


if __name__ == "__main__":
    main()
