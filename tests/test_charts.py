"""analysis.charts: every builder makes a valid chart that saves as SVG and PNG, with the
shared palette, readable titles and paper-column sizes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import altair as alt
import numpy as np
import polars as pl
import pytest
from conftest import chart_rows
from analysis_fixtures import messy_store, single_size_store, store, twins  # noqa: F401  (fixtures)

from analysis import charts, fits, queries, selection
from analysis.load import load

BY = ["optimizer", "norm", "rotation", "group_size"]


def _frames(path: str) -> dict[str, object]:
    r = load(path)
    per = queries.per_trial(r, "kurtosis").collect()
    kfits = fits.fit_each(per, "params_non_embedding", "value", BY, offset=3.0, n_boot=100)
    lfits = fits.fit_each(
        r.done_runs().collect(), "params_non_embedding", "final_val_loss", BY, n_boot=100
    )
    return {
        "profile": queries.layer_profile(r, "kurtosis").collect(),
        "scale": queries.scale_table(r, "kurtosis").collect(),
        "curves": fits.fit_curves(kfits, BY, x="params_non_embedding"),
        "training": queries.metric_over_training(r, "kurtosis").collect(),
        "basis": queries.basis_comparison(r).collect(),
        "loss": queries.loss_table(r).collect(),
        "loss_curves": fits.fit_curves(lfits, BY, x="params_non_embedding"),
        "matched": selection.versus(queries.loss_table(r), queries.scale_table(r, "kurtosis")).collect(),
        "quant": selection.quant_penalty(r, "w8a8").collect(),
        "onsets": selection.onset(r, threshold=3.5).collect(),
    }


def _build(f: dict[str, object]) -> dict[str, alt.TopLevelMixin]:
    return {
        "kurtosis_by_layer": charts.kurtosis_by_layer(f["profile"]),
        "metric_vs_params": charts.metric_vs_params(f["scale"], f["curves"]),
        "metric_over_training": charts.metric_over_training(f["training"]),
        "basis_comparison": charts.basis_comparison(f["basis"]),
        "loss_vs_params": charts.loss_vs_params(f["loss"], f["loss_curves"]),
        "kurtosis_vs_loss": charts.kurtosis_vs_loss(f["matched"], facet="norm"),
        "quant_penalty": charts.quant_penalty(f["quant"], facet="norm"),
        "onset": charts.metric_over_training(
            f["training"], size=None, threshold=3.5, onsets=f["onsets"]
        ),
        "by_family": charts.metric_vs_params(f["scale"], None, facet="optimizer_family", connect=True),
    }


@pytest.fixture(scope="module")
def built(store) -> dict[str, alt.TopLevelMixin]:  # noqa: F811
    return _build(_frames(store.path))


@pytest.fixture(scope="module")
def messy_built(messy_store) -> dict[str, alt.TopLevelMixin]:  # noqa: F811
    return _build(_frames(messy_store.path))


NAMES = [
    "kurtosis_by_layer", "metric_vs_params", "metric_over_training", "basis_comparison",
    "loss_vs_params", "kurtosis_vs_loss", "quant_penalty", "onset", "by_family",
]  # fmt: skip
WIDE = {"basis_comparison", "onset", "by_family"}  # several panels: wider or taller than a column


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.mark.parametrize("name", NAMES)
def test_chart_saves_as_svg_and_png(built, tmp_path: Path, name: str) -> None:
    chart = built[name]
    chart.save(tmp_path / f"{name}.svg")
    chart.save(tmp_path / f"{name}.png")
    svg = (tmp_path / f"{name}.svg").read_text()
    assert svg.lstrip().startswith("<svg") and "</svg>" in svg
    width, height = _png_size(tmp_path / f"{name}.png")
    assert width > 100 and height > 100
    if name not in WIDE:  # one panel: fits a paper column (3.3 in at 72 dpi)
        assert 240 <= width <= 360, width


@pytest.mark.parametrize("name", NAMES)
def test_messy_sweep_charts_build(messy_built, tmp_path: Path, name: str) -> None:
    chart = messy_built[name]
    spec = chart.to_dict()
    chart.save(tmp_path / f"{name}.svg")
    text = json.dumps(spec)
    assert "partial(2)" in text  # rotation label with its group size
    if name not in ("basis_comparison", "by_family"):
        assert "facet" in spec  # two norms (or sizes): one panel each


def _nodes(spec: object):
    """Every dict in a Vega-Lite spec (layers, facets, encodings), the inline datasets skipped."""
    if isinstance(spec, dict):
        yield spec
        for k, v in spec.items():
            if k != "datasets":
                yield from _nodes(v)
    elif isinstance(spec, list):
        for v in spec:
            yield from _nodes(v)


def _colour_map(spec: dict) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in _nodes(spec):
        scale = node.get("scale")
        if node.get("field") == "optimizer" and isinstance(scale, dict) and "range" in scale:
            found.update(zip(scale["domain"], scale["range"], strict=True))
    return found


def test_optimizer_colours_are_the_same_in_every_chart(built, messy_built) -> None:
    for chart in [*built.values(), *messy_built.values()]:
        colours = _colour_map(chart.to_dict())
        assert colours["adam"] == charts.OPTIMIZER_COLORS["adam"] == "#D55E00"
        assert colours["sgd"] == charts.OPTIMIZER_COLORS["sgd"] == "#0072B2"


@pytest.mark.parametrize("name", NAMES)
def test_each_reference_line_is_drawn_once_per_panel(messy_built, tmp_path: Path, name: str) -> None:
    # a constant rule bound to the chart's rows draws one identical line per row: a bloated SVG
    # and, in PNGs, a darker line (antialiased edges stacking), so each must be drawn once
    import re

    messy_built[name].save(tmp_path / f"{name}.svg")
    svg = (tmp_path / f"{name}.svg").read_text()
    groups = re.findall(r'<g class="mark-rule role-mark[^"]*"[^>]*>(.*?)</g>', svg)
    dashed = [g for g in groups if 'stroke-dasharray="3,3"' in g or 'stroke-dasharray="1,2"' in g]
    assert all(g.count("<line") == 1 for g in dashed), [g.count("<line") for g in dashed]


def test_axis_titles_and_reference_rule(built) -> None:
    layer = json.dumps(built["kurtosis_by_layer"].to_dict())
    assert "Kurtosis (Gaussian = 3)" in layer
    assert "Layer (0 = embeddings)" in layer
    assert '"datum": 3.0' not in layer  # the exact null at the model's width, not 3
    assert "null 3(d−1)/(d+1)" in json.dumps(built["kurtosis_by_layer"].to_dict(), ensure_ascii=False)
    scale = json.dumps(built["metric_vs_params"].to_dict())
    assert "Parameters (non-embedding)" in scale
    assert '"type": "log"' in scale
    assert "fit_low" in scale  # fitted bands drawn
    assert "Validation loss (nats/token)" in json.dumps(built["loss_vs_params"].to_dict())
    assert "Training tokens" in json.dumps(built["metric_over_training"].to_dict())
    basis = json.dumps(built["basis_comparison"].to_dict())
    assert "residual, random basis" in basis and "MLP input, computation basis" in basis


def test_largest_size_is_named_in_the_title(built, store) -> None:  # noqa: F811
    title = json.dumps(built["kurtosis_by_layer"].to_dict()["title"])
    assert charts.format_count(max(store.params_non_embedding)) in title and "largest" in title


def test_size_choices(store) -> None:  # noqa: F811
    prof = queries.layer_profile(load(store.path), "kurtosis").collect()
    smallest = min(store.params_non_embedding)
    spec = charts.kurtosis_by_layer(prof, size=smallest).to_dict()
    assert charts.format_count(smallest) in json.dumps(spec["title"])
    per_size = charts.kurtosis_by_layer(prof, size=None).to_dict()
    assert "row" in per_size["facet"]
    with pytest.raises(ValueError, match="not among"):
        charts.kurtosis_by_layer(prof, size=12345)


def test_single_size_scaling_chart(single_size_store, tmp_path: Path) -> None:  # noqa: F811
    r = load(single_size_store.path)
    chart = charts.metric_vs_params(queries.scale_table(r, "kurtosis").collect(), None)
    spec = json.dumps(chart.to_dict())
    assert '"domain"' in spec  # a window around the one size, not a degenerate axis
    chart.save(tmp_path / "single.png")


def test_unthemed_charts_compose(built, store) -> None:  # noqa: F811
    r = load(store.path)
    a = charts.kurtosis_by_layer(queries.layer_profile(r, "kurtosis").collect(), configure=False)
    b = charts.metric_over_training(queries.metric_over_training(r, "kurtosis").collect(), configure=False)
    both = charts.apply_theme(alt.hconcat(a, b))
    assert both.to_dict()["config"]["font"] == charts.FONT


def test_palette_helpers() -> None:
    scale = charts.optimizer_scale(["zeta", "sgd", "adam", "sgd"]).to_dict()
    assert scale["domain"] == ["adam", "sgd", "zeta"]  # known optimisers first, fixed order
    assert scale["range"][:2] == ["#D55E00", "#0072B2"]
    assert scale["range"][2] not in charts.OPTIMIZER_COLORS.values()
    twins = {"rotated_lion", "rotated_signsgd", "rotated_adafactor"}  # colours of their own, outside Okabe-Ito's 8
    assert set(charts.OKABE_ITO.values()) >= {c for n, c in charts.OPTIMIZER_COLORS.items()
                                              if c != "#8C6D1F" and n not in twins}
    assert len(set(charts.OPTIMIZER_COLORS.values())) == len(charts.OPTIMIZER_COLORS)  # one colour, one optimiser
    greys = [n for n, c in charts.OPTIMIZER_COLORS.items()
             if c[1:3] == c[3:5] == c[5:7] and 0x20 < int(c[1:3], 16) < 0xE0]
    assert greys == []  # mid greys belong to the null lines: a twin drawn grey vanishes into its null
    assert charts.format_count(1_234_567) == "1.23M"
    assert charts.format_count(50_000) == "50k"
    assert charts.format_count(12) == "12"
    assert charts.metric_title("kurtosis", "mlp_in", "computation") == "Kurtosis (Gaussian = 3), MLP input"
    assert charts.register_theme() == "paper"
    assert "paper" in alt.theme.names()
    alt.theme.enable("default")


def _marks(spec: dict) -> dict[str, list[dict[str, str | None]]]:
    """{mark type: [{channel: field}, ...]} over every layer and facet of a spec."""
    found: dict[str, list[dict[str, str | None]]] = {}
    for node in _nodes(spec):
        if "mark" in node:
            mark = node["mark"] if isinstance(node["mark"], str) else node["mark"]["type"]
            enc = {k: v.get("field") for k, v in node.get("encoding", {}).items() if isinstance(v, dict)}
            found.setdefault(mark, []).append(enc)
    return found


def test_layer_chart_shows_the_largest_models_profile(store) -> None:  # noqa: F811
    prof = queries.layer_profile(load(store.path), "kurtosis").collect()
    spec = charts.kurtosis_by_layer(prof.lazy()).to_dict()  # lazy frames are accepted
    marks = _marks(spec)
    assert {"x": "layer", "y": "mean", "color": "optimizer", "detail": "variant"} in marks["line"]
    assert {"x": "layer", "y": "ci_low", "y2": "ci_high", "color": "optimizer", "detail": "variant"} in marks["area"]
    assert "rule" in marks  # the Gaussian reference
    largest = prof.filter(pl.col("params_non_embedding") == pl.col("params_non_embedding").max())
    want = {(r["optimizer"], r["layer"], round(r["mean"], 9)) for r in largest.iter_rows(named=True)}
    assert {(r["optimizer"], r["layer"], round(r["mean"], 9)) for r in chart_rows(spec)} == want
    assert "Layer (0 = embeddings)" in json.dumps(spec) and "Kurtosis (Gaussian = 3)" in json.dumps(spec)


def test_scaling_chart_shows_every_point_and_each_fitted_curve(built, store) -> None:  # noqa: F811
    spec = built["metric_vs_params"].to_dict()
    marks = _marks(spec)
    assert {"x": "x_plot", "y": "mean", "color": "optimizer"} in marks["point"]
    assert {"x": "x_plot", "y": "fit", "color": "optimizer", "detail": "variant"} in marks["line"]
    assert {"x": "x_plot", "y": "fit_low", "y2": "fit_high", "color": "optimizer", "detail": "variant"} in marks["area"]
    assert any(m.get("y") == "ci_low" and m.get("y2") == "ci_high" for m in marks["rule"])  # error bars
    rows = chart_rows(spec)
    scale = queries.scale_table(load(store.path), "kurtosis").collect()
    points = {(r["optimizer"], r["params_non_embedding"], round(r["mean"], 9)) for r in rows if r["kind"] == "point"}
    assert points == {(r["optimizer"], r["params_non_embedding"], round(r["mean"], 9)) for r in scale.iter_rows(named=True)}
    fitted = [r for r in rows if r.get("fit") is not None]
    assert {r["optimizer"] for r in fitted} == {"adam"}  # sgd has no excess over 3: no fit, no curve
    assert all(r["fit_low"] <= r["fit"] <= r["fit_high"] for r in fitted)
    assert '"type": "log"' in json.dumps(spec) and "Parameters (non-embedding)" in json.dumps(spec)


def test_new_views_say_what_they_show(built) -> None:
    matched = json.dumps(built["kurtosis_vs_loss"].to_dict())
    assert "Validation loss (nats/token)" in matched and "Kurtosis (Gaussian = 3)" in matched
    assert "Model size" in matched  # marker size names the model size of each point
    quant = json.dumps(built["quant_penalty"].to_dict())
    assert "W8A8 penalty" in quant and "nats/token" in quant
    onset = built["onset"].to_dict()
    assert '"datum": 3.5' in json.dumps(onset) and "diamond" in json.dumps(onset)
    assert "row" in onset["facet"]  # one row per model size
    family = json.dumps(built["by_family"].to_dict())
    assert "family: per coordinate" in family and "family: rotation equivariant" in family


def test_configs_differing_in_momentum_are_separate_lines(twins) -> None:  # noqa: F811
    """Lines are told apart by every hyper-parameter that varies within an optimiser."""
    table = queries.scale_table(load(twins), "kurtosis").collect()
    spec = json.dumps(charts.metric_vs_params(table, None, facet="rotation", connect=True).to_dict())
    assert "Momentum" in spec and '"0.5"' in spec and '"0.9"' in spec
    assert "rotation: groups[[0,1],[2,3]]" in spec


def test_a_size_is_a_shape_whatever_the_norm_adds() -> None:
    # LayerNorm's gains give a model a few more parameters than the rmsnorm_scalar model of the
    # same shape; "largest" must keep both norms, and one row per size must not split them
    from analysis.charts.frames import pick_size

    df = pl.DataFrame({
        "norm": ["layernorm", "rmsnorm_scalar", "layernorm", "rmsnorm_scalar"],
        "d_model": [64, 64, 128, 128], "n_layers": [4, 4, 4, 4],
        "params_non_embedding": [199_296, 196_736, 788_736, 786_176], "mean": [3.0, 3.1, 5.0, 4.9],
    })  # fmt: skip
    largest, note = pick_size(df, "largest")
    assert sorted(largest["norm"]) == ["layernorm", "rmsnorm_scalar"] and set(largest["d_model"]) == {128}
    assert note == "786k-789k non-embedding params (largest)"
    every, _ = pick_size(df, None)
    assert every.group_by("size").len().height == 2
    assert pick_size(df, 196_736)[0]["d_model"].to_list() == [64, 64]


def _null_rows(spec: dict) -> list[tuple[int, float]]:
    return [(r["d_model"], r["null_ref"]) for r in chart_rows(spec) if r.get("null_ref") is not None]


@pytest.mark.parametrize("name", ["kurtosis_by_layer", "metric_over_training", "basis_comparison", "by_family",
                                  "kurtosis_vs_loss", "quant_penalty", "onset"])
def test_kurtosis_charts_draw_the_exact_null_for_the_sizes_shown(built, name: str) -> None:
    """Every kurtosis chart draws 3(d-1)/(d+1) at the widths it shows (labelled), never a line at 3."""
    spec = built[name].to_dict()
    text = json.dumps(spec, ensure_ascii=False)
    assert "null 3(d−1)/(d+1)" in text and '"datum": 3.0' not in text
    rows = _null_rows(spec)
    assert rows and all(v == pytest.approx(3 * (d - 1) / (d + 1), rel=1e-12) for d, v in rows)
    null_marks = [m for marks in _marks(spec).values() for m in marks if "null_ref" in m.values()]
    assert null_marks  # a mark encodes the null


def test_scaling_chart_draws_one_null_point_per_size(built, store) -> None:  # noqa: F811
    spec = built["by_family"].to_dict()
    widths = {d for d, _ in _null_rows(spec)}
    assert widths == {32, 64, 128}  # every size on the axis has its null
    layers = spec["spec"]["layer"]
    line = [la for la in layers if la.get("encoding", {}).get("y", {}).get("field") == "null_ref"
            and (la.get("mark") or {}).get("type") == "line"]
    assert len(line) == 1 and line[0]["transform"][-2]["aggregate"][0]["op"] == "mean"
    assert line[0]["transform"][-2]["groupby"] == ["params_non_embedding"]  # one point per size


def test_group_size_chart_shows_each_config_and_site(tmp_path: Path) -> None:
    from synthetic_store import Synthetic

    rots = ["none", ("partial", 1), ("partial", 2), ("partial", 4), ("partial", 1, False), ("partial", 4, False),
            ("partial", 4, "group")]
    s = (Synthetic("sharing").trials(sizes=(32, 64), n_layers=4, optimizers=("adam",), seeds=(0, 1), rotations=rots)
         .planted(sharing=True)
         .rows(steps=(0, 10), quant=False)
         .write(tmp_path))  # fmt: skip
    table = selection.group_size_table(load(s.path)).collect()
    spec = charts.kurtosis_vs_group_size(table).to_dict()
    rows = chart_rows(spec)
    largest = table.filter(pl.col("d_model") == 64)
    want = {(r["group_size_x"], r["site_name"], r["ends"], round(r["mean"], 9)) for r in largest.iter_rows(named=True)}
    assert {(r["group_size_x"], r["site_name"], r["ends"], round(r["mean"], 9)) for r in rows} == want
    assert len(want) == 2 * 6  # (k 1, 2, 4 own bases; 4 in the group's; 1, 4 unrotated) x (attention, MLP input)
    assert spec["facet"]["column"]["field"] == "ends"
    assert spec["facet"]["column"]["sort"] == ["ends in bases of their own", "ends in the group's basis", "ends unrotated"]
    assert spec["spec"]["layer"][0]["encoding"]["x"]["axis"]["values"] == [1, 2, 4]
    assert "null 3(d−1)/(d+1)" in json.dumps(spec, ensure_ascii=False)
    _save_both(charts.kurtosis_vs_group_size(table), tmp_path / "sharing")

    # the unrotated model as the reference: its largest-size rows in both panels, dotted over its band
    none = selection.unrotated_table(load(s.path)).collect()
    spec = charts.kurtosis_vs_group_size(table, baseline=none).to_dict()
    drawn = {(r["site_name"], r["ends"], round(r["mean"], 9), round(r["ci_low"], 9))
             for r in chart_rows(spec) if r["kind"] == "none"}  # fmt: skip
    big = none.filter(pl.col("d_model") == 64)
    assert big.height == 2 and none.height == 4  # (attention, MLP input) x 2 sizes
    assert drawn == {(r["site_name"], ends, round(r["mean"], 9), round(r["ci_low"], 9))
                     for r in big.iter_rows(named=True)
                     for ends in ("ends in bases of their own", "ends in the group's basis", "ends unrotated")}  # fmt: skip
    plans = {(r["group_size_x"], r["site_name"], r["ends"], round(r["mean"], 9)) for r in chart_rows(spec) if r["kind"] == "plan"}
    assert plans == want
    marks = [(la["mark"]["type"], la["transform"][0].get("filter")) for la in spec["spec"]["layer"] if "transform" in la]
    assert ("rect", "(datum.kind === 'none')") in marks and ("rule", "(datum.kind === 'none')") in marks
    assert ("line", "(datum.kind === 'plan')") in marks
    _save_both(charts.kurtosis_vs_group_size(table, baseline=none), tmp_path / "sharing_none")


@pytest.mark.parametrize(("lo", "hi", "want"), [
    (786e3, 1.77e6, [1e6]),  # under one 1-2-5 step: leading digits (the families study's 128 and 192)
    (240e3, 1.77e6, [5e5, 1e6]),  # 1-2-5
    (1e5, 1e11, [1e5, 1e8, 1e11]),  # decades
    (1.01e6, 1.09e6, [1e6, 1.1e6]),  # narrower: the ends, two significant digits
])  # fmt: skip
def test_log_axis_labels_a_few_round_values(lo: float, hi: float, want: list[float]) -> None:
    """Never one label per data value: the fitted curves' 50 x values once labelled a 2-size
    axis with every one of them (786k 883k 991k 1.11M ...), overlapping."""
    from analysis.charts.layers import log_axis

    curve = list(np.geomspace(lo, hi, 50))
    ticks = log_axis(curve, 6).to_dict()["values"]
    assert 2 <= len(ticks) <= 7 and set(want) <= set(ticks)
    assert all(float(f"{t:.2g}") == t for t in ticks)  # round values only


def _plans_store(tmp_path: Path, rots: list) -> str:
    from synthetic_store import Synthetic

    return (Synthetic("plans").trials(sizes=(32,), n_layers=4, optimizers=("adam",), seeds=(0, 1), rotations=rots)
            .planted(sharing=True)
            .rows(steps=(0, 10), quant=False)
            .write(tmp_path)).path  # fmt: skip


def _told_apart(spec: dict) -> dict[str, str]:
    """Each rotation plan drawn -> how it is told apart: "dash <pattern>" or "panel <name>".
    Fails when two plans share a dash pattern inside one panel."""
    dash = next((n["strokeDash"] for n in _nodes(spec) if isinstance(n.get("strokeDash"), dict)
                 and "scale" in n["strokeDash"]), None)
    if dash is not None:
        domain, patterns = dash["scale"]["domain"], [tuple(p) for p in dash["scale"]["range"]]
        assert len(set(patterns)) == len(domain), (domain, patterns)  # every plan its own pattern
        return {v: f"dash {p}" for v, p in zip(domain, patterns, strict=True)}
    rows = [r for r in chart_rows(spec) if r.get("kind", "line") == "line"]
    panels = {r["facet"] for r in rows}
    assert all(len({r["variant"] for r in rows if r["facet"] == f}) == 1 for f in panels)  # one plan per panel
    return {f.split("rotation: ")[-1]: f"panel {f}" for f in panels}


@pytest.mark.parametrize("rots", [
    ["none", "shared", "independent", ("partial", 1)],                                       # four: dashes
    ["none", "shared", "independent", ("partial", 1), ("partial", 2), ("partial", 1, False)],  # six
    ["none"] + [("partial", k) for k in (1, 2, 3, 4)] + [("partial", k, False) for k in (1, 2, 3, 4)],  # nine
], ids=["4 plans", "6 plans", "9 plans"])
@pytest.mark.parametrize("builder", ["kurtosis_by_layer", "metric_over_training"])
def test_every_rotation_plan_is_told_apart_from_every_other(tmp_path: Path, rots: list, builder: str) -> None:
    """Issue 37: with nine plans the sharing study drew `none` and `partial(6)` both solid (the
    dash patterns ran out). Each plan now has its own dash, or (past four) its own panel."""
    r = load(_plans_store(tmp_path, rots))
    frame = (queries.layer_profile(r, "kurtosis") if builder == "kurtosis_by_layer"
             else queries.metric_over_training(r, "kurtosis")).collect()
    chart = getattr(charts, builder)(frame, facet=None)
    apart = _told_apart(chart.to_dict())
    labels = {"none", "shared", "independent", "partial(1)", "partial(2)", "partial(3)", "partial(4)",
              "partial(1)-noemb", "partial(2)-noemb", "partial(3)-noemb", "partial(4)-noemb"}
    assert len(apart) == len(rots) and set(apart) <= labels
    assert len(set(apart.values())) == len(rots)
    if len(rots) > charts.MAX_DASHED:
        _save_both(chart, tmp_path / builder)


def test_plans_in_panels_draw_the_unrotated_model_in_every_other_panel(tmp_path: Path) -> None:
    rots = ["none"] + [("partial", k) for k in (1, 2, 3, 4)]
    prof = queries.layer_profile(load(_plans_store(tmp_path, rots)), "kurtosis").collect()
    spec = charts.kurtosis_by_layer(prof, facet=None).to_dict()
    rows = chart_rows(spec)
    none = {(r["layer"], round(r["mean"], 9)) for r in rows if r["kind"] == "line" and r["facet"] == "rotation: none"}
    for k in (1, 2, 3, 4):
        ref = {(r["layer"], round(r["mean"], 9)) for r in rows
               if r["kind"] == "unrotated" and r["facet"] == f"rotation: partial({k})"}
        assert ref == none and len(none) == 5  # layers 0-4 of the unrotated model, in each plan's panel
    grey = [n for n in _nodes(spec) if isinstance(n.get("mark"), dict) and n["mark"].get("color") == "#888888"]
    assert grey and "without rotation" in " ".join(spec["title"]["subtitle"])


def _matched(tmp_path: Path, seeds=(0, 1)) -> pl.DataFrame:
    from synthetic_store import Synthetic

    s = (Synthetic("ladder").trials(sizes=(32, 64), optimizers=("adam", "sgd"), seeds=seeds, lrs={"sgd": [0.1, 0.3, 1.0]})
         .planted(best_lrs={"sgd": 0.3})
         .rows(steps=(0, 10), quant=False)
         .write(tmp_path))  # fmt: skip
    r = load(s.path)
    return selection.versus(queries.loss_table(r), queries.scale_table(r, "kurtosis")).collect()


def test_matched_loss_chart_draws_each_ladders_best_lr_with_the_rest_faint(tmp_path: Path) -> None:
    """Issue 37: a long lr ladder cluttered the matched-loss view. By default each ladder's best
    lr (lowest seed-mean val loss) is a full point with intervals and lines; the other lrs are
    faint points behind; "best" hides them, "all" draws every lr alike (the old view)."""
    table = _matched(tmp_path)
    best = table.sort("x").group_by("tuning_id").first()
    want = {(r["optimizer"], r["d_model"], r["lr"]) for r in best.iter_rows(named=True)}
    assert len(want) == 4 and table.height == 2 * (1 + 3)  # adam one lr, sgd three, at two sizes

    spec = charts.kurtosis_vs_loss(table).to_dict()
    rows = chart_rows(spec)
    assert {(r["optimizer"], r["d_model"], r["lr"]) for r in rows if r["kind"] == "point"} == want
    faint = {(r["optimizer"], r["d_model"], r["lr"]) for r in rows if r["kind"] == "ladder"}
    assert len(faint) == 4 and not faint & want
    layers = spec["layer"]
    by_kind = {}
    for la in layers:
        for t in la.get("transform", []):
            if "filter" in t and "datum.kind" in str(t["filter"]):
                by_kind.setdefault(str(t["filter"]).split("'")[1], []).append(la)
    assert [la["mark"]["type"] for la in by_kind["ladder"]] == ["point"]  # no bars, no lines for the rest
    assert by_kind["ladder"][0]["mark"]["opacity"] < 0.5
    assert {la["mark"]["type"] for la in by_kind["point"]} == {"line", "rule", "point"}
    assert "best lr of each ladder" in " ".join(spec["title"]["subtitle"])

    hidden = chart_rows(charts.kurtosis_vs_loss(table, ladder="best").to_dict())
    assert {(r["optimizer"], r["d_model"], r["lr"]) for r in hidden} == want and len(hidden) == 4
    every = chart_rows(charts.kurtosis_vs_loss(table, ladder="all").to_dict())
    assert len(every) == table.height and {r["kind"] for r in every} == {"point"}
    chosen = table.filter((pl.col("optimizer") == "sgd") & (pl.col("lr") == 1.0)).select("config_id")
    picked = chart_rows(charts.kurtosis_vs_loss(table.filter(pl.col("optimizer") == "sgd"), best=chosen).to_dict())
    assert {r["lr"] for r in picked if r["kind"] == "point"} == {1.0}  # a given choice (selection.best_lr) wins
    _save_both(charts.kurtosis_vs_loss(table), tmp_path / "matched")


def _title(spec: dict) -> tuple[str, list[str]]:
    title = spec.get("title")
    assert isinstance(title, dict), title
    subtitle = title.get("subtitle") or []
    return title["text"], [subtitle] if isinstance(subtitle, str) else subtitle


@pytest.mark.parametrize("name", NAMES)
def test_every_figure_is_titled_and_captioned_inside_the_image(built, tmp_path: Path, name: str) -> None:
    """Issue 37: a PNG lifted into a paper or a slide explains itself: a title, and under it a
    caption that says what the marks are, in the rendered image (not only in index.html)."""
    text, lines = _title(built[name].to_dict())
    assert text and not text.endswith("(largest)")  # a title, not only the size note
    caption = " ".join(lines)
    assert len(caption) > 80 and any(w in caption for w in ("interval", "seed")), caption
    assert max(len(line) for line in lines) <= 120  # wrapped to the figure, not one long line
    built[name].save(tmp_path / f"{name}.svg")
    svg = (tmp_path / f"{name}.svg").read_text()
    assert text.split(",")[0] in svg and lines[-1].split()[-1] in svg  # drawn, first and last words


def test_the_report_can_put_its_own_caption_in_the_image(built) -> None:
    chart = built["kurtosis_by_layer"]
    text, lines = _title(chart.to_dict())
    mine = "The report's caption: residual-stream kurtosis by layer, best-lr points, 95% t-intervals over seeds. " * 2
    text2, lines2 = _title(charts.with_caption(chart, mine).to_dict())
    assert text2 == text and lines2[0] == lines[0]  # the size note stays
    assert " ".join(lines2[1:]) == mine.strip() and len(lines2) > 2


def test_group_size_and_slopes_charts_are_titled_and_captioned(tmp_path: Path) -> None:
    from synthetic_store import Synthetic

    rots = ["none", ("partial", 1), ("partial", 2), ("partial", 1, False), ("partial", 2, False)]
    s = (Synthetic("sharing").trials(sizes=(32,), n_layers=4, optimizers=("adam",), seeds=(0, 1), rotations=rots)
         .planted(sharing=True)
         .rows(steps=(0, 10), quant=False)
         .write(tmp_path))  # fmt: skip
    table = selection.group_size_table(load(s.path)).collect()
    none = selection.unrotated_table(load(s.path)).collect()
    for baseline, said in ((none, "no rotation"), (None, "No unrotated run")):
        text, lines = _title(charts.kurtosis_vs_group_size(table, baseline=baseline).to_dict())
        assert text == "Shared bases and alignment" and said in " ".join(lines)
    fits_table = pl.DataFrame({"fit": ["kurtosis / null"], "config": ["adam"], "optimizer": ["adam"],
                               "exponent": [0.2], "exponent_low": [0.1], "exponent_high": [0.3],
                               "interval": ["between-seed t (3 seeds)"]})  # fmt: skip
    text, lines = _title(charts.slopes(fits_table).to_dict())
    assert text == "Fitted exponents" and "between-seed t (3 seeds)" in " ".join(lines)


def test_slopes_chart_draws_each_fit_with_its_interval(tmp_path: Path) -> None:
    fits_table = pl.DataFrame({
        "fit": ["kurtosis / null 3(d−1)/(d+1), MLP input (mean over blocks)"] * 2
        + ["outlier fraction (outlier_dims_rel / d_model), MLP input (over blocks, quasi-Poisson GLM)"],
        "config": ["adam · rmsnorm · none", "sgd · rmsnorm · none", "adam · rmsnorm · none"],
        "optimizer": ["adam", "sgd", "adam"], "exponent": [0.2, 0.001, 0.5],
        "exponent_low": [0.1, -0.01, 0.2], "exponent_high": [0.3, 0.012, 0.8], "n": [9, 9, 6],
        "interval": ["between-seed t (3 seeds)"] * 2 + ["quasi-Poisson GLM, t(4)"],
    })  # fmt: skip
    spec = charts.slopes(fits_table).to_dict()
    rows = chart_rows(spec)
    assert {(r["fit_short"], r["config"], r["exponent_low"], r["exponent"], r["exponent_high"]) for r in rows} == {
        ("kurtosis / null 3(d−1)/(d+1), MLP input", "adam · rmsnorm · none", 0.1, 0.2, 0.3),
        ("kurtosis / null 3(d−1)/(d+1), MLP input", "sgd · rmsnorm · none", -0.01, 0.001, 0.012),
        ("outlier fraction (outlier_dims_rel / d_model), MLP input", "adam · rmsnorm · none", 0.2, 0.5, 0.8),
    }
    marks = _marks(spec)
    assert {"x": "exponent_low", "x2": "exponent_high", "y": "config", "color": "optimizer"} in marks["rule"]
    _save_both(charts.slopes(fits_table), tmp_path / "slopes")


def _save_both(chart: alt.TopLevelMixin, stem: Path) -> None:
    """The chart renders: an SVG with marks and a PNG."""
    chart.save(f"{stem}.svg")
    chart.save(f"{stem}.png")
    assert "<path" in Path(f"{stem}.svg").read_text() and Path(f"{stem}.png").read_bytes()[:4] == b"\x89PNG"


def test_legends_and_line_labels_name_muon_ends_and_precondition_frequency() -> None:
    # issue 23: two Muons that differ only in what trains their ends (or two SOAPs only in their
    # precondition frequency) must not share one legend entry or one line label
    from analysis.charts.frames import decorate

    rows = pl.DataFrame({
        "optimizer": ["muon", "muon", "soap", "soap"], "muon_ends": ["adamw", "sgd", None, None],
        "precondition_frequency": [None, None, 10, 50], "lr": [3e-3] * 4, "norm": ["rmsnorm_scalar"] * 4,
        "rotation_label": ["none"] * 4, "tuned_line_id": ["a", "b", "c", "d"],
    })
    variants = decorate(rows, None).get_column("variant").to_list()
    assert len(set(variants[:2])) == 2 and len(set(variants[2:])) == 2, variants
    labels = dict(selection.line_labels(rows).select("tuned_line_id", "config").iter_rows())
    assert "muon_ends=adamw" in labels["a"] and "muon_ends=sgd" in labels["b"], labels
    assert "precondition_frequency=10" in labels["c"] and "precondition_frequency=50" in labels["d"], labels


@pytest.mark.parametrize("helpers", ["frames", "layers"])
def test_the_shared_helpers_the_builders_import_are_in_all(helpers: str) -> None:
    import ast
    import importlib

    module = f"analysis.charts.{helpers}"
    imported = {
        alias.name
        for f in [*Path(charts.__file__).parent.rglob("*.py"), *Path(__file__).parent.glob("test_*.py")]
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == module
        for alias in node.names
    }
    assert imported and imported <= set(importlib.import_module(module).__all__)
