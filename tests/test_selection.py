"""analysis.selection's line labels: every config axis that differs between lines of one optimiser
is named (here the attention variant, issue 36)."""

from __future__ import annotations

import polars as pl

from analysis.selection import line_labels


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
