"""The paper's floating-point test: rotate a trained model's residual basis, measure the loss change.

Algebra (row vectors; torch Linear computes y = u W^T with W stored (out, in); Q is d x d with
Q Q^T = I). We want a model whose residual stream is x' = x Q at every layer while every layer
computes the same thing. Take one sub-layer with read matrix M_r (= R, or I for Identity), write
matrix M_w (= R^T, or I), norm N, reading maps W_in (qkv or fc), writing map W_out (attn/mlp proj),
inner function h:

    original:   u = x M_r,  n = N(u),  y = h(n W_in^T) W_out^T,  x <- x + y M_w

Rotated weights: M_r' = Q^T M_r Q, M_w' = Q^T M_w Q, W_in' = W_in Q, W_out' = Q^T W_out, and an
Identity read/write stays Identity (the formula with M = I gives Q^T Q = I, so it is consistent):

    u' = x' M_r' = x Q Q^T M_r Q = u Q                   (the norm sees its input rotated)
    n' = N(u Q)  = N(u) Q = n Q        iff N commutes with Q (rmsnorm_scalar: exactly; a
                                        per-coordinate gain/bias or mean-subtraction: no)
    n' W_in'^T   = n Q Q^T W_in^T = n W_in^T             (the layer computes the same thing)
    y'  = h(...) (Q^T W_out)^T = h(...) W_out^T Q = y Q
    y' M_w' = y Q Q^T M_w Q = (y M_w) Q                  (the write lands rotated)

so x' <- x' + (y M_w) Q = (x + y M_w) Q keeps x' = x Q. Ends, the same rule: the embeddings
are a write (W_E -> W_E Q, P -> P Q, write_emb M_w -> Q^T M_w Q: (e Q)(Q^T M_w Q) = (e M_w) Q, so
x' = x Q at layer 0), the final norm + unembedding a read (read_out M_r -> Q^T M_r Q: it sees
u Q, N(u Q) = N(u) Q, and W_U -> W_U Q gives N(u) Q Q^T W_U^T = the original logits).

Attention variants (study.attention) add maps of two kinds: a gate that reads the normalised
input (gated: W_g -> W_g Q, like qkv) and a key/value bias in the heads' coordinates (kv_bias:
untouched, as it never meets the residual basis); softmax1 and clipped add no parameter.

Norm gains and biases are left untouched, so layernorm (mean subtraction, per-coordinate gain
and bias) and rmsnorm (per-coordinate gain) are not invariant unless the gains happen to be
uniform, while rmsnorm_scalar is invariant in exact arithmetic: its float64 loss change
measures rounding only.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch import Tensor

from study.model import Rotate, Transformer
from study.rotation import Plan, generator_for, random_orthogonal

__all__ = ["DTYPES", "rotate_residual_basis", "plan_in_basis", "loss_change_by_dtype"]

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _unwrap(model: nn.Module) -> Transformer:
    return getattr(model, "_orig_mod", model)  # a torch.compile'd model wraps the original


@torch.no_grad()
def rotate_residual_basis(model: Transformer, Q: Tensor) -> Transformer:
    """A deep copy of `model` whose residual stream is x Q (see the module docstring).

    The products are formed in float64 and cast back to each tensor's own dtype; `model` is
    left unchanged.
    """
    rotated = copy.deepcopy(_unwrap(model))
    for p in rotated.parameters():
        p.grad = None  # gradients of the old basis would be stale
    d = rotated.tok_emb.weight.shape[1]
    if Q.shape != (d, d):
        raise ValueError(f"Q must be ({d}, {d}), got {tuple(Q.shape)}")
    q = Q.detach().to(device=rotated.tok_emb.weight.device, dtype=torch.float64)

    def right(t: Tensor) -> None:  # t <- t Q: anything that reads, or is, the residual vector
        t.copy_(t.double() @ q)

    def left(t: Tensor) -> None:  # t <- Q^T t: anything whose output becomes a residual vector
        t.copy_(q.T @ t.double())

    for rot in rotated.modules():
        if isinstance(rot, Rotate):  # every read and write, the ends' included; Identity stays Identity
            rot.matrix.copy_(q.T @ rot.matrix.double() @ q)
    right(rotated.tok_emb.weight)
    right(rotated.pos_emb.weight)
    for block in rotated.blocks:
        for read in block.attn.reads:  # qkv, and gated attention's gate: both read the normalised input
            right(getattr(block.attn, read).weight)
        left(block.attn.proj.weight)
        right(block.mlp.fc.weight)
        left(block.mlp.proj.weight)
    right(rotated.unembed.weight)
    return rotated


def plan_in_basis(plan: Plan, Q: Tensor) -> Plan:
    """The plan that reads a residual stream x Q exactly as `plan` reads x: every R -> Q^T R
    (so x Q Q^T R = x R; each write R^T -> R^T Q lands rotated). None stays None.

    With every read and write rotated (embeddings included), a model built from this plan and
    the same parameters computes the same function with residual stream x Q: no parameter
    lives in the residual basis, so training (Adam included) is the same step for step. Where
    the plan has an identity (embeddings false, or a block outside every `groups` list), the
    parameters next to it see the residual basis itself and the property fails.
    """
    q = Q.detach().to(torch.float64)
    return plan.map(lambda r: q.T @ r.to(torch.float64))


@torch.no_grad()
def loss_change_by_dtype(
    model: Transformer, x: Tensor, y: Tensor, seed: int, dtypes: tuple[str, ...] = ("float64", "float32", "bfloat16")
) -> list[dict]:
    """Check rows {"check": "rotate_residual_basis", "dtype", "value": rotated - original loss}.

    Q is Haar-random from generator_for(seed, "invariance"); the rotation is done in float64,
    then both the original and the rotated model are cast to each dtype and evaluated on (x, y).
    `model` is left unchanged.
    """
    base = copy.deepcopy(_unwrap(model)).double()
    device = base.tok_emb.weight.device
    x, y = x.to(device), y.to(device)
    q = random_orthogonal(base.tok_emb.weight.shape[1], generator_for(seed, "invariance"))
    rotated = rotate_residual_basis(base, q)
    rows = []
    for name in dtypes:
        dtype = DTYPES[name]
        cast = [m if dtype == torch.float64 else copy.deepcopy(m).to(dtype) for m in (base, rotated)]
        losses = [float(m.eval()(x, y)[1]) for m in cast]
        rows.append({"check": "rotate_residual_basis", "dtype": name, "value": losses[1] - losses[0]})
    return rows
