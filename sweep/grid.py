"""expand(spec) -> [TrialConfig]: the cartesian product of the grid axes. Pure; no Ray."""

from __future__ import annotations

import itertools

from study.config import TrialConfig
from sweep.spec import SpecError, SweepSpec, trial_config


def expand(spec: SweepSpec) -> list[TrialConfig]:
    """Every grid point in a stable order (model, optimizer, norm, rotation, seed). Two axis
    entries that describe the same trial are an error, not a silent merge.

    Each combination of the axes is validated once and copied per seed (seeds are distinct
    integers, checked with the grid), so a 10,000-trial plan validates its few hundred
    combinations, and ids are hashed when first asked for."""
    g = spec.grid
    trials: list[TrialConfig] = []
    seen: dict[str, int] = {}
    for i, (model, optimizer, norm, rotation) in enumerate(itertools.product(g.model, g.optimizer, g.norm, g.rotation)):
        first = trial_config(spec, model, optimizer, norm, rotation, g.seed[0])
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
