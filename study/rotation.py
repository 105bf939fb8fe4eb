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
  covers blocks g*k .. g*k+k-1; `groups` uses the list's position. Hence the blocks of
  `partial` with group_size = n_layers and of `groups: [[0..L-1]]` read exactly as `shared`'s.
- `independent`: ("rotation", "block", l, "attn") and ("rotation", "block", l, "mlp").
- the ends (RotationConfig.embeddings, every mode but none): `shared` uses its one R for the
  embeddings' write and the final read; every other mode gives each end a basis of its own,
  ("rotation", "embed") and ("rotation", "unembed"), unless RotationConfig.ends is `group`: then
  the embeddings write in block 0's attention basis and the unembedding reads in the last
  block's MLP basis. So with every block rotated and the ends on, no parameter lives in the
  residual basis (invariance.plan_in_basis). Only with ends `group` is partial(k = n_layers)
  the `shared` model: with their own bases the ends are two more bases the blocks do not share.

Consequence: `shared` with its ends is the unrotated model itself seen in the basis x R (z = x R
evolves exactly as `none`'s residual stream, for every norm and optimiser); only the basis the
residual stream is stored and measured in differs. `independent`, `partial` and `groups` are
different models (layers compute in unrelated bases).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from study.config import RotationConfig


__all__ = ["Plan", "generator_for", "random_orthogonal", "build_plan"]


@dataclass(frozen=True)
class Plan:
    """Every read of the residual stream (x @ R) and, through R^T, every write. None: identity."""

    blocks: tuple[tuple[Tensor | None, Tensor | None], ...]
    """Per block: (attention read R, MLP read R)."""
    embed: Tensor | None = None
    """The embeddings' basis: token + position embeddings enter the residual stream through R^T."""
    unembed: Tensor | None = None
    """The final norm and the unembedding read the residual stream through R."""

    @classmethod
    def identity(cls, n_layers: int) -> Plan:
        return cls(blocks=((None, None),) * n_layers)

    def map(self, f: Callable[[Tensor], Tensor]) -> Plan:
        """Apply f to every matrix (once per distinct tensor, so shared bases stay shared); None stays None."""
        done: dict[int, Tensor] = {}

        def g(r: Tensor | None) -> Tensor | None:
            if r is None:
                return None
            if id(r) not in done:
                done[id(r)] = f(r)
            return done[id(r)]

        return Plan(blocks=tuple((g(a), g(m)) for a, m in self.blocks), embed=g(self.embed), unembed=g(self.unembed))


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
    """The trial's Plan, float64, deterministic from `seed`.

    Blocks: none: all None. shared: one R for every read. independent: a fresh R per read.
    partial(k): blocks l // k == g share group g's R for both reads (k = 1: one R per block;
    k = n_layers: the blocks of shared). groups: each listed set of 0-based blocks shares one R
    for both reads; blocks in no list read through the identity (None). Blocks sharing a basis
    share the same tensor object.
    Ends (rotation.embeddings, any mode but none): shared's one R; otherwise one basis each,
    or with rotation.ends = group the first block's (embeddings) and the last block's (unembedding).
    """
    mode = rotation.mode

    def group(g: int) -> Tensor:
        return random_orthogonal(d_model, generator_for(seed, "rotation", "group", g))

    def own(*tags: object) -> Tensor:
        return random_orthogonal(d_model, generator_for(seed, "rotation", *tags))

    if mode == "none":
        return Plan.identity(n_layers)
    if mode == "shared":
        r = group(0)
        blocks = [(r, r) for _ in range(n_layers)]
    elif mode == "independent":
        blocks = [(own("block", l, "attn"), own("block", l, "mlp")) for l in range(n_layers)]
    elif mode == "partial":
        k = rotation.group_size
        if k is None or not 1 <= k <= n_layers:
            raise ValueError(f"rotation.group_size ({k}) must be in 1..n_layers ({n_layers})")
        rs = [group(g) for g in range((n_layers + k - 1) // k)]
        blocks = [(rs[l // k], rs[l // k]) for l in range(n_layers)]
    elif mode == "groups":
        blocks = [(None, None) for _ in range(n_layers)]
        for g, members in enumerate(rotation.groups or ()):
            r = group(g)
            for l in members:
                if not 0 <= l < n_layers:
                    raise ValueError(f"rotation.groups index {l} out of range 0..{n_layers - 1}")
                blocks[l] = (r, r)
    else:
        raise ValueError(f"unknown rotation mode {mode!r}")
    if not rotation.embeddings:
        return Plan(blocks=tuple(blocks))
    if mode == "shared":
        return Plan(blocks=tuple(blocks), embed=blocks[0][0], unembed=blocks[0][0])
    if rotation.ends == "group":  # the first block's attention basis, the last block's MLP basis
        return Plan(blocks=tuple(blocks), embed=blocks[0][0], unembed=blocks[-1][1])
    return Plan(blocks=tuple(blocks), embed=own("embed"), unembed=own("unembed"))
