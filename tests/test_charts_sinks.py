"""analysis.charts.sinks: the sink measures by layer with uniform attention's reference, and the
outlier measure against the sink with the attention variant as the marker's shape."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import chart_rows
from analysis.charts.sinks import MEASURE_TITLES, sinks_by_layer, sinks_vs_outliers

UNIFORM = {"first_mass": 0.074, "delimiter_mass": 0.25, "sink_heads": None, "null_mass": None}


def _profile() -> pl.DataFrame:
    """layer_profile-like rows: two optimisers x two attentions x four blocks x every measure."""
    rows = []
    for measure in MEASURE_TITLES:
        for opt in ("adam", "sgd"):
            for attention, level in (("softmax", 0.6), ("gated", 0.2)):
                for layer in range(1, 5):
                    mean = level * layer / 4
                    rows.append({"config_id": f"{opt}-{attention}", "optimizer": opt, "attention": attention,
                                 "norm": "rmsnorm_scalar", "rotation": "none", "rotation_label": "none", "lr": 3e-3,
                                 "d_model": 128, "n_layers": 4, "params_non_embedding": 786432, "layer": layer,
                                 "mean": mean, "ci_low": mean - 0.02, "ci_high": mean + 0.02, "n": 3,
                                 "measure": measure, "uniform": UNIFORM[measure]})
    return pl.DataFrame(rows)


def _layers(spec: dict) -> list[dict]:
    return spec["spec"]["layer"]


def test_one_panel_per_measure_in_order_with_uniform_attentions_reference() -> None:
    chart = sinks_by_layer(_profile())
    spec = chart.to_dict(validate=False)
    assert spec["facet"]["column"]["sort"] == list(MEASURE_TITLES.values())
    rows = chart_rows(chart)
    refs = {r["facet"]: r["uniform"] for r in rows if r["kind"] == "uniform"}
    assert refs == {"Mass on position 0": pytest.approx(0.074), "Mass on delimiters": pytest.approx(0.25)}
    lines = [r for r in rows if r["kind"] == "line"]
    assert {r["variant"] for r in lines} == {"softmax", "gated"}  # the attention varies within an optimiser
    dashed = [lay for lay in _layers(spec) if "strokeDash" in lay.get("encoding", {})]
    assert dashed and dashed[0]["encoding"]["strokeDash"]["field"] == "variant"
    assert spec["title"]["text"] == "Attention sinks by layer"
    assert "uniform causal attention" in " ".join(spec["title"]["subtitle"])


def test_one_attention_draws_no_dashes_and_an_empty_profile_is_refused() -> None:
    one = _profile().filter(pl.col("attention") == "softmax")
    spec = sinks_by_layer(one).to_dict(validate=False)
    assert not any("strokeDash" in lay.get("encoding", {}) for lay in _layers(spec))
    with pytest.raises(ValueError, match="no rows"):
        sinks_by_layer(one.head(0))
    one_seed = one.with_columns(ci_low=pl.lit(None, pl.Float64), ci_high=pl.lit(None, pl.Float64), n=pl.lit(1))
    assert "one seed (no interval)" in " ".join(sinks_by_layer(one_seed).to_dict(validate=False)["title"]["subtitle"])


def test_the_outlier_measure_against_the_sink_marks_the_attention_by_shape() -> None:
    table = pl.DataFrame([
        {"config_id": f"{o}-{a}", "optimizer": o, "attention": a, "norm": "rmsnorm_scalar", "rotation": "none",
         "rotation_label": "none", "lr": 3e-3, "d_model": 128, "n_layers": 4,
         "params_non_embedding": 786432 + (4 * 128 * 128 if a == "gated" else 0), "x": x, "x_low": x - 0.01, "x_high": x + 0.01, "x_n": 3, "mean": y, "ci_low": y - 0.1, "ci_high": y + 0.1, "n": 3}
        for o, a, x, y in (("adam", "softmax", 0.6, 1.9), ("adam", "gated", 0.2, 1.2), ("sgd", "softmax", 0.6, 1.0),
                           ("sgd", "gated", 0.2, 1.0))])
    chart = sinks_vs_outliers(table, uniform=0.074)
    spec = chart.to_dict(validate=False)
    layers = spec["layer"] if "layer" in spec else spec["spec"]["layer"]
    shapes = [lay["encoding"]["shape"]["field"] for lay in layers if "shape" in lay.get("encoding", {})]
    assert shapes == ["variant"]
    rules = [lay for lay in layers if lay.get("mark", {}).get("type") == "rule" and "datum" in str(lay.get("encoding"))]
    assert any("0.074" in str(lay["encoding"]) for lay in rules)  # uniform attention, on x
    assert "Dashed vertical: uniform causal attention (0.074)" in " ".join(spec["title"]["subtitle"])
    assert {r["size"] for r in chart_rows(chart)} == {"786k"}  # one model shape: the gate's weights make no new size
    words = " ".join(spec["title"]["subtitle"])
    assert "each a seed mean with its 95% t-interval over 3 seeds both ways" in words
    assert "marker size" not in words  # one model shape: no size to read
    one_seed = table.with_columns(n=pl.lit(1), x_n=pl.lit(1), ci_low=pl.col("mean"), ci_high=pl.col("mean"))
    words = " ".join(sinks_vs_outliers(one_seed).to_dict(validate=False)["title"]["subtitle"])
    assert "one seed (no interval)" in words and "seed mean" not in words, words
