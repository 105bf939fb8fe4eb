"""Column roles are declared once, in resultstore/schema.py, and every list of run columns follows
them: the carried label columns, trial labels, line labels, chart variants and progress labels
(issue 35). A column declared at the schema, and nowhere else, is picked up by all of them."""

from __future__ import annotations

import polars as pl
import pytest

import resultstore.schema as schema
from analysis.charts.frames import decorate, variant_axes
from analysis.labels import label_axes, trial_labels
from analysis.load import label_columns
from analysis.selection import line_labels
from resultstore.schema import Role
from sweep.grid import expand
from analysis.labels import label_rows, labels_for
from sweep.spec import parse_spec


def test_the_lists_are_what_they_were_before_roles():
    assert label_columns() == (
        "optimizer", "optimizer_family", "lr", "momentum", "nesterov", "weight_decay", "eps", "beta1", "beta2",
        "rotate", "norm", "attention", "rotation", "group_size", "rotation_groups", "rotation_label",
        "parametrization", "mup_base_width", "precondition_frequency", "muon_ends")
    assert variant_axes() == ("norm", "attention", "rotation_label", "parametrization", "lr", "momentum", "nesterov", "weight_decay", "eps",
                              "beta1", "beta2", "rotate", "precondition_frequency", "muon_ends")
    assert label_axes() == ("d_model", "n_layers", "n_heads", "d_mlp", "optimizer", "lr", "momentum", "nesterov",
                            "weight_decay", "eps", "beta1", "beta2", "rotate", "precondition_frequency", "muon_ends",
                            "norm", "attention", "rotation_label", "parametrization", "corpus", "seq_len", "batch_size",
                            "seed")
    hypers = schema.runs_columns(Role.HYPER)
    assert [c for c in schema.ARROW["runs"].names if c in hypers] == list(schema.runs_columns()[13:23])


SOAP_LADDER = {
    "name": "roles", "data": {"corpus": "stdlib", "seq_len": 16},
    "train": {"steps": 2, "batch_size": 4, "eval_batch": {"sequences": 2}},
    "grid": {"model": [{"d_model": 16, "n_layers": 1, "n_heads": 2}],
             "optimizer": [{"name": "soap", "lr": 3e-3, "shampoo_beta": [0.9, 0.95]}, {"name": "adam", "lr": 3e-3}]},
}


def test_a_hyper_parameter_column_declared_at_the_schema_reaches_every_list(declared):
    trials = expand(parse_spec(SOAP_LADDER))
    assert "shampoo_beta" in label_rows(trials)[1]  # before: an option of soap's that no column holds
    declared("shampoo_beta", "float", Role.HYPER)

    rows, options = label_rows(trials)
    assert [r["shampoo_beta"] for r in rows] == [0.9, 0.95, None] and "shampoo_beta" not in options  # flat() fills it
    assert label_columns()[-1] == variant_axes()[-1] == "shampoo_beta" and "shampoo_beta" in label_axes()
    assert list(labels_for(trials).values()) == ["soap · shampoo_beta 0.9", "soap · shampoo_beta 0.95", "adam"]
    frame = pl.DataFrame(rows).with_columns(tuned_line_id=pl.Series([t.trial_id for t in trials]))
    assert line_labels(frame).sort("config").get_column("config").to_list() == [
        "adam · layernorm · none · lr=0.003", "soap · layernorm · none · shampoo_beta=0.9 · lr=0.003",
        "soap · layernorm · none · shampoo_beta=0.95 · lr=0.003"]
    chart = decorate(frame, facet=None)
    assert chart.get_column("variant").to_list() == ["0.9", "0.95", "–"]
    assert chart.get_column("variant_axes").unique().to_list() == ["shampoo_beta"]


def test_an_axis_column_declared_at_the_schema_names_itself_in_every_label(declared):
    declared("mlp_kind", "string", Role.AXIS)
    rows = [{"optimizer": "adam", "lr": 1e-3, "mlp_kind": kind, "norm": "layernorm", "seed": 0} for kind in ("gelu", "glu")]
    assert trial_labels(rows) == ["gelu", "glu"]  # an axis's value names itself
    frame = pl.DataFrame(rows).with_columns(tuned_line_id=pl.Series(["a", "b"]))
    assert "mlp_kind" in label_columns() and "mlp_kind" in variant_axes()
    assert line_labels(frame).sort("tuned_line_id").get_column("config").to_list() == [
        "adam · layernorm · mlp_kind=gelu · lr=0.001", "adam · layernorm · mlp_kind=glu · lr=0.001"]
    assert decorate(frame, facet=None).get_column("variant").to_list() == ["gelu", "glu"]


def test_a_column_is_declared_once(declared):
    declared("mlp_kind", "string", Role.AXIS)
    declared("mlp_kind", "string", Role.AXIS)  # again, the same: nothing happens
    assert schema.ARROW["runs"].names.count("mlp_kind") == 1 and schema.ARROW["runs"].names[-1] == "mlp_kind"
    with pytest.raises(ValueError, match="declared already"):
        declared("momentum", "string", Role.HYPER)
    with pytest.raises(ValueError, match="kind 'decimal'"):
        declared("x", "decimal", Role.HYPER)
