"""analysis.charts.privilege: the top-k energy share against size, with its null drawn."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import chart_rows
from analysis.charts.privilege import FIXED_SHARE_WORDS, top_share_vs_params
from analysis.null import top_share_label, top_share_null


def _table(norms: tuple[str, ...] = ("layernorm",)) -> pl.DataFrame:
    """scale_table-like rows: two optimisers x two widths x two sites (x norms), seed summaries."""
    rows = []
    for site in ("Residual stream (stored basis)", "MLP input"):
        for norm in norms:
            for opt, share in (("adam", 0.3), ("sgd", None)):
                for d in (64, 128):
                    mean = share if share is not None else top_share_null(d)
                    rows.append({"config_id": f"{opt}{norm}{d}", "optimizer": opt, "norm": norm, "rotation": "none",
                                 "rotation_label": "none", "lr": 3e-3, "d_model": d, "n_layers": 4,
                                 "params_non_embedding": 48 * d * d, "mean": mean, "ci_low": mean - 0.01,
                                 "ci_high": mean + 0.01, "n": 3, "site_name": site})  # fmt: skip
    return pl.DataFrame(rows)


@pytest.mark.parametrize("k", [1, 4])
def test_the_null_is_drawn_at_each_width_and_labelled_once_per_panel(k: int) -> None:
    chart = top_share_vs_params(_table(), k=k, panel_order=["Residual stream (stored basis)", "MLP input"])
    rows = chart_rows(chart)
    nulls = [r for r in rows if r["kind"] == "null"]
    assert {(r["panel"], r["d_model"]): r["null_ref"] for r in nulls} == {
        (p, d): pytest.approx(top_share_null(d, k)) for p in ("Residual stream (stored basis)", "MLP input")
        for d in (64, 128)}  # fmt: skip
    labels = [(r["panel"], r["d_model"]) for r in nulls if r.get("null_label")]
    assert sorted(labels) == [("MLP input", 128), ("Residual stream (stored basis)", 128)]  # the largest width
    assert {r["null_label"] for r in nulls if r.get("null_label")} == {top_share_label(k)}
    spec = chart.to_dict(validate=False)
    assert spec["facet"]["column"]["sort"] == ["Residual stream (stored basis)", "MLP input"]
    assert spec["title"]["text"].startswith(f"Top-{k} energy share")
    assert FIXED_SHARE_WORDS.split(":")[0].split()[-1] in " ".join(spec["title"]["subtitle"])
    assert "row" not in spec["facet"]


def test_a_varying_norm_gets_a_row_of_panels_each() -> None:
    chart = top_share_vs_params(_table(("layernorm", "rmsnorm_scalar")), facet="norm")
    spec = chart.to_dict(validate=False)
    assert "row" in spec["facet"]
    assert {r["facet"] for r in chart_rows(chart)} == {"norm: layernorm", "norm: rmsnorm_scalar"}
    assert len([r for r in chart_rows(chart) if r.get("null_label")]) == 4  # 2 sites x 2 norms


def test_it_renders_and_refuses_an_empty_frame() -> None:
    import vl_convert as vlc

    png = vlc.vegalite_to_png(top_share_vs_params(_table()).to_dict(), scale=1)
    assert png[:4] == b"\x89PNG" and len(png) > 10_000
    with pytest.raises(ValueError, match="no rows"):
        top_share_vs_params(_table().head(0))
