"""Faults, then a re-run: the store after the re-run equals an uninterrupted run's, row for row
(issue 18). One uninterrupted smoke-sized run is the reference; each fault is applied to a copy
of it (or to a fresh run) and `sweep run` / `sweep train` repairs it. Real Ray, real Parquet."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from conftest import invoke
from resultstore.writer import ResultsStore

SMOKE = Path(__file__).parent.parent / "specs" / "smoke.yaml"
KEYS = {"runs": ["trial_id", "status", "steps"], "metrics": ["trial_id", "step", "layer", "site", "basis", "metric"],
        "curves": ["trial_id", "step"], "checks": ["trial_id", "check", "dtype"]}
pytestmark = pytest.mark.slow


def rows(sweep: Path) -> dict[str, pl.DataFrame]:
    """Each table's identifying columns, sorted: what 'row for row' compares (values are floats
    of a re-run that may resume from a checkpoint)."""
    store = ResultsStore(sweep.parent, sweep.name)
    return {t: store.read(t).select(k).sort(k) for t, k in KEYS.items()}


def assert_same_rows(sweep: Path, reference: Path) -> None:
    got, want = rows(sweep), rows(reference)
    for table in KEYS:
        assert got[table].equals(want[table]), (table, got[table].height, want[table].height)
    assert invoke("status", sweep, "--verify").exit_code == 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run of the smoke spec, on a private local Ray kept for the module."""
    import ray

    os.environ.pop("RAY_ADDRESS", None)
    root = tmp_path_factory.mktemp("reference")
    result = invoke("run", SMOKE, "--results", root)
    assert result.exit_code == 0, result.output
    yield root / "smoke"
    ray.shutdown()


@pytest.fixture
def copy(reference, tmp_path):
    shutil.copytree(reference, tmp_path / "smoke", ignore=shutil.ignore_patterns("ray"))
    return tmp_path / "smoke"


def test_damaged_deleted_and_missing_files_are_repaired_by_one_rerun(reference, copy):
    first, second = sorted(ResultsStore(copy.parent, "smoke").completed_ids())
    metrics = sorted((copy / "metrics").glob(f"{first}.*.parquet"))
    data = metrics[0].read_bytes()
    metrics[0].write_bytes(data[: len(data) // 2])  # a truncated part
    sorted((copy / "curves").glob(f"{second}.*.parquet"))[-1].unlink()  # a deleted part
    result = invoke("run", SMOKE, "--results", copy.parent)
    assert result.exit_code == 0, result.output
    assert "0 already complete, 2 to run" in result.output, result.output
    assert_same_rows(copy, reference)
    assert (copy / "quarantine" / "metrics" / metrics[0].name).read_bytes() == data[: len(data) // 2]


def test_a_deleted_runs_row_reruns_its_trial_without_doubling(reference, copy):
    first = sorted(ResultsStore(copy.parent, "smoke").completed_ids())[0]
    (copy / "runs" / f"{first}.parquet").unlink()
    result = invoke("run", SMOKE, "--results", copy.parent)
    assert result.exit_code == 0 and "1 already complete, 1 to run" in result.output, result.output
    assert_same_rows(copy, reference)


def test_a_second_writer_is_refused_then_a_sigkilled_driver_is_taken_over_and_equals_an_uninterrupted_run(
        reference, tmp_path):
    """Two faults on one run (one Ray start-up, not two): a second `sweep run` while the first holds
    the sweep is refused and writes nothing; the first, SIGKILLed mid-trial, leaves its lock,
    which a re-run takes over as stale (the refused writer did not remove it) and then completes
    the store row for row as an uninterrupted run writes it."""
    spec = tmp_path / "smoke.yaml"
    spec.write_text(SMOKE.read_text())
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(Path(__file__).parent.parent)
    log = tmp_path / "driver.log"  # what the driver said, should it end before the kill
    with log.open("w") as said:
        driver = subprocess.Popen([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(tmp_path)],
                                  stdout=said, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and driver.poll() is None and not (tmp_path / "smoke" / "run.lock").exists():
            time.sleep(0.1)
        second = invoke("run", spec, "--results", tmp_path)
        assert second.exit_code == 2 and "another `sweep run` holds this sweep" in second.output, second.output
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None and not list((tmp_path / "smoke").glob("metrics/*.parquet")):
            time.sleep(0.2)  # kill it mid-trial: once the first part is written
        assert driver.poll() is None, f"the run ended before it could be killed:\n{log.read_text()[-3000:]}"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        if driver.poll() is None:
            driver.kill()
    time.sleep(2)  # its Ray goes with it (test_launch checks that by pid)
    result = invoke("run", spec, "--results", tmp_path)
    assert result.exit_code == 0, result.output
    assert "took over a stale lock" in result.output, result.output
    assert_same_rows(tmp_path / "smoke", reference)


def test_a_full_disk_fails_the_trial_cleanly_and_a_rerun_repairs_it(reference, tmp_path, monkeypatch):
    """`sweep train` in-process, its store's writes failing with ENOSPC after the first few (as a
    full disk does): exit 1 or 2 with one line, no traceback; then, with space again, a re-run
    writes exactly the reference's rows for that trial."""
    trial = sorted(ResultsStore(reference.parent, "smoke").completed_ids())[0]
    original, writes = ResultsStore._write_atomic, []

    def full_disk(self, rel, table):
        writes.append(rel)
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), rel)
        return original(self, rel, table)

    monkeypatch.setattr(ResultsStore, "_write_atomic", full_disk)
    result = invoke("train", SMOKE, "--trial", trial, "--results", tmp_path)
    assert result.exit_code in (1, 2), result.output
    assert "No space left on device" in result.output and "Traceback" not in result.output, result.output
    monkeypatch.setattr(ResultsStore, "_write_atomic", original)
    result = invoke("train", SMOKE, "--trial", trial, "--results", tmp_path)
    assert result.exit_code == 0, result.output
    got, want = rows(tmp_path / "smoke"), rows(reference)
    for table in KEYS:
        assert got[table].equals(want[table].filter(pl.col("trial_id") == trial)), table


TEXT_SPEC = """\
name: {name}
data: {{text: {corpus}, seq_len: 32}}
train: {{steps: 30, batch_size: 8, eval_every: 10, eval_batch: {{sequences: 4}}, checkpoint_every: 10}}
grid:
  model: [{{d_model: 32, n_layers: 2, n_heads: 2}}]
  optimizer: [{{name: sgd, lr: {lr}}}]
  norm: [layernorm]
  rotation: [none]
  seed: [0]
resources: {{cpu: 1}}
"""


def text_spec(tmp_path: Path, name: str, lr: float) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join((Path(__file__).parent.parent / p).read_text() for p in ("sweep/cli.py", "resultstore/writer.py")))
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(TEXT_SPEC.format(name=name, corpus=corpus, lr=lr))
    return spec


def _files(sweep: Path) -> dict[str, int]:
    return {p.relative_to(sweep).as_posix(): p.stat().st_mtime_ns for p in sweep.rglob("*.parquet")}


def test_a_diverged_trial_is_complete_named_and_never_rerun(tmp_path):
    spec = text_spec(tmp_path, "diverge", lr=1000.0)
    result = invoke("train", spec, "--trial", "0", "--results", tmp_path / "r")
    assert result.exit_code == 1 and "diverged" in result.output, result.output
    before = _files(tmp_path / "r" / "diverge")
    result = invoke("run", spec, "--results", tmp_path / "r")  # nothing to run: no Ray starts
    assert result.exit_code == 0, result.output
    assert "1 already complete (1 of them diverged" in result.output and "0 to run" in result.output, result.output
    assert _files(tmp_path / "r" / "diverge") == before


def test_a_deleted_corpus_is_refused_by_name_and_the_store_left_as_it_was(tmp_path):
    spec = text_spec(tmp_path, "corpus", lr=0.1)
    assert invoke("train", spec, "--trial", "0", "--results", tmp_path / "r").exit_code == 0
    reference = rows(tmp_path / "r" / "corpus")
    before = _files(tmp_path / "r" / "corpus")
    text = (tmp_path / "corpus.txt").read_text()
    (tmp_path / "corpus.txt").unlink()
    for verb in ("run", "plan", "train"):
        result = invoke(verb, spec, *(["--trial", "0"] if verb == "train" else []), "--results", tmp_path / "r")
        assert result.exit_code == 2 and "data.text: no such file" in result.output and "corpus.txt" in result.output, \
            (verb, result.output)
    assert _files(tmp_path / "r" / "corpus") == before
    (tmp_path / "corpus.txt").write_text(text)  # restored: a re-train writes the same rows, none doubled
    assert invoke("train", spec, "--trial", "0", "--results", tmp_path / "r").exit_code == 0
    after = rows(tmp_path / "r" / "corpus")
    assert all(after[t].equals(reference[t]) for t in KEYS)


@pytest.mark.parametrize("damage", ["random-bytes"])  # truncated: tests/test_trainable.py, without Ray
def test_a_checkpoint_that_cannot_be_loaded_is_quarantined_and_its_trial_restarts(reference, copy, damage):
    """Issue 34: a truncated or random checkpoint.pt failed its trial on every re-run (random bytes
    gave a UnicodeDecodeError naming no file). Now it is moved to quarantine/, the trial starts
    again from step 0 with a warning naming the file, and the store ends as the reference's."""
    trial = sorted(ResultsStore(copy.parent, "smoke").completed_ids())[0]
    checkpoint = copy / "trials" / trial / "checkpoint.pt"
    data = checkpoint.read_bytes()
    bad = data[: len(data) // 3] if damage == "truncated" else os.urandom(len(data))
    checkpoint.write_bytes(bad)
    (copy / "runs" / f"{trial}.parquet").unlink()  # interrupted: the next run resumes from the checkpoint
    for part in sorted((copy / "metrics").glob(f"{trial}.*.parquet"))[-1:]:
        part.unlink()  # the rows after the checkpoint were never flushed
    result = invoke("run", SMOKE, "--results", copy.parent)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"checkpoint {checkpoint} cannot be loaded" in said and "restarts from step 0" in said, result.output
    assert (copy / "quarantine" / "trials" / trial / "checkpoint.pt").read_bytes() == bad
    assert_same_rows(copy, reference)


def _mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()[:120]}): the full-disk fault needs one")


def test_a_real_full_disk_is_named_and_a_rerun_with_space_repairs_it(reference, tmp_path):
    """Issue 34: `sweep run` into a 600 KiB tmpfs (a real ENOSPC, not a mock). It exits 1 with the
    reason (no Ray UnpicklingError, no traceback), leaves no temporary file (run.lock.*.tmp,
    .tmp-*.parquet), and `status` names the full disk; once the tmpfs is grown, one re-run gives
    the reference's rows, row for row."""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "600k")
    try:
        spec = tmp_path / "smoke.yaml"
        spec.write_text(SMOKE.read_text().replace("retries: 1", "retries: 0"))  # the same trials, tried once
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["PYTHONPATH"] = str(Path(__file__).parent.parent)
        run = subprocess.run([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(disk)],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        output = run.stdout + run.stderr
        assert run.returncode == 1, output
        assert "No space left on device" in output and "disk is full" in output, output
        assert "Traceback" not in output and "UnpicklingError" not in output, output
        leftovers = [p.name for p in disk.rglob("*") if ".tmp" in p.name and p.is_file()]
        assert leftovers == [], leftovers
        status = invoke("status", disk / "smoke")
        assert status.exit_code == 1 and "disk is full" in " ".join(status.output.split()), status.output
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        result = invoke("run", spec, "--results", disk)
        assert result.exit_code == 0, result.output
        assert_same_rows(disk / "smoke", reference)
        assert not [p for p in disk.rglob("run.lock*")]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def corrupt_a_page(part: Path) -> Path:
    """Zero the middle of the last column's data (a data page), the footer left intact."""
    import pyarrow.parquet as pq

    col = pq.read_metadata(part).row_group(0).column(pq.read_metadata(part).num_columns - 1)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data = bytearray(part.read_bytes())
    mid = start + col.total_compressed_size // 2
    data[mid - 16 : mid + 16] = bytes(32)
    part.write_bytes(bytes(data))
    return part


def test_a_copied_part_a_damaged_page_and_a_corrupt_final_pt_are_repaired_by_one_rerun(reference, copy):
    """Issue 50: a part copied under another name (set aside; its trial stays done), a data page
    zeroed under an intact footer and a final.pt of random bytes (each trial set aside, trained
    again): one `sweep run` leaves the store row for row as an uninterrupted run's."""
    first, second = sorted(ResultsStore(copy.parent, "smoke").completed_ids())
    shutil.copy(sorted((copy / "metrics").glob(f"{second}.*.parquet"))[0], copy / "metrics" / "copied.parquet")
    shutil.copy(copy / "runs" / f"{second}.parquet", copy / "runs" / "copied.parquet")
    page = corrupt_a_page(sorted((copy / "curves").glob(f"{first}.*.parquet"))[0])
    assert invoke("verify", copy).exit_code == 2
    (copy / "trials" / second / "final.pt").write_bytes(os.urandom(100))
    result = invoke("run", SMOKE, "--results", copy.parent)
    assert result.exit_code == 0, result.output
    assert "0 already complete, 2 to run" in result.output, result.output
    assert "copied.parquet" in result.output and page.name in result.output and "final.pt" in result.output
    assert_same_rows(copy, reference)
    assert (copy / "quarantine" / "trials" / second / "final.pt").stat().st_size == 100


def test_a_run_stopped_past_its_lease_keeps_its_lock_and_equals_an_uninterrupted_run(reference, tmp_path):
    """Issue 50: `sweep run` (its whole process group) SIGSTOPped mid-trial for three leases (the
    lease shortened to 2 s): a second `sweep run` on this host is refused, as the holder's pid is
    alive; resumed, the first finishes and the store equals an uninterrupted run's row for row."""
    spec = tmp_path / "smoke.yaml"
    spec.write_text(SMOKE.read_text())
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(Path(__file__).parent.parent), SWEEP_LOCK_LEASE_S="2")
    log = tmp_path / "driver.log"
    with log.open("w") as said:
        driver = subprocess.Popen([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(tmp_path)],
                                  stdout=said, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None and not list((tmp_path / "smoke").glob("metrics/*.parquet")):
            time.sleep(0.2)
        assert driver.poll() is None, f"the run ended before it could be stopped:\n{log.read_text()[-3000:]}"
        os.killpg(driver.pid, signal.SIGSTOP)
        time.sleep(6)
        os.environ["SWEEP_LOCK_LEASE_S"] = "2"
        try:
            second = invoke("run", spec, "--results", tmp_path)
        finally:
            os.environ.pop("SWEEP_LOCK_LEASE_S")
        assert second.exit_code == 2 and "another `sweep run` holds this sweep" in second.output, second.output
        os.killpg(driver.pid, signal.SIGCONT)
        assert driver.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGCONT)
            driver.kill()
    assert "taken over" not in log.read_text()
    assert_same_rows(tmp_path / "smoke", reference)
