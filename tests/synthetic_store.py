"""A synthetic results store with known answers, written by the product's own writer
(``resultstore.writer.ResultsStore``), so the analysis tests read the layout a sweep writes
(``runs/<id>.parquet``, ``metrics/<id>.<first>-<last>.parquet``, ...).

For the tests and the report benchmark (``benchmarks/bench_report.py``); not part of the product:

    truth = Synthetic().trials(sizes=(32, 64, 128), seeds=(0, 1, 2)).write("/tmp/results")
    analysis.write_report(truth.path)

(``Synthetic``: which trials, what is planted, which rows are written; its docstring.)

The residual-stream kurtosis of optimiser ``o`` at its final step, in block l of L, is

    3(d-1)/(d+1) + amplitude * (P / P_min) ** exponents[o] * w_l * exp(noise * z_trial + layer_noise * z)

with P = params_non_embedding, w_l = l / L (w_0 = 0.05 for the embeddings), z standard normal;
3(d-1)/(d+1) is the exact null (``analysis.null``): what centred per-token kurtosis reads at
width d without a privileged basis (below 3 at small d), and the random-basis control reads it
too. An exponent of ``None`` means no excess (like SGD
in the paper). Averaged over blocks 1..L the excess over the null (and the control) is
``amplitude * mean(w) * (P/P_min)**exponent`` times log-normal noise, so a power-law fit of
stored minus control kurtosis recovers ``exponent``. The excess grows linearly over training
(zero at step 0). Rotated models move the excess out of the stored basis into the
computation basis (the paper's finding). Other metrics are simple functions of the excess
(``outlier_dims_rel`` = round(2 excess), 0 at d_model <= 36 as in a real model).

The width-free measure and the per-trial test (issue 32; ``basis_test=True``, with ``metrics``
containing kurtosis; off by default, so the stores the older tests build are unchanged): the
planted excess is one coordinate holding the share f = min(0.95, sqrt(excess / d)) of every
token's energy (kurtosis ~ d f^2), so ``top1_share`` /
``top4_share`` = f + (1 - f) * top_share_null(d, k) at every (layer, site, basis) that has
kurtosis, and the null itself in random bases (with the default exponent 0.5, excess ~ P^0.5 ~ d
and f is the same at every width: kurtosis grows, the top-1 share does not). The control rows
of the probe's basis test, in basis ``random`` at sites resid (layers 0..L), attn_in and mlp_in
(layers 1..L): kurtosis (the exact null), top1_share, top4_share (their null), ``kurtosis_sd``
(``CONTROL_SD``), ``kurtosis_median`` (null - 0.02) and the rank tests ``kurtosis_rank_p``,
``top1_share_rank_p`` = (1 + #{i <= 32: z_i >= z_0 + excess / CONTROL_SD}) / 33 with z standard
normal (the stored basis' excess: resid's stored basis, the inputs' computation basis): 1/33
where the excess is clear, uniform on {1..33}/33 where there is none (step 0, SGD).

The attention axis (issue 36; ``attentions`` beyond softmax, ``sinks=True``; off by default, so
older stores are unchanged): attention ``a`` multiplies every trial's planted excess by
``SINK_SHARE[a]`` (1 for softmax: removing the sink removes part of the excess), and the sink rows
at site ``attn``, basis ``heads``, blocks 1..L, are ``s = SINK_SHARE[a] * (0.2 + 0.6 w_l) * frac``:
first_mass = u + (1 - u) s with u = H_64 / 64 (uniform causal attention at seq_len 64),
delimiter_mass = 0.25 + 0.5 s, sink_heads = min(1, 2 s), null_mass = ``NULL_MASS[a]`` * frac; and at
layer -1, basis ``uniform``: first_mass = u, delimiter_mass = 0.25. The sink follows the attention,
not the optimiser; the excess follows both.

``lrs`` gives an optimiser an lr ladder: one trial per lr, the final val loss rising as
``lr_penalty * log(lr / best)**2`` away from the optimiser's best lr (``best_lrs``, at the
smallest size; it moves as (P / P_min) ** lr_exponents[o] with size).
The quantisation penalty (metric ``quant_loss_delta``, site ``model``, layer -1, bases
``w8a8`` / ``w4a4``, final step) is ``0.01 * (1 + excess)`` (x 8 for w4a4), log-normal noise.
Everything is vectorised so ~10M metric rows take seconds.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

import pyarrow.parquet as pq

from analysis.identity import science_hash
from analysis.null import null_expr, top_share_null, top_share_null_expr
from analysis.load import CHECKS_SCHEMA, CURVES_SCHEMA, METRICS_SCHEMA, RUNS_SCHEMA
from resultstore.schema import ARROW
from study.optim import OPTIMIZER_FAMILY
from resultstore.writer import ResultsStore

__all__ = ["BASIS_TEST_METRICS", "CONTROL_SD", "FAMILIES", "NULL_MASS", "Planted", "Rows", "SINK_SHARE", "SITE_METRICS", "Synthetic",
           "SyntheticStore", "Trials", "UNIFORM_FIRST"]

FAMILIES = OPTIMIZER_FAMILY
"""The family each synthetic optimiser's runs row carries: its rule on a hidden matrix, from the
optimiser registry (study/optim/; torch-free), so a new optimiser needs no line here."""
_DEFAULT_LR = {"adam": 3e-3, "rotated_adam": 3e-3, "sgd": 0.3}

SITE_METRICS = (
    "kurtosis",
    "neuron_kurtosis",
    "outlier_dims_abs",
    "outlier_dims_rel",
    "max_abs",
    "max_median_ratio",
)
"""The metrics at every site (with ``basis_test``, also top1_share and top4_share)."""

BASIS_TEST_METRICS = (
    "top1_share", "top4_share", "kurtosis_sd", "kurtosis_median", "kurtosis_rank_p", "top1_share_rank_p",
)  # fmt: skip
"""The rows ``basis_test=True`` adds (issue 32's probe): the top-k shares at every site, the
control's spread and rank tests in basis random; and kurtosis / top shares at attn_in and mlp_in
in basis random."""

CONTROL_SD = 0.05
"""The synthetic control's sd of kurtosis across its random bases (``kurtosis_sd``): the unit in
which the rank tests see the planted excess."""
_CONTROL_BASES = 32

SINK_SHARE = {"softmax": 1.0, "softmax1": 0.4, "gated": 0.25, "clipped": 0.6, "kv_bias": 0.4}
"""Per attention: the planted sink level, and the factor on the planted excess."""
NULL_MASS = {"softmax1": 0.3, "kv_bias": 0.3, "clipped": 0.05}
"""Per attention: the final null_mass (0 for the rest)."""
UNIFORM_FIRST = sum(1 / i for i in range(1, 65)) / 64
"""first_mass of uniform causal attention at seq_len 64: H_64 / 64."""


@dataclass(frozen=True)
class SyntheticStore:
    """Where the store was written and the numbers it was built from."""

    path: str
    exponents: Mapping[str, float | None]
    amplitude: float
    mean_layer_weight: float
    params_non_embedding: tuple[int, ...]
    n_trials: int
    n_done: int
    n_metric_rows: int
    layer_weights: tuple[float, ...] = ()
    """w_l of blocks 1..L (of the first size's depth)."""

    def expected_excess(self, optimizer: str, params_non_embedding: float) -> float:
        """Noise-free block-mean excess kurtosis (stored basis, no rotation, final step)."""
        b = self.exponents.get(optimizer)
        if b is None:
            return 0.0
        p0 = min(self.params_non_embedding)
        return self.amplitude * self.mean_layer_weight * (params_non_embedding / p0) ** b

    def expected_top1_share(self, optimizer: str, params_non_embedding: float, d_model: int) -> float:
        """Noise-free block-mean top-1 share (stored basis, no rotation, final step):
        f_l + (1 - f_l) * top_share_null(d) with f_l = min(0.95, sqrt(excess_l / d))."""
        b = self.exponents.get(optimizer)
        p0 = min(self.params_non_embedding)
        amp = 0.0 if b is None else self.amplitude * (params_non_embedding / p0) ** b
        null = top_share_null(d_model)
        shares = [min(0.95, math.sqrt(amp * w / d_model)) for w in self.layer_weights]
        return float(np.mean([f + (1 - f) * null for f in shares]))


def _params(d: int, n_layers: int, vocab: int, seq_len: int) -> tuple[int, int]:
    non_emb = 12 * n_layers * d * d
    return non_emb + vocab * d + seq_len * d, non_emb


@dataclass(frozen=True)
class Trials:
    """Which trials there are: one per size x optimizer (x lr) x norm x attention x rotation x seed.

    ``n_layers`` is one depth or one per size; ``lrs`` gives an optimiser an lr ladder (one trial
    per lr). ``rotations`` entries are names, ``("partial", k)``, ``("partial", k, False)``
    (embeddings not rotated: label ``partial(k)-noemb``), ``("partial", k, "group")`` (the ends in
    the group's basis: ``partial(k)-groupends``) or ``("groups", [[0, 1], [2, 3]])``. The first
    ``failed`` trials are marked failed (null results, an error, a few metric rows that must be
    ignored), the next ``diverged`` diverged."""

    sizes: Sequence[int] = (32, 64, 128)
    n_layers: int | Sequence[int] = 4
    optimizers: Sequence[str] = ("adam", "sgd")
    lrs: Mapping[str, Sequence[float]] | None = None
    norms: Sequence[str] = ("layernorm",)
    attentions: Sequence[str] = ("softmax",)
    rotations: Sequence[str | tuple] = ("none",)
    seeds: Sequence[int] = (0, 1, 2)
    failed: int = 0
    diverged: int = 0


@dataclass(frozen=True)
class Planted:
    """The known answers (the module docstring's formulas). ``exponents``: the excess kurtosis'
    power in P per optimiser (None: no excess; default 0.5 for an adam, None otherwise).
    ``sharing``: the computation-basis excess of ``partial(k)`` grows with k (x k / L; x 1.5 with
    the ends unrotated), as the paper's question 5 would have it. ``best_lrs``, ``lr_exponents``,
    ``lr_penalty``: the final val loss of an lr ladder (the module docstring)."""

    exponents: Mapping[str, float | None] | None = None
    amplitude: float = 2.0
    noise: float = 0.1
    layer_noise: float = 0.02
    sharing: bool = False
    best_lrs: Mapping[str, float] | None = None
    lr_exponents: Mapping[str, float] | None = None
    lr_penalty: float = 0.05


@dataclass(frozen=True)
class Rows:
    """Which rows and tables are written: metrics at ``steps`` (``metrics`` at every site, the
    quantisation penalty with ``quant``, its standard error with ``quant_se``), the probe's basis
    test (``basis_test``, issue 32; off: a store from before it, row for row), the sink rows
    (``sinks``, issue 36), and the curves and checks tables."""

    steps: Sequence[int] = (0, 50, 100)
    metrics: Sequence[str] = SITE_METRICS
    quant: bool = True
    quant_se: bool = False
    basis_test: bool = False
    sinks: bool = False
    curves: bool = True
    checks: bool = True


@dataclass(frozen=True)
class Synthetic:
    """A synthetic store to write, built in parts, each step a new builder:

        Synthetic("flat", seed=1).trials(sizes=(32, 64)).rows(steps=(0, 10)).write(root)

    writes ``<root>/flat/`` and returns its ``SyntheticStore``. ``name`` is the sweep's (it is in
    each trial's config, so in its config_id); ``seed`` seeds every random draw. A builder is a
    value: keep one as a module's template and vary it (``replace(template, name=...)``)."""

    name: str = "synthetic"
    seed: int = 0
    grid: Trials = Trials()
    truth: Planted = Planted()
    tables: Rows = Rows()

    def trials(self, **fields: Any) -> Synthetic:
        """These ``Trials`` fields replaced."""
        return replace(self, grid=replace(self.grid, **fields))

    def planted(self, **fields: Any) -> Synthetic:
        """These ``Planted`` fields replaced."""
        return replace(self, truth=replace(self.truth, **fields))

    def rows(self, **fields: Any) -> Synthetic:
        """These ``Rows`` fields replaced."""
        return replace(self, tables=replace(self.tables, **fields))

    def write(self, root: str | os.PathLike[str], *, parts: int = 1, through_store: bool = True) -> SyntheticStore:
        """Write ``<root>/<name>/`` through ``ResultsStore``: a runs row, a checks file and ``parts``
        flushed step ranges of metrics and curves per trial. ``through_store=False`` writes the same
        files with the same Arrow schema directly (row dicts are too slow for the 10M-row benchmark)."""
        g = self.grid
        rng = np.random.default_rng(self.seed)
        exps = dict(self.truth.exponents or {"adam": 0.5, "sgd": None})
        for o in g.optimizers:
            exps.setdefault(o, 0.5 if "adam" in o else None)
        depths = [g.n_layers] * len(g.sizes) if isinstance(g.n_layers, int) else list(g.n_layers)
        runs = _runs(self, exps, depths, rng)
        m = _metric_rows(self, runs, depths, rng)
        tables = {"runs": runs.with_columns(**{c: pl.lit(None) for c in RUNS_SCHEMA if c not in runs.columns})
                  .select(list(RUNS_SCHEMA)).cast(RUNS_SCHEMA),  # type: ignore[arg-type]
                  "metrics": m.cast(METRICS_SCHEMA)}  # type: ignore[arg-type]
        curves, checks = _curves_and_checks(runs, self.tables.steps)
        if self.tables.curves:
            tables["curves"] = curves.cast(CURVES_SCHEMA)  # type: ignore[arg-type]
        if self.tables.checks:
            tables["checks"] = checks.cast(CHECKS_SCHEMA)  # type: ignore[arg-type]
        _write_tables(ResultsStore(root, self.name), tables, parts, through_store)
        sweep = os.path.join(os.fspath(root), self.name)
        os.makedirs(os.path.join(sweep, "ray"), exist_ok=True)  # a non-table folder to ignore
        with open(os.path.join(sweep, "ray", "experiment_state.json"), "w") as f:
            f.write("{}")
        sizes_ne = tuple(sorted({_params(d, L, _VOCAB, _SEQ_LEN)[1] for d, L in zip(g.sizes, depths, strict=True)}))
        weights = tuple(l / depths[0] for l in range(1, depths[0] + 1))
        return SyntheticStore(path=sweep, exponents=exps, amplitude=self.truth.amplitude,
                              mean_layer_weight=float(np.mean(weights)), params_non_embedding=sizes_ne,
                              n_trials=runs.height, n_done=runs.height - g.failed - g.diverged,
                              n_metric_rows=m.height, layer_weights=weights)


_VOCAB, _SEQ_LEN, _BATCH = 256, 64, 8


def _runs(spec: Synthetic, exps: dict[str, float | None], depths: list[int], rng: np.random.Generator) -> pl.DataFrame:
    """One runs row per trial (plus the hidden columns the other tables are computed from:
    ``_excess_b``, ``_sink``, ``_null_mass``, ``_lr_off``, ``_z``, ``_amp``), statuses and losses set."""
    g, t, name = spec.grid, spec.truth, spec.name
    rows = []
    p_min = min(_params(d, L, _VOCAB, _SEQ_LEN)[1] for d, L in zip(g.sizes, depths, strict=True))
    ladders = {o: list((g.lrs or {}).get(o) or [_DEFAULT_LR.get(o, 3e-3)]) for o in g.optimizers}
    best = {o: (t.best_lrs or {}).get(o, _DEFAULT_LR.get(o, 3e-3)) for o in g.optimizers}
    attention_column = spec.tables.sinks or tuple(g.attentions) != ("softmax",)  # else a store from before the axis
    for (d, L), opt, lr, norm, att, rot, s in (
        (dl, o, lr, n, a, r, s)
        for dl in zip(g.sizes, depths, strict=True)
        for o in g.optimizers
        for lr in ladders[o]
        for n in g.norms
        for a in g.attentions
        for r in g.rotations
        for s in g.seeds
    ):
        rot_name, gs, emb = (rot, None, True) if isinstance(rot, str) else (*rot, True)[:3]
        ends_group, emb = emb == "group", emb if emb != "group" else True
        groups = gs if rot_name == "groups" else None
        gs = None if rot_name == "groups" else gs
        label = (
            f"partial({gs})" if gs is not None
            else "groups" + json.dumps(groups, separators=(",", ":")) if groups is not None
            else rot_name
        ) + ("-groupends" if ends_group else "" if emb else "-noemb")  # fmt: skip
        params, non_emb = _params(d, L, _VOCAB, _SEQ_LEN)
        tokens = 20 * non_emb
        config = {
            "model": {"d_model": d, "n_layers": L, "n_heads": max(1, d // 16), "d_mlp": 4 * d},
            "norm": norm,
            **({} if att == "softmax" else {"attention": {"name": att}}),
            "rotation": {"mode": rot_name, "group_size": gs, "groups": groups, **({} if emb else {"embeddings": False}),
                         **({"ends": "group"} if ends_group else {})},
            "optimizer": {"name": opt, "lr": lr},
            "data": {"corpus": "stdlib", "seq_len": _SEQ_LEN},
            "train": {"tokens_per_param": 20, "batch_size": _BATCH},
            "seed": s,
            "sweep": name,
        }
        rows.append({
            "trial_id": f"t{len(rows):05d}", "sweep": name, "status": "done",
            "d_model": d, "n_layers": L, "n_heads": max(1, d // 16), "d_mlp": 4 * d,
            "params": params, "params_non_embedding": non_emb, "flops_per_token": 6.0 * non_emb,
            "optimizer": opt, "optimizer_family": FAMILIES.get(opt), "lr": lr, "norm": norm,
            **({"attention": att} if attention_column else {}),
            "rotation": rot_name, "group_size": gs,
            "rotation_groups": None if groups is None else json.dumps(groups, separators=(",", ":")),
            "rotation_label": label, "rotate_embeddings": emb, "config_id": science_hash(config), "seed": s,
            "corpus": "stdlib", "seq_len": _SEQ_LEN, "batch_size": _BATCH, "tokens": tokens,
            "steps": max(spec.tables.steps), "final_train_loss": 0.0, "final_val_loss": 0.0,
            "tokens_per_s": 1e5, "wall_s": tokens / 1e5, "device": "cpu", "torch_version": "2.5.0",
            "version": "0.1.0", "git_sha": "0000000", "corpus_fingerprint": "abc", "error": None,
            "config_json": json.dumps(config),
            "_excess_b": exps[opt], "_sink": SINK_SHARE[att], "_null_mass": NULL_MASS.get(att, 0.0),
            "_lr_off": math.log(lr / (best[opt] * (non_emb / p_min) ** (t.lr_exponents or {}).get(opt, 0.0))) ** 2,
            "_z": float(rng.standard_normal()),
        })  # fmt: skip
    return _outcomes(pl.DataFrame(rows), spec, p_min)


def _outcomes(runs: pl.DataFrame, spec: Synthetic, p_min: int) -> pl.DataFrame:
    """Statuses (the first ``failed``, then ``diverged``), losses, errors and each trial's planted
    amplitude ``_amp``."""
    g, t = spec.grid, spec.truth
    n = runs.height
    status = ["failed"] * g.failed + ["diverged"] * g.diverged + ["done"] * (n - g.failed - g.diverged)
    runs = runs.with_columns(status=pl.Series(status[:n]))
    p_rel = pl.col("params_non_embedding") / p_min
    val = 2.0 + 40.0 * pl.col("params_non_embedding").cast(pl.Float64) ** -0.3 * (
        1 + 0.01 * pl.col("_z")
    )
    val = val + t.lr_penalty * pl.col("_lr_off")
    runs = runs.with_columns(final_val_loss=val, final_train_loss=val - 0.02)
    bad = pl.col("status") != "done"
    return runs.with_columns(
        final_val_loss=pl.when(pl.col("status") == "diverged")
        .then(float("nan"))
        .when(bad)
        .then(None)
        .otherwise(pl.col("final_val_loss")),
        final_train_loss=pl.when(bad).then(None).otherwise(pl.col("final_train_loss")),
        error=pl.when(pl.col("status") == "failed")
        .then(pl.lit("RuntimeError: CUDA out of memory\nTraceback ..."))
        .otherwise(None),
        _amp=pl.when(pl.col("_excess_b").is_null())
        .then(0.0)
        .otherwise(t.amplitude * p_rel.cast(pl.Float64) ** pl.col("_excess_b"))
        * (t.noise * pl.col("_z")).exp() * pl.col("_sink"),
    )


def _metric_rows(spec: Synthetic, runs: pl.DataFrame, depths: list[int], rng: np.random.Generator) -> pl.DataFrame:
    """trial x step x (site, basis, layer) x metric, vectorised; then the basis test's, the
    quantisation and the sink rows, as ``spec.tables`` asks."""
    r, layer_noise = spec.tables, spec.truth.layer_noise
    site_rows = []
    for L in sorted(set(depths)):
        for layer in range(L + 1):
            w = 0.05 if layer == 0 else layer / L
            site_rows += [(L, "resid", "stored", layer, w), (L, "resid", "random", layer, w)]
            if layer:
                site_rows += [
                    (L, "attn_in", "computation", layer, w),
                    (L, "mlp_in", "computation", layer, w),
                    (L, "mlp_act", "neuron", layer, w),
                ]
        site_rows.append((L, "model", "computation", -1, 1.0))
    sites = pl.DataFrame(
        site_rows, schema=["n_layers", "site", "basis", "layer", "w"], orient="row"
    )
    step_frame = _step_frame(r.steps)
    metric_frame = pl.DataFrame({"metric": [*r.metrics, "dettmers_outliers"]})
    trials = runs.filter(pl.col("status") != "failed").select(
        "trial_id", "n_layers", "rotation", "d_model", "tokens", "_amp", "group_size", "rotate_embeddings"
    )
    quant_trials = trials
    trials = pl.concat(
        [trials, runs.filter(pl.col("status") == "failed").select(trials.columns).head(1)]
    )
    m = (
        trials.join(sites, on="n_layers")
        .join(step_frame, how="cross")
        .join(metric_frame, how="cross")
        .filter((pl.col("site") == "model") == (pl.col("metric") == "dettmers_outliers"))
    )
    m = m.with_columns(z=pl.Series(rng.standard_normal(m.height)))
    planted = pl.col("_amp") * pl.col("w") * pl.col("frac") * _basis_factor(spec.truth.sharing) * (
        layer_noise * pl.col("z")).exp()
    shares = (
        _basis_test_rows(m.filter(pl.col("metric") == "kurtosis").with_columns(planted=planted), layer_noise, spec.seed)
        if r.basis_test and "kurtosis" in r.metrics else None
    )  # fmt: skip
    m = m.select(
        "trial_id",
        "step",
        tokens=(pl.col("tokens") * pl.col("frac")).cast(pl.Int64),
        layer="layer",
        site="site",
        basis="basis",
        metric="metric",
        value=_site_value(planted + 0.01 * layer_noise * pl.col("z")).cast(pl.Float64),
    )
    if shares is not None:  # these top shares replace any asked for in ``metrics`` (z was drawn: it is unchanged)
        m = m.filter(~pl.col("metric").is_in(["top1_share", "top4_share"]))
        m = pl.concat([m, shares.select(m.columns).cast(m.schema)])  # type: ignore[arg-type]
    if r.quant:
        m = pl.concat([m, *_quant_rows(quant_trials, r, depths, rng, m.schema)])
    if r.sinks:
        m = pl.concat([m, _sink_rows(runs, step_frame).cast(m.schema)])  # type: ignore[arg-type]
    return m


def _step_frame(steps: Sequence[int]) -> pl.DataFrame:
    return pl.DataFrame({"step": list(steps)}).with_columns(frac=pl.col("step") / max(max(steps), 1))


def _basis_factor(sharing: bool) -> pl.Expr:
    """The share of the planted excess each (site, basis) sees: none in random bases, 0.02 of it in
    the stored basis of a rotated model, the computation basis' share by rotation."""
    rotated = pl.col("rotation") != "none"
    stored_factor = pl.when(rotated).then(0.02).otherwise(1.0)
    comp_factor = pl.when(pl.col("rotation") == "independent").then(0.3).otherwise(1.0)
    if sharing:
        by_group = pl.col("group_size") / pl.col("n_layers") * pl.when(pl.col("rotate_embeddings")).then(1.0).otherwise(1.5)
        comp_factor = pl.when(pl.col("rotation") == "partial").then(by_group).otherwise(comp_factor)
    return (
        pl.when(pl.col("basis") == "random")
        .then(0.0)
        .when(pl.col("site") == "resid")
        .then(stored_factor)
        .otherwise(comp_factor)
    )


def _site_value(excess: pl.Expr) -> pl.Expr:
    """Each site metric from the row's excess kurtosis (the module docstring)."""
    control = null_expr("d_model")  # no privileged basis: the exact null
    return (
        pl.when(pl.col("metric") == "kurtosis")
        .then(control + excess)
        .when(pl.col("metric") == "neuron_kurtosis")
        .then(1.0 + 0.5 * excess)
        .when(pl.col("metric") == "outlier_dims_abs")
        .then(pl.when(pl.col("site") == "resid").then(pl.col("d_model")).otherwise(excess.round()))
        .when(pl.col("metric") == "outlier_dims_rel")  # none can pass 6 RMS at d <= 36
        .then(pl.when(pl.col("d_model") <= 36).then(0.0).otherwise((2.0 * excess).round().clip(0)))
        .when(pl.col("metric") == "max_abs")
        .then(5.0 + 3.0 * excess)
        .when(pl.col("metric") == "max_median_ratio")
        .then(4.0 + excess)
        .otherwise(excess.round().clip(0))
    )


def _quant_rows(trials: pl.DataFrame, r: Rows, depths: list[int], rng: np.random.Generator,
                schema: pl.Schema) -> list[pl.DataFrame]:
    """The quantisation penalties (and, with ``quant_se``, their standard errors) at the final step."""
    q = trials.join(
        pl.DataFrame({"basis": ["w8a8", "w4a4"], "scale": [1.0, 8.0]}), how="cross"
    )
    q = q.with_columns(z=pl.Series(rng.standard_normal(q.height)))
    mean_w = float(np.mean([layer / max(depths) for layer in range(1, max(depths) + 1)]))
    unrotated = pl.when(pl.col("rotation") == "none").then(1.0).otherwise(0.02)
    q = q.select(
        "trial_id",
        step=pl.lit(max(r.steps), pl.Int64),
        tokens="tokens",
        layer=pl.lit(-1, pl.Int64),
        site=pl.lit("model"),
        basis="basis",
        metric=pl.lit("quant_loss_delta"),
        value=0.01 * pl.col("scale") * (1 + pl.col("_amp") * mean_w * unrotated)
        * (0.1 * pl.col("z")).exp(),
    )
    out = [q.cast(schema)]  # type: ignore[arg-type]
    if r.quant_se:  # each penalty's standard error over the eval sequences: a fifth of its size
        out.append(q.with_columns(metric=pl.lit("quant_loss_delta_se"), value=0.2 * pl.col("value"))
                   .cast(schema))  # type: ignore[arg-type]
    return out


def _curves_and_checks(runs: pl.DataFrame, steps: Sequence[int]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The loss curves and the rotation check of every trial that ran."""
    done = runs.filter(pl.col("status") != "failed")
    cur = done.select("trial_id", "tokens", "final_val_loss", "lr").join(_step_frame(steps), how="cross")
    cur = cur.select(
        "trial_id",
        "step",
        tokens=(pl.col("tokens") * pl.col("frac")).cast(pl.Int64),
        train_loss=pl.col("final_val_loss") + 3.0 * (1 - pl.col("frac")) ** 2 - 0.02,
        val_loss=pl.when(pl.col("step") % 2 == 0)
        .then(pl.col("final_val_loss") + 3.0 * (1 - pl.col("frac")) ** 2)
        .otherwise(None),
        lr=pl.col("lr") * (0.5 * (1 + (math.pi * pl.col("frac")).cos())),
        grad_norm=1.0 / (1 + pl.col("frac")),
        tokens_per_s=pl.lit(1e5),
    )
    dtypes = pl.DataFrame(
        {"dtype": ["float64", "float32", "bfloat16"], "eps": [1e-12, 1e-6, 1e-2]}
    )
    chk = done.select("trial_id", "norm").join(dtypes, how="cross")
    chk = chk.select(
        "trial_id",
        check=pl.lit("rotate_residual_basis"),
        dtype="dtype",
        value=pl.when(pl.col("norm") == "layernorm")
        .then(0.05 + pl.col("eps"))
        .otherwise(pl.col("eps")),
    )
    return cur, chk


def _write_tables(store: ResultsStore, tables: dict[str, pl.DataFrame], parts: int, through_store: bool) -> None:
    """Each trial's rows of each table: runs and checks in one file, metrics and curves in ``parts``
    flushes, each a step range."""
    for table, frame in tables.items():
        for (tid,), part in sorted(frame.partition_by("trial_id", as_dict=True).items()):
            if table in ("runs", "checks"):
                if not through_store:
                    _write(store, f"{table}/{tid}.parquet", part, table)
                elif table == "runs":
                    store.write_run(part.row(0, named=True))
                else:
                    store.write_rows("checks", tid, part.drop("trial_id").to_dicts())
                continue
            steps_ = part.get_column("step").unique().sort().to_list()
            k = max(1, min(parts, len(steps_)))
            for i in range(k):  # k flushes, each a step range
                lo, hi = steps_[i * len(steps_) // k], steps_[(i + 1) * len(steps_) // k - 1]
                piece = part.filter(pl.col("step").is_between(lo, hi))
                if through_store:
                    store.write_rows(table, tid, piece.drop("trial_id").to_dicts())
                else:
                    _write(store, f"{table}/{tid}.{lo:09d}-{hi:09d}.parquet", piece, table)


def _write(store: ResultsStore, rel: str, frame: pl.DataFrame, table: str) -> None:
    """What ``ResultsStore`` writes, from a frame: same name, same Arrow schema."""
    path = os.path.join(store.path, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(frame.to_arrow().select(ARROW[table].names).cast(ARROW[table]), path)


def _sink_rows(runs: pl.DataFrame, step_frame: pl.DataFrame) -> pl.DataFrame:
    """The attention-sink rows of every trial that ran (the module docstring's formulas): blocks
    1..L at site attn / basis heads, and the uniform reference at layer -1 / basis uniform."""
    trials = runs.filter(pl.col("status") != "failed").select("trial_id", "n_layers", "tokens", "_sink", "_null_mass")
    blocks = trials.join(step_frame, how="cross").with_columns(
        layer=pl.int_ranges(1, pl.col("n_layers") + 1)).explode("layer")
    s = pl.col("_sink") * (0.2 + 0.6 * pl.col("layer") / pl.col("n_layers")) * pl.col("frac")
    keys = dict(step="step", tokens=(pl.col("tokens") * pl.col("frac")).cast(pl.Int64), layer="layer",
                site=pl.lit("attn"), basis=pl.lit("heads"))
    heads = [blocks.select("trial_id", **keys, metric=pl.lit(name), value=value.cast(pl.Float64)) for name, value in (
        ("first_mass", UNIFORM_FIRST + (1 - UNIFORM_FIRST) * s), ("delimiter_mass", 0.25 + 0.5 * s),
        ("sink_heads", (2 * s).clip(upper_bound=1.0)), ("null_mass", pl.col("_null_mass") * pl.col("frac")))]
    ends = trials.join(step_frame, how="cross")
    uniform = [ends.select("trial_id", **{**keys, "layer": pl.lit(-1, pl.Int64), "basis": pl.lit("uniform")},
                           metric=pl.lit(name), value=pl.lit(value, pl.Float64))
               for name, value in (("first_mass", UNIFORM_FIRST), ("delimiter_mass", 0.25))]
    return pl.concat(heads + uniform)


def _basis_test_rows(kurt: pl.DataFrame, layer_noise: float, seed: int) -> pl.DataFrame:
    """The rows ``basis_test`` adds, from the kurtosis rows (``planted``: each row's noise-free
    excess): top shares beside every kurtosis row, the control's kurtosis and top shares at
    attn_in / mlp_in in basis random, and the control's spread, median and rank tests in basis
    random at resid, attn_in and mlp_in. Own random stream: the other rows do not move."""
    rng = np.random.default_rng([seed, 32])
    keys = ["trial_id", "step", "tokens", "layer", "site", "basis"]
    kurt = kurt.with_columns(tokens=(pl.col("tokens") * pl.col("frac")).cast(pl.Int64)).sort(keys)
    tested = pl.col("site").is_in(["attn_in", "mlp_in"]) & (pl.col("basis") == "computation")
    # the inputs' random-basis control: no planted excess, the exact null
    control = kurt.filter(tested).with_columns(basis=pl.lit("random"), planted=pl.lit(0.0))
    control = control.with_columns(z=pl.Series(rng.standard_normal(control.height)))
    noise = 0.01 * layer_noise * pl.col("z")
    kurt_control = control.select(*keys, metric=pl.lit("kurtosis"), value=null_expr("d_model") + noise)
    every = pl.concat([kurt, control], how="diagonal_relaxed")
    share = (pl.col("planted").clip(0.0) / pl.col("d_model")).sqrt().clip(upper_bound=0.95)
    tops = [
        every.select(*keys, metric=pl.lit(f"top{k}_share"),
                     value=share + (1 - share) * top_share_null_expr("d_model", k) * (1 + noise))
        for k in (1, 4)
    ]  # fmt: skip
    # the rank tests: the stored (resid) or computation (inputs) basis' excess against 32 bases
    own = kurt.filter((pl.col("site") == "resid") & (pl.col("basis") == "stored") | tested)
    own = own.with_columns(basis=pl.lit("random")).sort(keys)
    null = null_expr("d_model")
    spread = [
        own.select(*keys, metric=pl.lit("kurtosis_sd"), value=pl.lit(CONTROL_SD) * (1 + noise)),
        own.select(*keys, metric=pl.lit("kurtosis_median"), value=null - 0.02 + noise),
    ]
    ranks = []
    for name in ("kurtosis_rank_p", "top1_share_rank_p"):
        z = rng.standard_normal((own.height, _CONTROL_BASES + 1))
        bar = z[:, :1] + own.get_column("planted").to_numpy()[:, None] / CONTROL_SD
        p = (1 + (z[:, 1:] >= bar).sum(axis=1)) / (1 + _CONTROL_BASES)
        ranks.append(own.select(*keys, metric=pl.lit(name), value=pl.Series(p)))
    return pl.concat([f.cast({"value": pl.Float64}) for f in (kurt_control, *tops, *spread, *ranks)])
