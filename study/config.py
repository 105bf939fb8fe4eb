"""TrialConfig: everything that defines one trial, typed, frozen and JSON round-trippable.

Choices are strings (`Literal[...]`) mapped to classes in one place each (model.NORMS, the
optimiser registry in study/optim/, rotation.build_plan). The optimiser's config is its own
module's class (`OptimizerConfig` chooses it by name: study/optim/registry.py). `trial_id` hashes the canonical JSON
of the fields that change a result; `runtime` (device, threads, compile) is excluded.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, ClassVar, Literal

from pydantic import Field, SerializeAsAny, model_validator

from resultstore.ids import canonical_json, digest, science_hash
from resultstore.schema import Role, runs_columns as schema_columns
from study.attention import AttentionConfig
from study.frozen import INT64_MAX, FieldError, _Frozen, string_is, without_new_defaults  # noqa: F401  (re-exported)
from study.optim.registry import OPTIMIZERS, OptimizerConfig, optimizer_family, optimizer_names, runs_columns

__all__ = [
    "NormName", "OptimizerName", "RotationMode", "INT64_MAX", "FieldError", "without_new_defaults",
    "ModelConfig", "AttentionConfig", "RotationConfig", "OptimizerConfig", "DataConfig", "EvalBatchConfig",
    "TrainConfig", "RuntimeConfig", "TrialConfig",
]

NormName = Literal["layernorm", "rmsnorm", "rmsnorm_scalar"]
OptimizerName = Literal[optimizer_names()]  # the registry's names (study/optim/), in order
RotationMode = Literal["none", "shared", "independent", "partial", "groups"]


class ModelConfig(_Frozen):
    """Transformer shape. `{depth: n}` is shorthand for d_model = 64 n, n_layers = n_heads = n."""

    d_model: int = Field(gt=0)
    """Width of the residual stream."""
    n_layers: int = Field(gt=0)
    """Number of transformer blocks."""
    n_heads: int = Field(gt=0)
    """Attention heads per block; must divide d_model."""
    d_mlp: int = Field(default=0, ge=0)
    """MLP hidden width; 0 means 4 x d_model."""
    parametrization: Literal["sp", "mup"] = "sp"
    """sp: standard (GPT-2 init, every parameter at the one lr); mup: the maximal-update
    parameterisation relative to a base model of width mup_base_width (study.model.Transformer's
    docstring says which variant; study/optim/rules/groups.py the lr multipliers), so that an lr
    tuned at one width transfers to another."""
    mup_base_width: int = Field(default=64, gt=0)
    """mup: the base model's d_model (same depth, heads and d_mlp / d_model), at which mup is sp
    exactly; the width multiplier is m = d_model / mup_base_width."""

    id_optional: ClassVar[tuple[str, ...]] = ("parametrization", "mup_base_width")

    @model_validator(mode="before")
    @classmethod
    def _expand_depth(cls, data: Any) -> Any:
        if isinstance(data, dict) and "depth" in data:
            data = dict(data)
            depth = data.pop("depth")
            if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
                raise FieldError("depth", f"depth must be a positive integer, got {depth!r}")
            data.setdefault("d_model", 64 * depth)
            data.setdefault("n_layers", depth)
            data.setdefault("n_heads", depth)
        return data

    @model_validator(mode="after")
    def _check_shape(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise FieldError("n_heads", f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.d_mlp == 0:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        if self.parametrization == "sp" and self.mup_base_width != type(self).model_fields["mup_base_width"].default:
            raise FieldError("mup_base_width", "mup_base_width applies to parametrization mup only")
        if self.parametrization == "mup" and self.mup_base_width % self.n_heads:
            raise FieldError("mup_base_width", f"mup_base_width ({self.mup_base_width}) must be divisible by n_heads "
                             f"({self.n_heads}): the base model has the same heads, each mup_base_width / n_heads wide")
        return self

    @property
    def width_mult(self) -> float:
        """muP's width multiplier m = d_model / mup_base_width; 1 under sp."""
        return self.d_model / self.mup_base_width if self.parametrization == "mup" else 1.0


class RotationConfig(_Frozen):
    """Rotation plan between the residual stream and each layer's computation basis.

    A bare string (`none`, `shared`, `independent`) is accepted as `{mode: ...}`.
    """

    mode: RotationMode = "none"
    """none: R = I; shared: one R for every read; independent: one R per read;
    partial: consecutive blocks in groups of `group_size` share one R; groups: explicit."""
    group_size: int | None = Field(default=None, gt=0)
    """Blocks per shared-basis group (mode partial only)."""
    groups: tuple[tuple[int, ...], ...] | None = None
    """Explicit lists of 0-based block indices that share one R (mode groups only)."""
    embeddings: bool = True
    """Rotate the ends too: embeddings write through R^T, final norm + unembedding read x R (shared:
    the one R; other modes: a basis each). false leaves them in the residual basis (an ablation)."""
    ends: Literal["own", "group"] = "own"
    """With the ends rotated, their bases: own (a basis each, not any block's) or group (the
    embeddings write in the first block's basis, the unembedding reads in the last block's), so
    that partial with group_size = n_layers is exactly `shared` (the sharing study's control)."""

    id_optional: ClassVar[tuple[str, ...]] = ("ends",)
    _from_string = string_is("mode")

    @model_validator(mode="after")
    def _check_mode(self) -> RotationConfig:
        if self.mode == "partial" and self.group_size is None:
            raise ValueError("mode partial needs group_size")
        if self.mode != "partial" and self.group_size is not None:
            raise ValueError(f"group_size only applies to mode partial, not {self.mode}")
        if self.mode == "groups" and not self.groups:
            raise ValueError("mode groups needs groups: a list of block-index lists")
        if self.mode != "groups" and self.groups is not None:
            raise ValueError(f"groups only applies to mode groups, not {self.mode}")
        if self.mode == "none" and not self.embeddings:
            raise ValueError("embeddings: false needs a rotation (mode none rotates nothing)")
        if self.ends == "group" and self.mode in ("none", "shared"):
            raise FieldError("ends", f"ends: group needs mode partial, independent or groups ({self.mode} "
                             f"{'rotates nothing' if self.mode == 'none' else 'already puts its ends in its one basis'})")
        if self.ends == "group" and not self.embeddings:
            raise FieldError("ends", "ends: group rotates the ends, embeddings: false leaves them unrotated")
        if self.groups is not None:
            if not all(self.groups):
                raise FieldError("groups", "every group needs at least one block index")
            flat = [b for g in self.groups for b in g]
            if len(flat) != len(set(flat)) or any(b < 0 for b in flat):
                raise ValueError("groups must list distinct, non-negative block indices")
        return self

    @property
    def label(self) -> str:
        """Short human label: none, shared, independent, partial(2), groups[[0,1],[2]]; with
        embeddings false, `-noemb` appended (shared-noemb); with ends group, `-groupends`."""
        if self.mode == "partial":
            label = f"partial({self.group_size})"
        elif self.mode == "groups":
            label = "groups" + json.dumps([list(g) for g in self.groups or ()], separators=(",", ":"))
        else:
            label = self.mode
        if self.ends == "group":
            return label + "-groupends"
        return label if self.embeddings else label + "-noemb"


class DataConfig(_Frozen):
    """Training corpus: exactly one of `corpus: stdlib`, `text: PATH`, `tokens: PATH`. Values
    only: the corpus itself is checked, and a prepared folder's vocab_size read from its
    manifest, by study.data.check_corpus."""

    corpus: Literal["stdlib"] | None = None
    """The embedded default: the Python standard library's .py sources, byte-level."""
    text: str | None = None
    """A text file or a folder of text files, byte-level (vocab 256)."""
    tokens: str | None = None
    """A folder from `sweep data prepare` (manifest.json + shards), or a uint16/uint32 .bin / .npy memmap."""
    vocab_size: int | None = Field(default=None, gt=0)
    """Vocabulary size: required with a .bin/.npy file, read from a prepared folder's manifest, 256 otherwise."""
    seq_len: int = Field(default=128, gt=0)
    """Training context length."""
    val_fraction: float = Field(default=0.05, gt=0, lt=1)
    """Held-out share (by file for stdlib/text folders, the tail of a token file; a prepared folder has its own split)."""

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        sources = [s for s in ("corpus", "text", "tokens") if getattr(self, s) is not None]
        if not sources:
            object.__setattr__(self, "corpus", "stdlib")
        elif len(sources) > 1:
            raise ValueError(f"give exactly one of corpus, text, tokens (got {', '.join(sources)})")
        if self.tokens is None:
            if self.vocab_size not in (None, 256):
                raise FieldError("vocab_size", f"byte-level corpora have vocab_size 256, got {self.vocab_size}")
            object.__setattr__(self, "vocab_size", 256)
        return self

    @property
    def source(self) -> str:
        """A short description: stdlib, text:PATH or tokens:PATH."""
        if self.text is not None:
            return f"text:{self.text}"
        if self.tokens is not None:
            return f"tokens:{self.tokens}"
        return "stdlib"


class EvalBatchConfig(_Frozen):
    """The fixed held-out batch every probe and val loss is measured on."""

    sequences: int = Field(default=16, gt=0)
    """Number of held-out sequences."""
    seq_len: int | None = Field(default=None, gt=0)
    """Length of each; defaults to the training seq_len."""


class TrainConfig(_Frozen):
    """Length, batch, schedule and the cadence of evals and checkpoints."""

    id_optional: ClassVar[tuple[str, ...]] = ("attribution_every",)

    steps: int | None = Field(default=None, gt=0)
    """Optimiser steps (give one of steps, tokens, tokens_per_param)."""
    tokens: int | None = Field(default=None, gt=0)
    """Training tokens; steps = ceil(tokens / (batch_size x seq_len))."""
    tokens_per_param: float | None = Field(default=None, gt=0)
    """Tokens per non-embedding parameter (Chinchilla ~20)."""
    batch_size: int = Field(default=32, gt=0)
    """Sequences per step."""
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup."""
    warmup: float = Field(default=0.02, ge=0)
    """Warmup length: a fraction of steps if < 1, else a number of steps."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """Final lr as a fraction of the peak (cosine, linear)."""
    grad_clip: float = Field(default=1.0, ge=0)
    """Global grad-norm clip; 0 disables."""
    eval_every: int = Field(default=100, gt=0)
    """Steps between probes/evals (the final step is always evaluated)."""
    eval_batch: EvalBatchConfig = EvalBatchConfig()
    """The fixed held-out eval batch."""
    checkpoint_every: int = Field(default=500, ge=0)
    """Steps between checkpoints; 0 disables (the final state is still not saved)."""
    invariance_check: bool = True
    """At the end, rotate the residual basis and record the loss change (checks table)."""
    quant_every: int = Field(default=0, ge=0)
    """Quantisation cost (W8A8, W4A4 loss deltas) at every quant_every-th eval too; 0: final eval only."""
    attribution_every: int = Field(default=0, ge=0)
    """Outlier-dimension attribution and ablation (dims table) at every attribution_every-th eval
    too; 0: final eval only."""
    diverge_factor: float = Field(default=4.0, gt=1)
    """Loss above diverge_factor x the initial loss (or non-finite) marks the run diverged."""

    @model_validator(mode="after")
    def _one_length(self) -> TrainConfig:
        given = [f for f in ("steps", "tokens", "tokens_per_param") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of steps, tokens, tokens_per_param (got {given or 'none'})")
        return self


class RuntimeConfig(_Frozen):
    """Where and how the trial runs. Not part of trial_id: it does not change the science."""

    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """auto (cuda if available), cpu, cuda, cuda:N."""
    num_threads: int = Field(default=0, ge=0)
    """torch CPU threads; 0 leaves torch's default."""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile the model: true, false, or auto (CUDA trials from study.device.COMPILE_MIN_PARAMS up)."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """Autocast: auto is bf16 on CUDA and fp32 on CPU; bf16 forces it on CPU too; fp32 is full fp32
    everywhere (no autocast, and no TF32 matmuls on CUDA)."""
    gpu_fraction: float | None = Field(default=None, gt=0, le=1)
    """This trial's share of one GPU (Ray's fractional gpu); caps its CUDA memory at that fraction."""


class TrialConfig(_Frozen):
    """One trial: a model, norm, rotation plan, optimiser, data, schedule and seed."""

    model: ModelConfig
    """Transformer shape."""
    norm: NormName = "layernorm"
    """Normalisation before each read and at the end."""
    attention: AttentionConfig = AttentionConfig()
    """The attention every block computes (study.attention): softmax, softmax1, kv_bias, gated, clipped."""
    rotation: RotationConfig = RotationConfig()
    """Rotation plan between the residual stream and each layer's computation basis."""
    optimizer: SerializeAsAny[OptimizerConfig]
    """Optimiser and hyper-parameters: the named optimiser's config class (study/optim/)."""
    data: DataConfig = DataConfig()
    """Corpus and context length."""
    train: TrainConfig
    """Length, batch, schedule, evals, checkpoints."""
    seed: int = Field(default=0, ge=0)
    """Seeds init, data order and every random basis."""
    sweep: str = "adhoc"
    """Name of the sweep this trial belongs to (not part of trial_id)."""
    runtime: RuntimeConfig = RuntimeConfig()
    """Device and threads (not part of trial_id)."""

    id_optional: ClassVar[tuple[str, ...]] = ("attention",)

    @model_validator(mode="after")
    def _check_cross(self) -> TrialConfig:
        r, n = self.rotation, self.model.n_layers
        if r.mode == "partial" and r.group_size is not None and r.group_size > n:
            raise FieldError("rotation.group_size", f"rotation.group_size ({r.group_size}) must be in 1..n_layers ({n})")
        if r.groups is not None and any(b >= n for g in r.groups for b in g):
            raise FieldError("rotation.groups", f"rotation.groups index out of range 0..{n - 1}")
        if self.model.parametrization == "mup" and OPTIMIZERS[self.optimizer.name].mup is None:
            raise FieldError("model.parametrization", f"mup is not defined for {self.optimizer.name}")
        check = OPTIMIZERS[self.optimizer.name].trial_check
        if check is not None and (problem := check(self)) is not None:
            raise FieldError(*problem)
        if self.eval_seq_len > self.data.seq_len:
            raise FieldError("train.eval_batch.seq_len",
                             f"train.eval_batch.seq_len ({self.eval_seq_len}) exceeds data.seq_len ({self.data.seq_len})")
        return self

    # ---- identity -------------------------------------------------------------------------

    def science_json(self) -> str:
        """Canonical JSON of everything that changes a result."""
        return self._canonical(exclude={"runtime", "sweep"})

    def config_json(self) -> str:
        """The whole config as JSON (the runs column `config_json`; `model_validate_json` reads it
        back), without new fields at their defaults, as the ids hash it."""
        return self._canonical(exclude=set())

    def _canonical(self, exclude: set[str]) -> str:
        return canonical_json(self._payload(exclude))

    def _payload(self, exclude: set[str]) -> dict:
        return without_new_defaults(self, self.model_dump(mode="json", exclude=exclude))

    # Cached: a 10,000-trial plan asks each id several times. model_copy drops the cache, since
    # an update may change what the ids hash.
    @functools.cached_property
    def trial_id(self) -> str:
        """12-hex-digit hash of science_json()."""
        return digest(self.science_json())

    @functools.cached_property
    def config_id(self) -> str:
        """12-hex-digit hash of science_json() without the seed: the seeds of one config share
        it, and every seed aggregate groups by it (never by a hand-picked column list)."""
        return science_hash(self._payload(exclude=set()))  # analysis hashes config_json with the same function

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> TrialConfig:
        copy = super().model_copy(update=update, deep=deep)
        for cached in ("trial_id", "config_id"):
            copy.__dict__.pop(cached, None)
        return copy

    # ---- sizes ----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        if self.data.vocab_size is None:  # a prepared folder's, before study.data.check_corpus read it
            raise ValueError(f"data.tokens {self.data.tokens}: vocab_size unknown until the corpus is checked "
                             "(study.data.check_corpus reads it from the manifest)")
        return self.data.vocab_size

    @property
    def params_non_embedding(self) -> int:
        """Exact count of block + final-norm parameters (no token/position embedding, no unembed)."""
        d, f = self.model.d_model, self.model.d_mlp
        norm = {"layernorm": 2 * d, "rmsnorm": d, "rmsnorm_scalar": 1}[self.norm]
        block = 2 * norm + 4 * d * d + 2 * d * f + self.attention.extra_params(d)  # norms, qkv + out, mlp, the variant's own
        return self.model.n_layers * block + norm

    @property
    def params(self) -> int:
        """Exact total: non-embedding + token embedding + position embedding + unembedding."""
        d = self.model.d_model
        return self.params_non_embedding + 2 * self.vocab_size * d + self.data.seq_len * d

    @property
    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 (N_nonemb + d V) + 6 L (T + e) d (attention scores over T keys
        and the variant's e extra ones, causal not discounted; Kaplan et al. 2020 / PaLM convention)."""
        m, keys = self.model, self.data.seq_len + self.attention.extra_keys
        return 6.0 * (self.params_non_embedding + m.d_model * self.vocab_size) + 6.0 * m.n_layers * keys * m.d_model

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.data.seq_len

    @property
    def total_steps(self) -> int:
        """Optimiser steps, resolved from steps, tokens or tokens_per_param."""
        t = self.train
        if t.steps is not None:
            return t.steps
        tokens = t.tokens if t.tokens is not None else t.tokens_per_param * self.params_non_embedding
        return max(1, math.ceil(tokens / self.tokens_per_step))

    @property
    def total_tokens(self) -> int:
        return self.total_steps * self.tokens_per_step

    @property
    def warmup_steps(self) -> int:
        w = self.train.warmup
        return int(round(w * self.total_steps)) if w < 1 else int(w)

    @property
    def eval_seq_len(self) -> int:
        return self.train.eval_batch.seq_len or self.data.seq_len

    def flat(self) -> dict[str, Any]:
        """The grid axes as flat columns for the runs table."""
        o = self.optimizer
        out = {
            "config_id": self.config_id,
            "d_model": self.model.d_model, "n_layers": self.model.n_layers,
            "n_heads": self.model.n_heads, "d_mlp": self.model.d_mlp,
            "parametrization": self.model.parametrization,
            "mup_base_width": self.model.mup_base_width if self.model.parametrization == "mup" else None,
            "params": self.params, "params_non_embedding": self.params_non_embedding,
            "flops_per_token": self.flops_per_token,
            "optimizer": o.name, "optimizer_family": optimizer_family(o, self.norm), "lr": o.lr, "weight_decay": o.weight_decay,
            **runs_columns(o),  # momentum .. muon_ends, as the optimiser's config fills them
            "norm": self.norm, "attention": self.attention.label, "rotation": self.rotation.mode,
            "group_size": self.rotation.group_size,
            "rotation_groups": (json.dumps([list(g) for g in self.rotation.groups], separators=(",", ":"))
                                if self.rotation.groups is not None else None),
            "rotation_label": self.rotation.label,
            "rotate_embeddings": self.rotation.embeddings if self.rotation.mode != "none" else None,
            "seed": self.seed, "corpus": self.data.source, "seq_len": self.data.seq_len,
            "batch_size": self.train.batch_size,
        }
        # An axis column the lines above do not fill (an axis added later, sweep.axes) holds the
        # field of its name (its label where it has one), its own or its model, data or train
        # part's, as an optimiser's hyper-parameter column holds its config's field of that name.
        for column in schema_columns(Role.AXIS):
            part = next((p for p in (self, self.model, self.data, self.train) if column in type(p).model_fields), None)
            if part is not None and column not in out:
                out[column] = getattr(getattr(part, column), "label", getattr(part, column))
        return out
