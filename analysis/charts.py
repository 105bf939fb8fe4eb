"""Altair chart builders: a query's DataFrame in, a paper-ready Chart out, no I/O.

Every builder takes the frame of the matching query in ``analysis.queries`` (or fit curves
from ``analysis.fits.fit_curves``), and returns a chart sized for one paper column (about
300 px = 3.3 in at 72 dpi; faceted charts grow by panel). Optimisers always get the same
colour-blind-safe Okabe-Ito colour (``OPTIMIZER_COLORS``); the other config axes (norm,
rotation) become facets or line dashes. ``configure=False`` returns the chart without the
shared theme so it can still be layered or concatenated; apply ``apply_theme`` at the end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import altair as alt
import polars as pl

__all__ = [
    "AXIS_TITLES",
    "OKABE_ITO",
    "OPTIMIZER_COLORS",
    "apply_theme",
    "basis_comparison",
    "format_count",
    "kurtosis_by_layer",
    "kurtosis_vs_loss",
    "loss_vs_params",
    "metric_over_training",
    "metric_title",
    "metric_vs_metric",
    "metric_vs_params",
    "optimizer_scale",
    "quant_penalty",
    "paper_theme",
    "register_theme",
]

OKABE_ITO = {
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
    "black": "#000000",
}
# Fixed so a given optimiser has one colour in every chart of every report.
OPTIMIZER_COLORS = {
    "adam": OKABE_ITO["vermillion"],
    "sgd": OKABE_ITO["blue"],
    "rotated_adam": OKABE_ITO["bluish_green"],
    "soap": OKABE_ITO["reddish_purple"],
    "muon": OKABE_ITO["orange"],
    "lion": OKABE_ITO["sky_blue"],
    "signsgd": OKABE_ITO["black"],
    "adafactor": "#8C6D1F",  # dark ochre: Okabe-Ito yellow is unreadable as a thin line
}
FAMILY_ORDER = ("per_coordinate", "rotation_equivariant", "fixed_random_basis", "adaptive_basis")
"""The optimiser families (DESIGN.md), in the order their panels appear."""
_SPARE = ["#999999", "#6A3D9A", "#B15928", "#1F78B4", "#33A02C"]

METRIC_TITLES = {
    "kurtosis": "Kurtosis (Gaussian = 3)",
    "neuron_kurtosis": "Neuron kurtosis (Gaussian ≈ 1)",
    "outlier_dims_abs": "Outlier dimensions (|x| > 6)",
    "outlier_dims_rel": "Outlier dimensions (|x| > 6 RMS)",
    "max_abs": "Max |activation|",
    "max_median_ratio": "Max / median |activation|",
    "dettmers_outliers": "Outlier features (Dettmers)",
    "final_val_loss": "Validation loss (nats/token)",
    "final_train_loss": "Training loss (nats/token)",
    "quant_loss_delta": "Quantisation penalty (Δ val loss, nats/token)",
}
REFERENCES = {"kurtosis": 3.0, "neuron_kurtosis": 1.0}
AXIS_TITLES = {
    "params_non_embedding": "Parameters (non-embedding)",
    "params": "Parameters (total)",
    "flops_per_token": "FLOPs per token",
    "tokens": "Training tokens",
    "step": "Training step",
    "layer": "Layer (0 = embeddings)",
    "depth": "Relative depth (layer / layers)",
}
SITE_NAMES = {
    ("resid", "stored"): "residual stream",
    ("resid", "random"): "residual stream, random basis",
    ("attn_in", "computation"): "attention input",
    ("mlp_in", "computation"): "MLP input",
    ("mlp_act", "neuron"): "MLP neurons",
    ("model", "computation"): "model",
}

# Plot-area sizes: with axes and legend a single chart is ~310 px wide, one paper column
# (3.3 in at 72 dpi), so 10 px labels print at ~10 pt when the figure is set at \columnwidth.
WIDTH, HEIGHT = 250, 165
PANEL_WIDTH, PANEL_HEIGHT = 125, 110  # one facet panel; two panels fill one column
FONT = "Helvetica, Arial, 'Liberation Sans', 'DejaVu Sans', sans-serif"

MAX_EVALS = 40  # evals drawn per line over training
SizeChoice = Literal["largest", "smallest"] | int | None


# ---------------------------------------------------------------- theme


def paper_theme() -> dict[str, Any]:
    """The shared Vega-Lite config: paper font sizes, light grid, legends below the plot."""
    return {
        "font": FONT,
        "background": "white",
        "padding": 6,
        "view": {"continuousWidth": WIDTH, "continuousHeight": HEIGHT, "stroke": "#bbbbbb"},
        "axis": {
            "labelFontSize": 10,
            "titleFontSize": 11,
            "titleFontWeight": "normal",
            "titleColor": "#222222",
            "labelColor": "#222222",
            "gridColor": "#ececec",
            "domainColor": "#666666",
            "tickColor": "#666666",
            "labelOverlap": "greedy",
        },
        "legend": {
            "orient": "bottom",
            "direction": "horizontal",
            "labelFontSize": 10,
            "titleFontSize": 10,
            "titleFontWeight": "normal",
            "symbolSize": 70,
            "symbolStrokeWidth": 2,
            "labelLimit": 200,
            "columns": 4,
            "columnPadding": 8,
            "rowPadding": 3,
            "offset": 12,
            # several legends stack under the plot instead of spreading sideways past it
            "layout": {"expr": "{bottom: {anchor: 'start', direction: 'vertical', margin: 4}}"},
        },
        "header": {"labelFontSize": 10, "titleFontSize": 10, "titleFontWeight": "normal"},
        "title": {"fontSize": 12, "fontWeight": "normal", "anchor": "start", "offset": 6},
        "line": {"strokeWidth": 1.6},
        "point": {"size": 28, "filled": True},
        "area": {"opacity": 0.18},
    }


def apply_theme(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """``chart.configure(...)`` with ``paper_theme()``."""
    return chart.configure(**paper_theme())


def register_theme(name: str = "paper", *, enable: bool = True) -> str:
    """Register ``paper_theme`` as an Altair theme (for charts built outside this module)."""

    def _theme() -> dict[str, Any]:
        return {"config": paper_theme()}

    alt.theme.register(name, enable=enable)(_theme)
    return name


def optimizer_scale(names: Sequence[str]) -> alt.Scale:
    """A colour scale over ``names`` that gives each optimiser its fixed colour."""
    domain = _order(names, list(OPTIMIZER_COLORS))
    spare = iter(_SPARE * 4)
    colours = [OPTIMIZER_COLORS.get(n) or next(spare) for n in domain]
    return alt.Scale(domain=domain, range=colours)


def metric_title(metric: str, site: str | None = None, basis: str | None = None) -> str:
    """A readable axis title for a metric, e.g. ``"Kurtosis (Gaussian = 3)"``."""
    title = METRIC_TITLES.get(metric, metric.replace("_", " ").capitalize())
    where = SITE_NAMES.get((site, basis)) if site else None
    return title if where in (None, "residual stream", "model") else f"{title}, {where}"


def format_count(n: float | None) -> str:
    """1234567 -> ``"1.2M"``; 50000 -> ``"50k"``."""
    if n is None or not math.isfinite(n):
        return "?"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            v = n / div
            return f"{v:.3g}{unit}"
    return f"{n:g}"


# ---------------------------------------------------------------- builders


def kurtosis_by_layer(
    profile: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = "kurtosis",
    size: SizeChoice = "largest",
    facet: str | None = "norm",
    reference: float | None = None,
    log_y: bool | None = None,
    title: str | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Metric by layer (from ``queries.layer_profile``): one line per config with its CI
    band, a dashed rule at the Gaussian reference (3 for kurtosis). One model size
    (``size``: "largest", "smallest", a params value, or None for a row per size)."""
    df, size_note = _pick_size(_frame(profile), size)
    df = _decorate(df, facet)
    reference = REFERENCES.get(metric) if reference is None else reference
    y_title = metric_title(metric)
    layers = _lines_with_band(df, "layer", y_title, "Layer (0 = embeddings)", log_y, reference)
    chart = _assemble(layers, df, facet, rows="size" if size is None else None, keep=["layer"])
    chart = chart.properties(title=_title(title, size_note))
    return apply_theme(chart) if configure else chart


def metric_over_training(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = "kurtosis",
    x: str = "tokens",
    size: SizeChoice = "largest",
    facet: str | None = "norm",
    reference: float | None = None,
    log_x: bool = False,
    log_y: bool | None = None,
    title: str | None = None,
    threshold: float | None = None,
    onsets: pl.DataFrame | pl.LazyFrame | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Metric over training (from ``queries.metric_over_training``), tokens on x: one line
    per config with its CI band and the Gaussian reference rule. ``size=None`` gives one
    row of panels per model size. ``threshold`` draws a dotted rule there; ``onsets`` (from
    ``queries.onset``) marks each config's mean onset on it, with its seed interval."""
    df, size_note = _pick_size(_frame(frame), size)
    if log_x:
        df = df.filter(pl.col(x) > 0)
    df = _thin_steps(df)
    df = _decorate(df, facet)
    reference = REFERENCES.get(metric) if reference is None else reference
    layers = _lines_with_band(
        df, x, metric_title(metric), AXIS_TITLES.get(x, x), log_y, reference, log_x=log_x
    )
    if threshold is not None:
        layers.append(
            alt.Chart().mark_rule(color="#222222", strokeDash=[1, 2], strokeWidth=1)
            .encode(y=alt.datum(threshold))
        )  # fmt: skip
    if onsets is not None and threshold is not None:
        on, _ = _pick_size(_frame(onsets), size)
        on = _decorate(on.filter(pl.col("mean").is_not_null()), facet)
        if on.height:
            on = on.with_columns(
                kind=pl.lit("onset"), onset_y=pl.lit(threshold), onset=pl.col("mean"),
                onset_low=pl.col("ci_low"), onset_high=pl.col("ci_high"),
            ).drop("mean", "ci_low", "ci_high")  # fmt: skip
            df = pl.concat([df.with_columns(kind=pl.lit("curve")), on], how="diagonal_relaxed")
            layers = [lay.transform_filter(alt.datum.kind == "curve") for lay in layers[:2]] + layers[2:]
            color = alt.Color("optimizer:N", scale=optimizer_scale(df.get_column("optimizer").to_list()))
            onset_x = alt.X("onset:Q", scale=alt.Scale(type="log") if log_x else alt.Undefined)
            layers += [
                alt.Chart().mark_rule(strokeWidth=2.5, opacity=0.8)
                .encode(x=onset_x, x2="onset_high:Q", y="onset_y:Q", color=color)
                .transform_filter(alt.datum.kind == "onset"),
                alt.Chart().mark_rule(strokeWidth=2.5, opacity=0.8)
                .encode(x=alt.X("onset_low:Q"), x2="onset:Q", y="onset_y:Q", color=color)
                .transform_filter(alt.datum.kind == "onset"),
                alt.Chart().mark_point(shape="diamond", size=60, filled=True, opacity=1)
                .encode(x=onset_x, y="onset_y:Q", color=color,
                        tooltip=_tooltip(on, ["optimizer", "variant", "onset", "onset_low", "onset_high", "n", "n_never"]))
                .transform_filter(alt.datum.kind == "onset"),
            ]  # fmt: skip
    chart = _assemble(
        layers, df, facet, rows="size" if size is None else None,
        keep=[x, "kind", "onset", "onset_low", "onset_high", "onset_y", "n_never"],
    )  # fmt: skip
    chart = chart.properties(title=_title(title, size_note))
    return apply_theme(chart) if configure else chart


def metric_vs_params(
    table: pl.DataFrame | pl.LazyFrame,
    curves: pl.DataFrame | pl.LazyFrame | None = None,
    *,
    metric: str = "kurtosis",
    x: str = "params_non_embedding",
    facet: str | None = "norm",
    reference: float | None = None,
    log_y: bool | None = None,
    title: str | None = None,
    y_title: str | None = None,
    connect: bool = False,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Metric against model size (from ``queries.scale_table``) on a log x axis: seed means
    with CI error bars, and fitted power laws with bootstrap bands (``curves`` from
    ``fits.fit_curves`` with the same config columns and x column), faceted by ``facet``
    (e.g. ``"optimizer_family"``). ``connect`` joins each config's seed means across sizes
    with a line (one line per optimiser and variant)."""
    reference = REFERENCES.get(metric) if reference is None else reference
    chart = _scaling(
        _frame(table), curves, x, y_title or metric_title(metric), facet, log_y, reference,
        connect=connect,
    )  # fmt: skip
    chart = chart.properties(title=_title(title, None))
    return apply_theme(chart) if configure else chart


def loss_vs_params(
    table: pl.DataFrame | pl.LazyFrame,
    curves: pl.DataFrame | pl.LazyFrame | None = None,
    *,
    column: str = "final_val_loss",
    x: str = "params_non_embedding",
    facet: str | None = "norm",
    log_y: bool | None = True,
    title: str | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """Final loss against model size (from ``queries.loss_table``), log-log, with fitted
    power laws (``curves``) when given: the usual scaling-law plot."""
    chart = _scaling(_frame(table), curves, x, metric_title(column), facet, log_y, None)
    chart = chart.properties(title=_title(title, None))
    return apply_theme(chart) if configure else chart


def basis_comparison(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    metric: str = "kurtosis",
    size: SizeChoice = "largest",
    reference: float | None = None,
    log_y: bool | None = None,
    title: str | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """The metric by layer in each basis (from ``queries.basis_comparison``): residual
    stream (stored basis, and the random-basis control) against the attention and MLP
    inputs in their computation basis. One panel per config (rows: optimiser and norm,
    columns: rotation); colour is the optimiser, dash and marker the basis."""
    df, size_note = _pick_size(_frame(frame), size)
    df = _decorate(df, None)
    reference = REFERENCES.get(metric) if reference is None else reference
    rows = ["optimizer"] + (["norm"] if _varies(df, "norm") else [])
    df = df.with_columns(
        row=pl.concat_str([pl.col(c).cast(pl.String) for c in rows], separator=" · "),
        column=pl.format("rotation: {}", pl.col("rotation_label"))
        if "rotation_label" in df.columns
        else pl.lit(""),
    )
    order = [s for s in _SERIES_ORDER if s in set(df.get_column("series").to_list())]
    y_scale = _y_scale(df, log_y, reference)
    enc = {
        "x": alt.X("layer:Q", title="Layer", axis=alt.Axis(tickMinStep=1, format="d")),
        "y": alt.Y("mean:Q", title=metric_title(metric), scale=y_scale),
        "color": alt.Color(
            "optimizer:N",
            scale=optimizer_scale(df.get_column("optimizer").unique().to_list()),
            title="Optimizer",
            legend=None,
        ),
        "strokeDash": alt.StrokeDash(
            "series:N",
            title="Activations",
            sort=order,
            scale=alt.Scale(domain=order, range=_DASHES[: len(order)]),
            legend=alt.Legend(columns=2, symbolType="stroke", symbolStrokeColor="#333333"),
        ),
    }
    band = (
        alt.Chart()
        .mark_area()
        .encode(
            x="layer:Q",
            y=alt.Y("ci_low:Q", scale=y_scale),
            y2="ci_high:Q",
            color=enc["color"],
            detail="series:N",
        )
    )
    line = alt.Chart().mark_line().encode(
        **enc, tooltip=_tooltip(df, ["series", "layer", "mean", "ci_low", "ci_high", "n"])
    )
    marks = alt.Chart().mark_point(size=22, filled=True).encode(
        x="layer:Q",
        y=alt.Y("mean:Q", scale=y_scale),
        color=enc["color"],
        shape=alt.Shape(
            "series:N",
            title="Activations",
            sort=order,
            scale=alt.Scale(domain=order, range=_SHAPES[: len(order)]),
        ),
    )
    layers = [band, line, marks]
    if reference is not None:
        layers.append(_reference_rule(reference))
    n_cols = max(1, df.get_column("column").n_unique())
    chart = (
        alt.layer(*layers, data=_slim(df))
        .properties(width=_panel_width(n_cols) if n_cols > 1 else 240, height=PANEL_HEIGHT)
        .facet(
            row=alt.Row("row:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")),
            column=alt.Column("column:N", title=None, sort=_rotation_sort(df)),
        )
        .resolve_scale(y="shared")
    )
    chart = chart.properties(title=_title(title, size_note))
    return apply_theme(chart) if configure else chart


def metric_vs_metric(
    table: pl.DataFrame | pl.LazyFrame,
    *,
    x_title: str,
    y_title: str,
    facet: str | None = None,
    log_x: bool = False,
    log_y: bool | None = None,
    reference: float | None = None,
    x_reference: float | None = None,
    connect: bool = True,
    title: str | None = None,
    configure: bool = True,
) -> alt.TopLevelMixin:
    """One seed-aggregated measure against another, per config (from ``queries.versus``:
    ``x``/``x_low``/``x_high`` against ``mean``/``ci_low``/``ci_high``): a point per config
    with both t-intervals as error bars, colour = optimiser, marker size = model size;
    ``connect`` joins each optimiser's (and variant's) points in order of size."""
    df = _decorate(_frame(table), facet)
    size_col = _size_col(df)
    df = df.with_columns(kind=pl.lit("point"))
    if size_col:
        df = df.with_columns(
            size=pl.col(size_col).map_elements(lambda v: format_count(v), return_dtype=pl.String),
            _order=pl.col(size_col).cast(pl.Float64),
        )
    layers = _xy_layers(df, x_title, y_title, log_x, log_y, reference, x_reference, connect, size_col)
    chart = _assemble(layers, df, facet, keep=["x", "x_low", "x_high", "_order", "x_n"])
    chart = chart.properties(title=_title(title, None))
    return apply_theme(chart) if configure else chart


def kurtosis_vs_loss(
    table: pl.DataFrame | pl.LazyFrame, *, facet: str | None = None, **kw: Any
) -> alt.TopLevelMixin:
    """The matched-loss view: residual kurtosis (y) against final validation loss (x) per
    config (``queries.versus(loss_table, scale_table)``); configs at the same loss compare
    optimisers at matched quality, not matched steps."""
    kw.setdefault("title", "Kurtosis at matched loss")
    return metric_vs_metric(
        table, x_title=METRIC_TITLES["final_val_loss"], y_title=metric_title("kurtosis"),
        facet=facet, reference=REFERENCES["kurtosis"], **kw,
    )  # fmt: skip


def quant_penalty(
    table: pl.DataFrame | pl.LazyFrame, *, facet: str | None = None, **kw: Any
) -> alt.TopLevelMixin:
    """What outliers cost: the quantisation penalty (y, from ``queries.quant_penalty``)
    against residual kurtosis (x), per config, coloured by optimiser."""
    df = _frame(table)
    quant = df.get_column("quant").first() if "quant" in df.columns and df.height else "w8a8"
    kw.setdefault("title", f"{str(quant).upper()} quantisation penalty")
    return metric_vs_metric(
        df, x_title=metric_title("kurtosis"),
        y_title=f"{str(quant).upper()} penalty (Δ val loss, nats/token)",
        facet=facet, x_reference=REFERENCES["kurtosis"], **kw,
    )  # fmt: skip


# ---------------------------------------------------------------- internals

_SERIES_ORDER = [
    "residual, stored basis",
    "residual, random basis",
    "attention input, computation basis",
    "MLP input, computation basis",
]
_SHAPES = ["circle", "triangle-up", "square", "diamond"]
_DASHES = [[1, 0], [2, 2], [6, 3], [8, 2, 2, 2]]
_ROTATION_ORDER = ["none", "shared", "partial", "groups", "independent"]


def _frame(df: pl.DataFrame | pl.LazyFrame | Any) -> pl.DataFrame:
    if isinstance(df, pl.LazyFrame):
        return df.collect()
    if isinstance(df, pl.DataFrame):
        return df
    return pl.DataFrame(df)


def _thin_steps(df: pl.DataFrame, most: int = MAX_EVALS) -> pl.DataFrame:
    """At most ``most`` evals per line (every k-th step, the last kept): a curve needs no
    more, and every point is embedded in each saved chart."""
    if "step" not in df.columns or df.height == 0:
        return df
    steps = sorted(df.get_column("step").unique().to_list())
    if len(steps) <= most:
        return df
    k = math.ceil(len(steps) / most)
    keep = pl.col("step").is_in(sorted(set(steps[::k]) | {steps[-1]}))
    if "config_id" in df.columns:  # each config's own last eval (sizes train for different lengths)
        keep = keep | (pl.col("step") == pl.col("step").max().over("config_id"))
    return df.filter(keep)


def _varies(df: pl.DataFrame, col: str) -> bool:
    return col in df.columns and df.get_column(col).n_unique() > 1


def _varies_within(df: pl.DataFrame, col: str, groups: Sequence[str | None]) -> bool:
    """Whether ``col`` takes several values inside one group (e.g. lr within an optimiser:
    an lr that only follows the optimiser is not a separate axis)."""
    keys = [g for g in groups if g and g in df.columns]
    if col not in df.columns or df.height == 0:
        return False
    if not keys:
        return _varies(df, col)
    return int(df.group_by(keys).agg(pl.col(col).n_unique()).get_column(col).max()) > 1  # type: ignore[arg-type]


def _order(values: Sequence[Any], preferred: Sequence[Any]) -> list[Any]:
    seen = [v for v in dict.fromkeys(values) if v is not None]
    known = [p for p in dict.fromkeys(preferred) if p in seen]
    return known + sorted((v for v in seen if v not in known), key=str)


def _size_col(df: pl.DataFrame) -> str | None:
    for c in ("params_non_embedding", "params", "d_model"):
        if c in df.columns and df.get_column(c).null_count() < df.height:
            return c
    return None


def _pick_size(df: pl.DataFrame, size: SizeChoice) -> tuple[pl.DataFrame, str | None]:
    col = _size_col(df)
    if col is None or df.height == 0:
        return df, None
    sizes = sorted(v for v in df.get_column(col).unique().to_list() if v is not None)
    unit = "non-embedding params" if col == "params_non_embedding" else col.replace("_", " ")
    if size is None or len(sizes) <= 1:
        df = df.with_columns(
            size=pl.col(col).map_elements(
                lambda v: f"{format_count(v)} {unit}", return_dtype=pl.String
            )
        )
        note = f"{format_count(sizes[0])} {unit}" if len(sizes) == 1 else None
        return df, note
    if size == "largest":
        pick = sizes[-1]
    elif size == "smallest":
        pick = sizes[0]
    else:
        if size not in sizes:
            raise ValueError(f"size {size} not among {col} values {sizes}")
        pick = size
    note = f"{format_count(pick)} {unit}" + (" (largest)" if size == "largest" else "")
    return df.filter(pl.col(col) == pick), note


def _decorate(df: pl.DataFrame, facet: str | None) -> pl.DataFrame:
    """Add label columns: ``variant`` (the config axes that vary within an optimiser and
    are neither colour nor facet: norm, rotation, lr, any other hyper-parameter), ``facet``.
    The rotation reads the stored ``rotation_label``."""
    if "rotation" in df.columns:
        from analysis.load import rotation_label

        if "rotation_label" not in df.columns:
            df = df.with_columns(rotation_label=pl.lit(None, pl.String))
        if "group_size" not in df.columns:
            df = df.with_columns(group_size=pl.lit(None, pl.Int64))
        df = df.with_columns(rotation_label())
    candidates = [c for c in _VARIANT_AXES if c != _facet_col(facet)]
    # within one optimiser, panel and model size: a best-lr view whose lr changes from size
    # to size draws one line, not one per lr
    within = ["optimizer", _facet_col(facet), None if "fit" in df.columns else _size_col(df)]
    varying = [c for c in candidates if _varies_within(df, c, within)]
    df = df.with_columns(variant_axes=pl.lit(",".join(varying)))
    if varying:
        df = df.with_columns(
            variant=pl.concat_str(
                [_axis_value(c) for c in varying], separator=" · "
            )
        )
    else:
        df = df.with_columns(variant=pl.lit(""))
    fc = _facet_col(facet)
    if fc and fc in df.columns:
        name = {"rotation_label": "rotation", "optimizer_family": "family"}.get(fc, fc)
        value = pl.col(fc).cast(pl.String)
        if fc == "optimizer_family":
            value = value.str.replace_all("_", " ")
        df = df.with_columns(facet=pl.format(f"{name}: {{}}", value))
    if "optimizer" not in df.columns:
        df = df.with_columns(optimizer=pl.lit("all"))
    return df


def _axis_value(col: str) -> pl.Expr:
    """A variant axis's value as text: numbers compact (0.003 -> 3e-03 stays short)."""
    e = pl.col(col)
    if col in ("lr", "eps", "weight_decay", "momentum", "beta1", "beta2"):
        e = e.map_elements(lambda v: f"{v:g}", return_dtype=pl.String)
    return e.cast(pl.String).fill_null("–")


def _facet_col(facet: str | None) -> str | None:
    return "rotation_label" if facet == "rotation" else facet


def _y_scale(
    df: pl.DataFrame, log_y: bool | None, reference: float | None, cols: Sequence[str] = ()
) -> alt.Scale:
    vals: list[float] = []
    for c in ("mean", "ci_low", "ci_high", *cols):
        if c in df.columns:
            vals += [v for v in df.get_column(c).to_list() if v is not None and math.isfinite(v)]
    if reference is not None:
        vals.append(reference)
    positive = bool(vals) and min(vals) > 0
    if log_y is None:
        log_y = positive and max(vals) / min(vals) > 20
    if log_y and positive:
        return alt.Scale(type="log", nice=False, padding=8)
    return alt.Scale(zero=False, nice=False, padding=8)


def _lines_with_band(
    df: pl.DataFrame,
    x: str,
    y_title: str,
    x_title: str,
    log_y: bool | None,
    reference: float | None,
    *,
    log_x: bool = False,
) -> list[alt.Chart]:
    y_scale = _y_scale(df, log_y, reference)
    color_scale = optimizer_scale(df.get_column("optimizer").to_list())
    color = alt.Color("optimizer:N", scale=color_scale, title="Optimizer", legend=_COLOR_LEGEND)
    if x == "layer":  # explicit integer ticks: tickMinStep alone still yields 0.5 steps
        x_axis = alt.Axis(values=sorted({int(v) for v in df.get_column(x).to_list()}), format="d")
    elif log_x:
        x_axis = _log_axis(df.get_column(x).to_list(), _max_ticks(df))
    else:
        x_axis = alt.Axis(format="~s", labelExpr=_SI_LABEL, labelFlush=True)
    x_enc = alt.X(
        f"{x}:Q", title=x_title, axis=x_axis, scale=alt.Scale(type="log") if log_x else alt.Undefined
    )
    has_variant = _varies(df, "variant")
    dash: dict[str, Any] = {}
    if has_variant:
        order = _variant_order(df)
        dash["strokeDash"] = alt.StrokeDash(
            "variant:N",
            title=_variant_title(df),
            sort=order,
            scale=alt.Scale(domain=order, range=(_DASHES * 3)[: len(order)]),
            legend=_DASH_LEGEND,
        )
    band = (
        alt.Chart()
        .mark_area()
        .encode(
            x=x_enc,
            y=alt.Y("ci_low:Q", scale=y_scale),
            y2="ci_high:Q",
            color=color,
            detail="variant:N",
        )
    )
    tip = _tooltip(df, ["optimizer", "variant", "size", x, "mean", "ci_low", "ci_high", "n"])
    line = (
        alt.Chart()
        .mark_line(point=alt.OverlayMarkDef(size=16) if df.get_column(x).n_unique() <= 25 else False)
        .encode(
            x=x_enc,
            y=alt.Y("mean:Q", title=y_title, scale=y_scale),
            color=color,
            detail="variant:N",
            tooltip=tip,
            **dash,
        )
    )
    layers = [band, line]
    if reference is not None:
        layers.append(_reference_rule(reference))
    return layers


_COLOR_LEGEND = alt.Legend(symbolOpacity=1, symbolType="circle")
_DASH_LEGEND = alt.Legend(symbolType="stroke", symbolStrokeColor="#333333", symbolSize=300)
_SI_LABEL = "datum.value == 0 ? '0' : format(datum.value, '.3~s')"


def _log_axis(values: Sequence[float | None], max_ticks: int = 6) -> alt.Axis:
    """A log axis labelled only at 1-2-5 x 10^k (or 10^k when the range is wide), with SI
    suffixes (50k, 1M), instead of Vega's crowded default labels."""
    vals = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not vals:
        return alt.Axis(format="~s")
    lo, hi = min(vals) / 1.12, max(vals) * 1.12
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks = [m * 10.0**k for k in decades for m in (1, 2, 5) if lo <= m * 10.0**k <= hi]
    if len(ticks) > max_ticks:
        ticks = [10.0**k for k in decades if lo <= 10.0**k <= hi]
        if len(ticks) > 7:
            ticks = ticks[:: math.ceil(len(ticks) / 6)]
    if len(ticks) < 2:
        ticks = sorted(set(vals))
    return alt.Axis(values=ticks, format="~s", labelExpr=_SI_LABEL, grid=True)


def _xy_layers(
    df: pl.DataFrame,
    x_title: str,
    y_title: str,
    log_x: bool,
    log_y: bool | None,
    reference: float | None,
    x_reference: float | None,
    connect: bool,
    size_col: str | None,
) -> list[alt.Chart]:
    """Point + two-way error bars (+ connecting line) layers for ``metric_vs_metric``."""
    y_scale = _y_scale(df, log_y, reference)
    xs = [v for c in ("x", "x_low", "x_high") if c in df.columns for v in df.get_column(c).to_list()
          if v is not None and math.isfinite(v)]  # fmt: skip
    if x_reference is not None:
        xs.append(x_reference)
    x_scale = alt.Scale(type="log" if log_x else "linear", zero=False, nice=False, padding=10)
    x_enc = alt.X("x:Q", title=x_title, scale=x_scale)
    color = alt.Color(
        "optimizer:N", scale=optimizer_scale(df.get_column("optimizer").to_list()),
        title="Optimizer", legend=_COLOR_LEGEND,
    )  # fmt: skip
    extra: dict[str, Any] = {}
    if _varies(df, "variant"):
        extra["shape"] = alt.Shape("variant:N", title=_variant_title(df), sort=_variant_order(df))
    if size_col and _varies(df, "size"):
        order = df.select("size", "_order").unique().sort("_order").get_column("size").to_list()
        extra["size"] = alt.Size(
            "size:N", sort=order, title="Model size",
            scale=alt.Scale(domain=order, range=[18 + 90 * i / max(1, len(order) - 1) for i in range(len(order))]),
        )  # fmt: skip
    tip = _tooltip(df, ["optimizer", "variant", "size", "x", "x_low", "x_high", "mean", "ci_low", "ci_high", "n"])
    layers: list[alt.Chart] = []
    if connect:
        layers.append(
            alt.Chart().mark_line(strokeWidth=1, opacity=0.6)
            .encode(x=x_enc, y=alt.Y("mean:Q", scale=y_scale), color=color, detail="variant:N",
                    order=alt.Order("_order:Q") if size_col else alt.Undefined)
        )  # fmt: skip
    layers += [
        alt.Chart().mark_rule(strokeWidth=1).encode(
            x=x_enc, y=alt.Y("ci_low:Q", scale=y_scale), y2="ci_high:Q", color=color),
        alt.Chart().mark_rule(strokeWidth=1).encode(
            x=alt.X("x_low:Q", scale=x_scale), x2="x_high:Q", y=alt.Y("mean:Q", scale=y_scale), color=color),
        alt.Chart().mark_point(filled=True, opacity=1).encode(
            x=x_enc, y=alt.Y("mean:Q", title=y_title, scale=y_scale), color=color, tooltip=tip, **extra),
    ]  # fmt: skip
    if reference is not None:
        layers.append(_reference_rule(reference))
    if x_reference is not None:
        layers.append(
            alt.Chart().mark_rule(color="#555555", strokeDash=[3, 3], strokeWidth=1)
            .encode(x=alt.datum(x_reference))
        )  # fmt: skip
    return layers


def _reference_rule(reference: float) -> alt.Chart:
    return (
        alt.Chart()
        .mark_rule(color="#555555", strokeDash=[3, 3], strokeWidth=1)
        .encode(y=alt.datum(reference))
    )


_CHART_COLUMNS = (
    "layer", "step", "tokens", "x_plot", "x", "x_low", "x_high", "params", "params_non_embedding", "d_model",
    "mean", "ci_low", "ci_high", "n", "fit", "fit_low", "fit_high", "kind",
    "optimizer", "variant", "facet", "size", "series", "row", "column",
)  # fmt: skip


def _slim(df: pl.DataFrame, keep: Sequence[str] = ()) -> pl.DataFrame:
    """Only the columns the charts encode: the data is embedded in every saved spec."""
    cols = dict.fromkeys([*_CHART_COLUMNS, *keep])
    return df.select([c for c in cols if c in df.columns])


def _assemble(
    layers: list[alt.Chart],
    df: pl.DataFrame,
    facet: str | None,
    *,
    rows: str | None = None,
    keep: Sequence[str] = (),
) -> alt.TopLevelMixin:
    has_facet = "facet" in df.columns and _varies(df, "facet")
    has_rows = rows is not None and _varies(df, rows)
    df = _slim(df, keep)
    if not has_facet and not has_rows:
        return alt.layer(*layers, data=df).properties(width=WIDTH, height=HEIGHT)
    n_cols = df.get_column("facet").n_unique() if has_facet else 1
    width = _panel_width(n_cols)
    base = alt.layer(*layers, data=df).properties(width=width, height=PANEL_HEIGHT)
    kw: dict[str, Any] = {}
    if has_facet:
        sort: Any = "ascending"
        if facet == "rotation":
            sort = _rotation_sort(df)
        elif facet == "optimizer_family":  # per-coordinate first, then the basis-free families
            sort = [f"family: {f.replace('_', ' ')}" for f in FAMILY_ORDER]
        kw["column"] = alt.Column("facet:N", title=None, sort=sort)
    if has_rows:  # size labels above each row's panels, not beside the y-axis title
        header = alt.Header(labelOrient="top", labelAngle=0, labelAnchor="start", labelFontWeight="bold")
        kw["row"] = alt.Row(f"{rows}:N", title=None, sort=_size_sort(df), header=header)
    chart = base.facet(**kw)
    if has_rows and any(k in keep for k in ("tokens", "step")):
        chart = chart.resolve_scale(x="independent")  # each size trains for its own length
    return chart


def _max_ticks(df: pl.DataFrame) -> int:
    """Labelled ticks that fit: 6 across a full-width chart, 4 in a facet panel."""
    return 4 if "facet" in df.columns and _varies(df, "facet") else 6


def _panel_width(n_cols: int) -> int:
    # Two panels share one column; more panels make a two-column (page-wide) figure.
    return max(100, min(PANEL_WIDTH, (4 * WIDTH) // max(n_cols, 1) - 20))


def _rotation_sort(df: pl.DataFrame) -> list[str]:
    col = next((c for c in ("column", "facet", "rotation_label") if c in df.columns), "")
    vals = df.get_column(col).unique().to_list() if col in df.columns else []

    def key(v: str) -> tuple[int, str]:
        base = (v or "").removeprefix("rotation: ").split("(")[0]
        return (_ROTATION_ORDER.index(base) if base in _ROTATION_ORDER else 99, v or "")

    return sorted((v for v in vals if v is not None), key=key)


def _size_sort(df: pl.DataFrame) -> list[str]:
    col = _size_col(df)
    if col is None:
        return sorted(df.get_column("size").unique().to_list())
    return (
        df.select("size", col).unique().sort(col).get_column("size").unique(maintain_order=True).to_list()
    )


def _variant_order(df: pl.DataFrame) -> list[str]:
    return sorted(df.get_column("variant").unique().to_list(), key=lambda v: (
        [(_ROTATION_ORDER.index(p.split("(")[0]) if p.split("(")[0] in _ROTATION_ORDER else 50, p)
         for p in v.split(" · ")]
    ))  # fmt: skip


_VARIANT_AXES = (
    "norm", "rotation_label", "lr", "momentum", "nesterov", "weight_decay", "eps", "beta1",
    "beta2", "rotate",
)  # fmt: skip


def _variant_title(df: pl.DataFrame) -> str:
    names = {"norm": "Norm", "rotation_label": "Rotation", "lr": "LR", "momentum": "Momentum",
             "nesterov": "Nesterov", "weight_decay": "Weight decay", "eps": "Adam ε",
             "beta1": "β1", "beta2": "β2", "rotate": "Rotate"}  # fmt: skip
    return " · ".join(names[c] for c in df.get_column("variant_axes").first().split(",") if c) or "Config"


def _tooltip(df: pl.DataFrame, cols: Sequence[str]) -> list[alt.Tooltip]:
    out = []
    for c in cols:
        if c in df.columns:
            kind = "Q" if df.schema[c].is_numeric() else "N"
            fmt = ".4g" if kind == "Q" else alt.Undefined
            out.append(alt.Tooltip(f"{c}:{kind}", format=fmt))
    return out


def _title(title: str | None, size_note: str | None) -> alt.TitleParams | str:
    if not title:
        return size_note or ""
    return alt.TitleParams(text=title, subtitle=size_note or alt.Undefined)


def _dodge(df: pl.DataFrame, x: str, width: float = 0.03, span: float = 0.12) -> pl.DataFrame:
    """Spread series that share an x value apart on the log axis (multiplicatively), so
    their error bars do not overlap; the fitted curves keep the true x."""
    series = (
        df.select("optimizer", "variant").unique().sort("optimizer", "variant").rows()
        if df.height
        else []
    )
    k = len(series)
    if k <= 1:
        return df.with_columns(x_plot=pl.col(x).cast(pl.Float64))
    step = min(width, span / (k - 1))  # in decades; all series within `span` decades
    factors = {s: 10 ** (step * (i - (k - 1) / 2)) for i, s in enumerate(series)}
    f = pl.struct("optimizer", "variant").map_elements(
        lambda r: factors.get((r["optimizer"], r["variant"]), 1.0), return_dtype=pl.Float64
    )
    return df.with_columns(x_plot=pl.col(x).cast(pl.Float64) * f)


def _scaling(
    table: pl.DataFrame,
    curves: pl.DataFrame | pl.LazyFrame | None,
    x: str,
    y_title: str,
    facet: str | None,
    log_y: bool | None,
    reference: float | None,
    *,
    connect: bool = False,
) -> alt.TopLevelMixin:
    points = _dodge(_decorate(table, facet), x).with_columns(kind=pl.lit("point"))
    frames = [points]
    if curves is not None:
        cur = _frame(curves)
        if cur.height:
            cur = _decorate(cur, facet).with_columns(
                x_plot=pl.col(x).cast(pl.Float64), kind=pl.lit("curve")
            )
            frames.append(cur)
    data = pl.concat(frames, how="diagonal_relaxed")
    y_scale = _y_scale(data, log_y, reference, cols=("fit", "fit_low", "fit_high"))
    color_scale = optimizer_scale(data.get_column("optimizer").to_list())
    color = alt.Color("optimizer:N", scale=color_scale, title="Optimizer", legend=_COLOR_LEGEND)
    true_x = [v for v in data.get_column(x).cast(pl.Float64).to_list() if v and v > 0]
    x_scale = alt.Scale(type="log", nice=False, padding=10)
    if len(set(true_x)) == 1:  # one model size: centre it in a decade-wide window
        x_scale = alt.Scale(type="log", domain=[true_x[0] / 3.0, true_x[0] * 3.0])
    x_enc = alt.X(
        "x_plot:Q",
        title=AXIS_TITLES.get(x, x),
        scale=x_scale,
        axis=_log_axis(true_x, _max_ticks(data)),
    )
    has_variant = _varies(points, "variant")
    shape: dict[str, Any] = {}
    dash: dict[str, Any] = {}
    if has_variant:
        order = _variant_order(data)
        title = _variant_title(points)
        shape["shape"] = alt.Shape("variant:N", title=title, sort=order)
        dash["strokeDash"] = alt.StrokeDash(
            "variant:N",
            title=title,
            sort=order,
            scale=alt.Scale(domain=order, range=(_DASHES * 3)[: len(order)]),
            legend=None,
        )
    is_point = alt.datum.kind == "point"
    is_curve = alt.datum.kind == "curve"
    tip = _tooltip(points, ["optimizer", "variant", x, "mean", "ci_low", "ci_high", "n"])
    layers: list[alt.Chart] = []
    if len(frames) > 1:
        layers += [
            alt.Chart()
            .mark_area(opacity=0.15)
            .encode(
                x=x_enc,
                y=alt.Y("fit_low:Q", scale=y_scale),
                y2="fit_high:Q",
                color=color,
                detail="variant:N",
            )
            .transform_filter(is_curve),
            alt.Chart()
            .mark_line(strokeWidth=1.4)
            .encode(
                x=x_enc,
                y=alt.Y("fit:Q", scale=y_scale),
                color=color,
                detail="variant:N",
                **dash,
            )
            .transform_filter(is_curve),
        ]
    if connect:
        layers.append(
            alt.Chart().mark_line(strokeWidth=1.4)
            .encode(x=x_enc, y=alt.Y("mean:Q", scale=y_scale), color=color, detail="variant:N",
                    order=alt.Order("x_plot:Q"), **dash)
            .transform_filter(is_point)
        )  # fmt: skip
    layers += [
        alt.Chart()
        .mark_rule(strokeWidth=1.2)
        .encode(
            x=x_enc,
            y=alt.Y("ci_low:Q", scale=y_scale),
            y2="ci_high:Q",
            color=color,
        )
        .transform_filter(is_point),
        alt.Chart()
        .mark_point(filled=True, size=34, opacity=1)
        .encode(
            x=x_enc,
            y=alt.Y("mean:Q", title=y_title, scale=y_scale),
            color=color,
            tooltip=tip,
            **shape,
        )
        .transform_filter(is_point),
    ]
    if reference is not None:
        layers.append(_reference_rule(reference))
    return _assemble(layers, data, facet, keep=[x])
