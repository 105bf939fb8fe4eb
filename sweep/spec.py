"""SweepSpec: the YAML a user writes, validated before anything starts.

Every error names its place in the YAML and shows the value written there
(`grid.optimizer[2].lr: Input should be greater than 0, got -1 (line 9)`). Everything that can
be checked without training is: types, ranges, finiteness, every grid point's cross-field
rules, duplicate points, memory and time bounds, the corpus (study.data.check_corpus and
check_data) and the device. A grid optimizer entry may give a list for any field, a ladder
(see Grid.optimizer).

The pieces: sweep.spec_schema (the sections), sweep.spec_yaml (reading the YAML, located
errors), sweep.spec_checks (grid points, budgets, corpus) and sweep.grid (trial construction).
This module reads and checks a spec through them, and names what callers use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from study.config import DataConfig
from study.optim.registry import WRITTEN
from sweep.spec_checks import checked_corpus, corpus_problems, point_problems, unprepared
from sweep.spec_schema import (
    BatchScaling, Grid, LrScaling, OptimizerEntry, ResourceOverride, Resources, SweepSpec, TrainSpec, expand_ladders,
)
from sweep.spec_yaml import SpecError, Where, line_in, read_yaml

__all__ = [
    "BatchScaling", "Grid", "LrScaling", "OptimizerEntry", "ResourceOverride", "Resources", "SpecError", "SweepSpec",
    "TrainSpec", "expand_ladders", "line_in", "load_spec", "parse_spec", "unprepared",
]


def parse_spec(data: Any, root: yaml.Node | None = None, source: str = "spec", *,
               unprepared_ok: bool = False) -> SweepSpec:
    """Validate a spec dict, every grid point, the corpus and the budgets, or raise SpecError
    with every problem located. `unprepared_ok` (for `sweep plan`) accepts a corpus folder that
    does not exist yet when the spec states its vocab_size; one that exists is always checked."""
    where = Where(root, data)
    if not isinstance(data, dict):
        shown = "an empty file" if data is None else type(data).__name__
        raise SpecError(f"{source}: expected a mapping (name:, train:, grid:, ...) at the top level, got {shown}")
    try:
        spec = SweepSpec.model_validate(data, context=WRITTEN)  # a field its optimiser lacks: refused at any value
    except ValidationError as exc:
        problems = where.errors(exc)
        try:  # the corpus of a valid data section is checked too, and reported in its place
            alone = DataConfig.model_validate(data.get("data", {}))
        except ValidationError:
            alone = None
        corpus = checked_corpus(alone, data, where)[1] if alone is not None else None
        if corpus and not any(e["loc"] for e in exc.errors()):
            problems = [corpus]  # a field at fault: the spec-wide rules that failed are not reached
        elif corpus:
            at = next((i for i, p in enumerate(problems) if not p.startswith("name:")), len(problems))
            problems.insert(at, corpus)
        raise SpecError("\n".join(problems)) from None
    checked, corpus = checked_corpus(spec.data, data, where)
    if corpus:
        raise SpecError(corpus)
    spec = spec.model_copy(update={"data": checked})
    problems = list(dict.fromkeys(point_problems(spec, where)))
    if not (unprepared_ok and unprepared(spec)):
        problems += corpus_problems(spec, where)
    if problems:
        raise SpecError("\n".join(problems))
    return spec


def load_spec(path: str | Path, *, unprepared_ok: bool = False) -> SweepSpec:
    """Read and validate a YAML spec; SpecError names the file, place and line of each problem.
    `unprepared_ok`: see parse_spec."""
    data, root = read_yaml(path)
    try:
        return parse_spec(data, root, str(path), unprepared_ok=unprepared_ok)
    except SpecError as exc:
        raise SpecError(f"{Path(path)}:\n" + "\n".join("  " + l for l in str(exc).splitlines())) from None
