"""SweepSpec: the YAML a user writes, validated before anything starts.

Every error names its place in the YAML and shows the value written there
(`grid.optimizer[2].lr: Input should be greater than 0, got -1 (line 9)`). Everything that can
be checked without training is: types, ranges, finiteness, every grid point's cross-field
rules, duplicate points, memory and time bounds, the corpus (study.data.check_data) and the
device. A grid optimizer entry may give a list for any field, a ladder (see Grid.optimizer).
"""

from __future__ import annotations

import itertools
import math
import re
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from study.config import (
    DataConfig, FieldError, ModelConfig, NormName, OptimizerConfig, RotationConfig, RuntimeConfig,
    TrainConfig, TrialConfig, _Frozen,
)
from study.data import check_corpus

MAX_TRIAL_BYTES = 1 << 40
"""Estimated training memory above which a trial is refused (1 TiB: no single device or host)."""
MAX_TRIAL_SECONDS = 365 * 86400
"""Estimated duration above which a trial is refused (a year)."""
FASTEST_FLOP_S = 1e15
"""An optimistic sustained rate for one trial (1 PFLOP/s) for that estimate ..."""
MAX_GPUS_PER_TRIAL = 16
"""A trial runs on one node, and the largest nodes hold 8 (HGX) to 16 GPUs."""
MIN_STEP_S = 1e-4
"""... and an optimistic floor on one optimiser step's wall time (0.1 ms)."""


class SpecError(ValueError):
    """A spec that cannot run; the message lists every problem with its YAML location."""


class _Spec(_Frozen):
    """Spec sections share the configs' strictness (finite floats, no bools for numbers, int64)."""


def _tuple_valued(field: str) -> bool:
    info = OptimizerConfig.model_fields.get(field)
    return info is not None and typing.get_origin(info.annotation) in (tuple, list)


def expand_ladders(entries: Any) -> tuple[Any, list[tuple[int, dict[str, int]]]]:
    """grid.optimizer entries -> one entry per ladder point, and for each its source: (entry
    index, {field: index in that field's list}). A field's value is a ladder when it is a list,
    except for tuple-valued fields (betas), whose ladder is a list of lists. Several ladders in
    one entry give their cartesian product, in field order, the last varying fastest."""
    if not isinstance(entries, list):
        return entries, []
    out, sources = [], []
    for i, entry in enumerate(entries):
        ladders = {}
        if isinstance(entry, dict):
            for key, value in entry.items():
                if isinstance(value, list) and value and (
                        not _tuple_valued(key) or all(isinstance(v, (list, tuple)) for v in value)):
                    ladders[key] = value
        if not ladders:
            out.append(entry)
            sources.append((i, {}))
            continue
        for picks in itertools.product(*(range(len(v)) for v in ladders.values())):
            out.append({**entry, **{k: ladders[k][j] for k, j in zip(ladders, picks)}})
            sources.append((i, dict(zip(ladders, picks))))
    return out, sources


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
    """A grid optimizer entry: an OptimizerConfig, plus an optional lr rule over model size."""

    lr_scaling: LrScaling | None = None
    """{reference_params: N0, exponent: b}: the trial's lr is lr x (params_non_embedding / N0) ** b."""

    def plain(self) -> OptimizerConfig:
        """The OptimizerConfig without the rule (lr as written, at the reference size)."""
        return OptimizerConfig.model_validate(self.model_dump(exclude={"lr_scaling"}))


class Grid(_Spec):
    """Axes of the cartesian product; each is a list."""

    model: list[ModelConfig] = Field(min_length=1)
    """Model shapes: {depth: n} or {d_model, n_layers, n_heads, d_mlp}."""
    optimizer: list[OptimizerEntry] = Field(min_length=1)
    """Optimisers with their hyper-parameters. Any field may be a list, a ladder: `{name: sgd,
    lr: [0.1, 0.3, 1.0]}` is three grid points; for betas, a list of pairs. Several ladders in
    one entry give their cartesian product. `lr_scaling` moves the lr with model size
    (LrScaling). Holds the expanded entries once validated."""
    norm: list[NormName] = Field(default=["layernorm"], min_length=1)
    """Norm types."""
    rotation: list[RotationConfig] = Field(default=[RotationConfig()], min_length=1)
    """Rotation plans: none, shared, independent, {mode: partial, group_size: k}, {mode: groups, ...}."""
    seed: list[int] = Field(default=[0], min_length=1)
    """Seeds: replicates of every other point."""

    @model_validator(mode="before")
    @classmethod
    def _expand_ladders(cls, data: Any) -> Any:
        if isinstance(data, dict) and "optimizer" in data:
            data = {**data, "optimizer": expand_ladders(data["optimizer"])[0]}
        return data

    @model_validator(mode="after")
    def _seeds(self) -> Grid:
        if any(s < 0 for s in self.seed):
            raise FieldError("seed", "seeds must be >= 0")
        if len(set(self.seed)) != len(self.seed):
            raise FieldError("seed", "seeds must be distinct")
        return self


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


class Resources(_Spec):
    """Per-trial resources; `by_size` raises them for larger models."""

    cpu: float = Field(default=1, gt=0)
    """CPUs per trial (also the trial's torch thread count)."""
    gpu: float = Field(default=0, ge=0)
    """GPUs per trial; a fraction (0.25) packs several small trials on one GPU."""
    workers: int = Field(default=1, ge=1)
    """Data-parallel workers per trial (Ray Train's TorchTrainer, DDP); cpu and gpu are per worker.
    The global batch stays train.batch_size, split evenly over the workers."""
    sharding: str = "ddp"
    """How a multi-worker trial splits the work: only ddp (whole parameters on every worker)."""
    by_size: list[ResourceOverride] = []
    """Overrides by parameter count; the largest min_params that applies wins."""

    @model_validator(mode="after")
    def _whole_gpus(self) -> Resources:
        for loc, g in [("gpu", self.gpu)] + [(("by_size", i, "gpu"), o.gpu) for i, o in enumerate(self.by_size)]:
            if g > 1 and g != int(g):
                raise FieldError(loc, f"gpu above 1 must be a whole number, got {g}")
            if g > MAX_GPUS_PER_TRIAL:  # one trial runs on one node: plan would price a trial nothing runs
                raise FieldError(loc, f"a trial runs on one node: at most {MAX_GPUS_PER_TRIAL} GPUs, got {g:g}")
        if self.sharding != "ddp":  # FSDP2 would split the whole matrices rotated_adam, soap and muon need
            raise FieldError("sharding", f"{self.sharding!r} is not supported: only 'ddp' (every worker holds "
                                         "whole parameters and optimiser state; FSDP is not implemented)")
        return self

    @property
    def any_gpu(self) -> bool:
        return self.gpu > 0 or any(o.gpu > 0 for o in self.by_size)

    def for_params(self, params: int) -> dict[str, float]:
        """{"cpu", "gpu"} per worker and "workers" for a trial of this size."""
        cpu, gpu, workers = self.cpu, self.gpu, self.workers
        for o in sorted(self.by_size, key=lambda o: o.min_params):
            if params >= o.min_params:
                cpu, gpu, workers = o.cpu, o.gpu, o.workers
        return {"cpu": cpu, "gpu": gpu, "workers": workers}


class SweepSpec(_Spec):
    """A whole study: data, schedule, grid, resources."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Sweep name: the results sub-folder."""
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


# ---- reading YAML ---------------------------------------------------------------------------


class SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently) and reads
    `1e15`, `3e-3` as floats (YAML 1.2; YAML 1.1 needs a dot and would give a string)."""

    def construct_mapping(self, node, deep=False):
        self.flatten_mapping(node)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: SafeLoader reports it below
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given at line {first}); give each key once",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789"))


MAX_SPEC_VALUES = 100_000
"""Values a spec may hold once its aliases are expanded (a hand-written grid has hundreds): an
alias bomb (`&a [..]` nested in `&b [*a, *a, ...]`) is refused before it is built."""


def _expansion(root: yaml.Node) -> tuple[tuple, yaml.Node, str] | None:
    """(place, node, why) when the YAML refers to itself (`&r [*r]`) or its aliases expand to
    more than MAX_SPEC_VALUES values; None otherwise. Sizes are counted on the composed graph,
    each shared node once, so this costs the size of the text, not of the expansion."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        kids = _children(node)
        if children_done:
            on_path.discard(id(node))
            size[id(node)] = min(1 + sum(size[id(k)] for k in kids), MAX_SPEC_VALUES + 1)
            continue
        if id(node) in size:
            continue
        if id(node) in on_path:
            return _path_to(root, node), node, "an alias refers to the list or mapping that holds it (&x [*x])"
        on_path.add(id(node))
        stack.append((node, True))
        stack += [(k, False) for k in kids if id(k) not in size]
    if size[id(root)] <= MAX_SPEC_VALUES:
        return None
    place, node = (), root  # descend to the smallest place that is still too big
    while True:
        big = [(p, k) for p, k in _labelled_children(node) if size[id(k)] > MAX_SPEC_VALUES]
        if not big:
            break
        step, node = big[0]
        place += (step,)
    return place, node, f"aliases expand to more than {MAX_SPEC_VALUES:,} values; write the values out"


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _labelled_children(node: yaml.Node) -> list[tuple[Any, yaml.Node]]:
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    if isinstance(node, yaml.MappingNode):
        return [(k.value if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in node.value]
    return []


def _path_to(root: yaml.Node, target: yaml.Node) -> tuple:
    """The place of `target`'s first occurrence, by a walk that enters each node once."""
    seen, stack = set(), [((), root)]
    while stack:
        place, node = stack.pop()
        if node is target and place:
            return place
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack += [(place + (p,), k) for p, k in reversed(_labelled_children(node))]
    return ()


# ---- located errors ---------------------------------------------------------------------------


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif str(p).startswith(("function-", "tagged-union", "union[")):
            continue
        else:
            out += ("." if out else "") + str(p)
    return out or "(top level)"


def _node_at(root: yaml.Node | None, parts: tuple[Any, ...]) -> tuple[yaml.Node | None, int | None]:
    """The YAML node at `parts` (None if absent) and the 1-based line of it, or of its deepest
    existing ancestor."""
    node, line = root, None
    for p in parts:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode) and isinstance(p, str):
            node = next((v for k, v in node.value if k.value == p), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and p < len(node.value):
            node = node.value[p]
        else:
            node = None
    return node, (node.start_mark.line + 1 if node is not None else line)


def _line_of(root: yaml.Node | None, parts: tuple[Any, ...]) -> int | None:
    return _node_at(root, parts)[1]


def _written(node: yaml.Node | None) -> str | None:
    """The text the user wrote for a node, when it is short and on one line."""
    if node is None or node.start_mark.buffer is None:
        return None
    text = node.start_mark.buffer[node.start_mark.index:node.end_mark.index].strip()
    if isinstance(node, yaml.ScalarNode) and node.style in ("'", '"'):
        text = repr(node.value)
    elif isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str":
        text = repr(node.value)
    return text if text and "\n" not in text and len(text) <= 80 else None


def _keys_at(loc: tuple) -> list[str]:
    """The keys the spec allows in the mapping that holds `loc`'s last key."""
    cls: Any = SweepSpec
    for p in loc[:-1]:
        if isinstance(p, int):
            continue
        field = cls.model_fields.get(p) if isinstance(cls, type) and issubclass(cls, _Frozen) else None
        if field is None:
            return []
        candidates, cls = [field.annotation], None
        while candidates:
            a = candidates.pop()
            if isinstance(a, type) and issubclass(a, _Frozen):
                cls = a
            else:
                candidates += list(typing.get_args(a))
    keys = list(cls.model_fields) if cls is not None else []
    return keys + (["depth"] if cls is ModelConfig else [])


def _message(err: dict) -> str:
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if err["type"] == "extra_forbidden":
        keys = _keys_at(tuple(err["loc"]))
        msg = "unknown key" + (f" (expected one of: {', '.join(keys)})" if keys else "")
    elif err["type"] == "finite_number":
        msg = "must be finite"
    elif err["type"] == "int_from_float":
        msg = "Input should be a whole number"
    elif err["type"] == "missing" and err["loc"] and isinstance(err["loc"][-1], int):
        msg = f"too few values: item {err['loc'][-1]} is missing"
    return msg


_ABSENT = object()


class _Where:
    """Maps error locations in the validated spec back to the YAML the user wrote: ladder
    points to their list element, and each place to its line and written value."""

    def __init__(self, root: yaml.Node | None, data: Any):
        self.root = root
        grid = data.get("grid") if isinstance(data, dict) else None
        self.sources = expand_ladders(grid.get("optimizer"))[1] if isinstance(grid, dict) else []

    def map(self, loc: tuple) -> tuple:
        if len(loc) >= 3 and loc[:2] == ("grid", "optimizer") and isinstance(loc[2], int) and loc[2] < len(self.sources):
            entry, picks = self.sources[loc[2]]
            rest = loc[3:]
            if rest and rest[0] in picks:
                return ("grid", "optimizer", entry, rest[0], picks[rest[0]], *rest[1:])
            return ("grid", "optimizer", entry, *rest)
        return loc

    def label(self, loc: tuple) -> str:
        """A grid entry's name; an expanded ladder point names its list element(s)."""
        if len(loc) == 3 and loc[:2] == ("grid", "optimizer") and loc[2] < len(self.sources):
            entry, picks = self.sources[loc[2]]
            if len(picks) == 1:
                (field, j), = picks.items()
                return _loc(("grid", "optimizer", entry, field, j))
            if picks:
                return _loc(("grid", "optimizer", entry)) + " (" + ", ".join(f"{f}[{j}]" for f, j in picks.items()) + ")"
        return _loc(self.map(loc))

    def line(self, loc: tuple) -> int | None:
        if len(loc) == 3 and loc[:2] == ("grid", "optimizer") and loc[2] < len(self.sources):
            entry, picks = self.sources[loc[2]]
            if picks:
                field, j = next(iter(picks.items()))
                return _line_of(self.root, ("grid", "optimizer", entry, field, j))
        return _line_of(self.root, self.map(loc))

    def format(self, loc: tuple, msg: str, value: Any = _ABSENT, custom: bool = True) -> str:
        """`place: message, got <what the user wrote> (line N)`. A custom message (ours, not
        pydantic's) that already quotes the value is left as it is."""
        loc = tuple(loc)
        node, _ = _node_at(self.root, self.map(loc))
        shown = _written(node) if self.root is not None else None
        if shown is None and value is not _ABSENT and not isinstance(value, dict):
            shown = repr(value) if len(repr(value)) <= 80 else None
        raw = node.value if isinstance(node, yaml.ScalarNode) else str(value) if value is not _ABSENT else None
        quoted = "got " in msg or (custom and raw is not None and re.search(rf"(?<![\w.]){re.escape(raw)}(?![\w.])", msg))
        got = f", got {shown}" if shown is not None and not quoted else ""
        line = self.line(loc)
        return f"{self.label(loc)}: {msg}{got}" + (f" (line {line})" if line else "")

    def errors(self, exc: ValidationError, prefix: tuple = ()) -> list[str]:
        out = []
        for err in exc.errors():
            loc, value = prefix + tuple(err["loc"]), err.get("input", _ABSENT)
            extra = getattr((err.get("ctx") or {}).get("error"), "loc", None)
            if extra:  # a cross-field check that names its field
                loc, value = loc + tuple(extra), _dig(value, extra)
            if err["type"] == "missing" and loc and isinstance(loc[-1], int):  # a tuple too short: show it
                loc, value = loc[:-1], _ABSENT
            elif err["type"] in ("extra_forbidden", "missing"):
                value = _ABSENT
            out.append(self.format(loc, _message(err), value, custom=err["type"] in ("value_error", "assertion_error")))
        return list(dict.fromkeys(out))


def _dig(value: Any, parts: tuple) -> Any:
    for p in parts:
        if isinstance(value, dict) and p in value:
            value = value[p]
        elif isinstance(value, (list, tuple)) and isinstance(p, int) and p < len(value):
            value = value[p]
        else:
            return _ABSENT
    return value


def format_errors(exc: ValidationError, root: yaml.Node | None = None, prefix: tuple = ()) -> str:
    return "\n".join(_Where(root, None).errors(exc, prefix))


# ---- parsing ----------------------------------------------------------------------------------


def parse_spec(data: Any, root: yaml.Node | None = None, source: str = "spec", *,
               unprepared_ok: bool = False) -> SweepSpec:
    """Validate a spec dict, every grid point, the corpus and the budgets, or raise SpecError
    with every problem located. `unprepared_ok` (for `sweep plan`) accepts a corpus folder that
    does not exist yet when the spec states its vocab_size; one that exists is always checked."""
    where = _Where(root, data)
    if not isinstance(data, dict):
        shown = "an empty file" if data is None else type(data).__name__
        raise SpecError(f"{source}: expected a mapping (name:, train:, grid:, ...) at the top level, got {shown}")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        problems = where.errors(exc)
        try:  # the corpus of a valid data section is checked too, and reported in its place
            alone = DataConfig.model_validate(data.get("data", {}))
        except ValidationError:
            alone = None
        corpus = _checked_corpus(alone, data, where)[1] if alone is not None else None
        if corpus and not any(e["loc"] for e in exc.errors()):
            problems = [corpus]  # a field at fault: the spec-wide rules that failed are not reached
        elif corpus:
            at = next((i for i, p in enumerate(problems) if not p.startswith("name:")), len(problems))
            problems.insert(at, corpus)
        raise SpecError("\n".join(problems)) from None
    checked, corpus = _checked_corpus(spec.data, data, where)
    if corpus:
        raise SpecError(corpus)
    spec = spec.model_copy(update={"data": checked})
    problems = list(dict.fromkeys(_check_points(spec, where)))
    if not (unprepared_ok and unprepared(spec)):
        problems += _check_data(spec, where)
    if problems:
        raise SpecError("\n".join(problems))
    return spec


def _checked_corpus(data: DataConfig, spec: dict, where: _Where) -> tuple[DataConfig | None, str | None]:
    """(study.data.check_corpus's DataConfig, None), or (None, its problem located in the spec)."""
    try:
        return check_corpus(data), None
    except FieldError as exc:
        return None, where.format(("data", *exc.loc), str(exc), _dig(spec.get("data"), exc.loc))


def line_in(path: str | Path, loc: tuple) -> int | None:
    """The line of a place (`("resources", "gpu")`) in a spec file that already loaded."""
    loader = SpecLoader(Path(path).read_text())
    try:
        return _line_of(loader.get_single_node(), loc)
    finally:
        loader.dispose()


def unprepared(spec: SweepSpec) -> bool:
    """The spec's token corpus folder is not prepared yet, and its stated vocab_size sizes the
    models (a missing .bin/.npy file is a wrong path, not a corpus still to prepare)."""
    d = spec.data
    return (d.tokens is not None and Path(d.tokens).suffix not in (".bin", ".npy")
            and not Path(d.tokens).expanduser().exists() and d.vocab_size is not None)


def load_spec(path: str | Path, *, unprepared_ok: bool = False) -> SweepSpec:
    """Read and validate a YAML spec; SpecError names the file, place and line of each problem.
    `unprepared_ok`: see parse_spec."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path}: is a folder, not a spec file")
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise SpecError(f"{path}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the spec as UTF-8") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    loader = SpecLoader(text)
    try:
        root = loader.get_single_node()
        bomb = _expansion(root) if root is not None else None
        if bomb is not None:
            place, node, why = bomb
            raise SpecError(f"{path}: {_loc(place)}: {why} (line {node.start_mark.line + 1})")
        data = loader.construct_document(root) if root is not None else None
    except RecursionError:
        raise SpecError(f"{path}: invalid YAML: nested too deeply; a spec needs a few levels") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: {_yaml_problem(exc, text)}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        shown = "an empty file" if data is None else f"a {type(data).__name__}: {_first_text(text)}"
        raise SpecError(f"{path}: expected a mapping (name:, train:, grid:, ...) at the top level, got {shown}")
    try:
        return parse_spec(data, root, str(path), unprepared_ok=unprepared_ok)
    except SpecError as exc:
        raise SpecError(f"{path}:\n" + "\n".join("  " + l for l in str(exc).splitlines())) from None


def _first_text(text: str) -> str:
    """The first line that holds something, quoted (a spec that is not a mapping shows what it is)."""
    line = next((l.strip() for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")), "")
    return repr(line if len(line) <= 60 else line[:57] + "...")


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """`line L, column C: invalid YAML: <problem>: '<the line as written>'`. An unclosed [ or {
    is reported where it opens, not on the line where the parser gave up."""
    mark, context = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    what = getattr(exc, "context", None) or ""
    if context is not None and mark is not None and "flow" in what and context.line != mark.line:
        opener = "[" if "sequence" in what else "{"
        problem = f"the {opener} here is not closed ({problem} on line {mark.line + 1})"
        mark = context
    if mark is None:
        return f"invalid YAML: {problem}"
    lines = text.splitlines()
    shown = lines[mark.line].strip() if mark.line < len(lines) else ""
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {problem}" + (f": {shown!r}" if shown else "")


# ---- grid points -----------------------------------------------------------------------------


def trial_config(spec: SweepSpec, model: ModelConfig, optimizer: OptimizerConfig, norm: str,
                 rotation: RotationConfig, seed: int) -> TrialConfig:
    """One grid point's TrialConfig, with the size rules (lr_scaling, batch_scaling,
    warmup_tokens_per_param) resolved to plain numbers. A rule that gives no usable value raises
    FieldError at its place (("optimizer", "lr_scaling") or ("train", ...))."""
    lr_rule = optimizer.lr_scaling if isinstance(optimizer, OptimizerEntry) else None
    if isinstance(optimizer, OptimizerEntry):
        optimizer = optimizer.plain()
    train: TrainConfig = spec.train.plain() if isinstance(spec.train, TrainSpec) else spec.train
    cfg = TrialConfig(model=model, norm=norm, rotation=rotation, optimizer=optimizer, data=spec.data,
                      train=train, seed=seed, sweep=spec.name,
                      runtime=RuntimeConfig(device=spec.device, compile=spec.compile))
    batch_rule = getattr(spec.train, "batch_scaling", None)
    warmup_rule = getattr(spec.train, "warmup_tokens_per_param", None)
    if lr_rule or batch_rule or warmup_rule:
        cfg = _sized(cfg, lr_rule, batch_rule, warmup_rule)
    want = spec.resources.for_params(cfg.params)
    # A GPU share below one caps the trial's memory to it, so packed trials cannot starve each other.
    share = want["gpu"] if 0 < want["gpu"] < 1 else None
    runtime = cfg.runtime.model_copy(update={"num_threads": max(1, math.floor(want["cpu"])), "gpu_fraction": share})
    return cfg.model_copy(update={"runtime": runtime})


def _sized(cfg: TrialConfig, lr_rule: LrScaling | None, batch_rule: BatchScaling | None,
           warmup_rule: float | None) -> TrialConfig:
    """cfg with its lr, batch and warmup set by the size rules, at its non-embedding size."""
    n = cfg.params_non_embedding
    optimizer, train = cfg.optimizer, cfg.train
    if lr_rule is not None:
        lr = optimizer.lr * lr_rule.factor(n)
        if not (math.isfinite(lr) and lr > 0):
            raise FieldError(("optimizer", "lr_scaling"), f"gives lr {lr:g} at {n:,} non-embedding parameters "
                                                          "(must be finite and > 0)")
        optimizer = optimizer.model_copy(update={"lr": lr})
    if batch_rule is not None:
        factor = batch_rule.factor(n)
        if not math.isfinite(factor) or train.batch_size * factor > 2**31:
            raise FieldError(("train", "batch_scaling"), f"gives a batch of {train.batch_size * factor:g} "
                                                         f"sequences at {n:,} non-embedding parameters")
        train = train.model_copy(update={"batch_size": batch_rule.batch(train.batch_size, n)})
    if warmup_rule is not None:
        tokens_per_step = train.batch_size * cfg.data.seq_len
        train = train.model_copy(update={"warmup": float(max(1, math.ceil(warmup_rule * n / tokens_per_step)))})
    parts = {f: getattr(cfg, f) for f in TrialConfig.model_fields}
    return TrialConfig(**{**parts, "optimizer": optimizer, "train": train})  # validated again, as a whole


def _check_points(spec: SweepSpec, where: _Where):
    """Every combination of the axes (seeds aside): rules across axes (group_size > n_layers,
    rotate: all with a big vocabulary), memory and time bounds; then repeated axis entries."""
    g = spec.grid
    axes = {"model": g.model, "optimizer": g.optimizer, "norm": g.norm, "rotation": g.rotation}
    for (mi, m), (oi, o), (ni, n), (ri, r) in itertools.product(*(enumerate(v) for v in axes.values())):
        index = {"model": mi, "optimizer": oi, "norm": ni, "rotation": ri}
        try:
            cfg = trial_config(spec, m, o, n, r, g.seed[0])
        except FieldError as exc:  # a size rule (lr_scaling, batch_scaling) with no usable value here
            loc = ("grid", "optimizer", oi, *exc.loc[1:]) if exc.loc[0] == "optimizer" else exc.loc
            yield where.format(loc, f"{exc} (with grid.model[{mi}])")
            continue
        except ValidationError as exc:
            for err in exc.errors():
                rel = tuple(getattr((err.get("ctx") or {}).get("error"), "loc", ()) or ())
                loc = ("grid", rel[0], index[rel[0]], *rel[1:]) if rel and rel[0] in index else rel
                msg = _message(err) + (f" (with grid.model[{mi}])" if rel[:1] == ("rotation",) else "")
                yield where.format(loc, msg, _dig(err.get("input"), rel) if rel else _ABSENT)
            continue
        for loc, msg in _budget(cfg, mi):
            yield where.format(loc, msg)
    for axis, entries in axes.items():
        for j, e in enumerate(entries):
            i = next(i for i, f in enumerate(entries) if f == e)
            if i < j:
                first = ("grid", axis, i)
                line = where.line(first)
                yield where.format(("grid", axis, j), f"the same grid point as {where.label(first)}"
                                   + (f" (line {line})" if line else ""))


def _largest_batch(spec: SweepSpec) -> int:
    """The largest batch a trial trains with: train.batch_size, or what batch_scaling gives at
    the grid's largest size (a rule that fails is reported by _check_points)."""
    g, batches = spec.grid, [spec.train.batch_size]
    if getattr(spec.train, "batch_scaling", None) is not None:
        batches = []
        for m in g.model:
            try:
                batches.append(trial_config(spec, m, g.optimizer[0], g.norm[0], g.rotation[0], g.seed[0]).train.batch_size)
            except (FieldError, ValidationError):
                continue
    return max(batches, default=spec.train.batch_size)


def _check_data(spec: SweepSpec, where: _Where) -> list[str]:
    from study.data import check_data  # loads the corpus: only once the spec itself is valid

    t = spec.train
    try:
        check_data(spec.data, t.eval_batch.sequences, t.eval_batch.seq_len or spec.data.seq_len, _largest_batch(spec))
    except FieldError as exc:
        return [where.format(("data", *exc.loc), str(exc))]
    return []


def _size(n: float) -> str:
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.3g} {unit}"
    return f"{n:,.0f} bytes"


def _budget(cfg: TrialConfig, mi: int):
    """Memory and time estimates (rough lower bounds, fp32) against MAX_TRIAL_BYTES and
    MAX_TRIAL_SECONDS; each problem at the field that drives it."""
    m, t, V, T = cfg.model, cfg.train, cfg.vocab_size, cfg.data.seq_len
    d, L, H, f = m.d_model, m.n_layers, m.n_heads, m.d_mlp
    state = 16 * cfg.params  # weights, gradients, two Adam moments, fp32
    limit = f"one trial may use at most {_size(MAX_TRIAL_BYTES)}"
    if state > MAX_TRIAL_BYTES:
        parts = {("grid", "model", mi, "d_model"): cfg.params_non_embedding, ("data", "vocab_size"): 2 * V * d,
                 ("data", "seq_len"): T * d}
        yield (max(parts, key=parts.get),
               f"{cfg.params:,} parameters (d_model {d}, {L} layers, vocab {V}, seq_len {T}) need about "
               f"{_size(state)} for weights, gradients and Adam moments; {limit}")
        return

    def activations(batch: int, seq: int) -> tuple[int, int]:  # (linear in T, attention T^2)
        return 4 * batch * seq * (L * (8 * d + 2 * f) + 2 * V), 8 * batch * L * H * seq * seq

    for (lin, att), b_loc, t_loc, (b, s) in (
        (activations(t.batch_size, T), ("train", "batch_size"), ("data", "seq_len"), (t.batch_size, T)),
        (activations(t.eval_batch.sequences, cfg.eval_seq_len), ("train", "eval_batch", "sequences"),
         ("train", "eval_batch", "seq_len") if t.eval_batch.seq_len else ("data", "seq_len"),
         (t.eval_batch.sequences, cfg.eval_seq_len)),
    ):
        if state + lin + att > MAX_TRIAL_BYTES:
            yield (t_loc if att > lin else b_loc,
                   f"a batch of {b:,} x {s:,} tokens needs about {_size(lin + att)} of activations "
                   f"({_size(att)} of them attention scores, which grow as seq_len^2); {limit}")
            return
    steps = cfg.total_steps
    step_s = max(MIN_STEP_S, cfg.flops_per_token * cfg.tokens_per_step / FASTEST_FLOP_S)
    if steps * step_s > MAX_TRIAL_SECONDS:
        field = next(k for k in ("steps", "tokens", "tokens_per_param") if getattr(t, k) is not None)
        yield (("train", field),
               f"{steps:,} steps would take at least {steps * step_s / MAX_TRIAL_SECONDS:,.3g} years even at "
               f"{FASTEST_FLOP_S:.0e} FLOP/s and {MIN_STEP_S * 1e3:g} ms per step; one trial may take at most a year")
