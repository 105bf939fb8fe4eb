"""Random orthogonal bases and the rotation plan between the residual stream and each layer.

A block reads the residual stream through its read rotation R (`x @ R`) and writes back through
R^T, so each layer computes in the basis R while the residual stream keeps its own. Every R sits
next to a full linear map, so a plan changes what the optimiser sees, never what the model can
express.

Random streams: every matrix is drawn from its own generator, `generator_for(seed, *tags)`, whose
seed is a SHA-256 hash of (seed, tags). Streams are therefore reproducible across processes and
Python versions and never collide between purposes ("init", "rotation", "invariance", ...).

Tags used by `build_plan` (so that equal modes give equal matrices):
- group g of a shared basis: ("rotation", "group", g). `shared` is group 0; `partial` group g
  covers blocks g*k .. g*k+k-1; `groups` uses the list's position. Hence `partial` with
  group_size = n_layers and `groups: [[0..L-1]]` are numerically identical to `shared`.
- `independent`: ("rotation", "block", l, "attn") and ("rotation", "block", l, "mlp").
"""

from __future__ import annotations

import hashlib
import json

import torch
from torch import Tensor

from study.config import RotationConfig

Plan = list[tuple[Tensor | None, Tensor | None]]
"""Per block: (attention read R, MLP read R); None means identity."""


def generator_for(seed: int, *tags: object) -> torch.Generator:
    """A CPU generator seeded from a stable SHA-256 hash of (seed, *tags)."""
    key = json.dumps([seed, *tags], default=str, separators=(",", ":"))
    digest = hashlib.sha256(key.encode()).digest()
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return g


def random_orthogonal(d: int, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> Tensor:
    """A Haar-random d x d orthogonal matrix: QR of a Gaussian, columns sign-fixed by diag(R).

    Computed in float64 on the CPU and cast to `dtype` at the end (Mezzadri 2007: without the
    sign fix, QR's output is not Haar-distributed).
    """
    a = torch.randn(d, d, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    signs = torch.where(torch.diagonal(r) >= 0, 1.0, -1.0).to(torch.float64)
    return (q * signs).to(dtype)  # scale column j by sign(r_jj)


def build_plan(rotation: RotationConfig, n_layers: int, d_model: int, seed: int) -> Plan:
    """Per block (attention read R, MLP read R), float64, deterministic from `seed`.

    none: all None. shared: one R for every read. independent: a fresh R per read.
    partial(k): blocks l // k == g share group g's R for both reads (k = 1: one R per block;
    k = n_layers: equals shared). groups: each listed set of 0-based blocks shares one R for both
    reads; blocks in no list read through the identity (None). Blocks sharing a basis share the
    same tensor object.
    """
    mode = rotation.mode

    def group(g: int) -> Tensor:
        return random_orthogonal(d_model, generator_for(seed, "rotation", "group", g))

    if mode == "none":
        return [(None, None) for _ in range(n_layers)]
    if mode == "shared":
        r = group(0)
        return [(r, r) for _ in range(n_layers)]
    if mode == "independent":
        return [
            tuple(random_orthogonal(d_model, generator_for(seed, "rotation", "block", l, site)) for site in ("attn", "mlp"))
            for l in range(n_layers)
        ]
    if mode == "partial":
        k = rotation.group_size
        if k is None or not 1 <= k <= n_layers:
            raise ValueError(f"rotation.group_size ({k}) must be in 1..n_layers ({n_layers})")
        rs = [group(g) for g in range((n_layers + k - 1) // k)]
        return [(rs[l // k], rs[l // k]) for l in range(n_layers)]
    if mode == "groups":
        plan: Plan = [(None, None) for _ in range(n_layers)]
        for g, blocks in enumerate(rotation.groups or ()):
            r = group(g)
            for l in blocks:
                if not 0 <= l < n_layers:
                    raise ValueError(f"rotation.groups index {l} out of range 0..{n_layers - 1}")
                plan[l] = (r, r)
        return plan
    raise ValueError(f"unknown rotation mode {mode!r}")
