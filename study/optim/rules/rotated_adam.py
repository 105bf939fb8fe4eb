"""RotatedAdam: Adam(W) whose first and second moments live in a fixed random orthogonal
basis. For a matrix W (out x in) with gradient G and bases Qo (out x out), Qi (in x in):

    G~ = Qo^T G Qi                      # gradient in the optimiser's basis
    m = b1 m + (1 - b1) G~ ;  v = b2 v + (1 - b2) G~^2
    U~ = m^ / (sqrt(v^) + eps)          # m^, v^ bias-corrected, as torch Adam
    W <- W (1 - lr wd) - lr Qo U~ Qi^T  # decoupled weight decay, as torch AdamW

Vectors use one Q (u = Q U~), scalars are never rotated. With Q = I this is torch Adam(W)
step for step. `rotate="residual"` rotates only dimensions of size d_model (never a
vocabulary or position index); `rotate="all"` rotates every dimension.

Every group's "lr" is the peak lr; a scheduler elsewhere rewrites group["lr"] each step and
`RotatedAdam.step` reads it there. Bases are drawn from the trial seed and the parameter's name
(`rotation.generator_for(seed, "optim", name)`, `rotation.random_orthogonal`), so the same
trial always gets the same bases. SOAP (soap.py) reuses this machinery with adaptive bases.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from study.rotation import generator_for, random_orthogonal

__all__ = ["BasisKey", "RotatedAdam"]

_MISSING = object()

BasisKey = Tensor | int | str
"""How `bases` / `index_dims` name a parameter: the tensor itself, its index, or its name."""


@dataclass
class _Bucket:
    """Parameters of one group with equal shape, dtype, device and rotated sides. Their state
    lives in stacked tensors here; the optimizer state holds views into them."""

    group: int
    params: list[Tensor]
    shape2: tuple[int, ...]  # per-parameter shape the rotations see: (), (n,) or (out, in)
    exp_avg: Tensor  # (K, *shape2), in the rotated basis
    exp_avg_sq: Tensor  # (K, *shape2), in the rotated basis
    step: Tensor  # (K,) float32, a slice of the group's step vector on this device
    offset: int  # where `step` starts in that vector
    basis_out: Tensor | None  # (K, out, out) or (K, n, n) for vectors
    basis_in: Tensor | None  # (K, in, in)
    gg_out: Tensor | None = None  # SOAP: (K, out, out) Shampoo factor L = E[G G^T]
    gg_in: Tensor | None = None  # SOAP: (K, in, in) Shampoo factor R = E[G^T G]


def _shape2(p: Tensor) -> tuple[int, ...]:
    """The shape the rotations act on: scalars (), vectors (n,), everything else (out, in)."""
    if p.ndim <= 1:
        return tuple(p.shape)
    return (p.shape[0], p.numel() // p.shape[0])


class RotatedAdam(torch.optim.Optimizer):
    """Adam(W) with its moments in fixed orthogonal bases (see the module docstring).

    Args:
        params: tensors, (name, tensor) pairs, or param-group dicts of either. Names, when
            given, seed the bases (else "param{i}", i the index over all groups).
        lr, betas, eps, weight_decay: as torch.optim.AdamW (weight decay is decoupled).
        rotate: "all" rotates every dimension of every vector and matrix; "residual" only
            dimensions of size `d_model` that are not in `index_dims`.
        d_model: residual width; required for rotate="residual" unless every parameter has
            explicit `bases`.
        seed: seeds the random bases, with each parameter's name.
        bases: explicit bases for some parameters, keyed by tensor, index or name:
            (Qo, Qi) for matrices, (Q, None) or Q for vectors; None means identity. They
            override `rotate`.
        index_dims: dims (of the parameter) that never rotate under "residual", keyed like
            `bases`; `build_optimizer` passes `index_dims(model, vocab)` (embeddings, unembed).

    State per parameter (views into per-shape stacked buffers): "step" (0-dim float32),
    "exp_avg", "exp_avg_sq" (the parameter's shape, in the rotated basis), "basis_out",
    "basis_in" (Tensor or None; for vectors basis_out is the one Q). All state, bases included,
    is allocated at construction, so state_dict() always has it and load_state_dict() restores it.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        rotate: Literal["all", "residual"] = "residual",
        d_model: int | None = None,
        seed: int = 0,
        bases: Mapping[BasisKey, Any] | None = None,
        index_dims: Mapping[BasisKey, Sequence[int]] | None = None,
    ) -> None:
        if not isinstance(lr, Tensor) and not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if rotate not in ("all", "residual"):
            raise ValueError(f"rotate must be 'all' or 'residual', got {rotate!r}")
        self.rotate = rotate
        self.d_model = d_model
        self.seed = seed
        self._bases = _keyed(bases)
        self._index_dims = {k: tuple(v) for k, v in _keyed(index_dims).items()}
        self._buckets: list[_Bucket] = []
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self._ready = True
        self._init_state()
        self._build_buckets()

    # -- state ------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if getattr(self, "_ready", False):
            self._init_state()
            self._build_buckets()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load, then re-stack the loaded moments and bases (the loaded ones win over this
        optimiser's own), so the next step continues the saved run exactly."""
        super().load_state_dict(state_dict)
        self._build_buckets()

    def bases(self, p: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """(basis_out, basis_in) of parameter `p`; None means identity (not rotated)."""
        s = self.state[p]
        return s["basis_out"], s["basis_in"]

    def _named(self) -> Iterable[tuple[int, int, str, Tensor]]:
        i = 0
        for gi, group in enumerate(self.param_groups):
            names = group.get("param_names")
            for j, p in enumerate(group["params"]):
                yield gi, i, (names[j] if names else f"param{i}"), p
                i += 1

    @staticmethod
    def _lookup(table: dict[Any, Any], p: Tensor, index: int, name: str, default: Any = None) -> Any:
        for key in (("tensor", id(p)), ("index", index), ("name", name)):
            if key in table:
                return table[key]
        return default

    def _init_state(self) -> None:
        for _, index, name, p in self._named():
            if "exp_avg" in self.state[p]:
                continue
            if p.is_sparse:
                raise ValueError(f"RotatedAdam does not support sparse parameters ({name})")
            qo, qi = self._make_bases(p, index, name)
            self.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.contiguous_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.contiguous_format),
                "basis_out": qo,
                "basis_in": qi,
            }

    def _make_bases(self, p: Tensor, index: int, name: str) -> tuple[Tensor | None, Tensor | None]:
        """This parameter's (Qo, Qi). Reads only self's _bases, _index_dims, rotate, d_model and seed,
        so the rotated twins' RotatedBasis draws its bases with this very function."""
        shape2 = _shape2(p)
        explicit = RotatedAdam._lookup(self._bases, p, index, name, default=_MISSING)
        if explicit is not _MISSING:
            return RotatedAdam._check_explicit(explicit, shape2, p, name)
        if not shape2:
            return None, None
        skip = RotatedAdam._lookup(self._index_dims, p, index, name) or ()
        if self.rotate == "all":
            rot = [True] * len(shape2)
        else:
            if self.d_model is None:
                raise ValueError(f"{type(self).__name__}(rotate='residual') needs d_model (no explicit bases for {name})")
            rot = [n == self.d_model and d not in skip for d, n in enumerate(shape2)]
        if not any(rot):
            return None, None
        gen = generator_for(self.seed, "optim", name)  # Qo then Qi, Haar, float64 then cast
        qs = [random_orthogonal(n, gen).to(device=p.device, dtype=p.dtype) if r else None for n, r in zip(shape2, rot)]
        return (qs[0], qs[1] if len(qs) > 1 else None)

    @staticmethod
    def _check_explicit(b: Any, shape2: tuple[int, ...], p: Tensor, name: str) -> tuple[Tensor | None, Tensor | None]:
        if b is None:
            return None, None
        qo, qi = (b, None) if isinstance(b, Tensor) else tuple(b)
        sides = list(shape2) + [None] * (2 - len(shape2))
        out: list[Tensor | None] = []
        for side, q, n in zip(("out", "in"), (qo, qi), sides):
            if q is None:
                out.append(None)
                continue
            if n is None or tuple(q.shape) != (n, n):
                raise ValueError(f"bases[{name}]: {side} basis of shape {tuple(q.shape)} does not fit a parameter of shape {tuple(p.shape)}")
            q64 = q.detach().to(torch.float64)
            err = float((q64.mT @ q64 - torch.eye(n, dtype=torch.float64, device=q.device)).abs().max())
            if err > 100 * n * torch.finfo(q.dtype).eps:
                raise ValueError(f"bases[{name}]: {side} basis is not orthogonal (max |Q^T Q - I| = {err:.2e})")
            out.append(q.detach().to(device=p.device, dtype=p.dtype).clone())
        return out[0], out[1]

    def _build_buckets(self) -> None:
        """Stack the state of equal-shaped parameters per group; state entries become views.

        A group's per-parameter step counters on one device are one vector, so the usual step
        (every parameter has a gradient) computes its bias corrections once per group.
        """
        keyed: dict[tuple[Any, ...], list[Tensor]] = {}
        for gi, _, _, p in self._named():
            s = self.state[p]
            key = (gi, str(p.device), _shape2(p), p.dtype, s["basis_out"] is None, s["basis_in"] is None)
            keyed.setdefault(key, []).append(p)
        self._buckets, self._steps = [], {}
        for (gi, _, shape2, dtype, no_out, no_in), ps in sorted(keyed.items(), key=lambda kv: kv[0][:2]):
            st = [self.state[p] for p in ps]
            device = ps[0].device

            def stack(key: str, shape: tuple[int, ...], dt: torch.dtype = dtype) -> Tensor:
                return torch.stack([s[key].to(device=device, dtype=dt).reshape(shape) for s in st])

            prev = self._steps.get((gi, device))
            offset = 0 if prev is None else prev.numel()
            steps = stack("step", (), torch.float32)
            self._steps[(gi, device)] = steps if prev is None else torch.cat([prev, steps])
            self._buckets.append(_Bucket(
                group=gi, params=ps, shape2=shape2,
                exp_avg=stack("exp_avg", shape2), exp_avg_sq=stack("exp_avg_sq", shape2),
                step=steps, offset=offset,
                basis_out=None if no_out else stack("basis_out", (shape2[0], shape2[0])),
                basis_in=None if no_in else stack("basis_in", (shape2[1], shape2[1])),
            ))
        for b in self._buckets:  # now that the step vectors are final: views everywhere
            k = len(b.params)
            b.step = self._steps[(b.group, b.params[0].device)][b.offset : b.offset + k]
            for i, p in enumerate(b.params):
                s = self.state[p]
                s["exp_avg"] = b.exp_avg[i].view(p.shape)
                s["exp_avg_sq"] = b.exp_avg_sq[i].view(p.shape)
                s["step"] = b.step[i]
                s["basis_out"] = None if b.basis_out is None else b.basis_out[i]
                s["basis_in"] = None if b.basis_in is None else b.basis_in[i]

    # -- step -------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter that has a gradient. No host syncs."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params: list[Tensor] = []
        updates: list[Tensor] = []
        for gi, group in enumerate(self.param_groups):
            # Decoupled weight decay first, on the pre-update weights (as torch AdamW).
            lr, wd = group["lr"], group["weight_decay"]
            if wd != 0:
                decayed = [p for p in group["params"] if p.grad is not None]
                if decayed:
                    torch._foreach_mul_(decayed, 1 - lr * wd)
            parts: list[tuple[_Bucket, slice, list[Tensor]]] = []
            whole = True  # every parameter of the group has a gradient
            for b in self._buckets:
                if b.group != gi:
                    continue
                grads = [p.grad for p in b.params]
                if all(g is not None for g in grads):  # the usual case: one batched update
                    parts.append((b, slice(None), grads))
                else:  # some parameters got no gradient: step the others one by one
                    whole = False
                    parts += [(b, slice(k, k + 1), [g]) for k, g in enumerate(grads) if g is not None]
            if parts:
                params += [p for b, sl, _ in parts for p in b.params[sl]]
                updates += self._update(gi, group, parts, whole)
        if params:
            torch._foreach_add_(params, updates)
        return loss

    def _update(self, gi: int, group: dict[str, Any], parts: list[tuple[_Bucket, slice, list[Tensor]]], whole: bool) -> list[Tensor]:
        """Advance m, v, step of each (bucket, slice, grads) part; return -lr Qo U~ Qi^T per parameter."""
        (b1, b2), eps, lr = group["betas"], group["eps"], group["lr"]
        if any(g.is_sparse for _, _, gs in parts for g in gs):
            raise RuntimeError("RotatedAdam does not support sparse gradients")
        # Bias corrections, per parameter, on device: -lr / bc1 and sqrt(bc2). Computed in float64
        # for float64 parameters, else float32; once per group (and device) when all step.
        scales: list[tuple[Tensor, Tensor]] = []
        if whole:
            full = {}
            for (g, device), steps in self._steps.items():
                if g == gi:
                    steps.add_(1)
                    wide = any(b.exp_avg.dtype == torch.float64 for b, _, _ in parts if b.params[0].device == device)
                    full[device] = _bias_corrections(steps, b1, b2, lr, torch.float64 if wide else torch.float32)
            for b, _, _ in parts:
                nss, bc2 = full[b.params[0].device]
                scales.append((nss[b.offset : b.offset + len(b.params)], bc2[b.offset : b.offset + len(b.params)]))
        else:
            for b, sl, _ in parts:
                steps = b.step[sl]
                steps.add_(1)
                scales.append(_bias_corrections(steps, b1, b2, lr, torch.promote_types(b.exp_avg.dtype, torch.float32)))
        # Into the optimiser's basis: G~ = Qo^T G Qi, one bmm per bucket and side.
        g_t, ms, vs, nss, bc2 = [], [], [], [], []
        for (b, sl, grads), (ns, bc) in zip(parts, scales):
            k = len(grads)
            bshape = (k,) + (1,) * len(b.shape2)
            g = torch.stack([g.reshape(b.shape2) for g in grads])
            self._precondition(b, sl, g)
            g_t.append(_to_basis(g, _side(b.basis_out, sl), _side(b.basis_in, sl)))
            ms.append(b.exp_avg[sl])
            vs.append(b.exp_avg_sq[sl])
            nss.append(ns.to(b.exp_avg.dtype).view(bshape))
            bc2.append(bc.to(b.exp_avg.dtype).view(bshape))
        # Adam on the stacked moments, every bucket of the group in each foreach call.
        torch._foreach_lerp_(ms, g_t, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, g_t, g_t, value=1 - b2)
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, bc2)
        torch._foreach_add_(denom, eps)
        u_t = torch._foreach_div(ms, denom)
        torch._foreach_mul_(u_t, nss)  # -lr U~
        # Back to the parameter basis: -lr Qo U~ Qi^T, split into per-parameter views.
        out: list[Tensor] = []
        for (b, sl, _), u in zip(parts, u_t):
            u = _from_basis(u, _side(b.basis_out, sl), _side(b.basis_in, sl))
            out += [u_k.view(p.shape) for u_k, p in zip(u.unbind(0), b.params[sl])]
        return out

    def _precondition(self, b: _Bucket, sl: slice, g: Tensor) -> None:
        """Hook before the basis change (SOAP updates its factors and bases here); bases are fixed."""


def _side(basis: Tensor | None, sl: slice) -> Tensor | None:
    return None if basis is None else basis[sl]


def _bias_corrections(steps: Tensor, b1: float, b2: float, lr: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(-lr / (1 - b1^t), sqrt(1 - b2^t)) for a vector of step counts t, in `dtype`, on device."""
    t = steps.to(dtype)
    return (1 - b1**t).reciprocal_().mul_(-lr), (1 - b2**t).sqrt_()


def _to_basis(g: Tensor, qo: Tensor | None, qi: Tensor | None) -> Tensor:
    """Qo^T G Qi for stacked matrices (K, o, i); Q^T g for stacked vectors (K, n)."""
    if g.ndim == 2:  # vectors: (Q^T g)^T = g^T Q
        return g if qo is None else torch.bmm(g.unsqueeze(1), qo).squeeze(1)
    if qo is not None:
        g = torch.bmm(qo.mT, g)
    if qi is not None:
        g = torch.bmm(g, qi)
    return g


def _from_basis(u: Tensor, qo: Tensor | None, qi: Tensor | None) -> Tensor:
    """Qo U Qi^T for stacked matrices (K, o, i); Q u for stacked vectors (K, n)."""
    if u.ndim == 2:  # vectors: (Q u)^T = u^T Q^T
        return u if qo is None else torch.bmm(u.unsqueeze(1), qo.mT).squeeze(1)
    if qo is not None:
        u = torch.bmm(qo, u)
    if qi is not None:
        u = torch.bmm(u, qi.mT)
    return u


def _keyed(table: Mapping[BasisKey, Any] | None) -> dict[tuple[str, Any], Any]:
    """Normalise a mapping keyed by tensor / index / name to hashable tagged keys."""
    out: dict[tuple[str, Any], Any] = {}
    for key, value in (table or {}).items():
        if isinstance(key, Tensor):
            out[("tensor", id(key))] = value
        elif isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(f"bases/index_dims keys are tensors, indices or names, not {type(key).__name__}")
        elif isinstance(key, int):
            out[("index", key)] = value
        else:
            out[("name", key)] = value
    return out
