"""sweep.estimate: the throughput table, interpolation, extrapolation flags; `sweep plan` prints
the figures quoted in the flagship specs' headers."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corpus_fixtures import stand_in_corpus
from study.config import TrialConfig
from study.device import peak_flops
from sweep import estimate as E
from sweep.cli import app

SPECS = Path(__file__).parent.parent / "specs"
TABLE = {"devices": {
    "cpu": {"threads": 1, "measured": [{"params": 1e5, "flops_per_s": 1e9}, {"params": 1e7, "flops_per_s": 4e9}]},
    "NVIDIA H200": {"measured": []},
}}


def test_table_interpolates_log_log_and_scales_cpu_threads():
    r = E.table_rate(TABLE, "cpu", 10**6)
    assert r.flops_per_s == pytest.approx(2e9) and not r.extrapolating  # halfway in log params, log rate
    assert E.table_rate(TABLE, "cpu", 10**6, threads=4).flops_per_s == pytest.approx(8e9)
    assert E.table_rate(TABLE, "cpu", 10**7).flops_per_s == pytest.approx(4e9)


def test_beyond_the_measured_sizes_is_flagged():
    r = E.table_rate(TABLE, "cpu", 10**9)
    assert r.extrapolating and r.flops_per_s == pytest.approx(4e9) and "extrapolating beyond" in r.basis


def test_unmeasured_gpu_extrapolates_from_its_peak_and_unknown_device_is_refused():
    r = E.table_rate(TABLE, "NVIDIA H200", 10**8)
    assert r.extrapolating and r.flops_per_s == pytest.approx(peak_flops("NVIDIA H200") * E.ASSUMED_MFU)
    with pytest.raises(ValueError, match="not in the throughput table"):
        E.table_rate(TABLE, "Abacus 3000", 10**8)


def test_estimate_prefers_measured_runs_and_counts_gpu_share():
    t = TrialConfig(model={"d_model": 32, "n_layers": 2, "n_heads": 2}, optimizer={"name": "adam", "lr": 1e-3},
                    train={"steps": 100})
    flops = t.flops_per_token * t.total_tokens
    share = lambda params: {"cpu": 1, "gpu": 0.25}  # noqa: E731
    est = E.estimate([t], share, {}, None, gpu=True, table=TABLE)
    assert est.extrapolating and est.pending_s == pytest.approx(flops / (peak_flops("NVIDIA H200") * E.ASSUMED_MFU))
    assert est.pending_device_hours == pytest.approx(est.pending_s * 0.25 / 3600)
    measured = E.estimate([t], share, {}, 1e12, gpu=True, table=TABLE)
    assert not measured.extrapolating and measured.trial_s[0] == pytest.approx(flops / 1e12)
    done = E.estimate([t], share, {t.trial_id: "done"}, 1e12, gpu=True, table=TABLE)
    assert done.pending_s == 0 and done.total_flops == pytest.approx(flops)


def test_shipped_table_parses():
    table = E.load_table()
    assert "NVIDIA H200" in table["devices"]
    for row in table["devices"].values():
        assert all(p["flops_per_s"] > 0 and p["params"] > 0 for p in row.get("measured", []))


@pytest.mark.parametrize("name", ["scaling.yaml", "scaling/scaling_lr.yaml"])
def test_plan_prints_the_figures_in_the_spec_header(tmp_path, monkeypatch, name):
    spec = SPECS / name
    stand_in_corpus(spec, tmp_path, monkeypatch)
    quoted = re.search(r"^#\s+(\d+/\d+ done · \S+ in all) · ([\d,]+ H200-hours)", spec.read_text(), re.M)
    assert quoted, f"{name}: the header quotes no `sweep plan` figures"
    result = CliRunner().invoke(app, ["plan", str(spec), "--results", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert quoted.group(1) in flat and quoted.group(2) in flat and "extrapolating" in flat
    n = int(quoted.group(1).split("/")[1].split()[0])
    header_count = re.search(r"= (\d+) trials", spec.read_text())
    assert header_count and int(header_count.group(1)) == n and f"{n} trials" in flat
    assert math.isfinite(n)


def test_measured_rate_is_the_median_over_done_runs_of_each_size():
    import polars as pl

    from sweep.estimate import measured_flops_per_s

    runs = pl.DataFrame({"status": ["done", "done", "failed", "done", "done"], "params": [10, 10, 10, 10, 99],
                         "flops_per_token": [1e6, 2e6, 1e9, 1e6, 1e6], "tokens_per_s": [1e3, 1e3, 1e3, 3e3, 7e3]})
    assert measured_flops_per_s(runs) == {10: 2e9, 99: 7e9}  # median of 1e9, 2e9, 3e9; the failed run ignored
    assert measured_flops_per_s(runs.filter(pl.col("status") == "failed")) == {}
    # a store with trials from a GPU and a CPU: a plan for one device reads only that device's runs
    mixed = runs.with_columns(device=pl.Series(["cpu (AMD EPYC, 1 threads)", "NVIDIA H200", None, "NVIDIA H200",
                                                "cpu (AMD EPYC, 1 threads)"]))
    assert measured_flops_per_s(mixed, gpu=False) == {10: 1e9, 99: 7e9}
    assert measured_flops_per_s(mixed, gpu=True) == {10: 2.5e9}  # median of 2e9 and 3e9
    assert measured_flops_per_s(mixed) == {10: 2e9, 99: 7e9}  # no device asked: every row


def test_a_size_no_run_finished_gets_the_table_s_shape_at_the_measured_level():
    """Small models run further from the peak: one measured rate for every size misjudges the sizes
    not run yet. This sweep ran at half the table's rate at 1e7 parameters, so a 1e6-parameter trial
    is planned at half the table's rate there (2e9 -> 1e9), not at the 1e7 runs' 2e9."""
    small, large = (TrialConfig(model={"d_model": d, "n_layers": 2, "n_heads": 2}, optimizer={"name": "adam",
                    "lr": 1e-3}, train={"steps": 100}) for d in (32, 64))
    share = lambda params: {"cpu": 1, "gpu": 0}  # noqa: E731
    table = {"devices": {"cpu": {"threads": 1, "measured": [{"params": small.params, "flops_per_s": 2e9},
                                                            {"params": large.params, "flops_per_s": 4e9}]}}}
    est = E.estimate([small, large], share, {}, {large.params: 2e9}, gpu=False, table=table)
    assert est.trial_s[1] == pytest.approx(large.flops_per_token * large.total_tokens / 2e9)
    assert est.trial_s[0] == pytest.approx(small.flops_per_token * small.total_tokens / 1e9)
    assert "scaled x0.50 to this sweep's finished runs" in est.basis and not est.extrapolating


def test_planned_seconds_are_the_plans_table_time_per_trial():
    """The progress line's time left starts from these (sweep.progress.Eta): FLOPs over the table's
    rate at the trial's size and threads, keyed by trial id."""
    from sweep.grid import expand
    from sweep.spec import load_spec

    spec = load_spec(SPECS / "first.yaml")
    trials = expand(spec)
    planned = E.planned_seconds(spec, trials, table=TABLE)
    assert list(planned) == [t.trial_id for t in trials] and not E.uses_gpu(spec)
    for t in trials:
        assert planned[t.trial_id] == pytest.approx(t.flops_per_token * t.total_tokens /
                                                    E.table_rate(TABLE, "cpu", t.params, threads=1).flops_per_s)
