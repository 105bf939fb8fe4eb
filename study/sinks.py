"""Attention sinks per layer: where a block's attention parks its mass (pure tensor functions).

A head that has nothing to add parks its attention on a token whose value it can ignore: the
first position or a delimiter (Xiao et al. 2024; Gu et al. 2025; Sun et al. 2024 tie the sink to
massive activations, Bondarenko et al. 2023 to outlier features). Measured by the probe
(study.metrics.ActivationProbe) on the eval batch, per layer l = 1..L (site `attn`, basis
`heads`), from A[b, h, i, j], the weight query i of sequence b puts on key j in head h as the
block's attention variant defines it (`Attention.pattern`; 0 for j > i):

- `first_mass`: mean over b, h, i of A[b, h, i, 0]: the mass on the first position. Reads 1 when
  every query puts all its mass there; 1/T for attention uniform over T keys. Uniform *causal*
  attention (query i uniform over its i + 1 keys, so 1/(i + 1) on position 0) reads
  H_T / T = (1/T) sum_{i=1..T} 1/i: 0.0424 at T = 128, not 1/T.
- `delimiter_mass`: mean over b, h, i of sum over keys j <= i holding a delimiter of A[b, h, i, j].
  Delimiters are the outlier-dimension study's (study.attribution.token_info): newline, space,
  tab and ASCII punctuation (DELIMITER_BYTES) for a byte-level vocabulary (256), the corpus's
  N_FREQUENT most frequent ids for any other.
- `null_mass`: mean over b, h, i of 1 - sum_j A[b, h, i, j]: the mass no key of the sequence
  gets: softmax1's zero logit or kv_bias's learned key (the explicit sink), what clipped
  softmax clips away; 0 for softmax and gated.
- `sink_heads`: the fraction of the layer's heads whose top key is a sink: query i's top key is a
  sink when the largest weight on a sink key (position 0 or a delimiter) exceeds every other
  key's weight (a tie, as in uniform attention, is not a sink); a head counts when that holds
  for more than half of its queries i >= 1 over the batch (query 0 sees only position 0).

Each mass is computed per head over its B x T queries and then averaged over heads (equal
counts, so the mean over (b, h, i)). The chance levels, what uniform causal attention would read
on the same tokens, are rows at layer -1, basis `uniform` (`uniform_reference`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from resultstore.vocabulary import SINK_METRICS, Basis, Sink, Site
from study.attribution import DELIMITER_BYTES, N_FREQUENT

__all__ = ["METRICS", "SITE", "BASIS", "UNIFORM", "MAX_CHUNK", "delimiter_ids", "head_stats", "finish", "sink_metrics",
           "uniform_reference"]

METRICS = tuple(SINK_METRICS)
"""Rows per layer (site SITE, basis BASIS), in this order."""
SITE, BASIS, UNIFORM = Site.ATTN, Basis.HEADS, Basis.UNIFORM

MAX_CHUNK = 1 << 24
"""Attention weights held at once (B' x H x T x T, float32: 64 MiB): longer batches go in chunks."""


def delimiter_ids(vocab_size: int, tokens: Tensor) -> Tensor:
    """(V,) bool: DELIMITER_BYTES for a byte-level vocabulary; for any other, as study.attribution
    does, the N_FREQUENT most frequent ids, counted here on `tokens` (the eval batch) when the
    caller has no corpus counts."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=tokens.device)
    if vocab_size == 256:
        mask[list(DELIMITER_BYTES)] = True
    else:
        counts = torch.bincount(tokens.reshape(-1), minlength=vocab_size)
        mask[counts.topk(min(N_FREQUENT, vocab_size)).indices] = True
    return mask


def head_stats(pattern: Tensor, delimiter: Tensor) -> Tensor:
    """(4, H) per head, over its B x T queries: mean mass on position 0, on delimiter keys, on no
    key, and the share of queries 1..T-1 whose top key is a sink. `pattern` (B, H, T, T) as
    `Attention.pattern` gives it; `delimiter` (B, T) bool: which keys hold a delimiter."""
    A = pattern.float()
    T = A.shape[-1]
    delim = delimiter[:, None, None, :].to(A.device)  # (B, 1, 1, T)
    sink = delim.clone()
    sink[..., 0] = True
    visible = torch.ones(T, T, dtype=torch.bool, device=A.device).tril()
    on_sink = A.masked_fill(~sink, -1.0).amax(-1)  # (B, H, T)
    elsewhere = A.masked_fill(sink | ~visible, -1.0).amax(-1)  # -1: every visible key is a sink
    per_query = torch.stack([A[..., 0], (A * delim).sum(-1), 1.0 - A.sum(-1)])  # (3, B, H, T)
    top_is_sink = (on_sink > elsewhere)[..., 1:].float()  # (B, H, T - 1)
    return torch.cat([per_query.mean((1, 3)), top_is_sink.mean((0, 2))[None]])


def finish(stats: Tensor) -> dict[str, Tensor]:
    """`head_stats` (4, H) -> the METRICS, each a 0-d tensor: masses averaged over heads, and the
    fraction of heads whose top key is a sink for more than half their queries."""
    first, delim, null, top = stats
    return {Sink.FIRST_MASS: first.mean(), Sink.DELIMITER_MASS: delim.mean(), Sink.NULL_MASS: null.mean(),
            Sink.SINK_HEADS: (top > 0.5).float().mean()}


def sink_metrics(pattern: Tensor, delimiter: Tensor) -> dict[str, Tensor]:
    """The METRICS of one layer's `pattern` (B, H, T, T), `delimiter` (B, T) bool."""
    return finish(head_stats(pattern, delimiter))


def uniform_reference(delimiter: Tensor) -> dict[str, Tensor]:
    """What uniform causal attention (1/(i+1) on each key j <= i) reads on these tokens:
    first_mass = H_T / T, delimiter_mass = mean over b, i of the delimiter share of x_b[0..i]."""
    d = delimiter.float()
    T = d.shape[-1]
    keys = torch.arange(1, T + 1, dtype=torch.float32, device=d.device)
    return {Sink.FIRST_MASS: (1.0 / keys).mean(), Sink.DELIMITER_MASS: (d.cumsum(-1) / keys).mean()}
