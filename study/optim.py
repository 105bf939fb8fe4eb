"""Optimisers: `build_optimizer(cfg, model)` is the one place optimiser names map to classes.

- `adam`: torch AdamW (decoupled weight decay; default 0).
- `sgd`: torch SGD with momentum (optionally Nesterov).
- `rotated_adam`: `RotatedAdam`, Adam(W) whose first and second moments live in a fixed random
  orthogonal basis. For a matrix W (out x in) with gradient G and bases Qo (out x out),
  Qi (in x in):

      G~ = Qo^T G Qi                      # gradient in the optimiser's basis
      m = b1 m + (1 - b1) G~ ;  v = b2 v + (1 - b2) G~^2
      U~ = m^ / (sqrt(v^) + eps)          # m^, v^ bias-corrected, as torch Adam
      W <- W (1 - lr wd) - lr Qo U~ Qi^T  # decoupled weight decay, as torch AdamW

  Vectors use one Q (u = Q U~), scalars are never rotated. With Q = I this is torch Adam(W)
  step for step. `rotate="residual"` rotates only dimensions of size d_model (never a
  vocabulary or position index); `rotate="all"` rotates every dimension.

- `soap`: `SOAP`, RotatedAdam whose bases are the eigenvectors of Shampoo's factors
  E[G G^T], E[G^T G], recomputed every `precondition_frequency` steps (adaptive basis).
- `muon`: `MuonAdamW`, torch Muon (Newton-Schulz-orthogonalised Nesterov momentum) on the
  hidden matrices; the ends (embeddings, unembedding, gains; `muon_exclude` says which
  matrices) by `muon_ends`: torch AdamW (default), torch SGD (momentum: then the whole update
  is rotation-equivariant, a pure Muon) or RotatedAdam (rotate "residual").
- `adafactor`: torch Adafactor (factored second moments, relative step size).
- `lion`: `Lion`, sign of an interpolated momentum; `signsgd`: `Lion` with b1 = b2 = momentum.

Weight decay, for every optimiser, applies only to parameters with ndim >= 2 (nanoGPT's two
groups). Every group's "lr" is the peak lr; a scheduler elsewhere rewrites group["lr"] each
step and `RotatedAdam.step` reads it there. Bases are drawn from the trial seed and the
parameter's name (`rotation.generator_for(seed, "optim", name)`, `rotation.random_orthogonal`),
so the same trial always gets the same bases.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from study.config import TrialConfig
from study.rotation import generator_for, random_orthogonal

__all__ = [
    "Lion",
    "MuonAdamW",
    "RotatedAdam",
    "SOAP",
    "build_optimizer",
    "decay_groups",
    "index_dims",
]

_MISSING = object()

BasisKey = Tensor | int | str
"""How `bases` / `index_dims` name a parameter: the tensor itself, its index, or its name."""


# ---- param groups and the name -> class map -------------------------------------------------


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two named param groups: ndim >= 2 with `weight_decay`, the rest (gains, biases, scalars)
    with 0. Empty groups are dropped. Frozen parameters are left out."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [(n, p) for n, p in named if p.ndim >= 2]
    no_decay = [(n, p) for n, p in named if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


_HEAD_NAMES = ("lm_head", "head", "unembed", "unembedding", "w_u", "wu")
_EMBED_NAMES = ("wte", "wpe", "tok_emb", "pos_emb", "embed", "embedding", "w_e", "w_pos")


def index_dims(model: nn.Module, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
    """Parameter dims that index tokens or positions, not residual coordinates: they never
    rotate under rotate="residual", even when their size happens to equal d_model (byte-level
    vocab 256 = d_model 256, or seq_len = d_model).

    Found by module type and name: an nn.Embedding's weight, dim 0; an nn.Linear named like an
    unembedding (lm_head, head, unembed, ...) with out_features == vocab_size (any, if None),
    dim 0 of weight and bias; a bare 2-D parameter named like an embedding or unembedding,
    dim 0 (nanoGPT's (V, d) layout). Shapes alone cannot tell a (V, d) unembedding from a
    (d, d) projection when V == d, hence the names.
    """
    dims: dict[str, tuple[int, ...]] = {}
    for mname, module in model.named_modules():
        leaf = mname.rsplit(".", 1)[-1].lower()
        if isinstance(module, nn.Embedding):
            dims[_join(mname, "weight")] = (0,)
        elif isinstance(module, nn.Linear) and leaf in _HEAD_NAMES:
            if vocab_size is None or module.out_features == vocab_size:
                dims[_join(mname, "weight")] = (0,)
                if module.bias is not None:
                    dims[_join(mname, "bias")] = (0,)
    for pname, p in model.named_parameters():
        leaf = pname.rsplit(".", 1)[-1].lower()
        if pname not in dims and p.ndim == 2 and (leaf in _EMBED_NAMES or leaf in _HEAD_NAMES):
            dims[pname] = (0,)
    return dims


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def build_optimizer(cfg: TrialConfig, model: nn.Module) -> torch.optim.Optimizer | MuonAdamW:
    """The optimiser named by cfg.optimizer.name, over `model`'s trainable parameters in two
    groups (weight decay on ndim >= 2 only; muon: its matrices, then AdamW's two groups).
    Group "lr" starts at the peak lr."""
    o = cfg.optimizer
    groups = decay_groups(model, o.weight_decay)
    if o.name == "adam":
        # Fused on CUDA (one kernel for every parameter); foreach on CPU keeps the reference path.
        fused = all(p.is_cuda for p in model.parameters()) or None
        return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, fused=fused)
    if o.name == "sgd":
        return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)
    if o.name == "rotated_adam":
        return RotatedAdam(
            groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
            rotate=o.rotate, d_model=cfg.model.d_model, seed=cfg.seed,
            index_dims=index_dims(model, cfg.vocab_size),
        )
    if o.name == "soap":
        return SOAP(groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, shampoo_beta=o.shampoo_beta,
                    precondition_frequency=o.precondition_frequency, max_precond_dim=o.max_precond_dim,
                    precondition_vectors=o.soap_vectors == "shampoo", seed=cfg.seed)
    if o.name == "muon":
        ends = {
            "adamw": None,
            "sgd": lambda gs: torch.optim.SGD(gs, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay),
            "rotated_adam": lambda gs: RotatedAdam(gs, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                                   rotate="residual", d_model=cfg.model.d_model, seed=cfg.seed,
                                                   index_dims=index_dims(model, cfg.vocab_size)),
        }[o.muon_ends]
        return muon_adamw(model, lr=o.lr, lr_ratio=o.muon_lr_ratio, momentum=o.muon_momentum, adjust_lr=o.muon_adjust_lr,
                          betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, exclude=o.muon_exclude,
                          ends=ends, ends_lr_ratio=o.muon_ends_lr_ratio)
    if o.name == "adafactor":
        return torch.optim.Adafactor(groups, lr=o.lr, weight_decay=o.weight_decay)
    if o.name == "lion":
        return Lion(groups, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
    if o.name == "signsgd":
        return Lion(groups, lr=o.lr, betas=(o.momentum, o.momentum), weight_decay=o.weight_decay)
    raise ValueError(f"optimizer.name: unknown optimiser {o.name!r}")


# ---- RotatedAdam ----------------------------------------------------------------------------


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
        shape2 = _shape2(p)
        explicit = self._lookup(self._bases, p, index, name, default=_MISSING)
        if explicit is not _MISSING:
            return self._check_explicit(explicit, shape2, p, name)
        if not shape2:
            return None, None
        skip = self._lookup(self._index_dims, p, index, name) or ()
        if self.rotate == "all":
            rot = [True] * len(shape2)
        else:
            if self.d_model is None:
                raise ValueError(f"RotatedAdam(rotate='residual') needs d_model (no explicit bases for {name})")
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


# ---- SOAP -----------------------------------------------------------------------------------


class SOAP(RotatedAdam):
    """Adam in the eigenbasis of Shampoo's preconditioner (Vyas et al. 2024, "SOAP").

    For a matrix W (out x in) with gradient G, every step updates Shampoo's factors

        L <- s L + (1 - s) G G^T ;  R <- s R + (1 - s) G^T G          # s = shampoo_beta

    The first step only does that (as the reference: a gradient never projects itself); then
    Qo, Qi = eigenvectors of L, R (eigh, descending), and after every `precondition_frequency`
    Adam steps they are refined as the reference does: sort the columns by diag(Q^T L Q), one
    power iteration L Q, QR. RotatedAdam's step runs in (Qo, Qi). On a refinement the first
    moment is carried into the new basis exactly; the second moment is permuted with the
    columns and otherwise kept (the paper's approximation). Scalars and sides longer than
    `max_precond_dim` are not preconditioned (plain Adam there); vectors neither, unless
    `precondition_vectors` (the reference's precondition_1d): then a vector is a 1 x n matrix
    preconditioned on its n side only, L = E[g g^T]. Its factor has rank at most the number of
    steps so far, so until then part of its eigenbasis is arbitrary: measured on a 6-vector
    over 20 steps, the run rotates with the problem to 1-3% of the distance moved, against
    ~50% with plain Adam on it (tests/test_optim.py).
    `precondition_frequency=None` freezes the bases at their start (identity, or explicit
    `bases`) and skips nothing: then this is RotatedAdam with those bases.

    Ours versus nikhilvyas/SOAP: batched per shape bucket (RotatedAdam's machinery); a basis is
    refreshed at the start of the step after the reference would refresh it (same factors).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        shampoo_beta: float = 0.95,
        precondition_frequency: int | None = 10,
        max_precond_dim: int = 4096,
        precondition_vectors: bool = False,
        seed: int = 0,
        bases: Mapping[BasisKey, Any] | None = None,
    ) -> None:
        if precondition_frequency is not None and precondition_frequency < 1:
            raise ValueError(f"precondition_frequency must be >= 1 (or None: frozen bases), got {precondition_frequency}")
        if not 0 <= shampoo_beta < 1:
            raise ValueError(f"shampoo_beta must lie in [0, 1), got {shampoo_beta}")
        self.shampoo_beta = shampoo_beta
        self.precondition_frequency = precondition_frequency
        self.max_precond_dim = max_precond_dim
        self.precondition_vectors = precondition_vectors
        self._refresh: str | None = None  # this step's basis refresh: None, "eigh" or "qr"
        super().__init__(params, lr, betas, eps, weight_decay, rotate="all", seed=seed, bases=bases)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self.precondition_frequency is not None and any(g.get("soap_step", 0) for g in getattr(self, "param_groups", [])):
            raise ValueError("SOAP.add_param_group after the first step is not supported (its first step is factor-only)")
        super().add_param_group(param_group)

    def _make_bases(self, p: Tensor, index: int, name: str) -> tuple[Tensor | None, Tensor | None]:
        explicit = self._lookup(self._bases, p, index, name, default=_MISSING)
        if explicit is not _MISSING:
            return self._check_explicit(explicit, _shape2(p), p, name)
        shape2 = _shape2(p)
        if len(shape2) == 1 and self.precondition_vectors and 2 <= shape2[0] <= self.max_precond_dim:
            return torch.eye(shape2[0], dtype=p.dtype, device=p.device), None  # one-sided, as a 1 x n matrix
        if len(shape2) < 2:
            return None, None
        eye = [torch.eye(n, dtype=p.dtype, device=p.device) if n <= self.max_precond_dim else None for n in shape2]
        return eye[0], eye[1]

    def _init_state(self) -> None:
        super()._init_state()
        for group in self.param_groups:
            group.setdefault("soap_step", 0)  # a plain int: deciding a refresh needs no host sync
            for p in group["params"]:
                s = self.state[p]
                if "gg_out" not in s:
                    s["gg_out"] = None if s["basis_out"] is None else torch.zeros_like(s["basis_out"])
                    s["gg_in"] = None if s["basis_in"] is None else torch.zeros_like(s["basis_in"])

    def _build_buckets(self) -> None:
        super()._build_buckets()
        for b in self._buckets:  # the factors stacked like the bases; state entries become views
            st = [self.state[p] for p in b.params]
            for key in ("gg_out", "gg_in"):
                if getattr(b, "basis_" + key[3:]) is not None:
                    stacked = torch.stack([s[key].to(device=b.exp_avg.device, dtype=b.exp_avg.dtype) for s in st])
                    setattr(b, key, stacked)
                    for i, s in enumerate(st):
                        s[key] = stacked[i]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update; the very first step (unless frozen) only accumulates the factors."""
        if self.precondition_frequency is None or all(g["soap_step"] > 0 for g in self.param_groups):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._refresh = None
        for gi, group in enumerate(self.param_groups):
            group["soap_step"] += 1
            for b in (b for b in self._buckets if b.group == gi):
                for k, p in enumerate(b.params):
                    if p.grad is not None:
                        self._precondition(b, slice(k, k + 1), p.grad.reshape((1,) + b.shape2))
        return loss

    def _update(self, gi: int, group: dict[str, Any], parts: list[tuple[_Bucket, slice, list[Tensor]]], whole: bool) -> list[Tensor]:
        self._refresh = None
        if self.precondition_frequency is not None:
            group["soap_step"] += 1
            adam_steps = group["soap_step"] - 2  # Adam steps taken before this one
            self._refresh = "eigh" if adam_steps == 0 else "qr" if adam_steps % self.precondition_frequency == 0 else None
        return super()._update(gi, group, parts, whole)

    def _precondition(self, b: _Bucket, sl: slice, g: Tensor) -> None:
        """Refresh the bases from the factors if due, then add G's outer products to them."""
        if self.precondition_frequency is None or g.ndim == 1 or (b.gg_out is None and b.gg_in is None):
            return
        if self._refresh is not None:
            self._refresh_bases(b, sl)
        s = self.shampoo_beta
        if g.ndim == 2:  # vectors (K, n): L = E[g g^T]
            b.gg_out[sl].baddbmm_(g.unsqueeze(2), g.unsqueeze(1), beta=s, alpha=1 - s)
            return
        if b.gg_out is not None:
            b.gg_out[sl].baddbmm_(g, g.mT, beta=s, alpha=1 - s)
        if b.gg_in is not None:
            b.gg_in[sl].baddbmm_(g.mT, g, beta=s, alpha=1 - s)

    def _refresh_bases(self, b: _Bucket, sl: slice) -> None:
        qo, qi = _side(b.basis_out, sl), _side(b.basis_in, sl)
        m = _from_basis(b.exp_avg[sl], qo, qi)  # first moment back in the parameter basis
        v = b.exp_avg_sq[sl]
        for dim, q, gg in ((1, qo, b.gg_out), (2, qi, b.gg_in)):
            if q is None:
                continue
            if self._refresh == "eigh":  # float64: float32 eigh fails on rank-deficient factors
                f = gg[sl].to(torch.float64)
                f.diagonal(dim1=-2, dim2=-1).add_(1e-30)
                q.copy_(torch.linalg.eigh(f).eigenvectors.flip(-1))  # descending eigenvalues
                continue
            # Sort the columns by estimated eigenvalue (v's coordinates follow), then one power
            # iteration and QR: each column stays close to its predecessor, so v still fits.
            est = torch.einsum("kij,kij->kj", q, torch.bmm(gg[sl], q))  # diag(Q^T L Q)
            order = est.argsort(dim=-1, descending=True)
            v.copy_(v.take_along_dim(order if v.ndim == 2 else order.unsqueeze(3 - dim), dim=dim))
            q.copy_(torch.linalg.qr(torch.bmm(gg[sl], q.take_along_dim(order.unsqueeze(1), dim=2))).Q)
        b.exp_avg[sl] = _to_basis(m, qo, qi)


# ---- sign methods ---------------------------------------------------------------------------


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023): the update is the sign of an interpolated momentum.

        u = sign(b1 m + (1 - b1) G) ;  W <- W (1 - lr wd) - lr u ;  m <- b2 m + (1 - b2) G

    With b1 = b2 = mu it is signSGD with momentum: u = sign(m_t), m_t = mu m + (1 - mu) G
    (`build_optimizer`'s "signsgd"). Every coordinate moves by exactly lr: maximally
    per-coordinate.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            (b1, b2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
            grads = [p.grad for p in ps]
            ms = []
            for p in ps:
                if "exp_avg" not in self.state[p]:
                    self.state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                ms.append(self.state[p]["exp_avg"])
            u = torch._foreach_lerp(ms, grads, 1 - b1)
            torch._foreach_sign_(u)
            if wd != 0:
                torch._foreach_mul_(ps, 1 - lr * wd)
            torch._foreach_add_(ps, u, alpha=-lr)
            torch._foreach_lerp_(ms, grads, 1 - b2)
        return loss


# ---- Muon on the hidden matrices, another optimiser (AdamW by default) on the ends --------------


class MuonAdamW:
    """torch.optim.Muon on the hidden 2-D matrices, another optimiser (`ends`: AdamW, SGD or
    RotatedAdam) on everything else, as one optimiser: `param_groups` lists Muon's groups then
    the ends' (the same dicts, so a scheduler writing group["lr"] reaches both); every group
    carries "lr_ratio", the multiple of that lr it steps with. state_dict() holds both (the
    ends' under "adamw", whatever trains them, so older checkpoints load)."""

    def __init__(self, muon: torch.optim.Optimizer, ends: torch.optim.Optimizer | None) -> None:
        self.muon, self.ends = muon, ends
        self._parts = [o for o in (muon, ends) if o is not None]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self._parts for g in o.param_groups]

    @property
    def state(self) -> dict[Tensor, Any]:
        return {p: s for o in self._parts for p, s in o.state.items()}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self._parts:
            peaks = [g["lr"] for g in part.param_groups]
            for g in part.param_groups:
                g["lr"] = g["lr"] * g.get("lr_ratio", 1.0)
            try:
                part.step()
            finally:
                for g, lr in zip(part.param_groups, peaks):
                    g["lr"] = lr
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self._parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": None if self.ends is None else self.ends.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        if self.ends is not None:
            self.ends.load_state_dict(state_dict["adamw"])


def muon_adamw(model: nn.Module, *, lr: float, lr_ratio: float = 1.0, momentum: float = 0.95,
               adjust_lr: str = "match_rms_adamw", betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
               weight_decay: float = 0.0, exclude: Sequence[str] = (),
               ends: Callable[[list[dict[str, Any]]], torch.optim.Optimizer] | None = None,
               ends_lr_ratio: float = 1.0) -> MuonAdamW:
    """Muon for every trainable 2-D parameter whose name matches no glob in `exclude`; the rest
    (decay on ndim >= 2 only, at ends_lr_ratio x lr) to `ends(groups)`, AdamW(lr, betas, eps,
    weight_decay) if None. Raises ValueError when Muon would get nothing."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matrices = [(n, p) for n, p in named if p.ndim == 2 and not any(fnmatch.fnmatchcase(n, g) for g in exclude)]
    if not matrices:
        raise ValueError(f"optimizer.muon_exclude: no 2-D parameter is left for Muon (excluded: {list(exclude)}; "
                         f"2-D parameters: {[n for n, p in named if p.ndim == 2]})")
    taken = {id(p) for _, p in matrices}
    rest = [(n, p) for n, p in named if id(p) not in taken]
    muon = torch.optim.Muon([{"params": matrices, "lr_ratio": lr_ratio}], lr=lr, weight_decay=weight_decay,
                            momentum=momentum, nesterov=True, adjust_lr_fn=adjust_lr)
    groups = [g for g in ({"params": [(n, p) for n, p in rest if p.ndim >= 2], "weight_decay": weight_decay},
                          {"params": [(n, p) for n, p in rest if p.ndim < 2], "weight_decay": 0.0}) if g["params"]]
    for g in groups:
        g["lr_ratio"] = ends_lr_ratio
    if ends is None:
        ends = lambda gs: torch.optim.AdamW(gs, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)  # noqa: E731
    return MuonAdamW(muon, ends(groups) if groups else None)
