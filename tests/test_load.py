"""analysis.load: finding the sweep, lazy tables with the contract's schema, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from analysis_fixtures import store  # noqa: F401  (fixture)

import analysis
from analysis.load import (
    CHECKS_SCHEMA,
    CURVES_SCHEMA,
    METRICS_SCHEMA,
    RUNS_SCHEMA,
    NoSweepError,
    Results,
    config_label,
    load,
)
from synthetic_store import Synthetic

REPO = Path(__file__).resolve().parents[1]


def test_import_pulls_in_neither_torch_nor_ray() -> None:
    code = (
        "import sys, analysis, analysis.load, analysis.queries, analysis.fits, "
        "analysis.charts, analysis.report, analysis.identity\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("module", ["analysis.report.content", "analysis.report.dims", "analysis.report.sae",
                                    "analysis.report.fits", "analysis.report.render", "analysis.report"])
def test_every_report_module_imports_on_its_own(module: str) -> None:
    # the package's lazy __getattr__ once resolved `from analysis import counts` through the
    # report, which imported the report's content module half-way through its own import
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_import_is_light() -> None:
    """`import analysis` loads no data and neither altair nor the report machinery."""
    code = (
        "import sys, analysis\n"
        "heavy = [m for m in ('altair', 'vl_convert', 'analysis.charts', 'analysis.report') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert callable(analysis.load) and callable(analysis.write_report)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_load_sweep_folder(store) -> None:  # noqa: F811
    r = load(store.path)
    assert isinstance(r, Results)
    assert r.name == "toy"
    for table in ("runs", "metrics", "curves", "checks"):
        assert isinstance(getattr(r, table), pl.LazyFrame)
        # the store's layout: one file per trial (runs, checks) or per flushed step range
        assert len(r.files[table]) == store.n_trials, table
        assert all(Path(f).name.startswith("t0") for f in r.files[table])
    runs = r.runs.collect()
    assert runs.height == store.n_trials
    assert dict(runs.schema) == RUNS_SCHEMA
    assert r.metrics.collect().height == store.n_metric_rows
    assert r.done_runs().collect().height == store.n_done
    assert "toy" in repr(r)


def test_load_results_root_with_one_sweep(store) -> None:  # noqa: F811
    r = load(Path(store.path).parent)
    assert r.path == store.path


def test_load_accepts_pathlike_and_file_uri(store) -> None:  # noqa: F811
    assert load(Path(store.path)).path == store.path
    assert load("file://" + store.path).path == store.path


def test_load_several_sweeps_lists_them(tmp_path: Path) -> None:
    Synthetic("alpha").trials(sizes=(16,), seeds=(0,)).rows(steps=(0,)).write(tmp_path)
    Synthetic("beta").trials(sizes=(16,), seeds=(0,)).rows(steps=(0,)).write(tmp_path)
    with pytest.raises(NoSweepError, match=r"2 sweeps \(alpha, beta\)"):
        load(tmp_path)
    assert load(tmp_path / "beta").name == "beta"


def test_load_empty_dir_is_a_clear_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no sweep found") as info:
        load(tmp_path)
    assert isinstance(info.value, NoSweepError)
    assert str(tmp_path) in str(info.value)
    assert "runs/" in str(info.value)  # says what was expected


def test_load_missing_path(tmp_path: Path) -> None:
    with pytest.raises(NoSweepError, match="no such folder"):
        load(tmp_path / "nope")


def test_load_file_is_not_a_sweep(tmp_path: Path) -> None:
    f = tmp_path / "x.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(f)
    with pytest.raises(NoSweepError, match="not a folder"):
        load(f)


def test_missing_tables_are_empty_frames_with_schema(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "ray").mkdir()  # non-table folder: ignored
    r = load(sweep)
    assert r.runs.collect().height == 0
    for table, schema in (
        ("runs", RUNS_SCHEMA),
        ("metrics", METRICS_SCHEMA),
        ("curves", CURVES_SCHEMA),
        ("checks", CHECKS_SCHEMA),
    ):
        frame = getattr(r, table).collect()
        assert frame.height == 0
        assert dict(frame.schema) == schema


def test_files_with_drifting_types_and_extra_columns_stack(tmp_path: Path) -> None:
    runs = tmp_path / "s" / "runs"
    runs.mkdir(parents=True)
    # first file: narrow ints, an all-null group_size (dtype Null), an extra grid axis
    pl.DataFrame(
        {
            "trial_id": ["a"],
            "status": ["done"],
            "d_model": pl.Series([32], dtype=pl.Int32),
            "group_size": [None],
            "lr": pl.Series([0.1], dtype=pl.Float32),
            "momentum": [0.9],
        }
    ).write_parquet(runs / "part-0.parquet")
    pl.DataFrame(
        {"trial_id": ["b"], "status": ["failed"], "d_model": [64], "group_size": [2], "error": ["boom"]}
    ).write_parquet(runs / "part-1.parquet")
    # in-flight atomic writes are hidden files: never read (this one is not even Parquet)
    (runs / ".part-2.parquet.tmp").write_bytes(b"garbage")
    (runs / ".part-3.parquet").write_bytes(b"garbage")
    frame = load(tmp_path / "s").runs.collect().sort("trial_id")
    assert frame.schema["d_model"] == pl.Int64
    assert frame.schema["group_size"] == pl.Int64
    assert frame.schema["lr"] == pl.Float64
    assert frame.get_column("d_model").to_list() == [32, 64]
    assert frame.get_column("group_size").to_list() == [None, 2]
    assert frame.get_column("momentum").to_list() == [0.9, None]  # extra column kept
    assert frame.get_column("error").to_list() == [None, "boom"]
    assert frame.get_column("optimizer").null_count() == 2  # contract column inserted


def test_nested_part_files_are_found(tmp_path: Path) -> None:
    metrics = tmp_path / "s" / "metrics" / "trial=abc"
    metrics.mkdir(parents=True)
    pl.DataFrame(
        {"trial_id": ["abc"], "step": [1], "tokens": [10], "layer": [1], "site": ["resid"],
         "basis": ["stored"], "metric": ["kurtosis"], "value": [3.5]}  # fmt: skip
    ).write_parquet(metrics / "part.parquet")
    assert load(tmp_path / "s").metrics.collect().get_column("value").to_list() == [3.5]


def test_config_label_reads_the_stored_rotation_label() -> None:
    df = pl.DataFrame(
        {
            "optimizer": ["adam", "sgd", None, "sgd"],
            "norm": ["layernorm", "rmsnorm_scalar", "rmsnorm", "layernorm"],
            "rotation": ["shared", "partial", "none", "groups"],
            "group_size": [None, 2, None, None],
            # stored by the writer; null for rows written before the column existed
            "rotation_label": ["shared", None, "none", "groups[[0,1],[2]]"],
        }
    )
    labels = df.select(config_label()).get_column("config").to_list()
    assert labels == [
        "adam · layernorm · shared",
        "sgd · rmsnorm_scalar · partial(2)",  # derived for an old row
        "? · rmsnorm · none",
        "sgd · layernorm · groups[[0,1],[2]]",  # explicit groups: only the stored label knows
    ]
    only = df.select(config_label(["optimizer", "rotation"], sep=" / ")).to_series().to_list()
    assert only[1] == "sgd / partial(2)"


def test_package_exports() -> None:
    assert analysis.load is load
    assert callable(analysis.layer_profile) and callable(analysis.fit_power_law)
    assert callable(analysis.best_lr) and callable(analysis.with_ids)
    with pytest.raises(AttributeError):
        analysis.nope  # noqa: B018


def test_light_modules_load_eagerly_and_the_heavy_ones_on_first_use() -> None:
    code = (
        "import sys, analysis\n"
        "from analysis import fits, identity, load, queries, selection\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('altair', 'vl_convert'))\n"
        "assert not heavy, heavy\n"
        "assert 'analysis.queries' in sys.modules and 'analysis.fits' in sys.modules\n"
        "for m in (analysis.queries, analysis.selection, analysis.fits, analysis.identity):\n"
        "    assert set(m.__all__) <= set(analysis.__all__), m\n"
        "assert analysis.write_report.__module__ == 'analysis.report' and 'altair' in sys.modules\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_the_benchmarks_direct_writer_writes_what_the_store_writes(tmp_path: Path) -> None:
    """tests/synthetic_store.py's ``through_store=False`` (the 10M-row benchmark's fast path)
    writes the same files, schema and rows as ``ResultsStore``."""
    import pyarrow.parquet as pq

    built = Synthetic("s", seed=4).trials(sizes=(16, 32), seeds=(0, 1), failed=1).rows(steps=(0, 10, 20))
    a = built.write(tmp_path / "a", parts=2)
    b = built.write(tmp_path / "b", parts=2, through_store=False)
    files = sorted(p.relative_to(a.path).as_posix() for p in Path(a.path).rglob("*.parquet"))
    assert files == sorted(p.relative_to(b.path).as_posix() for p in Path(b.path).rglob("*.parquet"))
    assert len([f for f in files if f.startswith("metrics/t00001.")]) == 2  # two flushes per trial
    for f in files:
        ta, tb = pq.read_table(Path(a.path) / f), pq.read_table(Path(b.path) / f)
        assert ta.schema.equals(tb.schema, check_metadata=False), f
        assert ta.equals(tb), f
