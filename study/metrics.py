"""Basis-alignment metrics (pure tensor functions) and the ActivationProbe that applies them.

Every metric takes a tensor whose LAST dim is the basis (any leading shape: (B, T, d) and
(B*T, d) give the same value), upcasts to float32 on the tensor's own device, never syncs
with the host and returns a 0-d float32 tensor (counts included, so that a probe can stack
everything into one tensor and read it back once).

Tokens whose value is undefined (a constant vector has no kurtosis) are left out of the
token averages (nanmean); if every token is undefined the result is nan.

Each metric `f(x)` is `_f(v)` on the (N, d) tokens; `_f` also takes a stack (K, N, d) and
returns (K,) (the control's kurtosis per random basis is computed so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn as nn
from torch import Tensor

from resultstore.vocabulary import PROBE_METRICS, RANK_P, Basis, Metric, Site
from study import sinks
from study.rotation import generator_for, random_orthogonal

__all__ = [
    "METRICS", "CONTROL_BASES", "CONTROL_SPREAD", "CONTROL_MEDIAN", "RANK_TESTED", "TESTED_SITES",
    "kurtosis_null", "kurtosis", "neuron_kurtosis", "top_share", "outlier_dims", "max_abs",
    "max_median_ratio", "basis_test", "control_metrics", "dettmers_outliers", "ProbeResult",
    "ActivationProbe",
]

METRICS = PROBE_METRICS
"""Metric names measured at every (layer, site, basis)."""

TOP_K = (1, 4)
"""The k of the top-k energy shares (metrics top1_share, top4_share)."""

RANK_TESTED = tuple(RANK_P)
"""Measures whose stored-basis value is ranked among the control's bases: rows `<metric>_rank_p`."""

TESTED_SITES = (Site.RESID, Site.ATTN_IN, Site.MLP_IN)
"""Sites whose basis is tested against the control's bases (rows in basis `random`)."""

CONTROL_BASES = 32
"""Haar-random bases the probe's control (site resid, basis random) averages over."""

CONTROL_SPREAD = Metric.KURTOSIS_SD
"""The control's extra metric: the sd of the kurtosis across its bases (basis random)."""

CONTROL_MEDIAN = Metric.KURTOSIS_MEDIAN
"""The median of the kurtosis across the control's bases (basis random): below the mean when
the statistic is right-skewed, so a stored basis can sit below the null's mean by chance."""


def kurtosis_null(d: int) -> float:
    """E[kurtosis] of a token uniform on the sphere in R^d: 3(d-1)/(d+1) (centred per-token
    kurtosis, ours; the uncentred moment ratio would give 3d/(d+2)). A Haar-random rotation
    makes every token uniform on its sphere, so this is the random basis' expected kurtosis
    whatever the activations, and Gaussian coordinates' expectation at finite d."""
    return 3.0 * (d - 1) / (d + 1)


def _tokens(x: Tensor) -> Tensor:
    """(..., d) -> (N, d) float32 (a view when x is already float32 and contiguous)."""
    return x.float().reshape(-1, x.shape[-1])


# ---- per-tensor metrics ---------------------------------------------------------------------


def kurtosis(x: Tensor) -> Tensor:
    """Elhage et al.'s activation kurtosis: for each token vector v in R^d, with m = mean(v),
    k = mean((v - m)^4) / mean((v - m)^2)^2, averaged over tokens.

    Gaussian coordinates give 3(d-1)/(d+1) in expectation (`kurtosis_null`, 3 as d grows),
    Laplace about 6; always in [1, d - 2 + 1/(d-1)]; invariant to scaling
    v. Computed as mean(z^4) with z = (v - m) / std(v) so that large activations cannot
    overflow float32. Tokens whose std is below 1e-6 of their RMS (constant up to rounding)
    are undefined and left out.
    """
    return _kurtosis(_tokens(x))


def _kurtosis(v: Tensor) -> Tensor:
    c = v - v.mean(-1, keepdim=True)
    m2 = c.pow(2).mean(-1, keepdim=True)
    k = (c * torch.rsqrt(m2)).pow(4).mean(-1)
    # a (numerically) constant token has no kurtosis: std below 1e-6 of its RMS is rounding
    k = torch.where(m2.squeeze(-1) > 1e-12 * v.pow(2).mean(-1), k, torch.nan)
    return torch.nanmean(k, -1)


def neuron_kurtosis(x: Tensor) -> Tensor:
    """He et al. (2024)'s kurtosis across coordinates: s_j = RMS over tokens of coordinate j,
    mean_j(s_j^4) / mean_j(s_j^2)^2. Equal coordinate scales give 1; one coordinate carrying
    all the energy gives d."""
    return _neuron_kurtosis(_tokens(x))


def _neuron_kurtosis(v: Tensor) -> Tensor:
    s2 = v.pow(2).mean(-2)  # (..., d) = s_j^2
    r = s2 / s2.mean(-1, keepdim=True)
    return r.pow(2).mean(-1)


def top_share(x: Tensor, k: int = 1) -> Tensor:
    """The share of a token's centred energy held by its k largest coordinates: with
    c = v - mean(v), sum of the k largest c_j^2 / sum_j c_j^2, averaged over tokens.

    Width-free where kurtosis is not: a coordinate holding a fixed share f of every token's
    energy reads about f at every width d, while kurtosis (d x the token's inverse
    participation ratio) reads about d f^2 + 3(1-f)^2. Without a privileged basis it reads its
    null, which falls with d (about 0.11 / 0.064 / 0.037 for top-1 at d 64 / 128 / 256;
    `analysis.null.top_share_null`). Constant tokens are undefined and left out, as in
    `kurtosis`."""
    return _top_share(_tokens(x), k)


def _top_share(v: Tensor, k: int) -> Tensor:
    c = v - v.mean(-1, keepdim=True)
    e = c.pow(2)
    total = e.sum(-1)
    share = e.topk(min(k, e.shape[-1]), dim=-1).values.sum(-1) / total
    share = torch.where(total > 1e-12 * v.pow(2).sum(-1), share, torch.nan)
    return torch.nanmean(share, -1)


def outlier_dims(x: Tensor, threshold: float = 6.0, relative: bool = False) -> Tensor:
    """Number of coordinates j with |x_j| > threshold on at least one token; with relative,
    |x_j| > threshold x that token's RMS (scale-free; needs d > threshold^2 to be non-zero,
    since max_j |x_j| <= sqrt(d) RMS)."""
    return _outlier_dims(_tokens(x), threshold, relative)


def _outlier_dims(v: Tensor, threshold: float, relative: bool) -> Tensor:
    limit = threshold * v.pow(2).mean(-1, keepdim=True).sqrt() if relative else threshold
    return (v.abs() > limit).any(-2).sum(-1).float()


def max_abs(x: Tensor) -> Tensor:
    """Largest |x| over every token and coordinate."""
    return _max_abs(_tokens(x))


def _max_abs(v: Tensor) -> Tensor:
    return v.abs().amax((-2, -1))


def max_median_ratio(x: Tensor) -> Tensor:
    """Per token max_j |x_j| / median_j |x_j|, averaged over tokens. The median of an even
    number of values is the mean of the middle two. A token whose median is 0 (more than half
    its coordinates 0, as GELU outputs can be) has no ratio: undefined and left out, not
    infinite; nan when every token is undefined (the probe stores it as null)."""
    return _max_median_ratio(_tokens(x))


def _max_median_ratio(v: Tensor) -> Tensor:
    a = v.abs()  # (..., N, d)
    d = a.shape[-1]
    lower = a.median(-1, keepdim=True).values  # the ((d+1)//2)-th smallest
    if d % 2:
        median = lower
    else:  # upper middle = the (d/2 + 1)-th smallest, without a second selection pass:
        # it equals `lower` when `lower` occurs past rank d/2, else the least value above it
        ties = (a <= lower).sum(-1, keepdim=True) > d // 2
        above = torch.where(a > lower, a, torch.inf).amin(-1, keepdim=True)
        median = 0.5 * (lower + torch.where(ties, lower, above))
    ratio = torch.where(median > 0, a.amax(-1, keepdim=True) / median, torch.nan)
    return torch.nanmean(ratio.squeeze(-1), -1)


def _all_metrics(v: Tensor, threshold: float) -> list[Tensor]:
    """Every METRICS entry, in order, of tokens v (N, d) or a stack of them (K, N, d)."""
    return [_kurtosis(v), *_after_kurtosis(v, threshold)]


def _after_kurtosis(v: Tensor, threshold: float) -> list[Tensor]:
    """METRICS[1:], in order."""
    return [_neuron_kurtosis(v), _outlier_dims(v, threshold, False), _outlier_dims(v, threshold, True),
            _max_abs(v), _max_median_ratio(v), *(_top_share(v, k) for k in TOP_K)]


RANK_TOKENS = 1024
"""At most this many tokens (evenly strided over the eval batch) enter the basis test: its cost
is K bases x tokens x d^2, and an exact test needs only the same tokens in every basis."""


def _kurtosis_and_top1(v: Tensor) -> tuple[Tensor, Tensor]:
    """(kurtosis, top1_share) of tokens v (..., N, d) from one centring and one squaring: what
    `kurtosis` and `top_share(k=1)` compute, in fewer passes (the basis test runs it K times)."""
    c = v - v.mean(-1, keepdim=True)
    e = c * c
    m2 = e.mean(-1)
    defined = m2 > 1e-12 * v.pow(2).mean(-1)
    k = torch.where(defined, (e * e).mean(-1) / (m2 * m2), torch.nan)
    top1 = torch.where(defined, e.amax(-1) / (m2 * e.shape[-1]), torch.nan)
    return torch.nanmean(k, -1), torch.nanmean(top1, -1)


def basis_test(x: Tensor, bases: Tensor, chunk: int = 8) -> dict[str, Tensor]:
    """Is the basis x is stored in privileged? The same tokens of x (..., d), at most RANK_TOKENS
    of them, read in x's own basis and in each of K Haar bases (K, d, d), `chunk` bases per matmul.

    Returns kurtosis and top1_share: the means over the bases (unbiased estimates of each
    measure's no-privilege null at this d, whatever the activations); kurtosis_sd and
    kurtosis_median across the bases; and for m in RANK_TESTED the exact rank p-value
    `m_rank_p` = (1 + #{bases with value >= x's own}) / (1 + K). If x's distribution is
    invariant under rotations (no privileged basis), x and its K rotations are exchangeable, so
    P(p <= j / (1 + K)) <= j / (1 + K): p = 1 / (K + 1) says the stored basis beats every random
    one. x's own value is computed on the same tokens (with more than RANK_TOKENS tokens it can
    differ slightly from the metric rows over every token)."""
    v = _tokens(x)
    v = v[:: -(-v.shape[0] // RANK_TOKENS)]  # every ceil(N / RANK_TOKENS)-th token
    own = _kurtosis_and_top1(v)
    per_basis = [torch.cat(parts) for parts in zip(*(
        _kurtosis_and_top1(torch.matmul(v, bases[i : i + chunk])) for i in range(0, bases.shape[0], chunk)))]
    k = per_basis[0]
    out = {Metric.KURTOSIS: torch.nanmean(k), Metric.TOP1_SHARE: torch.nanmean(per_basis[1]),
           CONTROL_SPREAD: k.std(), CONTROL_MEDIAN: k.median()}  # the median: the lower middle of an even count
    for name, values, stored in zip(RANK_TESTED, per_basis, own):
        out[RANK_P[name]] = (1 + (values >= stored).sum()).float() / (1 + values.numel())
    return out


def control_metrics(x: Tensor, bases: Tensor, threshold: float = 6.0) -> dict[str, Tensor]:
    """The residual stream's random-basis control over K Haar bases (K, d, d): `basis_test`
    (kurtosis, top-1 share, their spread and rank p-values, the same tokens in every basis),
    then the other METRICS on one basis' worth of tokens.

    For those (neuron_kurtosis, outlier counts, max_abs, max_median_ratio, top4_share) token i (flattened)
    is rotated by basis i mod K, in one batched matmul, so they cost what one basis on every
    token costs and see as many tokens as the stored basis does; the last N mod K tokens are
    left out, and with fewer tokens than bases only the first N bases are used."""
    v = _tokens(x)
    out = basis_test(v, bases)
    k, d = min(bases.shape[0], v.shape[0]), bases.shape[-1]
    n = v.shape[0] // k
    per_basis = torch.bmm(v[: n * k].view(n, k, d).transpose(0, 1), bases[:k])  # (K, n, d): basis j gets tokens j, j+K, ...
    rest = _after_kurtosis(per_basis.reshape(n * k, d), threshold)
    for name, value in zip(METRICS[1:], rest):
        out.setdefault(name, value)
    return out


# ---- model-level: Dettmers et al. (2022) -----------------------------------------------------


def _dettmers_hits(x: Tensor, threshold: float, pos_frac: float) -> Tensor:
    """(d,) bool: coordinate j has |x_j| >= threshold on at least pos_frac of the tokens (and
    on at least one)."""
    v = _tokens(x)
    need = max(1, math.ceil(pos_frac * v.shape[0] - 1e-9))  # exact integer compare, no float fuzz
    return (v.abs() >= threshold).sum(0) >= need


def _dettmers_count(hits: Tensor, layer_frac: float) -> Tensor:
    """hits (L, d) bool -> number of coordinates that count in at least layer_frac of the L."""
    need = max(1, math.ceil(layer_frac * hits.shape[0] - 1e-9))
    return (hits.sum(0) >= need).sum().float()


def dettmers_outliers(
    normalised_inputs: Sequence[Tensor], threshold: float = 6.0, layer_frac: float = 0.25, pos_frac: float = 0.06
) -> Tensor:
    """Dettmers et al. (LLM.int8(), 2022) model-level outlier count.

    `normalised_inputs` is one tensor (..., d) per layer input, all with the same d (the probe
    passes every attn_in and mlp_in, so L blocks give 2L "layers"). Coordinate j *counts in a
    layer* if |x_j| >= threshold on at least pos_frac of that layer's tokens (all leading dims
    flattened; and on at least one token). The model count is the number of coordinates j that
    count in at least layer_frac of the layers (and in at least one). Fractions are compared as
    integer counts: ceil(frac x n) of n. Coordinate j means the j-th axis of each layer's own
    computation basis, so with independent rotations the layers' axes are unrelated.
    """
    if not normalised_inputs:
        raise ValueError("dettmers_outliers needs at least one layer input")
    hits = torch.stack([_dettmers_hits(x, threshold, pos_frac) for x in normalised_inputs])  # (L, d)
    return _dettmers_count(hits, layer_frac)


# ---- the probe --------------------------------------------------------------------------------


@dataclass
class ProbeResult:
    """One probe pass: metric rows (layer, site, basis, metric, value) and the eval loss."""

    rows: list[dict] = field(default_factory=list)
    val_loss: float = float("nan")
    extra: list[list[float]] = field(default_factory=list)
    """The caller's `extra` tensors, read back in the same transfer (e.g. per-step train losses)."""


class ActivationProbe:
    """Measures every metric at every site and basis in ONE no-grad forward pass.

    Sites (blocks numbered 1..L):
    - `resid`, basis `stored`, layers 0..L: layer 0 = the input of blocks[0] (embeddings),
      layer l = the output of blocks[l-1];
    - `resid`, basis `random` (the control): the same activations read in `n_bases`
      (CONTROL_BASES, 32) fixed Haar-random bases Q_k, drawn once per probe from
      `generator_for(seed, "probe", k)` (`control_metrics`). Its kurtosis and top1_share are
      the means over the bases of each basis' value on the same (up to RANK_TOKENS) tokens: kurtosis
      estimates the exact null `kurtosis_null(d)` = 3(d-1)/(d+1) whatever the activations
      (2.818 at d 32, 2.953 at d 128). `kurtosis_sd` and `kurtosis_median` are the sd (n - 1
      denominator) and median across the bases, so the mean's standard error is
      kurtosis_sd / sqrt(n_bases). `kurtosis_rank_p`, `top1_share_rank_p`: the exact rank test
      of the stored basis against the K random ones (`basis_test`). The other metrics are those
      of one basis' worth of rotated tokens (token i in basis Q_(i mod K));
    - `attn_in` / `mlp_in`, basis `computation`, layers 1..L: outputs of block.attn_norm /
      block.mlp_norm (what the layer's first linear map sees, in its own basis), with the same
      basis test in basis `random` (kurtosis, top1_share, spread, median, rank p-values);
    - `mlp_act`, basis `neuron`, layers 1..L: output of block.mlp.act;
    - `model`, basis `computation`, layer -1: `dettmers_outliers` over all attn_in + mlp_in;
    - `attn`, basis `heads`, layers 1..L: the attention-sink measures (study.sinks: mass on the
      first position, on delimiters, on no key, the fraction of sink heads), from each block's
      attention pattern, recomputed from the q and k its qkv map returns; basis `uniform`, layer
      -1: what uniform causal attention reads on the same tokens. `delimiter` (V,) bool names the
      delimiter ids (study.attribution.TokenInfo.delimiter); None: `sinks.delimiter_ids`.

    Forward hooks exist only during `run` (removed in a finally), so training pays nothing.
    Metrics are computed inside the hooks, as each activation appears (so later in-place ops
    cannot change it and no activation is kept), with autocast off (float32). All values and
    the loss are stacked and read back with ONE host transfer. The caller chooses the
    forward's autocast context; the probe puts the model in eval mode and restores its mode.
    A torch.compile wrapper is unwrapped (hooks run on the eager module).
    """

    def __init__(self, model: nn.Module, seed: int, threshold: float = 6.0, n_bases: int = CONTROL_BASES,
                 delimiter: Tensor | None = None):
        if n_bases < 2:
            raise ValueError(f"n_bases must be >= 2 (the control keeps its sd across bases), got {n_bases}")
        self.model = getattr(model, "_orig_mod", model)
        self.seed = seed
        self.threshold = threshold
        self.n_bases = n_bases
        self.delimiter = delimiter
        self._bases: Tensor | None = None

    def random_bases(self, d: int, device: torch.device) -> Tensor:
        """The fixed (n_bases, d, d) float32 Haar-random orthogonal matrices of this probe's seed."""
        if self._bases is None or self._bases.shape[-1] != d or self._bases.device != device:
            qs = [random_orthogonal(d, generator_for(self.seed, "probe", k), dtype=torch.float32) for k in range(self.n_bases)]
            self._bases = torch.stack(qs).to(device)
        return self._bases

    def run(self, x: Tensor, y: Tensor, extra: Sequence[Tensor] = ()) -> ProbeResult:
        """One forward on (x, y); every (layer, site, basis, metric) row exactly once. `extra`
        device tensors ride along in the single readback (so an eval costs one host sync)."""
        model, blocks = self.model, self.model.blocks
        keys: list[tuple[int, str, str, str]] = []
        values: list[Tensor] = []
        hits: list[Tensor] = []

        def measure(layer: int, site: str, basis: str, act: Tensor) -> None:
            with torch.autocast(act.device.type, enabled=False):
                a = _tokens(act.detach())
                vals = _all_metrics(a, self.threshold)
                if site in (Site.ATTN_IN, Site.MLP_IN):
                    hits.append(_dettmers_hits(a, self.threshold, pos_frac=0.06))
                control: dict[str, Tensor] = {}
                if site in TESTED_SITES:
                    bases = self.random_bases(a.shape[-1], a.device)
                    control = control_metrics(a, bases, self.threshold) if site == Site.RESID else basis_test(a, bases)
            keys.extend((layer, site, basis, m) for m in METRICS)
            values.extend(vals)
            keys.extend((layer, site, Basis.RANDOM, m) for m in control)
            values.extend(control.values())

        def on_output(layer: int, site: str, basis: str):
            def hook(_module, _inputs, output):
                measure(layer, site, basis, output)
            return hook

        vocab = model.tok_emb.num_embeddings
        delimiter = (self.delimiter.to(x.device) if self.delimiter is not None else sinks.delimiter_ids(vocab, x))[x]  # (B, T)

        def on_qkv(layer: int, attn: nn.Module):
            def hook(_module, _inputs, output):
                with torch.autocast(output.device.type, enabled=False):
                    q, k, _ = attn.heads(output.detach().float())
                    B, H, T = q.shape[:3]
                    step = max(1, sinks.MAX_CHUNK // (H * T * T))
                    stats = sum(sinks.head_stats(attn.pattern(q[b : b + step], k[b : b + step]), delimiter[b : b + step])
                                * (min(step, B - b) / B) for b in range(0, B, step))
                for name, value in sinks.finish(stats).items():
                    keys.append((layer, sinks.SITE, sinks.BASIS, name))
                    values.append(value)
            return hook

        handles = [blocks[0].register_forward_pre_hook(lambda _m, args: measure(0, Site.RESID, Basis.STORED, args[0]))]
        for l, block in enumerate(blocks, start=1):
            handles += [
                block.register_forward_hook(on_output(l, Site.RESID, Basis.STORED)),
                block.attn_norm.register_forward_hook(on_output(l, Site.ATTN_IN, Basis.COMPUTATION)),
                block.mlp_norm.register_forward_hook(on_output(l, Site.MLP_IN, Basis.COMPUTATION)),
                block.mlp.act.register_forward_hook(on_output(l, Site.MLP_ACT, Basis.NEURON)),
                block.attn.qkv.register_forward_hook(on_qkv(l, block.attn)),
            ]
        was_training = model.training
        try:
            model.eval()
            with torch.no_grad():
                _, loss = model(x, y)
        finally:
            for h in handles:
                h.remove()
            model.train(was_training)

        keys.append((-1, Site.MODEL, Basis.COMPUTATION, Metric.DETTMERS_OUTLIERS))
        values.append(_dettmers_count(torch.stack(hits), layer_frac=0.25))
        for name, value in sinks.uniform_reference(delimiter).items():
            keys.append((-1, sinks.SITE, sinks.UNIFORM, name))
            values.append(value)
        scalars = torch.stack([v.float() for v in values] + [loss.detach().float()])
        flat = torch.cat([scalars, *(e.detach().float().reshape(-1) for e in extra)]).tolist()  # the one host sync
        out, rest = flat[: len(scalars)], flat[len(scalars):]
        extras = []
        for e in extra:
            extras.append(rest[: e.numel()])
            rest = rest[e.numel():]
        # an undefined measure (nan: e.g. no token has a non-zero median) is stored as null
        rows = [{"layer": l, "site": s, "basis": b, "metric": m, "value": v if v == v else None}
                for (l, s, b, m), v in zip(keys, out)]
        return ProbeResult(rows=rows, val_loss=out[-1], extra=extras)
