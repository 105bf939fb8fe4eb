"""What to run next for each lr ladder of a spec, read from its store (`sweep next`).

A ladder is the spec's trials that differ only in the lr (and seed): one ``tuning_id``. Its
best lr is ``analysis.selection.best_lr``'s (the lowest seed-mean final val loss, an lr where a
seed diverged only when every lr had one). Then, per ladder:

- ``waiting``: some of the spec's trials in it are not finished (pending, running or failed):
  nothing to decide yet.
- ``extend``: the best is the smallest or largest lr tried (or the ladder has one lr): one more
  lr beyond that edge, a step of the ladder's own ratio there (3 for a one-lr ladder, both
  sides), at the spec's seeds.
- ``seeds``: the best is strictly inside: the seeds still missing there, up to ``seeds`` in all
  (with ``neighbours``, also at the lr either side of it that trained: the fitted loss-optimal lr,
  analysis.optimum, reads the best and both neighbours, and wants their seeds alike).
- ``complete``: strictly inside, and every wanted seed finished at the best (and its neighbours).

``next_specs`` writes those trials as specs (one per value of every axis but the optimizer and
the seed, sweep.axes: model shape, norm, attention, rotation, ...; and per kind: edges at the spec's seeds, seeds at the best), with the spec's other sections as
written and its name, so the new trials join the same store and every stored trial is reused.
Each written spec is expanded again and must give exactly the trials decided here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import yaml

from analysis.labels import labels_for
from resultstore.ids import science_hash
from resultstore.schema import FINISHED
from study.config import TrialConfig
from sweep.axes import Axis, grid_axes, point_axes

__all__ = ["HEADER", "Ladder", "NextSpec", "next_specs", "plan_next", "seed_list"]

HEADER = "# Written by `sweep next`"
"""First line of every spec `sweep next` writes: such a file may be written over, no other."""
_SECTIONS = ("data", "train", "resources", "retries", "compile", "device")  # copied as written


@dataclass(frozen=True)
class Ladder:
    """One lr ladder of the spec and what to run next for it."""

    template: TrialConfig
    """The ladder's first trial in the spec (its shape, optimiser, norm, ...)."""
    label: str
    """The axes that tell this ladder from the spec's others ("adam", "lion · betas 0.9/0.99")."""
    losses: dict[float, float | None]
    """lr -> seed-mean final val loss at it (None: no seed done, e.g. diverged), every lr tried."""
    verdict: str
    """waiting, extend, seeds or complete."""
    why: str
    """The verdict in words."""
    best: float | None = None
    """The best lr (None while waiting or when every lr diverged)."""
    new: tuple[TrialConfig, ...] = field(default=())
    """The trials to run next for this ladder."""


@dataclass(frozen=True)
class NextSpec:
    """A spec `sweep next` writes: its file name, text and trials."""

    name: str
    text: str
    trials: tuple[TrialConfig, ...]


def seed_list(spec_seeds: Sequence[int], total: int) -> list[int]:
    """The first `total` seeds: the spec's own, then the smallest unused ones."""
    seeds = list(spec_seeds)[:total]
    n = 0
    while len(seeds) < total:
        if n not in seeds:
            seeds.append(n)
        n += 1
    return seeds


def _tuning_id(t: TrialConfig) -> str:
    return science_hash(json.loads(t.config_json()), ("optimizer.lr",))


def _unsized(t: TrialConfig, first: TrialConfig) -> TrialConfig:
    """`t` at `first`'s shape, lr 1 and seed 0: what labels name apart from those."""
    return _with_lr(t, 1.0, 0).model_copy(update={"model": first.model})


def _with_lr(t: TrialConfig, lr: float, seed: int) -> TrialConfig:
    return t.model_copy(update={"optimizer": t.optimizer.model_copy(update={"lr": lr}), "seed": seed})


def _beyond(edge: float, ratio: float, low: bool) -> float:
    """One step of `ratio` beyond `edge`, rounded to the nearest 1, 2, 3 or 5 x 10^k (in log
    terms) as people write lrs (0.03 / 3.33 -> 0.01, not 0.009), or to 3 significant digits
    where that rounding would not be beyond the edge."""
    target = edge / ratio if low else edge * ratio
    k = math.floor(math.log10(target))
    nice = min((m * 10.0**e for m in (1, 2, 3, 5) for e in (k - 1, k, k + 1)),
               key=lambda c: abs(math.log(c / target)))
    nice = float(f"{nice:.3g}")
    return nice if (nice < edge if low else nice > edge) else float(f"{target:.3g}")


def plan_next(trials: Sequence[TrialConfig], runs: pl.DataFrame, spec_seeds: Sequence[int],
              seeds: int, started: Sequence[str] = (), neighbours: bool = False) -> list[Ladder]:
    """One Ladder per tuning group of `trials` (a spec's grid), in grid order, judged from the
    store's `runs` (every lr stored for the group counts, the spec's or another's); `started`:
    trial ids started without a runs row yet (running or interrupted); `neighbours`: seed the lrs
    either side of an inside best as well."""
    from analysis.selection import best_lr

    groups: dict[str, list[TrialConfig]] = {}
    for t in trials:
        groups.setdefault(_tuning_id(t), []).append(t)
    status = {tid: "started" for tid in started}
    status.update(zip(runs["trial_id"].to_list(), runs["status"].to_list()) if runs.height else {})
    best = best_lr(runs) if runs.height else pl.DataFrame({"tuning_id": []}, schema={"tuning_id": pl.String})
    best_by = {r["tuning_id"]: r for r in best.iter_rows(named=True)}
    if runs.height:
        from analysis.query_base import prepare_runs
        seed_means = (prepare_runs(runs).filter(pl.col("status") == "done")
                      .group_by("tuning_id", "lr").agg(pl.col("final_val_loss").mean()).collect())
        tried = prepare_runs(runs).filter(pl.col("status").is_in(FINISHED)).select("tuning_id", "lr").collect()
    else:
        seed_means = tried = pl.DataFrame(schema={"tuning_id": pl.String, "lr": pl.Float64})
    reps = [_unsized(group[0], trials[0]) for group in groups.values()]
    labels = labels_for(reps)  # the model, lr and seed have columns of their own
    wanted = seed_list(spec_seeds, seeds)
    out = []
    for tid, group in groups.items():
        t0 = group[0]
        losses: dict[float, float | None] = {lr: None for lr in tried.filter(pl.col("tuning_id") == tid)["lr"]}
        for r in seed_means.filter(pl.col("tuning_id") == tid).iter_rows(named=True):
            losses[r["lr"]] = r["final_val_loss"]
        losses = dict(sorted(losses.items()))
        label = labels[_unsized(t0, trials[0]).trial_id] or t0.optimizer.name
        unfinished = [t for t in group if status.get(t.trial_id) not in FINISHED]
        if unfinished:
            states = sorted({status.get(t.trial_id, "pending") for t in unfinished})
            out.append(Ladder(t0, label, losses, "waiting",
                              f"{len(unfinished)} of its {len(group)} trials not finished ({', '.join(states)})"))
            continue
        out.append(_judge(t0, label, losses, best_by.get(tid), spec_seeds, wanted, status, neighbours))
    return out


def _judge(t0: TrialConfig, label: str, losses: dict[float, float | None], row: dict[str, Any] | None,
           spec_seeds: Sequence[int], wanted: Sequence[int], status: dict[str, str],
           neighbours: bool = False) -> Ladder:
    lrs = sorted(losses)
    if row is None:  # every lr tried diverged: go below the smallest
        lr = _beyond(lrs[0], lrs[1] / lrs[0] if len(lrs) > 1 else 3.0, low=True)
        return Ladder(t0, label, losses, "extend", f"every lr diverged: one below, {lr:g}", None,
                      tuple(_with_lr(t0, lr, s) for s in spec_seeds))
    best = row["lr"]
    tie = f"; a tie with {row['runner_up_lr']:g}" if row.get("tie") else ""
    if len(lrs) == 1:
        lo, hi = _beyond(best, 3.0, low=True), _beyond(best, 3.0, low=False)
        return Ladder(t0, label, losses, "extend", f"one lr tried: one either side, {lo:g} and {hi:g}", best,
                      tuple(_with_lr(t0, lr, s) for lr in (lo, hi) for s in spec_seeds))
    if best in (lrs[0], lrs[-1]):
        low = best == lrs[0]
        lr = _beyond(best, lrs[1] / lrs[0] if low else lrs[-1] / lrs[-2], low)
        side = "smallest" if low else "largest"
        return Ladder(t0, label, losses, "extend", f"best at the {side} lr tried: one beyond, {lr:g}{tie}", best,
                      tuple(_with_lr(t0, lr, s) for s in spec_seeds))
    missing = [s for s in wanted if status.get(_with_lr(t0, best, s).trial_id) not in FINISHED]
    rival = row["runner_up_lr"] if row.get("tie") else None
    if neighbours:  # the lr either side that trained (a diverged one has no loss to fit), and a tied rival
        i = lrs.index(best)
        sides = [lr for lr in (lrs[i - 1], lrs[i + 1]) if losses[lr] is not None]
        far = [rival] if rival is not None and rival not in sides else []
        todo = [(lr, s) for lr in (best, *sides, *far) for s in wanted
                if status.get(_with_lr(t0, lr, s).trial_id) not in FINISHED]
        if todo:
            at = sorted({lr for lr, _ in todo})
            return Ladder(t0, label, losses, "seeds",
                          f"best inside the ladder: seeds {', '.join(map(str, wanted))} at {best:g} and its "
                          f"neighbours ({', '.join(f'{lr:g}' for lr in sides) or 'none trained'}); "
                          f"{len(todo)} missing at {', '.join(f'{lr:g}' for lr in at)}{tie}", best,
                          tuple(_with_lr(t0, lr, s) for lr, s in todo))
        return Ladder(t0, label, losses, "complete",
                      f"best inside the ladder, {len(wanted)} seeds there and at its neighbours{tie}", best)
    rival_missing = [s for s in wanted if rival is not None
                     and status.get(_with_lr(t0, rival, s).trial_id) not in FINISHED]
    if not missing and rival_missing:  # a tie the best's seeds cannot settle alone: seed its rival too
        return Ladder(t0, label, losses, "seeds",
                      f"best inside the ladder, a tie with {rival:g}: seed{'s' * (len(rival_missing) > 1)} "
                      f"{', '.join(map(str, rival_missing))} at {rival:g} to pair them", best,
                      tuple(_with_lr(t0, rival, s) for s in rival_missing))
    if not missing:
        return Ladder(t0, label, losses, "complete", f"best inside the ladder, {len(wanted)} seeds there{tie}", best)
    return Ladder(t0, label, losses, "seeds",
                  f"best inside the ladder: seed{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} there{tie}",
                  best, tuple(_with_lr(t0, best, s) for s in missing))


def _per_file() -> tuple[Axis, ...]:
    """The axes a written spec holds one value of (the model shape, norm, attention, rotation,
    ...): every axis but the ladders' (optimizer) and the replicate (seed)."""
    return tuple(a for a in point_axes() if not a.ladders)


def _shape_tag(t: TrialConfig, templates: Sequence[TrialConfig]) -> str:
    """The file name's tag: d_model (and n_layers where the layers vary), the heads, MLP width and
    parametrization where they vary among the templates of that shape (the width study's sp and mup
    at one d_model: d64_sp, d64_mup), then the label of each other axis that varies among them."""
    m = t.model
    parts = [f"d{m.d_model}" + (f"_L{m.n_layers}" if len({u.model.n_layers for u in templates}) > 1 else "")]
    peers = [u.model for u in templates if (u.model.d_model, u.model.n_layers) == (m.d_model, m.n_layers)]
    if len({p.n_heads for p in peers}) > 1:
        parts.append(f"h{m.n_heads}")
    if len({p.d_mlp for p in peers}) > 1:
        parts.append(f"mlp{m.d_mlp}")
    if len({(p.parametrization, p.mup_base_width) for p in peers}) > 1:
        bases = {p.mup_base_width for p in peers if p.parametrization == "mup"}
        parts.append(m.parametrization + (f"{m.mup_base_width}" if m.parametrization == "mup" and len(bases) > 1 else ""))
    parts += [a.label(a.value(t)) for a in _per_file()
              if a.key != "model" and len({a.label(a.value(u)) for u in templates}) > 1]
    return "_".join(p.replace("/", "-").replace(":", "-") for p in parts)


def _written(t: TrialConfig, lads: Sequence[Ladder], seeds: list[int]) -> dict[str, Any]:
    """The grid of a written spec, in the axes' order: the template's value of each per-file axis
    (left out at its default unless the axis is always written), each ladder's optimizer entry
    with its new lrs, the seeds."""
    grid: dict[str, Any] = {}
    for a in grid_axes():
        if a.replicate:
            grid[a.key] = seeds
        elif a.ladders:
            entries = []
            for lad in lads:
                written = a.write(a.value(lad.template))
                lrs = sorted({n.optimizer.lr for n in lad.new})
                entries.append({"name": written.pop("name"), "lr": lrs[0] if len(lrs) == 1 else lrs,
                                **{k: v for k, v in written.items() if k != "lr"}})
            grid[a.key] = entries
        elif a.next_always or a.default is None or a.value(t) != a.default[0]:
            grid[a.key] = [a.write(a.value(t))]
    return grid


def next_specs(raw: dict[str, Any], name: str, ladders: Sequence[Ladder], spec_seeds: Sequence[int],
               command: str) -> list[NextSpec]:
    """The new trials of `ladders` as specs: one per value of the axes but optimizer and seed
    (model shape, norm, attention, rotation, ...), and per kind (edges: lrs beyond an edge;
    seeds: more seeds at an inside best). `raw`: the spec's YAML mapping, whose other sections
    are copied; `command` goes in each header."""
    from sweep.grid import expand
    from sweep.spec import parse_spec

    todo = [lad for lad in ladders if lad.new]
    templates = [lad.template for lad in todo]
    files: dict[tuple[str, str], list[Ladder]] = {}
    for lad in todo:
        kind = "edges" if lad.verdict == "extend" else "seeds"
        files.setdefault((kind, _shape_tag(lad.template, templates)), []).append(lad)
    specs = []
    for (kind, tag), group in files.items():
        seeds = sorted({s.seed for lad in group for s in lad.new})
        grid = _written(group[0].template, group, seeds)
        body = {"name": name, **{k: raw[k] for k in _SECTIONS[:2] if k in raw}, "grid": grid,
                **{k: raw[k] for k in _SECTIONS[2:] if k in raw}}
        what = ("one more lr beyond the edge of each ladder whose best was there" if kind == "edges"
                else "more seeds at each ladder's best lr (strictly inside it)")
        lines = [f"{HEADER}: {command}", f"# {name}, {tag}: {what}."]
        for lad in group:
            ladder = " / ".join(f"{lr:g}" + (f" ({loss:.3f})" if loss is not None else " (diverged)")
                                for lr, loss in lad.losses.items())
            lines.append(f"#   {lad.label}: lr {ladder}; {lad.why}")
        lines.append("# (val loss: seed-mean final val loss.) Same name as the spec: its store, every stored trial reused.")
        text = "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=110)
        trials = tuple(expand(parse_spec(yaml.safe_load(text), source=f"{name}_{kind}_{tag}", unprepared_ok=True)))
        _check_same(trials, group)
        specs.append(NextSpec(f"{name}_{kind}_{tag}.yaml", text, trials))
    return specs


def _check_same(trials: Sequence[TrialConfig], group: Sequence[Ladder]) -> None:
    """The written spec must expand to the decided trials (plus, in a seeds file, other
    ladders' seeds that are already finished: the grid is a product)."""
    decided = {n.trial_id for lad in group for n in lad.new}
    written = {t.trial_id for t in trials}
    if not decided <= written:
        raise RuntimeError(f"sweep next: a written spec lost trials {sorted(decided - written)} (a bug: please report)")
    bests = {(_tuning_id(lad.template), n.optimizer.lr) for lad in group for n in lad.new}
    stray = [t.trial_id for t in trials if t.trial_id not in decided and (_tuning_id(t), t.optimizer.lr) not in bests]
    if stray:
        raise RuntimeError(f"sweep next: a written spec gained trials {stray} (a bug: please report)")
