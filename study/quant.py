"""What outliers cost: the val loss under simulated (fake) quantisation minus the float val loss.

Schemes (symmetric, round to nearest, absmax scales, dynamic: scales from the tensor at hand):
- `w8a8`: every nn.Linear's weight at 8 bits with one scale per output channel (row of the
  (out, in) weight), and its input activation at 8 bits with one scale per tensor. The
  LLM.int8() / SmoothQuant baseline that basis-aligned outliers break: one huge coordinate sets
  the tensor's scale and rounds every other coordinate to a few levels.
- `w4a4`: the same at 4 bits.

What is quantised: every nn.Linear of the model, i.e. attention qkv and proj, MLP fc and proj, and
the unembedding (its weight and its input). Not quantised: the embeddings (tables, not matmuls),
the norms, the attention scores/softmax and the Rotate buffers (fixed orthogonal maps, kept in
float: a deployment folds R into the neighbouring weights where the norm allows it, or applies
it online in higher precision as QuaRot does with Hadamards). So a rotated model's quantised
matmuls see the computation basis, which is what the comparison with the unrotated one asks.

Recorded as metrics rows: metric `quant_loss_delta`, basis `w8a8` | `w4a4`, site `model`,
layer -1 (docs/guide.md, "The study, precisely"), and beside it `quant_loss_delta_se`: the standard error of
the penalty over the eval batch's sequences (sd of the per-sequence quantised-minus-float loss /
sqrt(sequences)), the floor below which a difference of penalties is this eval batch's noise.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn as nn
from torch import Tensor

from resultstore.vocabulary import Basis, Metric, Site

__all__ = [
    "SCHEMES", "fake_quantise", "quantised", "quantised_losses", "quantised_delta_se", "quant_rows",
]

SCHEMES: dict[str, tuple[int, int]] = {Basis.W8A8: (8, 8), Basis.W4A4: (4, 4)}
"""Scheme name -> (weight bits, activation bits)."""


def fake_quantise(x: Tensor, bits: int, dim: int | None = None) -> Tensor:
    """Symmetric absmax round-to-nearest: scale = max|x| / (2^(bits-1) - 1) over the whole tensor
    (dim None) or along `dim` (one scale per slice, e.g. dim=-1 of an (out, in) weight: per
    output channel); returns round(x / scale) * scale, in x's dtype. An all-zero slice stays 0.
    Computed in float32 (or float64 for a float64 x), so a bf16 input rounds once, at the end."""
    if bits < 2:
        raise ValueError(f"bits must be >= 2, got {bits}")
    qmax = 2 ** (bits - 1) - 1
    v = x if x.dtype == torch.float64 else x.float()
    a = v.abs().amax() if dim is None else v.abs().amax(dim=dim, keepdim=True)
    scale = torch.where(a > 0, a / qmax, torch.ones_like(a))
    return (torch.round(v / scale).clamp(-qmax, qmax) * scale).to(x.dtype)


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in getattr(model, "_orig_mod", model).modules() if isinstance(m, nn.Linear)]


@contextmanager
def quantised(model: nn.Module, weight_bits: int, act_bits: int) -> Iterator[nn.Module]:
    """Inside the block, every nn.Linear computes with fake-quantised weights (per output channel)
    and fake-quantised inputs (per tensor, dynamic). On exit, hooks are removed and the float
    weights are copied back bit for bit, also after an exception."""
    linears = _linears(model)
    saved = [m.weight.detach().clone() for m in linears]
    handles = []
    try:
        with torch.no_grad():
            for m in linears:
                m.weight.copy_(fake_quantise(m.weight, weight_bits, dim=-1))
        quantise_input = lambda _m, args: (fake_quantise(args[0], act_bits), *args[1:])  # noqa: E731
        handles = [m.register_forward_pre_hook(quantise_input) for m in linears]
        yield model
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for m, w in zip(linears, saved):
                m.weight.copy_(w)


@contextmanager
def _evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """The eager model in eval mode under no_grad; its mode restored on exit, also after an exception."""
    model = getattr(model, "_orig_mod", model)
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


def quantised_losses(model: nn.Module, x: Tensor, y: Tensor, schemes: Sequence[str] = tuple(SCHEMES)) -> Tensor:
    """The loss on (x, y) under each scheme, as one device tensor (len(schemes),): one eval forward
    per scheme, no host sync. The caller chooses the autocast context; eval mode is restored."""
    losses = []
    with _evaluating(model) as model:
        for name in schemes:
            with quantised(model, *SCHEMES[name]):
                losses.append(model(x, y)[1].detach().float())
    return torch.stack(losses)


def _sequence_losses(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """(B,) mean cross-entropy of each sequence."""
    logits = model(x, y)[0].float()  # (B, T, V)
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(1)


def quantised_delta_se(model: nn.Module, x: Tensor, y: Tensor, schemes: Sequence[str] = tuple(SCHEMES)) -> Tensor:
    """(len(schemes),) standard error of each scheme's penalty over the batch's sequences:
    sd_i(q_i - f_i) / sqrt(B), q_i and f_i sequence i's quantised and float losses. One float and
    one forward per scheme, no host sync; eval mode restored. nan with one sequence."""
    ses = []
    with _evaluating(model) as model:
        float_losses = _sequence_losses(model, x, y)
        for name in schemes:
            with quantised(model, *SCHEMES[name]):
                delta = _sequence_losses(model, x, y) - float_losses
            ses.append(delta.std() / delta.numel() ** 0.5)
    return torch.stack(ses)


def quant_rows(losses: Sequence[float], float_loss: float, schemes: Sequence[str] = tuple(SCHEMES),
               standard_errors: Sequence[float] = ()) -> list[dict]:
    """Metrics rows (layer, site, basis, metric, value): quantised loss minus the float loss, and,
    when given, each penalty's standard error over the eval sequences (`quant_loss_delta_se`)."""
    rows = [{"layer": -1, "site": Site.MODEL, "basis": name, "metric": Metric.QUANT_LOSS_DELTA, "value": q - float_loss}
            for name, q in zip(schemes, losses)]
    rows += [{"layer": -1, "site": Site.MODEL, "basis": name, "metric": Metric.QUANT_LOSS_DELTA_SE, "value": se}
             for name, se in zip(schemes, standard_errors)]
    return rows
