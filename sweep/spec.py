"""SweepSpec: the YAML a user writes, validated before anything starts.

Every error names its place in the YAML (`grid.optimizer[2].lr: must be > 0 (line 9)`).
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from study.config import (
    DataConfig, ModelConfig, NormName, OptimizerConfig, RotationConfig, RuntimeConfig,
    TrainConfig, TrialConfig,
)


class SpecError(ValueError):
    """A spec that cannot run; the message lists every problem with its YAML location."""


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Grid(_Spec):
    """Axes of the cartesian product; each is a list."""

    model: list[ModelConfig] = Field(min_length=1)
    """Model shapes: {depth: n} or {d_model, n_layers, n_heads, d_mlp}."""
    optimizer: list[OptimizerConfig] = Field(min_length=1)
    """Optimisers with their hyper-parameters."""
    norm: list[NormName] = Field(default=["layernorm"], min_length=1)
    """Norm types."""
    rotation: list[RotationConfig] = Field(default=[RotationConfig()], min_length=1)
    """Rotation plans: none, shared, independent, {mode: partial, group_size: k}, {mode: groups, ...}."""
    seed: list[int] = Field(default=[0], min_length=1)
    """Seeds: replicates of every other point."""

    @field_validator("seed")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if any(s < 0 for s in v):
            raise ValueError("seeds must be >= 0")
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v


class ResourceOverride(_Spec):
    """Resources for trials at or above a model size."""

    min_params: int = Field(ge=0)
    """Applies to trials with at least this many parameters."""
    cpu: float = Field(gt=0)
    """CPUs per trial."""
    gpu: float = Field(default=0, ge=0)
    """GPUs per trial (fractions share a GPU)."""


class Resources(_Spec):
    """Per-trial resources; `by_size` raises them for larger models."""

    cpu: float = Field(default=1, gt=0)
    """CPUs per trial (also the trial's torch thread count)."""
    gpu: float = Field(default=0, ge=0)
    """GPUs per trial; a fraction (0.25) packs several small trials on one GPU."""
    by_size: list[ResourceOverride] = []
    """Overrides by parameter count; the largest min_params that applies wins."""

    @model_validator(mode="after")
    def _whole_gpus(self) -> Resources:
        for g in [self.gpu] + [o.gpu for o in self.by_size]:
            if g > 1 and g != int(g):
                raise ValueError(f"gpu above 1 must be a whole number, got {g}")
        return self

    def for_params(self, params: int) -> dict[str, float]:
        cpu, gpu = self.cpu, self.gpu
        for o in sorted(self.by_size, key=lambda o: o.min_params):
            if params >= o.min_params:
                cpu, gpu = o.cpu, o.gpu
        return {"cpu": cpu, "gpu": gpu}


class SweepSpec(_Spec):
    """A whole study: data, schedule, grid, resources."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Sweep name: the results sub-folder."""
    data: DataConfig = DataConfig()
    """Corpus and context length, shared by every trial."""
    train: TrainConfig
    """Schedule shared by every trial."""
    grid: Grid
    """The axes."""
    resources: Resources = Resources()
    """Per-trial resources."""
    retries: int = Field(default=2, ge=0)
    """Times a failed trial is retried (from its last checkpoint)."""
    compile: bool = False
    """torch.compile every model."""
    device: str = "auto"
    """auto, cpu or cuda."""

    @model_validator(mode="after")
    def _paths_exist(self) -> SweepSpec:
        for key in ("text", "tokens"):
            path = getattr(self.data, key)
            if path is not None and not Path(path).exists():
                raise ValueError(f"data.{key}: {path} does not exist")
        eval_len = self.train.eval_batch.seq_len
        if eval_len is not None and eval_len > self.data.seq_len:
            raise ValueError(f"train.eval_batch.seq_len ({eval_len}) exceeds data.seq_len ({self.data.seq_len})")
        return self


# ---- loading with located errors -------------------------------------------------------------


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


def _line_of(root: yaml.Node | None, parts: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at `parts`, or of its deepest existing ancestor."""
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
    return node.start_mark.line + 1 if node is not None else line


def _message(err: dict) -> str:
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return msg


def format_errors(exc: ValidationError, root: yaml.Node | None = None, prefix: tuple = ()) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in prefix + tuple(err["loc"]))
        line = _line_of(root, loc)
        where = f" (line {line})" if line else ""
        lines.append(f"{_loc(loc)}: {_message(err)}{where}")
    return "\n".join(lines)


def parse_spec(data: Any, root: yaml.Node | None = None, source: str = "spec") -> SweepSpec:
    """Validate a spec dict (and every grid point) or raise SpecError with located messages."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_errors(exc, root)) from None
    problems = list(_check_points(spec, root))
    if problems:
        raise SpecError("\n".join(problems))
    return spec


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a YAML spec; SpecError names the file, place and line of each problem."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    text = path.read_text()
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{path}:{where}: invalid YAML: {problem}") from None
    try:
        return parse_spec(data, root, str(path))
    except SpecError as exc:
        raise SpecError(f"{path}:\n" + "\n".join("  " + l for l in str(exc).splitlines())) from None


# ---- grid points -----------------------------------------------------------------------------


def trial_config(spec: SweepSpec, model: ModelConfig, optimizer: OptimizerConfig, norm: str,
                 rotation: RotationConfig, seed: int) -> TrialConfig:
    cfg = TrialConfig(model=model, norm=norm, rotation=rotation, optimizer=optimizer, data=spec.data,
                      train=spec.train, seed=seed, sweep=spec.name,
                      runtime=RuntimeConfig(device=spec.device, compile=spec.compile))
    threads = max(1, math.floor(spec.resources.for_params(cfg.params)["cpu"]))
    return cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"num_threads": threads})})


def _check_points(spec: SweepSpec, root: yaml.Node | None):
    """Combinations that are individually valid but impossible together (e.g. group_size > n_layers)."""
    g = spec.grid
    seen: set[tuple] = set()
    for (mi, m), (ri, r) in itertools.product(enumerate(g.model), enumerate(g.rotation)):
        try:
            trial_config(spec, m, g.optimizer[0], g.norm[0], r, g.seed[0])
        except ValidationError as exc:
            for err in exc.errors():
                loc = ("grid", "rotation", ri)
                line = _line_of(root, loc)
                key = (ri, _message(err))
                if key not in seen:
                    seen.add(key)
                    yield (f"{_loc(loc)}: {_message(err)} (with grid.model[{mi}])"
                           + (f" (line {line})" if line else ""))
