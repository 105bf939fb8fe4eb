"""A small pre-norm GPT whose layers may compute in a rotated basis of the residual stream.

Block l (row vectors, x is (B, T, C)):

    x = x + write_attn(attn(attn_norm(read_attn(x))))
    x = x + write_mlp(mlp(mlp_norm(read_mlp(x))))

read = Rotate(R) computes x @ R, write = Rotate(R^T); without a rotation both are nn.Identity(),
so every variant is the same residual equation. The ends too (rotation.Plan's embed/unembed):

    x = write_emb(tok_emb(idx) + pos_emb(pos))        logits = unembed(final_norm(read_out(x)))

The attribute names are an interface: the activation probe hooks `blocks[i].attn_norm` /
`.mlp_norm` (normalised inputs in the computation basis), `blocks[i].mlp.act` (neuron basis),
blocks[0]'s input (the residual stream after write_emb) and each Block's output.

No biases in Linear layers, untied unembedding, learned positions, GELU, causal SDPA; the
attention variant (study.attention) is `ATTENTIONS[name]`, `blocks[i].attn`.

muP (`mup_base_width`; Yang, Hu et al. 2022, Tensor Programs V, Table 8's variant, the `mup`
package's: an output multiplier, not a 1/fan_in^2 unembedding init), with width multiplier
m = d_model / mup_base_width: hidden matrices (qkv, proj, fc, gate) drawn with SP's std / sqrt(m)
(variance ~ 1/fan_in); embeddings and unembedding drawn as in SP; logits = unembed(...) / m;
attention logits q.k sqrt(D0) / D (1/D, equal to SP's 1/sqrt(D) at the base head width
D0 = mup_base_width / n_heads). The per-role lr multipliers are the optimiser's
(study/optim/rules/groups.py). At m = 1 every number is SP's exactly.
Construction never touches torch's global RNG: weights are drawn from
`generator_for(seed, "init")` (in float64, then cast, so a float32 and a float64 model built
from one seed hold the same numbers up to rounding).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils import skip_init

from study.attention import AttentionConfig
from study.config import TrialConfig
from study.optim.rules.groups import mup_role
from study.rotation import Plan, build_plan, generator_for

__all__ = [
    "EPS", "LayerNorm", "RMSNorm", "ScalarRMSNorm", "NORMS", "Rotate", "read_write", "linear", "logits", "Attention",
    "ExtraKeyAttention", "KVBiasAttention", "GatedAttention", "ClippedAttention", "ATTENTIONS", "MLP", "Block",
    "Transformer",
]

EPS = 1e-5


# ---- norms --------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """Subtract the mean, divide by the std, per-coordinate gain and bias (basis-dependent)."""

    def __init__(self, d: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(d, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, EPS)


class RMSNorm(nn.Module):
    """Divide by the RMS, per-coordinate gain (basis-dependent through the gain)."""

    def __init__(self, d: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


class ScalarRMSNorm(nn.Module):
    """Divide by the RMS, ONE learned scalar gain: exactly rotation-invariant (the paper's)."""

    def __init__(self, d: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1, dtype=dtype))  # shape (1,), not (), for optimisers

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


NORMS: dict[str, type[nn.Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm, "rmsnorm_scalar": ScalarRMSNorm}


# ---- rotation -----------------------------------------------------------------------------


class Rotate(nn.Module):
    """Multiply by a fixed orthogonal matrix: x @ matrix. A buffer: saved, cast and moved, never trained.

    Computed in at least float32 with autocast off, and returned in x's dtype: under bf16
    autocast a plain matmul would return bf16 and carry every rotated plan's residual stream in
    bf16 while `none` keeps it in float32 (a precision confound between the plans)."""

    def __init__(self, matrix: Tensor):
        super().__init__()
        self.register_buffer("matrix", matrix.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)  # float64 models stay float64
        with torch.autocast(x.device.type, enabled=False):
            return (x.to(dtype) @ self.matrix.to(dtype)).to(x.dtype)  # (B, T, C) @ (C, C)


def read_write(r: Tensor | None, dtype: torch.dtype) -> tuple[nn.Module, nn.Module]:
    """The read/write pair for one layer: (Rotate(R), Rotate(R^T)), or two identities."""
    if r is None:
        return nn.Identity(), nn.Identity()
    return Rotate(r.to(dtype)), Rotate(r.T.to(dtype))


def linear(d_in: int, d_out: int, dtype: torch.dtype) -> nn.Linear:
    """An unbiased Linear left uninitialised (no global RNG); Transformer.init_weights fills it."""
    return skip_init(nn.Linear, d_in, d_out, bias=False, dtype=dtype)


# ---- layers -------------------------------------------------------------------------------


def logits(q: Tensor, k: Tensor, mult: float = 1.0) -> Tensor:
    """q . k / sqrt(D) (times `mult`, muP's sqrt(D0 / D)) for every query and key, in at least
    float32: (B, H, Tq, Tk)."""
    s = (q @ k.transpose(-2, -1)).to(torch.promote_types(q.dtype, torch.float32)) / math.sqrt(q.shape[-1])
    return s if mult == 1.0 else s * mult


class Attention(nn.Module):
    """Causal softmax attention (SDPA). The variants below change `mix` (how the heads' values are
    combined) or gate the output; `pattern` is the weight each query puts on each key, what the
    probe's sink metrics read (study.sinks): `pattern(q, k) @ v` is `mix`'s output over the
    sequence's own keys."""

    reads = ("qkv",)  # the maps that read the normalised input (study.invariance rotates them)
    logit_mult = 1.0
    """Multiplies the logits q.k / sqrt(D): muP sets sqrt(D0 / D) (Transformer), SP leaves 1."""

    def __init__(self, d_model: int, n_heads: int, dtype: torch.dtype, cfg: AttentionConfig = AttentionConfig()):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = linear(d_model, 3 * d_model, dtype)  # reads the normalised input
        self.proj = linear(d_model, d_model, dtype)  # writes towards the residual stream

    def heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """qkv's output (B, T, 3C) -> q, k, v, each (B, H, T, D)."""
        B, T, C3 = qkv.shape
        return tuple(t.view(B, T, self.n_heads, C3 // (3 * self.n_heads)).transpose(1, 2) for t in qkv.split(C3 // 3, dim=2))

    def scale(self, q: Tensor) -> float | None:
        """SDPA's scale: None (its 1/sqrt(D)) unless logit_mult changes it."""
        return None if self.logit_mult == 1.0 else self.logit_mult / math.sqrt(q.shape[-1])

    def mix(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale(q))  # (B, H, T, D)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Causal logits: keys after the query at -inf, (B, H, T, T)."""
        s = logits(q, k, self.logit_mult)
        T = s.shape[-1]
        return s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), -math.inf)

    def pattern(self, q: Tensor, k: Tensor) -> Tensor:
        return self.scores(q, k).softmax(-1)  # (B, H, T, T), at least float32

    def forward(self, x: Tensor) -> Tensor:
        y = self.mix(*self.heads(self.qkv(x)))  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(x.shape))  # (B, T, C)


class ExtraKeyAttention(Attention):
    """softmax1: every query also sees one key with logit 0 and value 0 (SDPA over T + 1 keys)."""

    def extra(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """The extra key and value, each (B, H, 1, D)."""
        zero = q.new_zeros(q.shape[0], q.shape[1], 1, q.shape[3])
        return zero, zero

    def mix(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k0, v0 = self.extra(q)
        T = q.shape[2]
        visible = torch.ones(T, T + 1, dtype=torch.bool, device=q.device).tril(1)  # key 0 = the extra: seen by all
        return F.scaled_dot_product_attention(q, torch.cat([k0.to(k.dtype), k], 2), torch.cat([v0.to(v.dtype), v], 2),
                                              attn_mask=visible, scale=self.scale(q))  # (B, H, T, D)

    def pattern(self, q: Tensor, k: Tensor) -> Tensor:
        extra = logits(q, self.extra(q)[0].to(q.dtype), self.logit_mult)  # (B, H, T, 1)
        return torch.cat([extra, self.scores(q, k)], -1).softmax(-1)[..., 1:]  # the sequence's keys only


class KVBiasAttention(ExtraKeyAttention):
    """kv_bias: the extra key and value are learned, one of each per head (Sun et al. 2024)."""

    def __init__(self, d_model: int, n_heads: int, dtype: torch.dtype, cfg: AttentionConfig = AttentionConfig()):
        super().__init__(d_model, n_heads, dtype, cfg)
        self.key_bias = nn.Parameter(torch.zeros(d_model, dtype=dtype))  # (H x D): vectors, so no weight decay
        self.value_bias = nn.Parameter(torch.zeros(d_model, dtype=dtype))

    def extra(self, q: Tensor) -> tuple[Tensor, Tensor]:
        B, H, _, D = q.shape
        return (self.key_bias.view(1, H, 1, D).expand(B, H, 1, D), self.value_bias.view(1, H, 1, D).expand(B, H, 1, D))


class GatedAttention(Attention):
    """gated: each head's output times sigmoid(x W_g^T), elementwise, from the normalised input x
    (Qiu et al. 2025's G1: after SDPA, before the output projection)."""

    reads = ("qkv", "gate")

    def __init__(self, d_model: int, n_heads: int, dtype: torch.dtype, cfg: AttentionConfig = AttentionConfig()):
        super().__init__(d_model, n_heads, dtype, cfg)
        self.gate = linear(d_model, d_model, dtype)  # reads the normalised input, as qkv does

    def forward(self, x: Tensor) -> Tensor:
        y = self.mix(*self.heads(self.qkv(x))).transpose(1, 2).reshape(x.shape)  # (B, T, C): heads side by side
        return self.proj(y * torch.sigmoid(self.gate(x)))  # (B, T, C)


class ClippedAttention(Attention):
    """clipped: p = clip((zeta - gamma) softmax + gamma, 0, 1), explicit (Bondarenko et al. 2023)."""

    def __init__(self, d_model: int, n_heads: int, dtype: torch.dtype, cfg: AttentionConfig = AttentionConfig(name="clipped")):
        super().__init__(d_model, n_heads, dtype, cfg)
        self.zeta, self.gamma = cfg.zeta, cfg.gamma

    def pattern(self, q: Tensor, k: Tensor) -> Tensor:
        return ((self.zeta - self.gamma) * self.scores(q, k).softmax(-1) + self.gamma).clamp(0.0, 1.0)

    def mix(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.pattern(q, k).to(v.dtype) @ v  # (B, H, T, D)


ATTENTIONS: dict[str, type[Attention]] = {"softmax": Attention, "softmax1": ExtraKeyAttention, "kv_bias": KVBiasAttention,
                                          "gated": GatedAttention, "clipped": ClippedAttention}


class MLP(nn.Module):
    def __init__(self, d_model: int, d_mlp: int, dtype: torch.dtype):
        super().__init__()
        self.fc = linear(d_model, d_mlp, dtype)  # reads the normalised input
        self.act = nn.GELU()  # its output is the neuron-basis activation
        self.proj = linear(d_mlp, d_model, dtype)  # writes towards the residual stream

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))  # (B, T, C) -> (B, T, F) -> (B, T, C)


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_mlp: int, norm: str, rotations: tuple[Tensor | None, Tensor | None],
                 dtype: torch.dtype, attention: AttentionConfig = AttentionConfig()):
        super().__init__()
        r_attn, r_mlp = rotations
        self.read_attn, self.write_attn = read_write(r_attn, dtype)
        self.attn_norm = NORMS[norm](d_model, dtype)
        self.attn = ATTENTIONS[attention.name](d_model, n_heads, dtype, attention)
        self.read_mlp, self.write_mlp = read_write(r_mlp, dtype)
        self.mlp_norm = NORMS[norm](d_model, dtype)
        self.mlp = MLP(d_model, d_mlp, dtype)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.write_attn(self.attn(self.attn_norm(self.read_attn(x))))  # (B, T, C)
        x = x + self.write_mlp(self.mlp(self.mlp_norm(self.read_mlp(x))))  # (B, T, C)
        return x


# ---- model --------------------------------------------------------------------------------


class Transformer(nn.Module):
    """Pre-norm GPT. `plan` is rotation.build_plan's output (None: no rotations anywhere)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_mlp: int,
        norm: str = "layernorm",
        attention: AttentionConfig | str = "softmax",
        plan: Plan | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        mup_base_width: int | None = None,
    ):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {sorted(NORMS)}, not {norm!r}")
        attention = AttentionConfig.model_validate(attention)
        plan = plan if plan is not None else Plan.identity(n_layers)
        if len(plan.blocks) != n_layers:
            raise ValueError(f"rotation plan has {len(plan.blocks)} blocks for {n_layers} blocks")
        self.seq_len = seq_len
        self.tok_emb = skip_init(nn.Embedding, vocab_size, d_model, dtype=dtype)
        self.pos_emb = skip_init(nn.Embedding, seq_len, d_model, dtype=dtype)
        self.write_emb = read_write(plan.embed, dtype)[1]  # Rotate(R_e^T) or Identity
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_mlp, norm, plan.blocks[l], dtype, attention)
                                    for l in range(n_layers))
        self.read_out = read_write(plan.unembed, dtype)[0]  # Rotate(R_u) or Identity
        self.final_norm = NORMS[norm](d_model, dtype)
        self.unembed = linear(d_model, vocab_size, dtype)
        # muP (None: SP): width multiplier, output multiplier 1 / m, attention logits sqrt(D0 / D)
        self.width_mult = 1.0 if mup_base_width is None else d_model / mup_base_width
        self.output_mult = 1.0 / self.width_mult
        if mup_base_width is not None:
            if mup_base_width % n_heads:
                raise ValueError(f"mup_base_width ({mup_base_width}) must be divisible by n_heads ({n_heads})")
            for block in self.blocks:
                block.attn.logit_mult = math.sqrt((mup_base_width // n_heads) / (d_model // n_heads))
        self.init_weights(generator_for(seed, "init"))

    @classmethod
    def from_config(cls, cfg: TrialConfig, dtype: torch.dtype = torch.float32) -> Transformer:
        """The trial's model: shape, norm, rotation plan and init, all from cfg (seed included)."""
        m = cfg.model
        plan = build_plan(cfg.rotation, m.n_layers, m.d_model, cfg.seed)
        return cls(vocab_size=cfg.vocab_size, seq_len=cfg.data.seq_len, d_model=m.d_model, n_layers=m.n_layers,
                   n_heads=m.n_heads, d_mlp=m.d_mlp, norm=cfg.norm, attention=cfg.attention, plan=plan, seed=cfg.seed,
                   dtype=dtype, mup_base_width=m.mup_base_width if m.parametrization == "mup" else None)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """GPT-2 init: N(0, 0.02) everywhere, write maps (attn/mlp proj) N(0, 0.02 / sqrt(2 L)); norms 1/0.
        muP: hidden matrices' std / sqrt(width_mult) (1/fan_in variance across widths).

        Draws in float64 on the CPU from `generator`, in a fixed order, then copies in: an
        attention variant's own parameters (gate, key/value bias) last, so that every variant of
        one seed starts from the same weights everywhere else.
        """
        out_std = 0.02 / math.sqrt(2 * len(self.blocks))
        own = lambda name: ".attn." in name and not name.endswith(("qkv.weight", "proj.weight"))  # noqa: E731
        for name, p in sorted(self.named_parameters(), key=lambda np_: own(np_[0])):  # stable: the order otherwise kept
            if "norm" in name:
                p.fill_(0.0 if name.endswith("bias") else 1.0)
                continue
            std = out_std if name.endswith("proj.weight") else 0.02
            if mup_role(name, p) == "hidden":
                std = std / math.sqrt(self.width_mult)  # SP: / 1.0, exact
            p.copy_(torch.empty(p.shape, dtype=torch.float64).normal_(0.0, std, generator=generator))

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count; non_embedding drops token/position embeddings and the unembedding."""
        skip = {"tok_emb.weight", "pos_emb.weight", "unembed.weight"} if non_embedding else set()
        return sum(p.numel() for n, p in self.named_parameters() if n not in skip)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        B, T = idx.shape
        if T > self.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's {self.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.write_emb(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C): layer 0 of the residual stream
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        logits = self.unembed(self.final_norm(self.read_out(x)))  # (B, T, V)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        if self.output_mult != 1.0:  # muP's 1 / m
            logits = logits * self.output_mult
        loss = None if targets is None else F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))
        return logits, loss
