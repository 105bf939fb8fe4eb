"""What the outlier dimensions are and what they do: attribution and causal ablation (issue 20).

Run at the final eval (and every `train.attribution_every`-th eval) on the fixed eval batch x
(B, T), by `Attribution.run`. Rows go to the `dims` table (resultstore/schema.py documents columns).

Attribution, per (layer, site): `resid` (basis `stored`, layers 0..L: 0 = the embeddings, l =
the output of block l) and `attn_in` / `mlp_in` (basis `computation`, layers 1..L: the norms'
outputs). Rows are the union of the top-k dimensions by max |x| (`rank_max`) and by share of
the fourth moment, sum_t x_tj^4 / sum_tj x_tj^4 (`rank_m4`), each with

- max_abs, median_abs (over the B*T eval tokens) and max_median = max_abs / median_abs;
  sun_ratio = max_abs / the median |x| of the whole layer (Sun et al. 2024's measure);
- over its n_top = B largest |x_j| (one per eval sequence on average): pos0_share (at position
  0), frequent_share (on the `n_frequent` most frequent training tokens), delimiter_share (on
  delimiters: newline, space, tab and ASCII punctuation for a byte corpus, vocab 256; the most
  frequent ids for any other), top_tokens ("id:count,..." of the commonest input ids there);
- freq_corr: Pearson correlation over the eval tokens of |x_j| with log(1 + the token's count
  in the training split);
- gain_ratio: |gain_j| / median |gain| of the norm that produced the site (attn_in, mlp_in) or
  that reads the residual stream next (resid; nan when that read is rotated); 1 for
  rmsnorm_scalar.

Ablation (rows at layer -1, site `resid`): the candidates are the k dimensions in the most
per-layer top-k-by-max|x| sets of the residual stream (ties: larger max |x|); `first_layer` is
the first layer whose top-k holds it. Each is set to 0 (`zero_*`) and, separately, to its mean
over the eval batch at that layer (`mean_*`), at the embeddings and every block's output
(`*_delta`: val loss change) and at its first layer only (`*_delta_first`). The null: `n_null`
dimensions drawn (seeded) from the others, ablated in the same two ways at every layer (role
`null`); a candidate's p = (1 + #null deltas >= its delta) / (1 + n_null). loss_tokens names
the target ids whose loss rises most under the zero ablation ("id:count,..." over the B
positions with the largest increase).
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from resultstore.vocabulary import Basis, Site
from study.model import Rotate, ScalarRMSNorm, Transformer
from study.rotation import generator_for

__all__ = ["Attribution", "Pending", "TokenInfo", "ablation_p_value", "dim_stats", "token_info", "top_dims"]

TOP_K = 8
N_NULL = 16
N_FREQUENT = 8
N_TOKENS = 3
"""Token ids listed in top_tokens / loss_tokens."""
DELIMITER_BYTES = b"\n \t" + string.punctuation.encode()
MAX_FREQ_TOKENS = 1 << 24
"""Token frequencies read at most this many training tokens (64 evenly spaced chunks beyond)."""
STATS = ("max_abs", "median_abs", "max_median", "sun_ratio", "m4_share", "pos0_share",
         "frequent_share", "delimiter_share", "freq_corr", "gain_ratio")
_FREQ_CACHE: dict[tuple[str, int], np.ndarray] = {}


# ---- tokens -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenInfo:
    """Per token id: log(1 + training count), and whether it is frequent / a delimiter."""

    log_freq: Tensor  # (V,) float32
    frequent: Tensor  # (V,) bool
    delimiter: Tensor  # (V,) bool


def token_frequencies(train: np.ndarray, vocab_size: int, max_tokens: int = MAX_FREQ_TOKENS) -> np.ndarray:
    """(V,) counts of each id in `train` (all of it up to max_tokens, else 64 evenly spaced chunks)."""
    n = len(train)
    if n <= max_tokens:
        return np.bincount(np.asarray(train[0:n]), minlength=vocab_size)[:vocab_size]  # a slice: memmap shards too
    size = max_tokens // 64
    starts = np.linspace(0, n - size, 64).astype(np.int64)
    return sum(np.bincount(np.asarray(train[s : s + size]), minlength=vocab_size)[:vocab_size] for s in starts)


def token_info(counts: np.ndarray, byte_level: bool, n_frequent: int = N_FREQUENT) -> TokenInfo:
    """Frequent ids: the n_frequent commonest; delimiters: DELIMITER_BYTES for a byte corpus,
    else the frequent ids (a BPE vocabulary has no fixed delimiter ids)."""
    counts = torch.as_tensor(np.asarray(counts, dtype=np.float64))
    frequent = torch.zeros(len(counts), dtype=torch.bool)
    frequent[counts.topk(min(n_frequent, len(counts))).indices] = True
    if byte_level:
        delimiter = torch.zeros(len(counts), dtype=torch.bool)
        delimiter[list(DELIMITER_BYTES)] = True
    else:
        delimiter = frequent.clone()
    return TokenInfo(torch.log1p(counts).float(), frequent, delimiter)


def corpus_token_info(corpus, n_frequent: int = N_FREQUENT) -> TokenInfo:
    """TokenInfo of a study.data.Corpus; its counts are computed once per process and corpus."""
    key = (corpus.fingerprint, corpus.vocab_size)
    if key not in _FREQ_CACHE:
        _FREQ_CACHE[key] = token_frequencies(corpus.train, corpus.vocab_size)
    return token_info(_FREQ_CACHE[key], byte_level=corpus.vocab_size == 256, n_frequent=n_frequent)


# ---- pure measures --------------------------------------------------------------------------------


def top_dims(a: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """a (N, d) -> (top-k dims by max |x|, top-k dims by fourth-moment share), largest first."""
    k = min(k, a.shape[-1])
    return a.abs().amax(0).topk(k).indices, a.pow(4).sum(0).topk(k).indices


def dim_stats(a: Tensor, ids: Tensor, seq_len: int, info: TokenInfo, gain: Tensor | None, n_top: int) -> Tensor:
    """(len(STATS), d) float32: every STATS measure of every dimension of a (N, d), N = B*T
    tokens in (B, T) order with input ids `ids` (N,). `gain` is the norm's (d,) gain or None
    (gain_ratio nan); a scalar gain gives 1."""
    a = a.float()
    x = a.abs()
    max_abs, median_abs = x.amax(0), x.median(0).values
    m4 = a.pow(4).sum(0)
    top = x.topk(min(n_top, x.shape[0]), dim=0).indices  # (n, d) token indices
    top_ids = ids[top]
    lf = info.log_freq.to(a.device)[ids]  # (N,)
    xc, fc = x - x.mean(0), lf - lf.mean()
    corr = (xc * fc[:, None]).sum(0) / (xc.pow(2).sum(0).sqrt() * fc.pow(2).sum().sqrt())
    if gain is None:
        gain_ratio = torch.full_like(max_abs, math.nan)
    elif gain.numel() == 1:
        gain_ratio = torch.ones_like(max_abs)
    else:
        g = gain.detach().float().abs()
        gain_ratio = g / g.median()
    return torch.stack([
        max_abs, median_abs, max_abs / median_abs, max_abs / x.median(), m4 / m4.sum(),
        (top % seq_len == 0).float().mean(0),
        info.frequent.to(a.device)[top_ids].float().mean(0),
        info.delimiter.to(a.device)[top_ids].float().mean(0),
        corr, gain_ratio,
    ])  # fmt: skip


def commonest(ids: Tensor, vocab_size: int, n: int = N_TOKENS) -> tuple[Tensor, Tensor]:
    """ids (m, J) -> the n commonest ids per column and their counts, both (J, n)."""
    counts = torch.zeros(ids.shape[1], vocab_size, device=ids.device)
    counts.scatter_add_(1, ids.T.long(), torch.ones(ids.T.shape, device=ids.device))
    c, i = counts.topk(min(n, vocab_size), dim=1)
    return i, c


def ablation_p_value(delta: float, null: list[float]) -> float:
    """Empirical p-value of `delta` against the null draws: (1 + #null >= delta) / (1 + n)."""
    return (1 + sum(d >= delta for d in null)) / (1 + len(null))


def _token_list(ids: list[float], counts: list[float]) -> str:
    return ",".join(f"{int(i)}:{int(c)}" for i, c in zip(ids, counts) if c > 0)


# ---- the pass ---------------------------------------------------------------------------------------


@dataclass
class Pending:
    """A measured pass still on the device: `values` (flat, float32) and how to read them back.
    The caller reads `values` with its own readback (the probe's one per eval) and calls rows()."""

    values: Tensor
    rows: Callable[[list[float]], list[dict]]


class Attribution:
    """The per-eval attribution + ablation pass over one model (see the module docstring)."""

    def __init__(self, model: nn.Module, info: TokenInfo, seed: int, k: int = TOP_K, n_null: int = N_NULL):
        self.model: Transformer = getattr(model, "_orig_mod", model)
        self.info, self.seed, self.k, self.n_null = info, seed, k, n_null

    def _gain(self, layer: int, site: str) -> Tensor | None:
        blocks = self.model.blocks
        if site != Site.RESID:
            return getattr(blocks[layer - 1], f"{site.split('_')[0]}_norm").weight
        read, norm = ((blocks[layer].read_attn, blocks[layer].attn_norm) if layer < len(blocks)
                      else (self.model.read_out, self.model.final_norm))
        return None if isinstance(read, Rotate) and not isinstance(norm, ScalarRMSNorm) else norm.weight

    def _activations(self, x: Tensor) -> tuple[list[tuple[int, str, Tensor]], Tensor, Tensor, Tensor]:
        """One forward. Per (layer, site): the top-k by max then by m4 (2k dims, duplicates kept)
        stacked with their ranks, STATS and commonest tokens, (2k, 2 + len(STATS) + 2 N_TOKENS);
        and over the resid layers: means (L+1, d), top-k-by-max masks and max |x| (L+1, d)."""
        blocks, (B, T) = self.model.blocks, x.shape
        ids = x.reshape(-1)
        sites: list[tuple[int, str, Tensor]] = []
        means, masks, maxes = [], [], []

        def measure(layer: int, site: str, act: Tensor) -> None:
            with torch.autocast(act.device.type, enabled=False):
                a = act.detach().float().reshape(-1, act.shape[-1])
                d = a.shape[-1]
                stats = dim_stats(a, ids, T, self.info, self._gain(layer, site), n_top=B)  # (S, d)
                by_max, by_m4 = top_dims(a, self.k)
                ranks = torch.zeros(2, d, device=a.device)
                ranks[0, by_max] = torch.arange(1, len(by_max) + 1, device=a.device, dtype=ranks.dtype)
                ranks[1, by_m4] = torch.arange(1, len(by_m4) + 1, device=a.device, dtype=ranks.dtype)
                sel = torch.cat([by_max, by_m4])
                top = a.abs().topk(min(B, a.shape[0]), dim=0).indices[:, sel]
                tok_i, tok_c = commonest(ids[top], len(self.info.log_freq))
                sites.append((layer, site, torch.cat([sel[:, None].float(), ranks[:, sel].T, stats[:, sel].T,
                                                      tok_i.float(), tok_c], 1)))
                if site == Site.RESID:
                    means.append(a.mean(0))
                    masks.append(ranks[0] > 0)
                    maxes.append(stats[0])

        def hook(layer: int, site: str):
            return lambda _m, _i, o: measure(layer, site, o)

        handles = [blocks[0].register_forward_pre_hook(lambda _m, args: measure(0, Site.RESID, args[0]))]
        for l, block in enumerate(blocks, start=1):
            handles += [block.register_forward_hook(hook(l, Site.RESID)),
                        block.attn_norm.register_forward_hook(hook(l, Site.ATTN_IN)),
                        block.mlp_norm.register_forward_hook(hook(l, Site.MLP_IN))]
        try:
            self.model(x)
        finally:
            for h in handles:
                h.remove()
        return sites, torch.stack(means), torch.stack(masks), torch.stack(maxes)

    def token_losses(self, x: Tensor, y: Tensor, dims: Tensor, values: Tensor, at: Tensor) -> Tensor:
        """Per-token losses (G, B*T) of G ablated copies of the batch run as one batch: copy g has
        coordinate dims[g] of the residual stream set to values[g, l] at each layer l (0..L) where
        at[g, l]. With no dims, the plain model's losses (1, B*T)."""
        blocks, (B, T) = self.model.blocks, x.shape
        G = max(1, len(dims))
        g = torch.arange(len(dims), device=x.device)

        def ablate(layer: int, h: Tensor) -> Tensor:
            if not len(dims):
                return h
            h = h.view(G, B, T, -1).clone()
            cur = h[g, :, :, dims]  # (G, B, T)
            v = values[:, layer, None, None].to(h.dtype)
            h[g, :, :, dims] = torch.where(at[:, layer, None, None], v, cur)
            return h.view(G * B, T, -1)

        handles = [blocks[0].register_forward_pre_hook(lambda _m, args: (ablate(0, args[0]), *args[1:]))]
        handles += [b.register_forward_hook(lambda _m, _i, o, l=l: ablate(l, o)) for l, b in enumerate(blocks, start=1)]
        try:
            logits, _ = self.model(x.repeat(G, 1))
        finally:
            for h in handles:
                h.remove()
        return F.cross_entropy(logits.float().reshape(G * B * T, -1), y.repeat(G, 1).reshape(-1),
                               reduction="none").view(G, B * T)

    def _losses(self, x: Tensor, y: Tensor, dims: Tensor, values: Tensor, at: Tensor) -> Tensor:
        """token_losses in chunks of copies that keep the logits under ~256 MB."""
        per_copy = x.numel() * len(self.info.log_freq) * 4
        size = max(1, min(16, (256 << 20) // per_copy))
        return torch.cat([self.token_losses(x, y, dims[i : i + size], values[i : i + size], at[i : i + size])
                          for i in range(0, len(dims), size)])

    def run(self, x: Tensor, y: Tensor) -> list[dict]:
        """Every dims row (without step / tokens / trial_id), read back here."""
        pending = self.measure(x, y)
        return pending.rows(pending.values.tolist())

    @torch.no_grad()
    def measure(self, x: Tensor, y: Tensor) -> Pending:
        """The whole pass on the device, no host sync. The caller picks autocast; eval mode is
        set and restored."""
        model = self.model
        was_training = model.training
        try:
            model.eval()
            return self._measure(x, y)
        finally:
            model.train(was_training)

    def _measure(self, x: Tensor, y: Tensor) -> Pending:
        B, T = x.shape
        sites, means, masks, maxes = self._activations(x)
        L1, d = means.shape  # L + 1 residual layers
        V = len(self.info.log_freq)
        # candidates: in the most per-layer top-k sets, ties by the larger max |x|
        count, peak = masks.sum(0).float(), maxes.amax(0)
        C = min(self.k, d)
        candidates = (count + peak / (2 * peak.max())).topk(C).indices
        first = masks[:, candidates].float().argmax(0)  # (C,) the first layer holding it
        # the null: a seeded random order of the dims, candidates last
        perm = torch.randperm(d, generator=generator_for(self.seed, "attribution-null")).to(x.device)
        priority = torch.empty(d, device=x.device).scatter_(0, perm, torch.arange(d, device=x.device, dtype=torch.float))
        priority[candidates] += d
        null = priority.argsort()[: min(self.n_null, d - C)]
        dims = torch.cat([candidates, null])
        n = len(dims)
        every = torch.ones(n, L1, dtype=torch.bool, device=x.device)
        at_first = F.one_hot(first, L1).bool()
        zeros, mean = torch.zeros(n, L1, device=x.device), means[:, dims].T  # (n, L+1)
        base = self.token_losses(x, y, dims[:0], zeros[:0], every[:0])  # (1, N)
        abl = self._losses(x, y, torch.cat([dims, dims, candidates, candidates]),
                           torch.cat([zeros, mean, zeros[:C], mean[:C]]),
                           torch.cat([every, every, at_first, at_first]))
        delta = (abl - base).mean(1)  # (2n + 2C,)
        worst = (abl[:n] - base).topk(min(B, B * T), dim=1).indices  # zero ablation at every layer
        loss_i, loss_c = commonest(y.reshape(-1)[worst].T, V)
        values = torch.cat([t.float().reshape(-1) for t in
                            [dims, first, delta, loss_i, loss_c] + [s[2] for s in sites]])
        layout = [(layer, site, s.shape) for layer, site, s in sites]
        return Pending(values, lambda flat: _decode(flat, n, C, layout))


def _decode(flat: list[float], n: int, C: int, layout: list[tuple[int, str, torch.Size]]) -> list[dict]:
    """Rows from Pending.values read back (the layout of Attribution._measure)."""
    pos = 0

    def take(m: int) -> list[float]:
        nonlocal pos
        pos += m
        return flat[pos - m : pos]

    dims, first = take(n), take(C)
    deltas = take(2 * n + 2 * C)
    loss_i, loss_c = take(n * N_TOKENS), take(n * N_TOKENS)
    zero_d, mean_d, zero_first, mean_first = deltas[:n], deltas[n : 2 * n], deltas[2 * n : 2 * n + C], deltas[2 * n + C :]
    rows = []
    for i, j in enumerate(dims):
        top, tokens = i < C, slice(i * N_TOKENS, (i + 1) * N_TOKENS)
        rows.append({
            "layer": -1, "site": Site.RESID, "basis": Basis.STORED, "dim": int(j), "role": "top" if top else "null",
            "rank_max": i + 1 if top else None, "first_layer": int(first[i]) if top else None,
            "zero_delta": zero_d[i], "mean_delta": mean_d[i],
            "zero_delta_first": zero_first[i] if top else None, "mean_delta_first": mean_first[i] if top else None,
            "zero_p": ablation_p_value(zero_d[i], zero_d[C:]) if top else None,
            "mean_p": ablation_p_value(mean_d[i], mean_d[C:]) if top else None,
            "loss_tokens": _token_list(loss_i[tokens], loss_c[tokens]),
        })  # fmt: skip
    for layer, site, (m, width) in layout:
        block, seen = take(m * width), set()
        for c in range(m):
            r = block[c * width : (c + 1) * width]
            j = int(r[0])
            if j in seen:  # in both top-k lists: one row
                continue
            seen.add(j)
            stats, toks = r[3 : 3 + len(STATS)], r[3 + len(STATS) :]
            rows.append({
                "layer": layer, "site": site, "basis": Basis.STORED if site == Site.RESID else Basis.COMPUTATION,
                "dim": j, "role": "top", "rank_max": int(r[1]) or None, "rank_m4": int(r[2]) or None,
                **dict(zip(STATS, stats)), "top_tokens": _token_list(toks[:N_TOKENS], toks[N_TOKENS:]),
            })  # fmt: skip
    return rows
