"""CPU (or GPU) cost of one SAE of `sweep probe sae`: ms per optimiser step and seconds per SAE.

    python benchmarks/bench_sae.py                          # d_model 128, expansion 8, k 8
    python benchmarks/bench_sae.py --d-model 64 --steps 200 --threads 1

Times --steps steps of study.sae.train_sae (Adam and SGD) on synthetic sparse activations and
extrapolates to the probe's default 2000 steps; the probe trains 4 SAEs per (trial, layer)
(2 bases x 2 optimisers). The measurement pass (metrics, Hungarian matching) is timed once.
"""

from __future__ import annotations

import argparse
import time

import torch

from study.rotation import generator_for, random_orthogonal
from study.sae import SAEConfig, decoder_alignment, matched_cosine, reconstruction_metrics, sparse_features, train_sae


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--expansion", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=12288, help="training tokens (3/4 of --tokens 16384)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200, help="steps timed (the probe's default is 2000)")
    ap.add_argument("--probe-steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    d = args.d_model
    x = sparse_features(args.tokens, random_orthogonal(d, generator_for(0, "bench")).repeat(4, 1)[: 4 * d],
                        args.k, generator_for(1, "bench")).float().to(args.device)
    print(f"d_model {d}, {args.expansion * d} latents, k {args.k}, batch {args.batch_size}, {args.tokens} tokens, "
          f"{args.threads} thread(s), {args.device}")
    for opt in ("adam", "sgd"):
        cfg = SAEConfig(k=args.k, expansion=args.expansion, optimizer=opt, steps=args.steps, batch_size=args.batch_size)
        train_sae(x[:1024], cfg.model_copy(update={"steps": 5}))  # warm-up
        t0 = time.perf_counter()
        trained = train_sae(x, cfg)
        dt = time.perf_counter() - t0
        t1 = time.perf_counter()
        reconstruction_metrics(trained.sae, x)
        decoder_alignment(trained.sae.W_dec)
        matched_cosine(trained.sae.W_dec, trained.sae.W_dec.flip(0))
        measure = time.perf_counter() - t1
        per_step = dt / args.steps
        print(f"{opt:5s}: {1e3 * per_step:7.2f} ms/step -> {per_step * args.probe_steps:6.1f} s per SAE at "
              f"{args.probe_steps} steps (+ {measure:.2f} s measuring)")


if __name__ == "__main__":
    main()
