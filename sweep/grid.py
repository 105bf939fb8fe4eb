"""Trial construction: trial_config (one grid point, size rules resolved), expand(spec) -> [TrialConfig]
(the cartesian product of the grid axes) and select. Pure; no Ray."""

from __future__ import annotations

import itertools
import math

from study.config import (
    AttentionConfig, FieldError, ModelConfig, OptimizerConfig, RotationConfig, RuntimeConfig, TrainConfig, TrialConfig,
)
from sweep.spec_schema import BatchScaling, LrScaling, OptimizerEntry, SweepSpec, TrainSpec
from sweep.spec_yaml import SpecError

__all__ = ["expand", "select", "trial_config"]


def trial_config(spec: SweepSpec, model: ModelConfig, optimizer: OptimizerConfig, norm: str,
                 rotation: RotationConfig, seed: int, attention: AttentionConfig = AttentionConfig()) -> TrialConfig:
    """One grid point's TrialConfig, with the size rules (lr_scaling, batch_scaling,
    warmup_tokens_per_param) resolved to plain numbers. A rule that gives no usable value raises
    FieldError at its place (("optimizer", "lr_scaling") or ("train", ...))."""
    lr_rule = optimizer.lr_scaling if isinstance(optimizer, OptimizerEntry) else None
    if isinstance(optimizer, OptimizerEntry):
        optimizer = optimizer.plain()
    train: TrainConfig = spec.train.plain() if isinstance(spec.train, TrainSpec) else spec.train
    cfg = TrialConfig(model=model, norm=norm, attention=attention, rotation=rotation, optimizer=optimizer, data=spec.data,
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


def expand(spec: SweepSpec) -> list[TrialConfig]:
    """Every grid point in a stable order (model, optimizer, norm, attention, rotation, seed). Two
    axis entries that describe the same trial are an error, not a silent merge.

    Each combination of the axes is validated once and copied per seed (seeds are distinct
    integers, checked with the grid), so a 10,000-trial plan validates its few hundred
    combinations, and ids are hashed when first asked for."""
    g = spec.grid
    trials: list[TrialConfig] = []
    seen: dict[str, int] = {}
    axes = itertools.product(g.model, g.optimizer, g.norm, g.attention, g.rotation)
    for i, (model, optimizer, norm, attention, rotation) in enumerate(axes):
        first = trial_config(spec, model, optimizer, norm, rotation, g.seed[0], attention)
        if first.config_id in seen:  # same config, so the same trial at every seed
            raise SpecError(f"grid: points {seen[first.config_id] * len(g.seed)} and {i * len(g.seed)} are the same "
                            f"trial ({first.trial_id}); remove the duplicate axis entry")
        seen[first.config_id] = i
        trials += [first] + [first.model_copy(update={"seed": seed}) for seed in g.seed[1:]]
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
