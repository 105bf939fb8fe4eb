"""Attribution overhead: one Attribution pass (top-k measures + zero/mean ablations + the
random-dimension null) vs the training steps of a trial, on the same model.

Budget (issue 20): run at the final eval, the pass adds under 5% to a trial at eval_every 100,
i.e. attribution_time / (steps x step_time) < 0.05 for the trial's length (--steps; 700 is
specs/laptop.yaml's). Also printed: the share per eval interval, what attribution_every 1
would cost.

    python benchmarks/bench_attribution.py                    # d_model 128, 4 layers, CPU
    python benchmarks/bench_attribution.py --device cuda --d-model 512 --layers 8 --steps 5000

Timings are medians over --reps, pass and step interleaved so that load from other processes
hits both alike. On CUDA both run under bf16 autocast as in study.train.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from study.attribution import Attribution, token_info
from study.config import TrialConfig
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
    ap.add_argument("--steps", type=int, default=700, help="the trial's length (specs/laptop.yaml: 700)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 keeps torch's default")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    cfg = TrialConfig.model_validate({
        "model": {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads},
        "optimizer": {"name": "adam", "lr": 1e-3}, "train": {"steps": 1}, "data": {"seq_len": args.seq_len},
    })
    model = Transformer.from_config(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    g = torch.Generator().manual_seed(0)
    rand = lambda b: torch.randint(0, cfg.vocab_size, (b, args.seq_len), generator=g).to(device)  # noqa: E731
    xt, yt = rand(args.train_batch), rand(args.train_batch)
    xe, ye = rand(args.eval_batch), rand(args.eval_batch)
    counts = np.bincount(xe.reshape(-1).cpu().numpy(), minlength=cfg.vocab_size)
    attribution = Attribution(model, token_info(counts, byte_level=True), seed=0)

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

    def attribute() -> list[dict]:
        with autocast:
            return attribution.run(xe, ye)  # ends in one host transfer

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    for _ in range(2):  # warm-up
        step(), attribute()
    steps, passes = [], []
    for _ in range(args.reps):
        steps.append(timed(step))
        passes.append(timed(attribute))
    t_step, t_pass = statistics.median(steps), statistics.median(passes)
    trial_share = t_pass / (args.steps * t_step)
    rows = len(attribute())
    print(f"model: d_model {args.d_model}, {args.layers} layers, {model.num_params():,} params, "
          f"{device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"train step   (batch {args.train_batch} x {args.seq_len}, fwd+bwd+AdamW): {t_step * 1e3:8.1f} ms")
    print(f"attribution  (batch {args.eval_batch} x {args.seq_len}, {rows} dims rows):     {t_pass * 1e3:8.1f} ms")
    print(f"attribution / step = {t_pass / t_step:.2f}; at the final eval of a {args.steps}-step trial: "
          f"{trial_share:.4f} ({'within' if trial_share < 0.05 else 'OVER'} the 0.05 budget); "
          f"at every eval (attribution_every 1, eval_every {args.eval_every}): {t_pass / (args.eval_every * t_step):.4f}")


if __name__ == "__main__":
    main()
