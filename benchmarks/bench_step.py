"""Benchmark: the WHOLE train step (forward, backward, clip, optimiser step, zero_grad) with each
optimiser, side by side with AdamW, interleaved in one process.

Run (from the repository root, venv active; the machine is shared, so nice it):

    nice -n 10 python benchmarks/bench_step.py --threads 1           # laptop grid 32/64/128 and 768
    nice -n 10 python benchmarks/bench_step.py --d-model 32 64 128 --threads 1 --repeats 5 --steps 2
    nice -n 10 python benchmarks/bench_step.py --d-model 768 --threads 1 --repeats 3 --steps 1 \
        --optimizers adam rotated_adam soap muon adafactor lion

Budget (docs/architecture.md "Budgets"): a whole step with rotated_adam (and soap, muon) within 1.15x of
one with AdamW, at every laptop-grid size (d_model 32/64/128, 4 layers, batch 32 x 128) and
at d_model 768. For each width it builds one `study.model.Transformer` per optimiser (same
init, same batch), runs the train loop's step exactly as study/train.py does, and in every
repeat times `--steps` steps of each optimiser in turn, so machine noise hits all alike. It
prints, per optimiser: median ms per whole step and its ratio to AdamW's; median ms of the
optimiser step alone and its ratio (on a CPU, ms of this process's CPU time: robust to other
processes' load; use --threads 1 on a shared machine, where threads also fight each other); and the FLOPs that explain them: the model's forward +
backward (6 N T plus attention, `TrialConfig.flops_per_token`) and the optimiser's own dense
arithmetic per step (`optimizer_flops`: basis changes, Shampoo factors and amortised basis
refreshes, Newton-Schulz iterations; AdamW's elementwise work is not counted).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from study.config import TrialConfig
from study.model import Transformer
from study.optim import SOAP, MuonAdamW, RotatedAdam, RotatedBasis, build_optimizer

OPTIMIZERS = {
    "adam": {"name": "adam", "lr": 1e-4},
    "rotated_adam": {"name": "rotated_adam", "lr": 1e-4},
    "soap": {"name": "soap", "lr": 1e-4},
    "muon": {"name": "muon", "lr": 1e-4},
    "adafactor": {"name": "adafactor", "lr": 1e-4},
    "lion": {"name": "lion", "lr": 1e-5},
    "signsgd": {"name": "signsgd", "lr": 1e-5},
    "sgd": {"name": "sgd", "lr": 1e-3},
}


def config(d_model: int, layers: int, heads: int, opt: dict, seq_len: int, batch: int) -> TrialConfig:
    return TrialConfig(model={"d_model": d_model, "n_layers": layers, "n_heads": heads}, data={"seq_len": seq_len},
                       optimizer={"weight_decay": 0.1, **opt}, train={"steps": 1, "batch_size": batch})


def optimizer_flops(opt: object) -> float:
    """Dense FLOPs one optimiser step adds on top of elementwise work (a multiply-add = 2).

    rotated_adam / soap: G~ = Qo^T G Qi and back, 2 (2 o^2 i) + 2 (2 o i^2) per matrix with
    both sides rotated (vectors 2 (2 n^2)); soap adds its factors L, R (2 o^2 i + 2 o i^2) and,
    every `precondition_frequency` steps, per side n: L Q and diag(Q^T L Q) (4 n^3) and a QR
    (4/3 n^3), amortised. Twins (RotatedBasis): three basis changes per matrix, G and W in and
    the update out, 3 (2 o^2 i) + 3 (2 o i^2). muon: 5 Newton-Schulz steps on the m x n
    momentum (m <= n): X X^T (2 m^2 n), a B + c B^2 (2 m^3), (...) X (2 m^2 n).
    """
    total = 0.0
    if isinstance(opt, RotatedAdam):
        f = getattr(opt, "precondition_frequency", None)
        for p in (p for g in opt.param_groups for p in g["params"]):
            qo, qi = opt.bases(p)
            o, i = (p.shape[0], p.numel() // p.shape[0]) if p.ndim >= 2 else (p.numel(), 1)
            total += 4 * o * o * i * (qo is not None) + 4 * o * i * i * (qi is not None)
            if isinstance(opt, SOAP) and f:
                total += 2 * o * o * i * (qo is not None) + 2 * o * i * i * (qi is not None)
                total += sum((4 + 4 / 3) * n**3 / f for n, q in ((o, qo), (i, qi)) if q is not None)
    elif isinstance(opt, RotatedBasis):  # a twin: G and W into the basis, the update out
        for p in (p for g in opt.param_groups for p in g["params"]):
            qo, qi = opt.bases(p)
            o, i = (p.shape[0], p.numel() // p.shape[0]) if p.ndim >= 2 else (p.numel(), 1)
            total += 6 * o * o * i * (qo is not None) + 6 * o * i * i * (qi is not None)
    elif isinstance(opt, MuonAdamW):
        for p in (p for g in opt.muon.param_groups for p in g["params"]):
            m, n = sorted(p.shape)
            total += 5 * (4 * m * m * n + 2 * m**3)
    return total


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stepper:
    """One model + optimiser, stepping exactly like study/train.py's loop."""

    def __init__(self, cfg: TrialConfig, device: torch.device) -> None:
        self.model = Transformer.from_config(cfg).to(device)
        self.opt = build_optimizer(cfg, self.model)
        self.device = device

    def steps(self, x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[float, float]:
        """(ms per whole step, ms per optimiser step), averaged over n steps. On a CPU the clock
        is this process's CPU time (time.process_time, all threads): on a shared machine other
        processes' load stretches wall time but not the CPU time our work needs."""
        clock = time.perf_counter if self.device.type == "cuda" else time.process_time
        whole = opt_only = 0.0
        for _ in range(n):
            sync(self.device)
            t0 = clock()
            _, loss = self.model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            sync(self.device)
            t1 = clock()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            sync(self.device)
            t2 = clock()
            whole += t2 - t0
            opt_only += t2 - t1
        return whole * 1e3 / n, opt_only * 1e3 / n


def bench_width(d_model: int, names: list[str], args: argparse.Namespace, device: torch.device) -> list[dict]:
    heads = 12 if d_model == 768 else 4
    cfgs = {n: config(d_model, args.layers, heads, OPTIMIZERS[n], args.seq_len, args.batch) for n in names}
    steppers = {n: Stepper(c, device) for n, c in cfgs.items()}
    g = torch.Generator().manual_seed(0)
    xy = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=g).to(device)
    x, y = xy[:, :-1], xy[:, 1:]
    for s in steppers.values():  # warm-up; soap's first step only builds its factors, its second eighs
        s.steps(x, y, args.warmup)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for _ in range(args.repeats):
        for n, s in steppers.items():
            times[n].append(s.steps(x, y, args.steps))
    cfg = next(iter(cfgs.values()))
    model_flops = cfg.flops_per_token * cfg.tokens_per_step
    base_whole = statistics.median(t[0] for t in times["adam"])
    base_opt = statistics.median(t[1] for t in times["adam"])
    print(f"\nd_model {d_model}, {args.layers} layers, {cfg.params / 1e6:.2f}M params, batch {args.batch} x {args.seq_len}, "
          f"threads {torch.get_num_threads()}, {args.repeats} repeats x {args.steps} steps, "
          f"model fwd+bwd {model_flops / 1e9:.1f} GFLOP/step")
    # "via opt": AdamW's whole step with its optimiser step swapped for this one's. The model's
    # forward + backward is the same for every optimiser, and the optimiser step is timed more
    # steadily than the whole step, so this ratio is the less noisy estimate of the same thing.
    print(f"  {'optimiser':<13} {'whole ms':>9} {'x adamw':>8} {'via opt':>8} {'opt ms':>8} {'x adamw':>8} "
          f"{'opt GFLOP':>10} {'opt/model FLOP':>15}")
    rows = []
    for n in names:
        whole = statistics.median(t[0] for t in times[n])
        opt = statistics.median(t[1] for t in times[n])
        via = (base_whole - base_opt + opt) / base_whole
        fl = optimizer_flops(steppers[n].opt)
        print(f"  {n:<13} {whole:>9.1f} {whole / base_whole:>8.3f} {via:>8.3f} {opt:>8.2f} {opt / base_opt:>8.2f} "
              f"{fl / 1e9:>10.3f} {fl / model_flops:>15.3f}")
        rows.append({"d_model": d_model, "optimizer": n, "whole_ms": whole, "whole_ratio": whole / base_whole, "via_opt": via,
                     "opt_ms": opt, "opt_ratio": opt / base_opt, "opt_gflop": fl / 1e9, "opt_model_flop": fl / model_flops})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, nargs="+", default=[32, 64, 128, 768])
    ap.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (soap needs 2 to reach its eigenbasis)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = ["adam"] + [n for n in args.optimizers if n != "adam"]
    for d in args.d_model:
        bench_width(d, names, args, torch.device(args.device))


if __name__ == "__main__":
    main()
