"""Damage detected and named (resultstore/writer.py: damaged, quarantine, status --verify), and a status
that tells the truth. One real trial is trained once (in-process, no Ray) and copied per test."""

import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import invoke

import analysis
from analysis.load import DamagedFile
from resultstore.writer import ResultsStore

SMOKE = Path(__file__).parent.parent / "specs" / "smoke.yaml"

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    result = invoke("train", SMOKE, "--trial", "1", "--results", root)
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def sweep(trained, tmp_path):
    shutil.copytree(trained / "smoke", tmp_path / "smoke")
    return tmp_path / "smoke"


def cut_in_half(sweep: Path, table: str = "metrics") -> Path:
    part = sorted((sweep / table).glob("*.parquet"))[0]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    return part


def test_an_intact_sweep_verifies_and_status_exits_0(sweep):
    result = invoke("status", sweep, "--verify")
    assert result.exit_code == 0, result.output
    assert "verified: every file readable" in result.output
    assert invoke("verify", sweep).exit_code == 0


@pytest.mark.parametrize("table", ["metrics", "runs"])
def test_a_damaged_part_is_named_by_status_query_report_and_load(sweep, table):
    part = cut_in_half(sweep, table)
    for args in (["status", sweep], ["query", sweep, "SELECT count(*) FROM metrics"], ["report", sweep]):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert part.name in result.output and "damaged Parquet file" in result.output, (args, result.output)
        assert "Traceback" not in result.output
    with pytest.raises(DamagedFile, match=part.name):
        analysis.load(sweep)


def test_quarantine_moves_the_damaged_part_and_makes_its_trial_incomplete(sweep):
    store = ResultsStore(sweep.parent, "smoke")
    (trial,) = store.completed_ids()
    part = cut_in_half(sweep)
    damaged_bytes = part.read_bytes()
    moved = store.quarantine()
    assert len(moved) == 1 and part.name in moved[0] and trial in moved[0]
    assert (sweep / "quarantine" / "metrics" / part.name).read_bytes() == damaged_bytes  # never deleted
    assert (sweep / "quarantine" / "runs" / f"{trial}.parquet").exists()
    assert not (sweep / "trials" / trial / "checkpoint.pt").exists()  # the re-run starts from step 0
    assert store.completed_ids() == set() and store.damaged() == []
    status = invoke("status", sweep)
    assert status.exit_code == 1, status.output  # started (its folder), no result until re-run
    assert "started, no result" in status.output and trial in status.output


def test_verify_finds_a_missing_part_that_reads_fine(sweep):
    parts = sorted((sweep / "metrics").glob("*.parquet"))
    parts[len(parts) // 2].unlink()
    curves = sorted((sweep / "curves").glob("*.parquet"))
    curves[-1].unlink()
    assert invoke("status", sweep).exit_code == 0  # every file reads: only --verify sees the gap
    result = invoke("status", sweep, "--verify")
    assert result.exit_code == 1, result.output
    assert "incomplete rows" in result.output and "curves miss" in result.output and "no metrics rows at eval steps" in result.output


def test_status_exits_1_for_a_trial_started_without_a_result(sweep):
    (sweep / "trials" / "abandoned1234").mkdir()
    result = invoke("status", sweep)
    assert result.exit_code == 1, result.output
    assert "abandoned1234" in result.output and "started, no result" in result.output


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_a_results_path_that_is_a_file_or_not_writable_is_refused_before_ray(tmp_path, kind):
    target = tmp_path / "results"
    if kind == "file":
        target.write_text("not a folder")
    else:
        target.mkdir()
        target.chmod(0o500)
        if os.access(target, os.W_OK):  # root: the run would go ahead and start Ray
            target.chmod(0o700)
            pytest.skip("running as a user who may write anywhere")
    try:
        result = invoke("run", SMOKE, "--results", target)
    finally:
        if kind != "file":
            target.chmod(0o700)
    if kind == "read-only" and result.exit_code == 0:
        pytest.skip("running as a user who may write anywhere")
    assert result.exit_code == 2, result.output
    assert ("is a file" if kind == "file" else "is not writable") in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 2


@pytest.mark.slow
def test_run_quarantines_a_damaged_part_and_reruns_its_trial_to_the_same_rows(sweep, monkeypatch):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a private local Ray, never another cluster
    store = ResultsStore(sweep.parent, "smoke")
    (trial,) = store.completed_ids()
    before = store.read("metrics").filter(pl.col("trial_id") == trial).sort("step", "layer", "site", "basis", "metric")
    part = cut_in_half(sweep)
    try:
        result = invoke("run", SMOKE, "--results", sweep.parent)
    finally:
        ray.shutdown()
    assert result.exit_code == 0, result.output
    assert (sweep / "quarantine" / "metrics" / part.name).exists()
    after = store.read("metrics").filter(pl.col("trial_id") == trial).sort("step", "layer", "site", "basis", "metric")
    assert after.height == before.height
    assert after.drop("value").equals(before.drop("value"))
    assert invoke("status", sweep, "--verify").exit_code == 0


@pytest.mark.slow
def test_a_trial_failing_before_training_gets_its_failed_row_from_the_driver(tmp_path, monkeypatch):
    """The worker fails before train_trial's own error handling (its trial folder's path is taken
    by a file): the driver writes the failed row from Tune's error, says where, and status lists it."""
    import ray

    from sweep.cli import load

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _, trials = load(SMOKE)
    victim = trials[0].trial_id
    (tmp_path / "smoke" / "trials").mkdir(parents=True)
    (tmp_path / "smoke" / "trials" / victim).write_text("in the way")
    try:
        result = invoke("run", SMOKE, "--results", tmp_path)
    finally:
        ray.shutdown()
    assert result.exit_code == 1, result.output
    store = ResultsStore(tmp_path, "smoke")
    assert store.statuses()[victim] == "failed"
    assert "the driver wrote its failed row" in result.output
    status = invoke("status", tmp_path / "smoke")
    assert status.exit_code == 1 and victim in status.output and "FileExistsError" in status.output


def delete_a_metrics_part(sweep: Path) -> Path:
    parts = sorted((sweep / "metrics").glob("*.parquet"))
    parts[-1].unlink()  # the last eval's rows: every other file reads fine
    return parts[-1]


def test_a_trial_whose_rows_miss_an_eval_is_not_complete_and_goes_to_quarantine(sweep):
    store = ResultsStore(sweep.parent, "smoke")
    (trial,) = store.completed_ids()
    delete_a_metrics_part(sweep)
    assert store.gaps_by_trial(store.read("runs")) == {trial: ["no metrics rows at eval steps [30]"]}
    left = {p.relative_to(sweep) for p in sweep.glob("*/*.parquet")}
    moved = store.quarantine_incomplete()
    assert len(moved) == 1 and trial in moved[0] and "no metrics rows at eval steps [30]" in moved[0]
    assert store.completed_ids() == set()
    assert not list(sweep.glob("*/*.parquet"))  # nothing of it left among the tables
    assert {p.relative_to(sweep / "quarantine") for p in (sweep / "quarantine").glob("*/*.parquet")} == left  # never deleted
    assert not (sweep / "trials" / trial / "checkpoint.pt").exists()  # the re-run starts from step 0
    assert store.quarantine_incomplete() == []


def test_report_refuses_a_sweep_with_an_incomplete_trial_and_names_it(sweep, tmp_path):
    (trial,) = ResultsStore(sweep.parent, "smoke").completed_ids()
    delete_a_metrics_part(sweep)
    result = invoke("report", sweep, "--out", tmp_path / "report")
    assert result.exit_code == 2, result.output
    assert trial in result.output and "incomplete" in result.output and "sweep run" in result.output
    assert not (tmp_path / "report").exists()


@pytest.mark.slow
def test_run_reruns_a_trial_whose_rows_miss_an_eval_to_the_same_rows(sweep, monkeypatch):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    store = ResultsStore(sweep.parent, "smoke")
    (trial,) = store.completed_ids()
    keys = ["step", "layer", "site", "basis", "metric"]
    before = store.read("metrics").filter(pl.col("trial_id") == trial).sort(keys)
    delete_a_metrics_part(sweep)
    try:
        result = invoke("run", SMOKE, "--results", sweep.parent)
    finally:
        ray.shutdown()
    assert result.exit_code == 0, result.output
    assert f"trial {trial} is incomplete" in result.output and "0 already complete, 2 to run" in result.output
    after = store.read("metrics").filter(pl.col("trial_id") == trial).sort(keys)
    assert after.drop("value").equals(before.drop("value"))
    assert invoke("status", sweep, "--verify").exit_code == 0


@pytest.mark.parametrize("damage", ["cut-metrics", "cut-runs", "cut-curves", "deleted-metrics"])
def test_every_verb_that_reads_the_store_names_damage(sweep, damage):
    """One health check (sweep.store_health) for every verb that reads the store: plan counts
    the trial as not done and refuses a damaged file (exit 2, issue 34) but only warns of an
    incomplete trial, which `sweep run` re-runs like a pending one; status, verify, report and
    probe sae refuse either; query refuses a damaged file."""
    (trial,) = ResultsStore(sweep.parent, "smoke").completed_ids()
    if damage.startswith("cut"):
        named = cut_in_half(sweep, damage.split("-")[1]).name
    else:
        delete_a_metrics_part(sweep)
        named = f"trial {trial}: incomplete"
    plan = invoke("plan", SMOKE, "--results", sweep.parent)
    assert plan.exit_code == (2 if damage.startswith("cut") else 0), plan.output
    assert named in plan.output and "0/2 done" in plan.output, plan.output
    assert ("damaged" if damage.startswith("cut") else "incomplete") in plan.output.split(trial, 1)[1].split("\n")[0]
    verbs = [["verify", sweep], ["report", sweep], ["status", sweep, "--verify"], ["probe", "sae", sweep]]
    if damage.startswith("cut"):  # a readable but incomplete store is a fair thing to query
        verbs += [["status", sweep], ["query", sweep, "SELECT count(*) FROM runs"]]
    for args in verbs:
        result = invoke(*args)
        assert result.exit_code in (1, 2), (args, result.output)
        assert (named if damage.startswith("cut") else trial) in result.output, (args, result.output)


def test_verify_names_a_damaged_file_once_and_whole(sweep):
    part = cut_in_half(sweep)
    result = invoke("status", sweep, "--verify")
    assert result.exit_code == 2, result.output
    assert result.output.count(part.name) == 1, result.output
    assert "incomplete rows" not in result.output


def test_a_checkpoint_between_evals_is_no_gap(tmp_path):
    """A checkpoint step evaluates too (its rows must exist before it is saved): with eval_every
    10 and checkpoint_every 15 the rows sit at 0, 10, 15, 20, 30. The scheduled evals come from
    the trial's own eval_every, not from the smallest gap (which read 5 and flagged 5 and 25)."""
    spec = tmp_path / "offbeat.yaml"
    spec.write_text(SMOKE.read_text().replace("name: smoke", "name: offbeat").replace("checkpoint_every: 10", "checkpoint_every: 15"))
    result = invoke("train", spec, "--trial", "0", "--results", tmp_path / "results")
    assert result.exit_code == 0, result.output
    store = ResultsStore(tmp_path / "results", "offbeat")
    steps = sorted(store.read("metrics", ["step"])["step"].unique().to_list())
    assert steps == [0, 10, 15, 20, 30]
    assert store.gaps_by_trial(store.read("runs")) == {}
    status = invoke("status", tmp_path / "results" / "offbeat", "--verify")
    assert status.exit_code == 0, status.output
    last = sorted((tmp_path / "results" / "offbeat" / "metrics").glob("*.parquet"))[-1]
    last.unlink()  # the part after the checkpoint: the evals at 20 and 30
    (trial,) = store.completed_ids()
    assert store.gaps_by_trial(store.read("runs")) == {trial: ["no metrics rows at eval steps [20, 30]"]}


# ---- issue 50: keys repeated, a damaged data page, a checkpoint that cannot be loaded ----------


def corrupt_a_page(part: Path) -> Path:
    """Zero the middle of the last column's data (a data page), the footer left intact."""
    import pyarrow.parquet as pq

    col = pq.read_metadata(part).row_group(0).column(pq.read_metadata(part).num_columns - 1)
    data = bytearray(part.read_bytes())
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    mid = start + col.total_compressed_size // 2
    data[mid - 16 : mid + 16] = bytes(32)
    part.write_bytes(bytes(data))
    pq.read_metadata(part)  # the footer still reads: only the page is damaged
    return part


@pytest.mark.parametrize("table", ["metrics", "runs", "curves", "checks", "dims"])
def test_a_copied_part_is_named_by_verify_and_refused_by_query_and_report(sweep, table):
    original = sorted((sweep / table).glob("*.parquet"))[-1]
    copy = original.with_name("zz-copy.parquet")
    shutil.copy(original, copy)
    result = invoke("verify", sweep)
    assert result.exit_code == 2, result.output
    assert f"rows of {table} repeat their key" in result.output and copy.name in result.output
    assert original.name in result.output and "Traceback" not in result.output
    for args in (["query", sweep, "SELECT count(*) FROM metrics"], ["report", sweep]):
        refused = invoke(*args)
        assert refused.exit_code == 2 and copy.name in refused.output and "sweep verify" in refused.output, refused.output


def test_writing_sets_aside_only_the_copy_and_the_trial_stays_done(sweep):
    from sweep.store_health import load_error

    store = ResultsStore(sweep.parent, "smoke")
    (trial,) = store.completed_ids()
    before = store.read("metrics").sort("step", "layer", "site", "basis", "metric")
    shutil.copy(sorted((sweep / "metrics").glob("*.parquet"))[0], sweep / "metrics" / "again.parquet")
    with store.writing("test", load_check=load_error) as notes:
        assert len(notes) == 1 and "again.parquet" in notes[0], notes
    assert store.completed_ids() == {trial}  # nothing left short: nothing re-trained
    assert (sweep / "quarantine" / "metrics" / "again.parquet").exists()
    assert store.read("metrics").sort("step", "layer", "site", "basis", "metric").equals(before)
    assert invoke("verify", sweep).exit_code == 0


def test_overlapping_parts_of_the_writer_set_their_trial_aside(sweep):
    """Two parts both named as the writer names them, whose step ranges overlap (a crash between
    a part and its discard): neither is the copy, so both go and the trial runs again."""
    import pyarrow.parquet as pq

    from resultstore import repair

    store = ResultsStore(sweep.parent, "smoke")
    (trial,) = store.completed_ids()
    rows = store.read("curves").filter(pl.col("step").is_between(5, 15))
    pq.write_table(rows.to_arrow(), sweep / "curves" / f"{trial}.000000005-000000015.parquet")
    assert [d.files for d in repair.duplicates(store)] == [
        (f"{trial}.000000000-000000010.parquet", f"{trial}.000000005-000000015.parquet"),
        (f"{trial}.000000005-000000015.parquet", f"{trial}.000000011-000000020.parquet")]
    moved = repair.quarantine_duplicates(store)
    assert len(moved) == 3, moved
    repair.quarantine_incomplete(store)
    assert store.completed_ids() == set() and not list((sweep / "curves").glob("*.parquet"))


@pytest.mark.parametrize("table", ["metrics", "curves"])
def test_a_damaged_data_page_is_named_by_verify_and_query_and_set_aside_by_run(sweep, table):
    from sweep.store_health import load_error

    part = corrupt_a_page(sorted((sweep / table).glob("*.parquet"))[0])
    for args in (["verify", sweep], ["query", sweep, "SELECT count(*) FROM curves"]):
        result = invoke(*args)
        assert result.exit_code == 2 and part.name in result.output and "data page" in result.output, result.output
        assert "Traceback" not in result.output
    store = ResultsStore(sweep.parent, "smoke")
    with store.writing("test", load_check=load_error) as notes:
        assert any(part.name in n for n in notes), notes
    assert (sweep / "quarantine" / table / part.name).exists() and store.completed_ids() == set()
    assert invoke("verify", sweep).exit_code == 1  # started, no result: `sweep run` re-trains it


@pytest.mark.parametrize("name", ["final.pt", "checkpoint.pt"])
def test_a_checkpoint_that_cannot_be_loaded_is_named_by_verify(sweep, name):
    from sweep.store_health import load_error

    store = ResultsStore(sweep.parent, "smoke")
    (trial,) = store.completed_ids()
    (sweep / "trials" / trial / name).write_bytes(os.urandom(100))
    result = invoke("verify", sweep)
    assert result.exit_code == 2 and f"trials/{trial}/{name}: cannot be loaded" in result.output, result.output
    assert invoke("status", sweep).exit_code == 0  # footers only: status stays quick
    with store.writing("test", load_check=load_error):
        pass
    assert (sweep / "quarantine" / "trials" / trial / name).exists()
    assert store.completed_ids() == (set() if name == "final.pt" else {trial})  # a bad final.pt: trained again


def test_a_part_of_the_wrong_schema_is_named_by_verify_and_query_and_set_aside_by_run(sweep):
    """Issue 50 (seen once): a checks part holding another schema (its key columns missing, a column
    the contract lacks) was read as rows: verify said "verified" and query counted it. Now every
    verb names it and `sweep run` moves it to quarantine/ and re-runs its trial."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sweep.store_health import load_error

    store = ResultsStore(sweep.parent, "smoke")
    (trial,) = store.completed_ids()
    part = sorted((sweep / "checks").glob("*.parquet"))[0]
    pq.write_table(pa.table({"trial_id": [trial], "foo": [1.0]}), part)
    for args in (["verify", sweep], ["query", sweep, "SELECT count(*) FROM checks"]):
        result = invoke(*args)
        assert result.exit_code == 2 and part.name in result.output and "schema" in result.output, result.output
        assert "Traceback" not in result.output
    with store.writing("test", load_check=load_error) as notes:
        assert any(part.name in n for n in notes), notes
    assert (sweep / "quarantine" / "checks" / part.name).exists() and store.completed_ids() == set()
