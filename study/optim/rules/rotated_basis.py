"""RotatedBasis: any per-coordinate optimiser (Lion, Adafactor, ...) run in fixed random
orthogonal bases, its "rotated twin". For a matrix W (out x in) with gradient G and bases Qo
(out x out), Qi (in x in), each step:

    W~ = Qo^T W Qi ;  G~ = Qo^T G Qi     # the parameter and its gradient in the twin's basis
    W~' = the base rule's step on W~     # its state (moments, factors) lives in that basis
    W <- W + Qo (W~' - W~) Qi^T          # its update, back in the parameter basis

Vectors use one Q, scalars and parameters with no rotated side are the base's own. The base
rule runs unchanged on "shadow" tensors that hold W~ (Adafactor's factored second moment is
over the rows and columns of the rotated matrix); its weight decay W~ (1 - lr wd) is linear,
so it is W (1 - lr wd) in the parameter basis. With every Q = I this is the base step for step.

Bases are drawn as RotatedAdam draws them (`rotation.generator_for(seed, "optim", name)`,
`rotation.random_orthogonal`, the same `rotate` and `index_dims`), so a twin and rotated_adam
of one trial share their bases. The wrapper's param_groups are the ones a scheduler writes: every
key of a group but "params" (lr, weight_decay, any key another rule adds) is copied to the base's
group before each step. state_dict() holds each parameter's bases beside the base's state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from study.optim.rules.rotated_adam import BasisKey, RotatedAdam, _from_basis, _keyed, _shape2, _to_basis

__all__ = ["RotatedBasis"]

_BASES = ("basis_out", "basis_in")


@dataclass
class _Bucket:
    """Rotated parameters of equal shape, dtype, device and rotated sides: their shadows are
    views of one stacked tensor, their bases stacked too."""

    params: list[Tensor]  # the model's parameters
    shape2: tuple[int, ...]  # per-parameter shape the rotations see: (n,) or (out, in)
    shadow: Tensor  # (K, *shape2): W~, the tensors the base optimiser steps are views of it
    views: list[Tensor]  # shadow[k] in params[k]'s shape: the base's parameters
    basis_out: Tensor | None  # (K, out, out), or (K, n, n) for vectors
    basis_in: Tensor | None  # (K, in, in)


class RotatedBasis(torch.optim.Optimizer):
    """A freshly built per-coordinate optimiser `base`, run in fixed orthogonal bases (see the
    module docstring). Its param_groups (and their keys) become this optimiser's.

    Args:
        base: the optimiser over the model's parameters, not yet stepped. Its rotated
            parameters' slots are taken over by shadows; its state lives in the rotated basis.
        rotate, d_model, seed, bases, index_dims: as RotatedAdam.

    State per parameter: "basis_out", "basis_in" (Tensor or None), and in state_dict() the
    base's state of that parameter (in the rotated basis) beside them.
    """

    def __init__(
        self,
        base: torch.optim.Optimizer,
        *,
        rotate: Literal["all", "residual"] = "residual",
        d_model: int | None = None,
        seed: int = 0,
        bases: Mapping[BasisKey, Any] | None = None,
        index_dims: Mapping[BasisKey, Sequence[int]] | None = None,
    ) -> None:
        if rotate not in ("all", "residual"):
            raise ValueError(f"rotate must be 'all' or 'residual', got {rotate!r}")
        if base.state:
            raise ValueError(f"RotatedBasis wraps a freshly built {type(base).__name__}, not one that holds state")
        self.base, self.rotate, self.d_model, self.seed = base, rotate, d_model, seed
        self._bases = _keyed(bases)
        self._index_dims = {k: tuple(v) for k, v in _keyed(index_dims).items()}
        self._buckets: list[_Bucket] = []
        super().__init__([{**g, "params": list(g["params"])} for g in base.param_groups], dict(base.defaults))
        self._ready = True
        self._init_state()
        self._build_buckets()

    # -- state ------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if getattr(self, "_ready", False):
            self.base.add_param_group({**self.param_groups[-1], "params": list(self.param_groups[-1]["params"])})
            self._init_state()
            self._build_buckets()

    def bases(self, p: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """(basis_out, basis_in) of parameter `p`; None means identity (not rotated)."""
        s = self.state[p]
        return s["basis_out"], s["basis_in"]

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: each parameter's bases and the base's state of it (rotated basis)."""
        out = super().state_dict()
        for i, s in self.base.state_dict()["state"].items():
            if clash := set(s) & set(_BASES):
                raise RuntimeError(f"{type(self.base).__name__} keeps state named {sorted(clash)}, as the bases are")
            out["state"].setdefault(i, {}).update(s)
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the bases (the loaded ones win over this optimiser's own) and the base's state,
        so the next step continues the saved run exactly."""
        ours = {i: {k: s[k] for k in _BASES if k in s} for i, s in state_dict["state"].items()}
        theirs = {i: {k: v.clone() if isinstance(v, Tensor) else v for k, v in s.items() if k not in _BASES}
                  for i, s in state_dict["state"].items()}  # cloned: torch would alias the saved tensors
        super().load_state_dict({**state_dict, "state": ours})
        self._build_buckets()
        self.base.load_state_dict({"state": {i: s for i, s in theirs.items() if s},
                                   "param_groups": state_dict["param_groups"]})

    def _named(self) -> Iterable[tuple[int, str, Tensor]]:
        i = 0
        for group in self.param_groups:
            names = group.get("param_names")
            for j, p in enumerate(group["params"]):
                yield i, (names[j] if names else f"param{i}"), p
                i += 1

    def _init_state(self) -> None:
        for index, name, p in self._named():
            if "basis_out" not in self.state[p]:
                if p.is_sparse:
                    raise ValueError(f"RotatedBasis does not support sparse parameters ({name})")
                self.state[p] = dict(zip(_BASES, self._make_bases(p, index, name)))

    _make_bases = RotatedAdam._make_bases  # exactly rotated_adam's bases (tests/test_twins.py checks it)

    def _build_buckets(self) -> None:
        """Stack the bases of equal-shaped rotated parameters, give each a shadow (a view of its
        bucket's stacked W~) and put the shadow in the parameter's slot of the base's groups; a
        parameter with no rotated side keeps its own slot. The base's state moves with the slot."""
        keyed: dict[tuple[Any, ...], list[Tensor]] = {}
        for _, _, p in self._named():
            qo, qi = self.bases(p)
            if qo is not None or qi is not None:
                keyed.setdefault((str(p.device), _shape2(p), p.dtype, qo is None, qi is None), []).append(p)
        self._buckets, slot = [], {}
        for (_, shape2, _, no_out, no_in), ps in keyed.items():
            st = [self.state[p] for p in ps]
            shadow = torch.zeros((len(ps), *shape2), dtype=ps[0].dtype, device=ps[0].device)
            views = [shadow[k].view(p.shape) for k, p in enumerate(ps)]
            slot.update({id(p): v for p, v in zip(ps, views)})
            self._buckets.append(_Bucket(
                params=ps, shape2=shape2, shadow=shadow, views=views,
                basis_out=None if no_out else torch.stack([s["basis_out"] for s in st]),
                basis_in=None if no_in else torch.stack([s["basis_in"] for s in st]),
            ))
            for k, (p, s) in enumerate(zip(ps, st)):  # state entries become views of the stacks
                s["basis_out"] = None if no_out else self._buckets[-1].basis_out[k]
                s["basis_in"] = None if no_in else self._buckets[-1].basis_in[k]
        for ours, theirs in zip(self.param_groups, self.base.param_groups):
            for j, p in enumerate(ours["params"]):
                old, new = theirs["params"][j], slot.get(id(p), p)
                if old is not new and old in self.base.state:
                    self.base.state[new] = self.base.state.pop(old)
                theirs["params"][j] = new

    # -- step -------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One step of the base rule in the rotated bases, for every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for ours, theirs in zip(self.param_groups, self.base.param_groups):
            theirs.update({k: v for k, v in ours.items() if k not in ("params", "param_names")})
        before = []
        for b in self._buckets:  # into the basis: W~ (the shadows) and G~ (their gradients)
            grads = [p.grad for p in b.params]
            if all(g is None for g in grads):
                before.append(None)
                continue
            if any(g is not None and g.is_sparse for g in grads):
                raise RuntimeError("RotatedBasis does not support sparse gradients")
            w = _to_basis(torch.stack([p.reshape(b.shape2) for p in b.params]), b.basis_out, b.basis_in)
            g = _to_basis(torch.stack([torch.zeros(b.shape2, dtype=p.dtype, device=p.device) if g is None else
                                       g.reshape(b.shape2) for p, g in zip(b.params, grads)]), b.basis_out, b.basis_in)
            b.shadow.copy_(w)
            for k, (view, grad) in enumerate(zip(b.views, grads)):
                view.grad = None if grad is None else g[k].view(view.shape)
            before.append(w)
        self.base.step()
        params, updates = [], []
        for b, w in zip(self._buckets, before):  # and back: W += Qo (W~' - W~) Qi^T
            if w is None:
                continue
            u = _from_basis(b.shadow - w, b.basis_out, b.basis_in)
            for k, (p, view) in enumerate(zip(b.params, b.views)):
                if view.grad is not None:
                    params.append(p)
                    updates.append(u[k].view(p.shape))
                view.grad = None
        if params:
            torch._foreach_add_(params, updates)
        return loss
