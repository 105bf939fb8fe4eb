"""analysis.selection's line labels: every config axis that differs between lines of one optimiser
is named (here the attention variant, issue 36)."""

from __future__ import annotations

import polars as pl

from analysis.selection import line_labels, untuned_choices


def test_line_labels_name_the_attention_where_it_varies_within_an_optimiser() -> None:
    frame = pl.DataFrame({
        "tuned_line_id": ["a", "b", "c"], "optimizer": ["adam", "adam", "sgd"], "norm": ["rmsnorm_scalar"] * 3,
        "rotation_label": ["none"] * 3, "attention": ["softmax", "gated", "softmax"], "lr": [3e-3, 3e-3, 0.1],
    })
    labels = dict(line_labels(frame).select("tuned_line_id", "config").iter_rows())
    assert labels == {"a": "adam · rmsnorm_scalar · none · attention=softmax · lr=0.003",
                      "b": "adam · rmsnorm_scalar · none · attention=gated · lr=0.003",
                      "c": "sgd · rmsnorm_scalar · none · attention=softmax · lr=0.1"}
    same = frame.with_columns(attention=pl.lit("softmax"))
    assert "attention" not in " ".join(line_labels(same).get_column("config"))


def _best(n_lrs: list[int], edge: list[str | None]) -> pl.DataFrame:
    n = len(n_lrs)
    return pl.DataFrame({"config_id": [f"c{i}" for i in range(n)], "d_model": [64 * (i + 1) for i in range(n)],
                         "n_lrs": n_lrs, "edge": pl.Series(edge, dtype=pl.String), "untuned": [k == 1 for k in n_lrs]})


def test_untuned_choices_name_edges_and_single_lrs_beside_ladders() -> None:
    """Issue 33: a fit labelled "lr tuned per size" read as tuned though one width's best sat at its
    ladder's edge and another width had one lr; each is named with its width."""
    marks = untuned_choices(_best([3, 3, 1, 4], [None, "low", None, "high"]))
    assert dict(marks.iter_rows()) == {"c1": "d_model 128: best at the smallest lr tried", "c2": "d_model 192: one lr",
                                       "c3": "d_model 256: best at the largest lr tried"}
    assert untuned_choices(_best([1, 1], [None, None])).height == 0  # no ladder anywhere: untuned throughout, said once
    frame = pl.DataFrame({"tuned_line_id": ["a", "a", "b", "b"], "optimizer": ["adam", "adam", "sgd", "sgd"],
                          "lr": [1e-2, 3e-3, 0.1, 0.1], "lr_choice": [None, "d_model 128: one lr", None, None]})
    labels = dict(line_labels(frame).select("tuned_line_id", "config").iter_rows())
    assert labels == {"a": "adam · lr tuned per size (not tuned at d_model 128: one lr)", "b": "sgd · lr=0.1"}
