"""The real training loop (study.train) twice: from the seed's init, and from that init rotated in
the residual basis (study.invariance.rotate_residual_basis). A rotation-equivariant optimiser
gives the same training losses up to float32 rounding; the computation-basis kurtoses then
differ only because the twin stores its residual stream in a rotated basis.

    python tools/twin_real.py 60 sgd       # steps, sgd | adam
"""
import sys, torch
from study import train as T
from study.config import TrialConfig
from study.invariance import rotate_residual_basis
from study.model import Transformer
from study.rotation import random_orthogonal, generator_for

steps = int(sys.argv[1]); opt = sys.argv[2]
optimizer = {"sgd": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
             "adam": {"name": "adam", "lr": 3e-3}}[opt]
cfg = TrialConfig.model_validate({"model": {"d_model": 64, "n_layers": 4, "n_heads": 4}, "norm": "rmsnorm_scalar",
    "optimizer": optimizer, "data": {"seq_len": 128},
    "train": {"steps": steps, "batch_size": 32, "lr_schedule": "cosine", "warmup": 0.05, "eval_every": steps,
              "eval_batch": {"sequences": 16}, "checkpoint_every": 0, "invariance_check": False},
    "seed": 0, "runtime": {"num_threads": 1}})
q = random_orthogonal(64, generator_for(9, "twin"))
orig = Transformer.from_config.__func__
out = {}
for label in ("base", "twin"):
    def build(cls, c, dtype=torch.float32, _l=label):
        m = orig(cls, c, dtype)
        return rotate_residual_basis(m, q) if _l == "twin" else m
    Transformer.from_config = classmethod(build)
    sink = T.MemorySink()
    T.train(cfg, sink)
    out[label] = sink
    Transformer.from_config = classmethod(orig)
lb = [r["train_loss"] for r in out["base"].tables["curves"] if r["train_loss"] is not None]
lt = [r["train_loss"] for r in out["twin"].tables["curves"] if r["train_loss"] is not None]
print("max loss gap over", len(lb), "steps:", max(abs(a - b) for a, b in zip(lb, lt)))
key = lambda r: (r["step"], r["layer"], r["site"], r["basis"], r["metric"])
b = {key(r): r["value"] for r in out["base"].tables["metrics"]}
t = {key(r): r["value"] for r in out["twin"].tables["metrics"]}
for k in sorted(b):
    if k[0] == steps and k[2] in ("attn_in", "mlp_in") and k[3] == "computation" and k[4] == "kurtosis":
        print(k, round(b[k], 5), round(t[k], 5))
