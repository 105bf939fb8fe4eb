"""`sweep keep` (resultstore.keep, sweep.cli_keep): a real store, trained here (three tiny trials,
`sweep train`, no Ray), kept compact; every verb reads the kept store as it read the original;
a second keep merges; a damaged byte is named by `status --verify`; bad input writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from conftest import invoke, ladder_spec


def said(result) -> str:
    """The CLI's output unwrapped: rich folds long lines (paths) at the terminal's width."""
    return result.output.replace("\n", "")


SPEC = ladder_spec(steps=20, batch_size=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(spec, results root): trials 0 and 1 trained in results/tiny, trial 2 not yet."""
    root = tmp_path_factory.mktemp("keep")
    spec = root / "tiny.yaml"
    spec.write_text(SPEC)
    for i in (0, 1):
        done = invoke("train", spec, "--trial", i, "--results", root / "results")
        assert done.exit_code == 0, done.output
    return spec, root / "results"


def tables(path: Path) -> dict[str, pl.DataFrame]:
    """Every table as `analysis.load` reads it, sorted on every column it can be."""
    from resultstore.reader import load

    return {name: ordered(frame.collect()) for name, frame in load(path).tables().items()}


def ordered(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort([c for c, t in df.schema.items() if t.is_numeric() or t == pl.String], nulls_last=True)


def test_a_kept_store_reads_back_equal_through_every_verb(trained, tmp_path: Path) -> None:
    from resultstore.writer import ResultsStore

    spec, results = trained
    kept = tmp_path / "kept" / "tiny"
    first = invoke("keep", results / "tiny", kept)
    assert first.exit_code == 0, first.output
    assert "kept 2 trial(s)" in said(first)
    files = sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file())
    assert files == ["checks/kept.parquet", "curves/kept.parquet", "dims/kept.parquet", "kept.json",
                     "metrics/kept.parquet", "runs/kept.parquet", *sorted(f for f in files if f.startswith("trials/"))]
    assert all(f.endswith("/final.pt") for f in files if f.startswith("trials/"))  # weights kept, nothing else
    manifest = json.loads((kept / "kept.json").read_text())
    before, after = tables(results / "tiny"), tables(kept)
    assert manifest["trials"] == sorted(before["runs"]["trial_id"]) and len(manifest["trials"]) == 2
    for name in before:  # every table, every column, every value
        assert before[name].equals(after[name]), name
        assert manifest["tables"].get(name, {}).get("rows", 0) == before[name].height, name

    verified = invoke("status", kept, "--verify")
    assert verified.exit_code == 0 and "verified:" in said(verified), verified.output
    for where, out in ((results / "tiny", tmp_path / "a"), (kept, tmp_path / "b")):
        assert invoke("report", where, "--out", out).exit_code == 0
    csvs = sorted(p.name for p in (tmp_path / "a").glob("*.csv"))
    assert csvs and all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in csvs)
    sql = "SELECT trial_id, metric, count(*) AS n, sum(value) AS s FROM metrics GROUP BY 1, 2 ORDER BY 1, 2"
    q = [invoke("query", where, sql, "--out", tmp_path / f"q{i}.csv") for i, where in enumerate((results / "tiny", kept))]
    assert all(r.exit_code == 0 for r in q) and (tmp_path / "q0.csv").read_bytes() == (tmp_path / "q1.csv").read_bytes()
    plan = invoke("plan", spec, "--results", tmp_path / "kept")
    assert plan.exit_code == 0 and "2/3 done" in said(plan), plan.output
    nxt = invoke("next", spec, "--results", tmp_path / "kept")
    assert nxt.exit_code == 0, nxt.output

    # --reuse: the kept trials are copied out as the writer lays them out, and not trained again
    one = tmp_path / "one.yaml"
    one.write_text(SPEC.replace("[1.0e-2, 3.0e-2, 1.0e-1]", "[1.0e-2, 3.0e-2]"))
    reused = invoke("run", one, "--results", tmp_path / "again", "--reuse", kept)
    assert reused.exit_code == 0 and "copied 2 finished trial(s)" in said(reused), reused.output
    again = tmp_path / "again" / "tiny"
    assert sorted(p.name for p in (again / "metrics").iterdir()) == sorted(p.name for p in (results / "tiny" / "metrics").iterdir())
    copied = tables(again)
    for name in before:
        assert before[name].equals(copied[name]), name
    assert not ResultsStore.at(again).damaged(pages=True)


def test_keeping_again_merges_and_a_damaged_byte_is_named(trained, tmp_path: Path) -> None:
    spec, results = trained
    kept = tmp_path / "tiny"
    assert invoke("keep", results / "tiny", kept).exit_code == 0
    first = tables(kept)
    unchanged = invoke("keep", results / "tiny", kept)
    assert unchanged.exit_code == 0 and "kept 0 trial(s)" in said(unchanged) and "2 already there" in said(unchanged)

    more = tmp_path / "more"
    assert invoke("train", spec, "--trial", 2, "--results", more).exit_code == 0
    merged = invoke("keep", more / "tiny", kept)
    assert merged.exit_code == 0 and "kept 1 trial(s)" in said(merged) and "3 in all" in said(merged), merged.output
    after, third = tables(kept), tables(more / "tiny")
    for name, frame in first.items():  # nothing lost, the new trial added, row for row
        both = pl.concat([frame, third[name]], how="diagonal_relaxed")
        assert after[name].equals(ordered(both.select(after[name].columns))), name
    manifest = json.loads((kept / "kept.json").read_text())
    assert len(manifest["trials"]) == 3 and [k["added"] for k in manifest["keeps"]] == [2, 1]
    assert invoke("status", kept, "--verify").exit_code == 0

    path = kept / "metrics" / "kept.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in a data page
    path.write_bytes(bytes(data))
    damaged = invoke("status", kept, "--verify")
    assert damaged.exit_code == 2, damaged.output
    assert f"{kept}/metrics/kept.parquet: damaged Parquet file" in damaged.output.replace("\n", "")
    refused = invoke("keep", more / "tiny", kept)  # nor does keep build on a damaged store
    assert refused.exit_code == 2 and "metrics/kept.parquet" in refused.output

    # a whole, readable Parquet file that is not the one kept: only its sha256 tells
    other = tmp_path / "other"
    assert invoke("keep", more / "tiny", other / "tiny").exit_code == 0
    path.write_bytes((other / "tiny" / "metrics" / "kept.parquet").read_bytes())
    swapped = invoke("status", kept, "--verify")
    assert swapped.exit_code == 2 and "as kept.json records" in swapped.output.replace("\n", ""), swapped.output


def test_keep_refuses_bad_input_writing_nothing(trained, tmp_path: Path) -> None:
    spec, results = trained
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("name: tiny", "name: other"))
    cases = [
        ((tmp_path / "nothing", tmp_path / "k" / "tiny"), "nothing: no such folder"),
        ((results / "tiny", results / "tiny"), "that is SOURCE itself"),
        ((results / "tiny", tmp_path / "k" / "wrong"), "name it after the sweep (tiny)"),
        ((results / "tiny", tmp_path / "k" / "tiny", "--spec", other), "its sweep is other, DEST's tiny"),
    ]
    for args, message in cases:
        out = invoke("keep", *args)
        assert out.exit_code == 2 and message in out.output.replace("\n", "") and "Traceback" not in out.output, (args, out.output)
    assert not (tmp_path / "k").exists()
    live = tmp_path / "live"
    assert invoke("train", spec, "--trial", 2, "--results", live).exit_code == 0
    before = sorted(p for p in (live / "tiny").rglob("*"))
    out = invoke("keep", results / "tiny", live / "tiny")
    assert out.exit_code == 2 and "a live sweep's store" in out.output.replace("\n", ""), out.output
    assert sorted(p for p in (live / "tiny").rglob("*")) == before  # nothing written into it
