"""The charts' look: the fixed optimiser palette, titles, sizes, markers and the paper theme."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import altair as alt

from analysis.labels import BASIS_SERIES, SITE_NAMES
from resultstore.vocabulary import Basis, Metric, Site

__all__ = [
    "AXIS_TITLES", "COLOR_LEGEND", "DASHES", "DASH_LEGEND", "FAMILY_ORDER", "FONT", "HEIGHT",
    "MAX_DASHED", "MAX_EVALS", "METRIC_TITLES", "OKABE_ITO", "OPTIMIZER_COLORS", "PANEL_HEIGHT", "PANEL_WIDTH",
    "REFERENCES", "ROTATION_ORDER", "SERIES_ORDER", "SHAPES", "SI_LABEL", "SITE_NAMES", "SizeChoice",
    "WIDTH", "apply_theme", "dashes", "format_count", "lr_axis", "metric_title", "optimizer_scale", "paper_theme",
    "register_theme",
]  # fmt: skip

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
# Fixed so a given optimiser has one colour in every chart of every report. The names are the
# runs column `optimizer` (study/optim/ registers them; analysis reads them from the rows, never
# from study): one not listed here gets a spare colour and sorts after these, so a new optimiser
# needs no line here unless it wants a colour of its own.
OPTIMIZER_COLORS = {
    "adam": OKABE_ITO["vermillion"],
    "sgd": OKABE_ITO["blue"],
    "rotated_adam": OKABE_ITO["bluish_green"],
    "soap": OKABE_ITO["reddish_purple"],
    "muon": OKABE_ITO["orange"],
    "lion": OKABE_ITO["sky_blue"],
    "signsgd": OKABE_ITO["black"],
    "adafactor": "#8C6D1F",  # dark ochre: Okabe-Ito yellow is unreadable as a thin line
    # the rotated twins (study/optim/twins.py): fixed, so a twin reads the same in every chart
    "rotated_lion": "#6A3D9A",
    "rotated_signsgd": "#882255",  # wine (Tol): never a grey, which the charts keep for the null
    "rotated_adafactor": "#B15928",
}
FAMILY_ORDER = ("per_coordinate", "mixed", "rotation_equivariant", "fixed_random_basis", "adaptive_basis")
"""The runs column `optimizer_family`'s values (study/optim/registry.py FAMILIES), in the order
their panels appear; tests/test_registry.py holds the two sets equal."""
_SPARE = ["#1F78B4", "#33A02C", "#FB9A99", "#CAB2D6", "#FDBF6F"]

METRIC_TITLES = {
    Metric.KURTOSIS: "Kurtosis (Gaussian = 3)",
    Metric.NEURON_KURTOSIS: "Neuron kurtosis (Gaussian ≈ 1)",
    Metric.OUTLIER_DIMS_ABS: "Outlier dimensions (|x| > 6)",
    Metric.OUTLIER_DIMS_REL: "Outlier dimensions (|x| > 6 RMS)",
    "outlier_fraction": "Outlier fraction of d (|x| > 6 RMS)",
    "kurtosis_over_null": "Kurtosis / null 3(d−1)/(d+1)",
    Metric.MAX_ABS: "Max |activation|",
    Metric.MAX_MEDIAN_RATIO: "Max / median |activation|",
    Metric.DETTMERS_OUTLIERS: "Outlier features (Dettmers)",
    "final_val_loss": "Validation loss (nats/token)",
    "final_train_loss": "Training loss (nats/token)",
    Metric.QUANT_LOSS_DELTA: "Quantisation penalty (Δ val loss, nats/token)",
}
REFERENCES = {Metric.KURTOSIS: 3.0, Metric.NEURON_KURTOSIS: 1.0}
AXIS_TITLES = {
    "params_non_embedding": "Parameters (non-embedding)",
    "params": "Parameters (total)",
    "flops_per_token": "FLOPs per token",
    "tokens": "Training tokens",
    "step": "Training step",
    "layer": "Layer (0 = embeddings)",
    "depth": "Relative depth (layer / layers)",
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


def lr_axis(lrs: list[float]) -> alt.Axis:
    """Ticks at 1 and 3 x 10^k (as lr ladders are written), in plain decimals: an lr of 0.001
    reads 0.001, not 1m."""
    lo, hi = min(lrs) / 1.05, max(lrs) * 1.05
    ticks = [m * 10.0**k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in (1, 3)]
    ticks = [t for t in ticks if lo <= t <= hi]
    if len(ticks) > 6:
        ticks = [t for t in ticks if f"{t:.0e}".startswith("1")]
    return alt.Axis(values=ticks or sorted(set(lrs)), format="~g", grid=True)


def metric_title(metric: str, site: str | None = None, basis: str | None = None) -> str:
    """A readable axis title for a metric, e.g. ``"Kurtosis (Gaussian = 3)"``."""
    title = METRIC_TITLES.get(metric, metric.replace("_", " ").capitalize())
    where = SITE_NAMES.get((site, basis)) if site else None
    return title if where in (None, SITE_NAMES[Site.RESID, Basis.STORED], SITE_NAMES[Site.MODEL, Basis.COMPUTATION]) \
        else f"{title}, {where}"


def format_count(n: float | None) -> str:
    """1234567 -> ``"1.2M"``; 50000 -> ``"50k"``."""
    if n is None or not math.isfinite(n):
        return "?"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            v = n / div
            return f"{v:.3g}{unit}"
    return f"{n:g}"

SERIES_ORDER = list(BASIS_SERIES.values())  # basis_comparison's legend, in this order
SHAPES = ["circle", "triangle-up", "square", "diamond"]
DASHES = [[1, 0], [2, 2], [6, 3], [8, 2, 2, 2], [1, 4], [12, 4], [4, 2, 1, 2, 1, 2], [12, 2, 2, 2, 2, 2]]


MAX_DASHED = 4
"""Most line variants told apart by dash alone: past four, patterns look alike in print and in
the legend, so the builders that draw lines give each variant a panel of its own instead."""


def dashes(n: int) -> list[list[int]]:
    """``n`` stroke patterns, distinct up to len(DASHES) (8); past that they repeat."""
    return [DASHES[i % len(DASHES)] for i in range(n)]
ROTATION_ORDER = ["none", "shared", "partial", "groups", "independent"]
COLOR_LEGEND = alt.Legend(symbolOpacity=1, symbolType="circle")
DASH_LEGEND = alt.Legend(symbolType="stroke", symbolStrokeColor="#333333", symbolSize=300)
SI_LABEL = "datum.value == 0 ? '0' : format(datum.value, '.3~s')"


def _order(values: Sequence[Any], preferred: Sequence[Any]) -> list[Any]:
    seen = [v for v in dict.fromkeys(values) if v is not None]
    known = [p for p in dict.fromkeys(preferred) if p in seen]
    return known + sorted((v for v in seen if v not in known), key=str)
