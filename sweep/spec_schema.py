"""The sweep spec's sections as typed, frozen configs: SweepSpec and what it holds (the grid with
its ladders, the size rules, resources). Values only; sweep.spec reads and checks a spec."""

from __future__ import annotations

import functools
import itertools
import math
import re
import typing
from typing import Any, ClassVar, Literal

from pydantic import Field, SerializeAsAny, create_model, field_validator, model_validator

from study.config import DataConfig, FieldError, OptimizerConfig, TrainConfig, _Frozen
from study.optim.registry import OPTIMIZERS
from sweep.axes import Axis, grid_axes, replicate
from sweep.bounds import grid_points_problem, share_problem

__all__ = [
    "MAX_GPUS_PER_TRIAL", "BatchScaling", "Grid", "LrScaling", "OptimizerEntry", "ResourceOverride", "Resources",
    "SweepSpec", "TrainSpec", "expand_ladders",
]

MAX_GPUS_PER_TRIAL = 16
"""A trial runs on one node, and the largest nodes hold 8 (HGX) to 16 GPUs."""


class _Spec(_Frozen):
    """Spec sections share the configs' strictness (finite floats, no bools for numbers, int64)."""


def _tuple_valued(field: str) -> bool:
    """Is `field` a tuple (betas) for any optimiser that has it?"""
    infos = [e.config.model_fields[field] for e in OPTIMIZERS.values() if field in e.config.model_fields]
    return any(typing.get_origin(info.annotation) in (tuple, list) for info in infos)


def expand_ladders(entries: Any) -> tuple[Any, list[tuple[int, dict[str, int]]]]:
    """grid.optimizer entries -> one entry per ladder point, and for each its source: (entry
    index, {field: index in that field's list}). A field's value is a ladder when it is a list,
    except for tuple-valued fields (betas), whose ladder is a list of lists. Several ladders in
    one entry give their cartesian product, in field order, the last varying fastest."""
    if not isinstance(entries, list):
        return entries, []
    out, sources = [], []
    for i, entry in enumerate(entries):
        ladders = _ladders(entry)
        if not ladders:
            out.append(entry)
            sources.append((i, {}))
            continue
        for picks in itertools.product(*(range(len(v)) for v in ladders.values())):
            out.append({**entry, **{k: ladders[k][j] for k, j in zip(ladders, picks)}})
            sources.append((i, dict(zip(ladders, picks))))
    return out, sources


def _ladders(entry: Any) -> dict[str, list]:
    """The fields of one grid.optimizer entry that are ladders: {field: its values}."""
    if not isinstance(entry, dict):
        return {}
    return {key: value for key, value in entry.items() if isinstance(value, list) and value and (
        not _tuple_valued(key) or all(isinstance(v, (list, tuple)) for v in value))}


def _points(data: dict) -> dict[str, int]:
    """{axis: its number of values} of a grid as written, ladders counted, not expanded."""
    lengths = {}
    for a in grid_axes():
        value = data.get(a.key, [None])
        if a.ladders and isinstance(value, list):
            lengths[a.key] = sum(math.prod(len(v) for v in _ladders(entry).values()) for entry in value)
        else:
            lengths[a.key] = len(value) if isinstance(value, list) else 1
    return lengths


def _fraction(value: Any) -> Any:
    """`2/3` as written in YAML (a string) -> 0.666...; anything else unchanged."""
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+(\.\d+)?\s*/\s*\d+(\.\d+)?\s*", value):
        top, bottom = (float(part) for part in value.split("/"))
        if bottom == 0:
            raise ValueError(f"a fraction with denominator 0: {value.strip()}")
        return top / bottom
    return value


class _SizeRule(_Spec):
    """A hyper-parameter that follows a power of the model size: value x (N / reference_params)
    ** exponent, N = the trial's non-embedding parameters."""

    reference_params: float = Field(gt=0)
    """N0: the non-embedding parameter count at which the written value holds."""
    exponent: float
    """b: the power of N / N0 (a number, or a fraction such as 2/3 or -1/3)."""

    @field_validator("exponent", mode="before")
    @classmethod
    def _read_fraction(cls, value: Any) -> Any:
        return _fraction(value)

    def factor(self, params_non_embedding: int) -> float:
        """(N / N0) ** b; inf where that overflows (the callers refuse it at their field)."""
        try:
            return (params_non_embedding / self.reference_params) ** self.exponent
        except OverflowError:
            return math.inf


class LrScaling(_SizeRule):
    """lr per model size: the entry's lr x (params_non_embedding / reference_params) ** exponent,
    a fitted lr*(N) = lr0 (N / N0)^b (`sweep report` of an lr-ladder sweep writes N0, lr0 and b
    to lr_fit.csv as reference_params, lr_at_reference and exponent; lr0 is the entry's lr).
    Porian et al. 2024 and DeepSeek LLM (2024) find the optimal AdamW lr falls with size (b < 0);
    OLMo's ladder uses lr ~ N^(-1/3)."""


class BatchScaling(_SizeRule):
    """Batch per model size: train.batch_size x (params_non_embedding / reference_params) **
    exponent sequences, rounded to a multiple of `multiple` (at least one). The published rule:
    DeepSeek LLM (2024) fits the optimal batch B ~ C^0.327 in compute C; at a fixed number of
    tokens per parameter C ~ N^2, so B ~ N^0.65, the exponent 2/3 of OLMo's ladder."""

    multiple: int = Field(default=8, gt=0)
    """The batch is a multiple of this (8: tensor-core and data-parallel friendly)."""
    max_batch_size: int | None = Field(default=None, gt=0)
    """At most this many sequences (a trial has no gradient accumulation: the batch must fit one
    device); none: no cap."""

    def batch(self, base: int, params_non_embedding: int) -> int:
        b = max(self.multiple, round(base * self.factor(params_non_embedding) / self.multiple) * self.multiple)
        return b if self.max_batch_size is None else min(b, self.max_batch_size)


class TrainSpec(TrainConfig):
    """The spec's `train:` section: a TrainConfig, plus rules that scale the batch and warmup with
    model size. They are resolved per trial, so every TrialConfig holds plain numbers."""

    batch_scaling: BatchScaling | None = None
    """Scale batch_size with model size (BatchScaling); none: every size trains at batch_size."""
    warmup_tokens_per_param: float | None = Field(default=None, gt=0)
    """Warmup of this many tokens per non-embedding parameter, in whole steps (at least one),
    replacing `warmup`. Porian et al. 2024 ("Resolving discrepancies in compute-optimal scaling")
    name a warmup too long for small models as one cause of Kaplan's exponent and set warmup to
    N tokens (1 per parameter)."""

    def plain(self) -> TrainConfig:
        """The TrainConfig without the size rules (as written: the reference size's values)."""
        return TrainConfig.model_validate(self.model_dump(exclude={"batch_scaling", "warmup_tokens_per_param"}))


class OptimizerEntry(OptimizerConfig):
    """A grid optimizer entry: the named optimiser's config, plus an optional lr rule over model
    size (validating against this class gives the named optimiser's entry class)."""

    chooses_by_name: ClassVar[bool] = True
    lr_scaling: LrScaling | None = None
    """{reference_params: N0, exponent: b}: the trial's lr is lr x (params_non_embedding / N0) ** b."""

    @classmethod
    def chosen(cls, config: type[OptimizerConfig]) -> type[OptimizerConfig]:
        return _entry_class(config)

    def plain(self) -> OptimizerConfig:
        """The optimiser's config without the rule (lr as written, at the reference size)."""
        return OptimizerConfig.model_validate(self.model_dump(exclude={"lr_scaling"}))


@functools.cache
def _entry_class(config: type[OptimizerConfig]) -> type[OptimizerEntry]:
    """`config` with the entry's lr rule: e.g. AdamConfigEntry(AdamConfig, OptimizerEntry)."""
    return type(f"{config.__name__}Entry", (config, OptimizerEntry), {"__module__": __name__, "__doc__": config.__doc__})


def _item(a: Axis) -> Any:
    """One value's type on the grid: an optimiser's config is written as an entry (its lr rule)."""
    return SerializeAsAny[OptimizerEntry] if a.type is OptimizerConfig else a.type


class _GridChecks(_Spec):
    """Axes of the cartesian product (sweep.axes.AXES); each is a list. At most
    sweep.bounds.MAX_GRID_POINTS (100,000) points in all, ladders expanded: the product of the
    axes' lengths is checked before any point is built."""

    @model_validator(mode="before")
    @classmethod
    def _expand_ladders(cls, data: Any) -> Any:
        if isinstance(data, dict):  # its size from the axes' lengths, before any list of points is built
            problem = grid_points_problem(_points(data))
            if problem:
                raise ValueError(problem)
            for a in grid_axes():
                if a.ladders and a.key in data:
                    data = {**data, a.key: expand_ladders(data[a.key])[0]}
        return data

    @model_validator(mode="after")
    def _seeds(self) -> Any:
        seeds = getattr(self, replicate().key)
        if any(s < 0 for s in seeds):
            raise FieldError(replicate().key, "seeds must be >= 0")
        if len(set(seeds)) != len(seeds):
            raise FieldError(replicate().key, "seeds must be distinct")
        return self


Grid = create_model(
    "Grid", __base__=_GridChecks, __module__=__name__, __doc__=_GridChecks.__doc__,
    **{a.key: (list[_item(a)], Field(**({} if a.default is None else {"default": a.defaults()}), min_length=1,
                                     description=a.doc)) for a in grid_axes()})
"""The spec's `grid:`: a list per axis of sweep.axes.AXES, in its order."""


def _share(value: float, field: str) -> float:
    """A CPU or GPU share per trial: at least sweep.bounds.MIN_SHARE (a GPU share may be 0)."""
    problem = share_problem(value, zero_ok=field == "gpu")
    if problem:
        raise ValueError(problem)
    return value


def _check_sharding(sharding: str, workers: int, at: tuple) -> None:
    if sharding == "fsdp" and workers < 2:
        raise FieldError((*at, "sharding"), "fsdp needs workers >= 2: one worker has nothing to shard over")


class ResourceOverride(_Spec):
    """Resources for trials at or above a model size."""

    min_params: int = Field(ge=0)
    """Applies to trials with at least this many parameters."""
    cpu: float = Field(gt=0)
    """CPUs per trial (per worker)."""
    gpu: float = Field(default=0, ge=0)
    """GPUs per trial (per worker; fractions share a GPU)."""
    workers: int = Field(default=1, ge=1)
    """Data-parallel workers per trial (Ray Train), each with `cpu` and `gpu`."""
    sharding: Literal["ddp", "fsdp"] = "ddp"
    """ddp or fsdp for these trials (see Resources.sharding); an override does not inherit it."""

    _shares = field_validator("cpu", "gpu")(lambda v, info: _share(v, info.field_name))

    @model_validator(mode="after")
    def _shards_over_workers(self) -> ResourceOverride:
        _check_sharding(self.sharding, self.workers, ())
        return self


class Resources(_Spec):
    """Per-trial resources; `by_size` raises them for larger models."""

    cpu: float = Field(default=1, gt=0)
    """CPUs per trial (also the trial's torch thread count); at least 0.01 (sweep.bounds.MIN_SHARE)."""
    gpu: float = Field(default=0, ge=0)
    """GPUs per trial; a fraction (0.25) packs several small trials on one GPU; 0 or at least 0.01."""
    workers: int = Field(default=1, ge=1)
    """Data-parallel workers per trial (Ray Train's TorchTrainer, DDP); cpu and gpu are per worker.
    The global batch stays train.batch_size, split evenly over the workers."""
    sharding: Literal["ddp", "fsdp"] = "ddp"
    """How a multi-worker trial splits the work: ddp (whole parameters and optimiser state on every
    worker) or fsdp (FSDP2: each worker holds 1/workers of the parameters, gradients and optimiser
    state; only the elementwise optimisers, study.optim.registry's `shardable`)."""
    by_size: list[ResourceOverride] = []
    """Overrides by parameter count; the largest min_params that applies wins."""

    _shares = field_validator("cpu", "gpu")(lambda v, info: _share(v, info.field_name))

    @model_validator(mode="after")
    def _whole_gpus(self) -> Resources:
        for loc, g in [("gpu", self.gpu)] + [(("by_size", i, "gpu"), o.gpu) for i, o in enumerate(self.by_size)]:
            if g > 1 and g != int(g):
                raise FieldError(loc, f"gpu above 1 must be a whole number, got {g}")
            if g > MAX_GPUS_PER_TRIAL:  # one trial runs on one node: plan would price a trial nothing runs
                raise FieldError(loc, f"a trial runs on one node: at most {MAX_GPUS_PER_TRIAL} GPUs, got {g:g}")
        _check_sharding(self.sharding, self.workers, ())  # each by_size entry checks its own
        return self

    @property
    def any_gpu(self) -> bool:
        return self.gpu > 0 or any(o.gpu > 0 for o in self.by_size)

    def for_params(self, params: int) -> dict[str, float | str]:
        """{"cpu", "gpu"} per worker, "workers" and "sharding" for a trial of this size."""
        cpu, gpu, workers, sharding = self.cpu, self.gpu, self.workers, self.sharding
        for o in sorted(self.by_size, key=lambda o: o.min_params):
            if params >= o.min_params:
                cpu, gpu, workers, sharding = o.cpu, o.gpu, o.workers, o.sharding
        return {"cpu": cpu, "gpu": gpu, "workers": workers, "sharding": sharding}

    def sharding_at(self, params: int) -> tuple[tuple, str]:
        """(the place in `resources` that sets this size's sharding, its value)."""
        place: tuple = ("sharding",)
        for i, o in sorted(enumerate(self.by_size), key=lambda io: io[1].min_params):
            if params >= o.min_params:
                place = ("by_size", i, "sharding")
        return place, self.for_params(params)["sharding"]


class SweepSpec(_Spec):
    """A whole study: data, schedule, grid, resources."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=255)
    """Sweep name: the results sub-folder (a folder name: at most 255 characters, ASCII)."""
    data: DataConfig = DataConfig()
    """Corpus and context length, shared by every trial."""
    train: TrainSpec
    """Schedule shared by every trial (batch and warmup may follow model size: TrainSpec)."""
    grid: Grid
    """The axes."""
    resources: Resources = Resources()
    """Per-trial resources."""
    retries: int = Field(default=2, ge=0)
    """Times a failed trial is retried (from its last checkpoint)."""
    compile: Literal["auto", True, False] = "auto"
    """torch.compile every model: true, false, or auto (CUDA trials from study.device.COMPILE_MIN_PARAMS up)."""
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """auto, cpu, cuda or cuda:N."""

    @model_validator(mode="after")
    def _device_has_gpus(self) -> SweepSpec:
        if self.device.startswith("cuda") and not self.resources.any_gpu:
            raise FieldError("device", f"{self.device} needs resources.gpu > 0: Ray gives a trial "
                                       "without a GPU share no GPU to run on")
        return self

    @model_validator(mode="after")
    def _batch_splits_over_workers(self) -> SweepSpec:
        r = self.resources
        for loc, n in [(("resources", "workers"), r.workers)] + [
                (("resources", "by_size", i, "workers"), o.workers) for i, o in enumerate(r.by_size)]:
            if self.train.batch_size % n:
                raise FieldError(loc, f"train.batch_size {self.train.batch_size} does not split evenly over {n} "
                                      "workers (each takes an equal slice of the global batch)")
        return self
