"""Trial construction: trial_config (one grid point, size rules resolved), expand(spec) -> [TrialConfig]
(the cartesian product of the grid axes, sweep.axes) and select. Pure; no Ray."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from study.config import FieldError, RuntimeConfig, TrainConfig, TrialConfig
from sweep.axes import AXES, point_axes, replicate
from sweep.spec_schema import BatchScaling, LrScaling, OptimizerEntry, SweepSpec, TrainSpec
from sweep.spec_yaml import SpecError

__all__ = ["expand", "select", "trial_config"]


def trial_config(spec: SweepSpec, point: Mapping[str, Any]) -> TrialConfig:
    """One grid point's TrialConfig ({axis key: value}, sweep.axes; an axis left out holds its
    first default), with the size rules (lr_scaling, batch_scaling, warmup_tokens_per_param)
    resolved to plain numbers. A rule that gives no usable value raises FieldError at its place
    (("optimizer", "lr_scaling") or ("train", ...))."""
    optimizer = point["optimizer"]
    lr_rule = optimizer.lr_scaling if isinstance(optimizer, OptimizerEntry) else None
    train: TrainConfig = spec.train.plain() if isinstance(spec.train, TrainSpec) else spec.train
    parts: dict[str, Any] = {"data": spec.data, "train": train, "sweep": spec.name,
                             "runtime": RuntimeConfig(device=spec.device, compile=spec.compile)}
    for a in AXES:
        value = point[a.key] if a.key in point else a.default[0]
        if isinstance(value, OptimizerEntry):
            value = value.plain()
        _put(parts, a.path, value)
    cfg = TrialConfig(**parts)
    batch_rule = getattr(spec.train, "batch_scaling", None)
    warmup_rule = getattr(spec.train, "warmup_tokens_per_param", None)
    if lr_rule or batch_rule or warmup_rule:
        cfg = _sized(cfg, lr_rule, batch_rule, warmup_rule)
    want = spec.resources.for_params(cfg.params)
    # A GPU share below one caps the trial's memory to it, so packed trials cannot starve each other.
    share = want["gpu"] if 0 < want["gpu"] < 1 else None
    runtime = cfg.runtime.model_copy(update={"num_threads": max(1, math.floor(want["cpu"])), "gpu_fraction": share})
    return cfg.model_copy(update={"runtime": runtime})


def _put(parts: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """parts[path[0]] = value, or a part (train, data, model) with its field at path[1:] set and
    validated again."""
    if len(path) == 1:
        parts[path[0]] = value
        return
    part = parts[path[0]]
    inner = part.model_dump(exclude_unset=True) if hasattr(part, "model_dump") else dict(part)
    at = inner
    for key in path[1:-1]:
        at[key] = dict(at.get(key) or {})
        at = at[key]
    at[path[-1]] = value
    parts[path[0]] = type(part).model_validate(inner) if hasattr(part, "model_validate") else inner


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


def expand(spec: SweepSpec) -> list[TrialConfig]:
    """Every grid point in a stable order (sweep.axes.AXES': model, optimizer, norm, attention,
    rotation, seed). Two axis entries that describe the same trial are an error, not a silent merge.

    Each combination of the axes is validated once and copied per seed (seeds are distinct
    integers, checked with the grid), so a 10,000-trial plan validates its few hundred
    combinations, and ids are hashed when first asked for."""
    g, axes, seed = spec.grid, point_axes(), replicate()
    seeds = getattr(g, seed.key)
    trials: list[TrialConfig] = []
    seen: dict[str, int] = {}
    points = itertools.product(*(getattr(g, a.key) for a in axes))
    for i, values in enumerate(points):
        first = trial_config(spec, {**dict(zip((a.key for a in axes), values)), seed.key: seeds[0]})
        if first.config_id in seen:  # same config, so the same trial at every seed
            raise SpecError(f"grid: points {seen[first.config_id] * len(seeds)} and {i * len(seeds)} are the same "
                            f"trial ({first.trial_id}); remove the duplicate axis entry")
        seen[first.config_id] = i
        trials += [first] + [first.model_copy(update={seed.key: s}) for s in seeds[1:]]
    return trials


def select(trials: list[TrialConfig], key: str) -> TrialConfig:
    """A trial by id (or unique id prefix) or by 0-based index in the grid."""
    if key.isdigit() and len(key) < 6:
        index = int(key)
        if index >= len(trials):
            raise SpecError(f"--trial {key}: the grid has {len(trials)} trials (indices 0..{len(trials) - 1})")
        return trials[index]
    matches = [t for t in trials if t.trial_id.startswith(key)]
    if len(matches) != 1:
        found = "no trial" if not matches else f"{len(matches)} trials"
        raise SpecError(f"--trial {key}: {found} with that id in this spec (see `sweep plan`)")
    return matches[0]
