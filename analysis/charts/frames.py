"""Chart data preparation: the query frame in, the columns the charts encode out (labels,
variants, facets, sizes, dodged x); no Altair marks here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import altair as alt
import polars as pl

from analysis.charts.style import MAX_DASHED, MAX_EVALS, ROTATION_ORDER, SizeChoice, format_count
from resultstore.schema import RUNS_SCHEMA, Role, runs_columns
from resultstore.vocabulary import Metric

__all__ = [
    "as_frame", "decorate", "dodge", "panels_for_variants", "pick_size", "rotation_sort", "size_column",
    "size_sort", "slim", "thin_steps", "tooltip", "variant_axes", "variant_order", "variant_title", "varies", "with_null",
]  # fmt: skip
"""The helpers the chart builders share; the rest is this module's own."""



def as_frame(df: pl.DataFrame | pl.LazyFrame | Any) -> pl.DataFrame:
    if isinstance(df, pl.LazyFrame):
        return df.collect()
    if isinstance(df, pl.DataFrame):
        return df
    return pl.DataFrame(df)


def thin_steps(df: pl.DataFrame, most: int = MAX_EVALS) -> pl.DataFrame:
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


def varies(df: pl.DataFrame, col: str) -> bool:
    return col in df.columns and df.get_column(col).n_unique() > 1


def varies_within(df: pl.DataFrame, col: str, groups: Sequence[str | None]) -> bool:
    """Whether ``col`` takes several values inside one group (e.g. lr within an optimiser:
    an lr that only follows the optimiser is not a separate axis)."""
    keys = [g for g in groups if g and g in df.columns]
    if col not in df.columns or df.height == 0:
        return False
    if not keys:
        return varies(df, col)
    return int(df.group_by(keys).agg(pl.col(col).n_unique()).get_column(col).max()) > 1  # type: ignore[arg-type]


def size_column(df: pl.DataFrame) -> str | None:
    for c in ("params_non_embedding", "params", "d_model"):
        if c in df.columns and df.get_column(c).null_count() < df.height:
            return c
    return None


def pick_size(df: pl.DataFrame, size: SizeChoice) -> tuple[pl.DataFrame, str | None]:
    """One model size (``size``: "largest", "smallest", a value of the size column) or, for
    None, every size with a ``size`` label column; and a note naming it. A size is a model
    shape (d_model x n_layers) where the frame has one: a LayerNorm model has a few more
    parameters than the rmsnorm_scalar model of the same shape, and both are the same size."""
    col = size_column(df)
    if col is None or df.height == 0:
        return df, None
    unit = "non-embedding params" if col == "params_non_embedding" else col.replace("_", " ")
    shape = [c for c in ("d_model", "n_layers") if c in df.columns and c != col] or [col]
    sizes = df.group_by(shape).agg(lo=pl.col(col).min(), hi=pl.col(col).max()).drop_nulls("hi").sort("hi", "lo")
    sizes = sizes.with_columns(
        size=pl.struct("lo", "hi").map_elements(
            lambda r: f"{format_count(r['hi'])} {unit}" if r["lo"] == r["hi"]
            else f"{format_count(r['lo'])}-{format_count(r['hi'])} {unit}", return_dtype=pl.String)
    ).drop("lo", "hi")  # fmt: skip
    if size is None or sizes.height <= 1:
        note = sizes.get_column("size")[0] if sizes.height == 1 else None
        return df.join(sizes, on=shape, how="left", nulls_equal=True), note
    if size in ("largest", "smallest"):
        pick = sizes.row(-1 if size == "largest" else 0, named=True)
    else:
        values = sorted(v for v in df.get_column(col).unique().to_list() if v is not None)
        if size not in values:
            raise ValueError(f"size {size} not among {col} values {values}")
        pick = df.filter(pl.col(col) == size).join(sizes, on=shape).row(0, named=True)
    note = pick["size"] + (" (largest)" if size == "largest" else "")
    return df.join(sizes.filter(pl.col("size") == pick["size"]).select(shape), on=shape, how="semi"), note


def decorate(df: pl.DataFrame, facet: str | None) -> pl.DataFrame:
    """Add label columns: ``variant`` (the config axes that vary within an optimiser and
    are neither colour nor facet: norm, rotation, lr, any other hyper-parameter), ``facet``.
    The axes read their labels (``analysis.load.axis_labels``: the stored ``rotation_label``,
    the attention ``softmax`` where null, ...)."""
    from analysis.load import axis_labels

    if "rotation" in df.columns:  # a frame of configs: its rotation label derived where missing
        if "rotation_label" not in df.columns:
            df = df.with_columns(rotation_label=pl.lit(None, pl.String))
        if "group_size" not in df.columns:
            df = df.with_columns(group_size=pl.lit(None, pl.Int64))
    df = df.with_columns(axis_labels(df.columns))
    candidates = [c for c in variant_axes() if c != facet_column(facet)]
    # within one optimiser, panel and model size: a best-lr view whose lr changes from size
    # to size draws one line, not one per lr
    within = ["optimizer", facet_column(facet), None if "fit" in df.columns else size_column(df)]
    varying = [c for c in candidates if varies_within(df, c, within)]
    df = df.with_columns(variant_axes=pl.lit(",".join(varying)))
    if varying:
        df = df.with_columns(
            variant=pl.concat_str(
                [axis_value(c) for c in varying], separator=" · "
            )
        )
    else:
        df = df.with_columns(variant=pl.lit(""))
    fc = facet_column(facet)
    if fc and fc in df.columns:
        name = {"rotation_label": "rotation", "optimizer_family": "family"}.get(fc, fc)
        value = pl.col(fc).cast(pl.String)
        if fc == "optimizer_family":
            value = value.str.replace_all("_", " ")
        df = df.with_columns(facet=pl.format(f"{name}: {{}}", value))
    if "optimizer" not in df.columns:
        df = df.with_columns(optimizer=pl.lit("all"))
    return df


def axis_value(col: str) -> pl.Expr:
    """A variant axis's value as text: a float runs column compact (0.003 -> 0.003, 1e-08 stays short)."""
    e = pl.col(col)
    if RUNS_SCHEMA.get(col) == pl.Float64():
        e = e.map_elements(lambda v: f"{v:g}", return_dtype=pl.String)
    return e.cast(pl.String).fill_null("–")


def facet_column(facet: str | None) -> str | None:
    return "rotation_label" if facet == "rotation" else facet


def variant_axes() -> tuple[str, ...]:
    """The run columns a line's variant may name (within one optimiser, the colour): the schema's
    axes but the optimiser (norm, attention, rotation_label), then every hyper-parameter (one an
    optimiser module declares too: read at call time)."""
    return (*(a for a in runs_columns(Role.AXIS) if a != "optimizer"), *runs_columns(Role.HYPER))


VARIANT_AXES = variant_axes()
"""``variant_axes()`` when this module was imported."""


def panels_for_variants(df: pl.DataFrame, most: int = MAX_DASHED) -> tuple[pl.DataFrame, list[str] | None]:
    """A decorated frame whose lines would need more than ``most`` dash patterns: each variant
    (e.g. each rotation plan) becomes a panel of its own (``facet``, joined to any facet it had),
    drawn solid, in variant order; and that panel order (None: left as it was)."""
    if not varies(df, "variant") or df.get_column("variant").n_unique() <= most:
        return df, None
    order = variant_order(df)
    names = variant_title(df).lower()
    has_facet = "facet" in df.columns and varies(df, "facet")
    label = pl.format(f"{names}: {{}}", pl.col("variant"))
    if has_facet:
        label = pl.concat_str([pl.col("facet"), label], separator=" · ")
        outer = sorted(df.get_column("facet").unique().to_list())
        panels = [f"{f} · {names}: {v}" for f in outer for v in order]
    else:
        panels = [f"{names}: {v}" for v in order]
    out = df.with_columns(facet=label).with_columns(variant=pl.lit(""), variant_axes=pl.lit(""))
    return out, panels


def variant_order(df: pl.DataFrame) -> list[str]:
    return sorted(df.get_column("variant").unique().to_list(), key=lambda v: (
        [(ROTATION_ORDER.index(p.split("(")[0]) if p.split("(")[0] in ROTATION_ORDER else 50, p)
         for p in v.split(" · ")]
    ))  # fmt: skip


def variant_title(df: pl.DataFrame) -> str:
    names = {"norm": "Norm", "attention": "Attention", "rotation_label": "Rotation", "lr": "LR", "momentum": "Momentum",
             "nesterov": "Nesterov", "weight_decay": "Weight decay", "eps": "Adam ε",
             "beta1": "β1", "beta2": "β2", "rotate": "Rotate"}  # fmt: skip
    return " · ".join(names.get(c, c) for c in df.get_column("variant_axes").first().split(",") if c) or "Config"


def rotation_sort(df: pl.DataFrame) -> list[str]:
    col = next((c for c in ("column", "facet", "rotation_label") if c in df.columns), "")
    vals = df.get_column(col).unique().to_list() if col in df.columns else []

    def key(v: str) -> tuple[int, str]:
        base = (v or "").removeprefix("rotation: ").split("(")[0]
        return (ROTATION_ORDER.index(base) if base in ROTATION_ORDER else 99, v or "")

    return sorted((v for v in vals if v is not None), key=key)


def size_sort(df: pl.DataFrame) -> list[str]:
    col = size_column(df)
    if col is None:
        return sorted(df.get_column("size").unique().to_list())
    return (
        df.select("size", col).unique().sort(col).get_column("size").unique(maintain_order=True).to_list()
    )


def tooltip(df: pl.DataFrame, cols: Sequence[str]) -> list[alt.Tooltip]:
    out = []
    for c in cols:
        if c in df.columns:
            kind = "Q" if df.schema[c].is_numeric() else "N"
            fmt = ".4g" if kind == "Q" else alt.Undefined
            out.append(alt.Tooltip(f"{c}:{kind}", format=fmt))
    return out


def dodge(df: pl.DataFrame, x: str, width: float = 0.03, span: float = 0.12) -> pl.DataFrame:
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


CHART_COLUMNS = (
    "layer", "step", "tokens", "x_plot", "x", "x_low", "x_high", "params", "params_non_embedding", "d_model",
    "mean", "ci_low", "ci_high", "n", "fit", "fit_low", "fit_high", "kind",
    "optimizer", "variant", "facet", "size", "series", "row", "column", "null_ref",
)  # fmt: skip


def with_null(df: pl.DataFrame, metric: str) -> pl.DataFrame:
    """For kurtosis, a ``null_ref`` column: the exact null 3(d-1)/(d+1) at each row's
    d_model (``analysis.null``), which the charts draw instead of a line at 3."""
    if metric != Metric.KURTOSIS or "d_model" not in df.columns or df.get_column("d_model").null_count() == df.height:
        return df
    from analysis.null import null_expr

    return df.with_columns(null_ref=null_expr("d_model"))


def slim(df: pl.DataFrame, keep: Sequence[str] = ()) -> pl.DataFrame:
    """Only the columns the charts encode: the data is embedded in every saved spec."""
    cols = dict.fromkeys([*CHART_COLUMNS, *keep])
    return df.select([c for c in cols if c in df.columns])
