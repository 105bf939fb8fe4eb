"""What a spec promises, checked before anything starts: every combination of the grid axes
(cross-axis rules, memory and time bounds, repeated entries) and the corpus (study.data's
check_corpus and check_data). Each problem is one located line (sweep.spec_yaml.Where)."""

from __future__ import annotations

import itertools
from pathlib import Path

from pydantic import ValidationError

from resultstore.inputs import file_kind
from study.config import DataConfig, FieldError, TrialConfig
from study.data import check_corpus, check_data
from study.optim.registry import sharding_problem
from sweep.axes import AXES, point_axes, replicate
from sweep.grid import trial_config
from sweep.spec_schema import SweepSpec
from sweep.spec_yaml import ABSENT, Where, dig, error_message

__all__ = [
    "FASTEST_FLOP_S", "MAX_TRIAL_BYTES", "MAX_TRIAL_SECONDS", "MIN_STEP_S", "checked_corpus", "corpus_problems",
    "point_problems", "unprepared",
]

MAX_TRIAL_BYTES = 1 << 40
"""Estimated training memory above which a trial is refused (1 TiB: no single device or host)."""
MAX_TRIAL_SECONDS = 365 * 86400
"""Estimated duration above which a trial is refused (a year)."""
FASTEST_FLOP_S = 1e15
"""An optimistic sustained rate for one trial (1 PFLOP/s) for that estimate ..."""
MIN_STEP_S = 1e-4
"""... and an optimistic floor on one optimiser step's wall time (0.1 ms)."""


def checked_corpus(data: DataConfig, spec: dict, where: Where) -> tuple[DataConfig | None, str | None]:
    """(study.data.check_corpus's DataConfig, None), or (None, its problem located in the spec).
    A source that is neither a file nor a folder (a FIFO would block, /dev/zero never ends) is
    named as what it is, before anything reads it."""
    for name in ("text", "tokens"):
        given = getattr(data, name)
        kind = file_kind(Path(given).expanduser()) if given is not None else "missing"
        if kind not in ("a file", "a folder", "missing"):
            return None, where.format(("data", name), f"{given} is {kind}, not a file or folder", given)
    try:
        return check_corpus(data), None
    except FieldError as exc:
        return None, where.format(("data", *exc.loc), str(exc), dig(spec.get("data"), exc.loc))


def unprepared(spec: SweepSpec) -> bool:
    """The spec's token corpus folder is not prepared yet, and its stated vocab_size sizes the
    models (a missing .bin/.npy file is a wrong path, not a corpus still to prepare)."""
    d = spec.data
    return (d.tokens is not None and Path(d.tokens).suffix not in (".bin", ".npy")
            and not Path(d.tokens).expanduser().exists() and d.vocab_size is not None)


def point_problems(spec: SweepSpec, where: Where):
    """Every combination of the axes (seeds aside): rules across axes (group_size > n_layers,
    rotate: all with a big vocabulary), memory and time bounds; then repeated axis entries."""
    g, seed = spec.grid, replicate()
    axes = {a.key: getattr(g, a.key) for a in point_axes()}
    crossing = {a.path[0] for a in point_axes() if a.crosses_model}
    for picks in itertools.product(*(enumerate(v) for v in axes.values())):
        index = {key: i for key, (i, _) in zip(axes, picks)}
        mi, oi = index["model"], index["optimizer"]
        try:
            cfg = trial_config(spec, {**{key: v for key, (_, v) in zip(axes, picks)}, seed.key: getattr(g, seed.key)[0]})
        except FieldError as exc:  # a size rule (lr_scaling, batch_scaling) with no usable value here
            loc = ("grid", "optimizer", oi, *exc.loc[1:]) if exc.loc[0] == "optimizer" else exc.loc
            yield where.format(loc, f"{exc} (with grid.model[{mi}])")
            continue
        except ValidationError as exc:
            for err in exc.errors():
                rel = tuple(getattr((err.get("ctx") or {}).get("error"), "loc", ()) or ())
                msg = error_message(err) + (f" (with grid.model[{mi}])" if rel[:1] and rel[0] in crossing else "")
                yield where.format(_on_grid(rel, index), msg, dig(err.get("input"), rel) if rel else ABSENT)
            continue
        place, sharding = spec.resources.sharding_at(cfg.params)
        shards = int(spec.resources.for_params(cfg.params)["workers"]) if sharding == "fsdp" else 1
        for loc, msg in _budget(cfg, mi, shards):
            yield where.format(loc, msg)
        if sharding == "fsdp" and (problem := sharding_problem(cfg.optimizer.name, where.label(("resources", *place)))):
            yield where.format(("grid", "optimizer", oi, "name"),
                               problem + (f" (with grid.model[{mi}])" if place[0] == "by_size" else ""))
    for axis, entries in axes.items():
        for j, e in enumerate(entries):
            i = next(i for i, f in enumerate(entries) if f == e)
            if i < j:
                first = ("grid", axis, i)
                line = where.line(first)
                yield where.format(("grid", axis, j), f"the same grid point as {where.label(first)}"
                                   + (f" (line {line})" if line else ""))


def _on_grid(rel: tuple, index: dict[str, int]) -> tuple:
    """A TrialConfig place (("rotation", "group_size")) as the grid entry that set it
    (("grid", "rotation", 2, "group_size")); a place no axis sets as it is."""
    for a in point_axes():
        if rel[:len(a.path)] == a.path:
            return ("grid", a.key, index[a.key], *rel[len(a.path):])
    return rel


def _largest_batch(spec: SweepSpec) -> int:
    """The largest batch a trial trains with: train.batch_size, or what batch_scaling gives at
    the grid's largest size (a rule that fails is reported by _check_points)."""
    g, batches = spec.grid, [spec.train.batch_size]
    if getattr(spec.train, "batch_scaling", None) is not None:
        batches = []
        for m in g.model:
            try:
                point = {a.key: getattr(g, a.key)[0] for a in AXES}
                batches.append(trial_config(spec, {**point, "model": m}).train.batch_size)
            except (FieldError, ValidationError):
                continue
    return max(batches, default=spec.train.batch_size)


def corpus_problems(spec: SweepSpec, where: Where) -> list[str]:
    """study.data.check_data's problem (the corpus loads, holds the largest batch and an eval
    window), located; empty when there is none."""
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


def _budget(cfg: TrialConfig, mi: int, shards: int = 1):
    """Memory and time estimates (rough lower bounds, fp32) against MAX_TRIAL_BYTES and
    MAX_TRIAL_SECONDS; each problem at the field that drives it. `shards`: the FSDP workers
    that split the weights, gradients and optimiser state (1 unsharded)."""
    m, t, V, T = cfg.model, cfg.train, cfg.vocab_size, cfg.data.seq_len
    d, L, H, f = m.d_model, m.n_layers, m.n_heads, m.d_mlp
    state = 16 * cfg.params // shards  # weights, gradients, two Adam moments, fp32 (per worker)
    limit = f"one trial may use at most {_size(MAX_TRIAL_BYTES)}"
    if state > MAX_TRIAL_BYTES:
        parts = {("grid", "model", mi, "d_model"): cfg.params_non_embedding, ("data", "vocab_size"): 2 * V * d,
                 ("data", "seq_len"): T * d}
        yield (max(parts, key=parts.get),
               f"{cfg.params:,} parameters (d_model {d}, {L} layers, vocab {V}, seq_len {T}) need about "
               f"{_size(state)} for weights, gradients and Adam moments"
               f"{f' per worker ({shards} FSDP shards)' if shards > 1 else ''}; {limit}")
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
