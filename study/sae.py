"""TopK sparse autoencoders on residual activations, and what they find (the paper's question 4).

The SAE is Gao et al. (2024)'s: latents z = ReLU(TopK(W_enc (x - b_pre) + b_enc)), reconstruction
x_hat = z W_dec + b_pre, decoder rows (the latents' directions) held at unit norm, encoder
initialised as the decoder's transpose, b_pre initialised at the data's geometric median (or mean),
loss = normalised MSE + AuxK (dead latents reconstruct the residual error).

Everything here is rotation-equivariant except the optimiser's own preference: rotating the data
x -> x Q and the initial SAE (W_dec Q, Q^T W_enc, b_pre Q) gives the rotated SAE at every step
when the optimiser is `sgd` (SGD with momentum); `adam` normalises per coordinate and does not.
The unit-norm projection, the geometric median and the data scaling are geometric, hence
equivariant. So a raw-vs-rotated difference under `sgd` comes from the data; under `adam` it
may also come from Adam. Pure torch: no Ray, no store.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from resultstore.vocabulary import Basis
from study.metrics import kurtosis
from study.rotation import generator_for

__all__ = [
    "SAE_OPTIMIZERS",
    "SAEConfig",
    "TopKSAE",
    "TrainedSAE",
    "decoder_alignment",
    "geometric_median",
    "initial_sae",
    "kurtosis_null",
    "matched_cosine",
    "probe_layer",
    "reconstruction_metrics",
    "residual",
    "sparse_features",
    "spliced_loss",
    "train_sae",
]

SAEOptimizer = Literal["adam", "sgd"]
SAE_OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")
"""`adam`: per-coordinate (basis-dependent); `sgd`: SGD with momentum, rotation-equivariant."""
_DEFAULT_LR = {"adam": 1e-3, "sgd": 0.1}


class SAEConfig(BaseModel):
    """One SAE's shape and training; frozen, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    k: int = Field(8, ge=1)
    """Active latents per token (TopK)."""
    expansion: int = Field(8, ge=1)
    """Latents per residual dimension: n_latents = expansion * d_model."""
    optimizer: SAEOptimizer = "adam"
    """`adam` (per-coordinate) or `sgd` (momentum; the rotation-equivariant control)."""
    lr: float | None = Field(None, gt=0)
    """Learning rate; None: 1e-3 for adam, 0.1 for sgd (on data scaled to unit mean square norm)."""
    momentum: float = Field(0.9, ge=0, lt=1)
    """SGD momentum."""
    steps: int = Field(2000, ge=1)
    """Optimiser steps."""
    batch_size: int = Field(256, ge=1)
    """Tokens per step, drawn without replacement per epoch."""
    aux_k: int | None = Field(None, ge=1)
    """Dead latents used by the AuxK loss; None: 2 k, at most half the latents."""
    aux_coef: float = Field(1 / 32, ge=0)
    """Weight of the AuxK loss (Gao et al.: 1/32)."""
    dead_tokens: int = Field(4096, ge=1)
    """A latent that has not fired for this many training tokens is dead (AuxK trains it)."""
    pre_bias: Literal["median", "mean"] = "median"
    """b_pre's initial value: the data's geometric median or its mean."""
    seed: int = 0
    """Seeds the initial decoder and the batch order."""

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else _DEFAULT_LR[self.optimizer]


class TopKSAE(nn.Module):
    """x (N, d) -> (x_hat (N, d), z (N, n)). Decoder rows are the latents' directions."""

    def __init__(self, d: int, n_latents: int, k: int, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.k = k
        w = torch.randn(n_latents, d, generator=generator, dtype=torch.float64)
        w = (w / w.norm(dim=1, keepdim=True)).to(dtype)
        self.W_dec = nn.Parameter(w)  # (n, d), unit rows
        self.W_enc = nn.Parameter(w.clone())  # (n, d): the encoder is the decoder's transpose
        self.b_enc = nn.Parameter(torch.zeros(n_latents, dtype=dtype))
        self.b_pre = nn.Parameter(torch.zeros(d, dtype=dtype))

    @property
    def n_latents(self) -> int:
        return self.W_dec.shape[0]

    def pre_acts(self, x: Tensor) -> Tensor:
        return F.linear(x - self.b_pre, self.W_enc, self.b_enc)  # (N, n)

    def encode(self, x: Tensor) -> Tensor:
        return topk_relu(self.pre_acts(x), self.k)

    def decode(self, z: Tensor) -> Tensor:
        return z @ self.W_dec + self.b_pre  # (N, d)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = self.encode(x)
        return self.decode(z), z

    @torch.no_grad()
    def rotated(self, q: Tensor) -> TopKSAE:
        """The same SAE for data in the basis x -> x q (q orthogonal, d x d)."""
        out = TopKSAE(self.W_dec.shape[1], self.n_latents, self.k, dtype=self.W_dec.dtype)
        q = q.to(self.W_dec.dtype)
        out.W_dec.copy_(self.W_dec @ q)
        out.W_enc.copy_(self.W_enc @ q)
        out.b_enc.copy_(self.b_enc)
        out.b_pre.copy_(self.b_pre @ q)
        return out

    @torch.no_grad()
    def normalise_decoder(self) -> None:
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12))


def topk_relu(pre: Tensor, k: int) -> Tensor:
    """Keep each row's k largest entries (then ReLU), zero elsewhere."""
    vals, idx = pre.topk(min(k, pre.shape[-1]), dim=-1)
    return torch.zeros_like(pre).scatter_(-1, idx, vals.relu())


def geometric_median(x: Tensor, iters: int = 50, tol: float = 1e-7) -> Tensor:
    """Weiszfeld's iteration from the mean: the point minimising the sum of distances to x's rows."""
    m = x.mean(0)
    for _ in range(iters):
        w = 1.0 / (x - m).norm(dim=1).clamp_min(1e-12)
        new = (w[:, None] * x).sum(0) / w.sum()
        if (new - m).norm() <= tol * (m.norm() + 1e-12):
            return new
        m = new
    return m


@dataclass(frozen=True)
class TrainedSAE:
    """A trained SAE (in the data's units) and its training record."""

    sae: TopKSAE
    final_loss: float
    """Normalised MSE of the last step."""
    scale: float
    """The data's RMS distance to its mean (training ran on x / scale; folded back in)."""


def initial_sae(d: int, cfg: SAEConfig, dtype: torch.dtype = torch.float32) -> TopKSAE:
    """The seeded starting SAE (random unit decoder rows, encoder = decoder transpose)."""
    return TopKSAE(d, cfg.expansion * d, cfg.k, generator_for(cfg.seed, "sae", "init"), dtype=dtype)


def _aux_k(cfg: SAEConfig, n: int) -> int:
    return cfg.aux_k if cfg.aux_k is not None else max(1, min(2 * cfg.k, n // 2))


def train_sae(x: Tensor, cfg: SAEConfig, init: TopKSAE | None = None) -> TrainedSAE:
    """Train a TopK SAE on activations x (N, d) in their own basis; returns it in x's units.

    `init` (e.g. `other_init.rotated(q)`) replaces the seeded random start; b_pre is always set
    from the data. The batch order depends only on cfg.seed and N, so runs in two bases pair up.
    """
    n_tok, d = x.shape
    mean = x.mean(0)
    scale = float((x - mean).pow(2).sum(1).mean().sqrt().clamp_min(1e-12))
    u = x / scale  # mean squared distance to the mean is 1: one lr serves every model
    n = cfg.expansion * d
    gen = generator_for(cfg.seed, "sae", "batches")
    sae = (initial_sae(d, cfg, x.dtype) if init is None else init).to(x.device)
    with torch.no_grad():
        if init is not None:
            sae.b_pre.div_(scale)
            sae.b_enc.div_(scale)
        sae.b_pre.copy_(geometric_median(u) if cfg.pre_bias == "median" else u.mean(0))
    if cfg.optimizer == "adam":
        opt = torch.optim.Adam(sae.parameters(), lr=cfg.learning_rate)
    else:
        opt = torch.optim.SGD(sae.parameters(), lr=cfg.learning_rate, momentum=cfg.momentum)
    u_mean = u.mean(0)
    k_aux = _aux_k(cfg, n)
    since_fired = torch.zeros(n, dtype=torch.long, device=x.device)
    order, pos, loss = torch.randperm(n_tok, generator=gen), 0, torch.tensor(float("nan"))
    for _ in range(cfg.steps):
        if pos + cfg.batch_size > n_tok:
            order, pos = torch.randperm(n_tok, generator=gen), 0
        batch = u[order[pos : pos + cfg.batch_size].to(x.device)]
        pos += cfg.batch_size
        pre = sae.pre_acts(batch)  # (B, n)
        z = topk_relu(pre, cfg.k)
        recon = sae.decode(z)
        denom = (batch - u_mean).pow(2).sum()
        loss = (batch - recon).pow(2).sum() / denom
        fired = (z > 0).any(0)
        since_fired = torch.where(fired, 0, since_fired + batch.shape[0])
        dead = since_fired >= cfg.dead_tokens
        total = loss
        if cfg.aux_coef > 0 and bool(dead.any()):
            err = (batch - recon).detach()
            z_aux = topk_relu(pre.masked_fill(~dead, float("-inf")), min(k_aux, int(dead.sum())))
            z_aux = torch.nan_to_num(z_aux, neginf=0.0)
            total = total + cfg.aux_coef * (err - z_aux @ sae.W_dec).pow(2).sum() / denom
        opt.zero_grad(set_to_none=True)
        total.backward()
        with torch.no_grad():  # keep the step tangent to the unit sphere of each decoder row
            g, w = sae.W_dec.grad, sae.W_dec
            g.sub_((g * w).sum(1, keepdim=True) * w)
        opt.step()
        sae.normalise_decoder()
    with torch.no_grad():
        sae.b_pre.mul_(scale)
        sae.b_enc.mul_(scale)
    return TrainedSAE(sae=sae, final_loss=float(loss.detach()), scale=scale)


# ---- metrics ------------------------------------------------------------------------------


@torch.no_grad()
def reconstruction_metrics(sae: TopKSAE, x: Tensor) -> dict[str, float]:
    """On activations x (N, d): fraction of variance explained, mean L0, and the fraction of
    latents that never fire (dead)."""
    x_hat, z = sae(x)
    fve = 1.0 - float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    active = z > 0
    return {"fve": fve, "l0": float(active.sum(1).double().mean()),
            "dead_fraction": float((~active.any(0)).double().mean())}


def kurtosis_null(d: int) -> float:
    """Expected centred kurtosis of a Haar-random direction's coordinates: 3(d-1)/(d+1)."""
    return 3.0 * (d - 1) / (d + 1)


@torch.no_grad()
def decoder_alignment(directions: Tensor) -> dict[str, float]:
    """How basis-aligned directions (n, d) are: the mean over rows of their coordinates'
    kurtosis (random directions: kurtosis_null(d); a basis vector: about d) and of the largest
    coordinate's share of the norm, max|w_i| / |w| (random: about sqrt(2 ln d / d); basis: 1)."""
    w = directions.double()
    share = w.abs().amax(1) / w.norm(dim=1).clamp_min(1e-300)
    return {"decoder_kurtosis": float(kurtosis(w)), "decoder_max_share": float(share.mean())}


@torch.no_grad()
def matched_cosine(a: Tensor, b: Tensor) -> float:
    """Mean cosine of the best one-to-one matching of a's rows to b's rows (Hungarian,
    scipy.optimize.linear_sum_assignment); with unequal counts, the smaller set is matched."""
    from scipy.optimize import linear_sum_assignment

    a = F.normalize(a.double(), dim=1)
    b = F.normalize(b.double(), dim=1)
    cos = (a @ b.T).cpu().numpy()
    rows, cols = linear_sum_assignment(cos, maximize=True)
    return float(cos[rows, cols].mean())


def sparse_features(n_tokens: int, directions: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Synthetic activations: each token is a sum of k distinct rows of `directions` (m, d) with
    magnitudes uniform in [0.5, 1.5]. For tests and benchmarks."""
    m = directions.shape[0]
    idx = torch.rand(n_tokens, m, generator=generator).argsort(1)[:, :k]
    mags = 0.5 + torch.rand(n_tokens, k, generator=generator, dtype=directions.dtype)
    codes = torch.zeros(n_tokens, m, dtype=directions.dtype).scatter_(1, idx, mags)
    return codes @ directions


# ---- on a trained model: residual activations, splicing, one layer's probe ------------------------


def _site(model: nn.Module, layer: int) -> nn.Module:
    """The module whose output is the residual stream at `layer` (0: the embeddings' write)."""
    return model.write_emb if layer == 0 else model.blocks[layer - 1]


@torch.no_grad()
def residual(model: nn.Module, idx: Tensor, layer: int) -> Tensor:
    """The residual stream after block `layer` (0: the embeddings), stored basis: (B*T, d)."""
    got: list[Tensor] = []
    handle = _site(model, layer).register_forward_hook(lambda m, i, o: got.append(o))
    try:
        model(idx)
    finally:
        handle.remove()
    return got[0].reshape(-1, got[0].shape[-1])


@torch.no_grad()
def spliced_loss(model: nn.Module, idx: Tensor, targets: Tensor, layer: int, replace=None) -> float:
    """The model's loss with the residual stream at `layer` replaced by replace((B*T, d)) -> (B*T, d)
    (None: unchanged)."""
    def hook(module, inputs, output):
        return replace(output.reshape(-1, output.shape[-1])).reshape(output.shape).to(output.dtype)

    handle = _site(model, layer).register_forward_hook(hook) if replace is not None else None
    try:
        return float(model(idx, targets)[1])
    finally:
        if handle is not None:
            handle.remove()


def probe_layer(model: nn.Module, idx: Tensor, targets: Tensor, layer: int, cfg: SAEConfig,
                basis: Tensor, train_fraction: float = 0.75) -> list[dict]:
    """Train cfg's SAE on `layer`'s residual stream in the stored basis and in `basis` (an
    orthogonal d x d, data x -> x basis; the SAE starts from the stored one's start, rotated) and
    measure both: two rows (basis `stored`, `random`). SAEs train on the first `train_fraction` of
    the sequences and are measured on the rest (dead latents: on all of them)."""
    t0 = time.perf_counter()
    n_train = max(1, min(idx.shape[0] - 1, round(idx.shape[0] * train_fraction)))
    acts = residual(model, idx, layer).float()
    d, per_seq = acts.shape[1], idx.shape[1]
    train_x, eval_x = acts[: n_train * per_seq], acts[n_train * per_seq :]
    eval_idx, eval_y = idx[n_train:], targets[n_train:]
    q = basis.to(acts)
    loss_orig = spliced_loss(model, eval_idx, eval_y, layer)
    loss_zero = spliced_loss(model, eval_idx, eval_y, layer, torch.zeros_like)
    saes = {Basis.STORED: (train_sae(train_x, cfg).sae, torch.eye(d, dtype=acts.dtype)),
            Basis.RANDOM: (train_sae(train_x @ q, cfg, init=initial_sae(d, cfg, acts.dtype).rotated(q)).sae, q)}
    live = {}
    rows = []
    for name, (sae, b) in saes.items():
        fired = (sae(acts @ b)[1] > 0).any(0)
        live[name] = sae.W_dec[fired] @ b.T  # live directions, back in the stored basis
        m = reconstruction_metrics(sae, eval_x @ b)
        loss_sae = spliced_loss(model, eval_idx, eval_y, layer, lambda x, sae=sae, b=b: sae(x.float() @ b)[0] @ b.T)
        gap = loss_zero - loss_orig
        rows.append({
            "layer": layer, "basis": name, "sae_optimizer": cfg.optimizer, "d_model": d,
            "n_latents": sae.n_latents, "k": cfg.k, "steps": cfg.steps, "tokens": int(train_x.shape[0]),
            "fve": m["fve"], "l0": m["l0"], "dead_fraction": float((~fired).double().mean()),
            "loss_orig": loss_orig, "loss_zero": loss_zero, "loss_sae": loss_sae,
            "loss_recovered": (loss_zero - loss_sae) / gap if gap != 0 else math.nan,
            **decoder_alignment(sae.W_dec[fired] if bool(fired.any()) else sae.W_dec),
            "decoder_kurtosis_null": kurtosis_null(d), "sae_config_json": cfg.model_dump_json(),
        })
    agreement = (matched_cosine(live[Basis.STORED], live[Basis.RANDOM])
                 if len(live[Basis.STORED]) and len(live[Basis.RANDOM]) else math.nan)
    wall = time.perf_counter() - t0
    return [{**r, "agreement": agreement, "wall_s": wall / 2} for r in rows]
