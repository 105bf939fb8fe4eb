"""tools/: the operational scripts, run for real (ladders.sh through `sweep run` and `sweep keep`, gpu_run.sh's CPU plumbing check), and docs/ holding documents: no tooling there, and
every tools/ or docs/scripts/ path the documents name exists (issue 47 item 5)."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tokenize
from pathlib import Path

import polars as pl
import pytest

from conftest import ladder_spec
from test_one_gpu import carried_corpus

REPO = Path(__file__).resolve().parent.parent
BIN = str(Path(sys.executable).parent)  # python3 and sweep, as the scripts call them

# ---- docs/ holds documents --------------------------------------------------------------------

THIN_IMPORTS = {"__future__", "analysis", "polars", "numpy", "sys", "json", "math", "itertools", "collections"}
THIN_LINES = 40
"""A script may stay in docs/scripts when it is a thin caller of analysis: it imports analysis, and
besides only polars/numpy and a few standard modules to print analysis's frames (no scipy: a
statistic it needs belongs in analysis; no torch, ray, study, sweep or resultstore: no training or
writing), reads no Parquet itself (analysis.load does), and has at most THIN_LINES lines of code
outside its docstring and comments."""


def _imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add((node.module or "").split(".")[0])
    return out


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not a comment, not the module docstring."""
    tree = ast.parse(source)
    first = tree.body[0] if tree.body else None
    doc = set()
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        doc = set(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip}
    return len(lines - doc)


def thin_caller_problems(path: Path) -> list[str]:
    source = path.read_text()
    tree = ast.parse(source)
    imports = _imports(tree)
    problems = []
    if "analysis" not in imports:
        problems.append("imports nothing from analysis")
    if imports - THIN_IMPORTS:
        problems.append(f"imports {sorted(imports - THIN_IMPORTS)}")
    if re.search(r"\b(read|scan)_parquet\b|pyarrow", source):
        problems.append("reads Parquet itself")
    if code_lines(source) > THIN_LINES:
        problems.append(f"{code_lines(source)} lines of code (at most {THIN_LINES})")
    return problems


def test_docs_hold_no_tooling() -> None:
    files = [p for p in sorted((REPO / "docs").rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) > 40, "docs/ holds the documents and the kept stores (one file per table each, kept compact)"
    bad = []
    for path in files:
        name = str(path.relative_to(REPO))
        if path.stat().st_mode & 0o111 or path.suffix in (".sh", ".bash"):
            bad.append(f"{name}: executable or a shell script")
        elif path.suffix == ".py":
            if path.parent != REPO / "docs/scripts":
                bad.append(f"{name}: Python outside docs/scripts")
            bad += [f"{name}: {p}" for p in thin_caller_problems(path)]
    assert not bad, "docs/ holds documents; move tooling to tools/:\n" + "\n".join(bad)


def test_the_thin_caller_rule_refuses_a_script_with_its_own_statistics(tmp_path: Path) -> None:
    thick = tmp_path / "thick.py"
    thick.write_text('"""doc\nstring"""\nimport sys\nfrom scipy import stats\nimport polars as pl\n'
                     "x = pl.read_parquet(sys.argv[1])\n" + "y = 1\n" * 41)
    assert thin_caller_problems(thick) == ["imports nothing from analysis", "imports ['scipy']", "reads Parquet itself",
                                           "45 lines of code (at most 40)"]
    thin = tmp_path / "thin.py"
    thin.write_text('"""doc"""\nimport sys\n# a comment\n\nfrom analysis.load import load\nprint(load(sys.argv[1]))\n')
    assert thin_caller_problems(thin) == [] and code_lines(thin.read_text()) == 3


NAMED = re.compile(r"(?<![\w/.-])((?:tools|docs/scripts)/[\w./-]*[\w/])")


def named_paths() -> dict[str, list[str]]:
    """Every tools/... or docs/scripts/... path named in README.md, docs/**/*.md, specs/*.yaml and
    tools/README.md, with the files naming it."""
    files = [REPO / "README.md", REPO / "tools/README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "specs").rglob("*.yaml")]
    named: dict[str, list[str]] = {}
    for f in files:
        for m in NAMED.finditer(f.read_text()):
            named.setdefault(m.group(1), []).append(str(f.relative_to(REPO)))
    return named


def test_every_named_tool_path_exists() -> None:
    named = named_paths()
    assert "tools/ladders.sh" in named and "tools/summaries/families_summary.py" in named  # the regex reads them
    missing = {p: where for p, where in named.items() if not (REPO / p).exists()}
    assert not missing, f"named but not in the repository: {missing}"


def test_tools_readme_names_every_tool() -> None:
    readme = (REPO / "tools/README.md").read_text()
    tools = [p for p in (REPO / "tools").rglob("*") if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts]
    unnamed = [str(p.relative_to(REPO / "tools")) for p in tools if p.name not in readme]
    assert tools and not unnamed, f"tools/README.md does not say what these are: {unnamed}"


# ---- ladders.sh -------------------------------------------------------------------------------

LADDER = ladder_spec(steps=30, batch_size=8)


def shell(script: str, *args: str | Path, cwd: Path, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO), **env}
    return subprocess.run(["bash", str(REPO / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=cwd)


def test_ladders_refuses_before_anything_runs(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(LADDER)
    bad = tmp_path / "bad.yaml"
    bad.write_text(LADDER.replace("d_model: 32", "d_model: -32"))
    usage = shell("tools/ladders.sh", spec, cwd=tmp_path)
    assert usage.returncode == 2 and "Run a spec's lr ladders to the end" in usage.stdout
    wrong = shell("tools/ladders.sh", spec, tmp_path / "r", tmp_path / "keep", cwd=tmp_path)
    assert wrong.returncode == 2 and "name the kept store after the sweep (tiny)" in wrong.stderr
    invalid = shell("tools/ladders.sh", bad, tmp_path / "r", tmp_path / "tiny", cwd=tmp_path)
    assert invalid.returncode == 2 and "d_model" in invalid.stderr and "Traceback" not in invalid.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "tiny.yaml"]  # nothing written


@pytest.mark.slow
def test_ladders_runs_each_ladder_to_the_end_keeping_every_trial(tmp_path: Path) -> None:
    """Two or more `sweep run`s (Ray), each followed by `sweep keep`: 2-4 minutes on 2 loaded cores."""
    from resultstore.reader import load
    from resultstore.writer import ResultsStore
    from sweep.grid import expand
    from sweep.ladder import plan_next
    from sweep.spec import load_spec

    spec = tmp_path / "tiny.yaml"
    spec.write_text(LADDER)
    out = shell("tools/ladders.sh", spec, tmp_path / "results", tmp_path / "kept" / "tiny", cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "every ladder of" in out.stdout and out.stdout.count("== ") >= 3  # two runs at least, then the end
    results, kept = tmp_path / "results" / "tiny", tmp_path / "kept" / "tiny"
    runs = ResultsStore.at(kept).read("runs")
    assert set(runs["trial_id"]) == set(ResultsStore.at(results).read("runs")["trial_id"]) and runs.height >= 5
    for table in ("runs", "metrics", "curves", "checks"):  # kept compact: every row, as the run wrote it
        a, b = (load(s).tables()[table].collect() for s in (results, kept))
        assert a.height == b.height > 0 and a.sort(a.columns[:3]).equals(b.sort(b.columns[:3])), table
    assert {f"{p.parent.name}/{p.name}" for p in kept.rglob("*.parquet")} == {f"{p.parent.name}/kept.parquet"
                                                                             for p in results.glob("*/*.parquet")}
    assert len(list(kept.rglob("final.pt"))) == runs.height  # the final weights too
    ladders = plan_next(expand(load_spec(spec)), runs, [0], 3)
    assert [lad.verdict for lad in ladders] == ["complete"], [lad.why for lad in ladders]


# ---- gpu_run.sh's local plumbing check --------------------------------------------------------


def carry_folder(folder: Path) -> str:
    """What gpu_carry.sh builds, but the wheels (SKIP_INSTALL: this Python has them): a carried
    stdlib cache as xz, and an empty English archive (it unpacks into the repository root)."""
    folder.mkdir()
    fingerprint = carried_corpus(folder / "cache")
    for name in ("train.npy", "val.npy"):
        subprocess.run(["xz", "-z", "-k", str(folder / "cache" / name)], check=True)
        shutil.move(folder / "cache" / f"{name}.xz", folder / f"{name}.xz")
    shutil.copy(folder / "cache" / "meta.json", folder / "meta.json")
    with tarfile.open(folder / "shakespeare.tar.xz", "w:xz"):
        pass
    return fingerprint


@pytest.mark.slow
def test_gpu_run_plumbing_on_the_cpu(tmp_path: Path) -> None:
    """The whole script, DEVICE=cpu, on a tiny spec: one_gpu.py follows the ladder, and what comes
    back in $OUT (new.tar.xz.part-*) unpacks to the finished trials' rows. 1-3 minutes."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(LADDER)
    fingerprint = carry_folder(tmp_path / "carry")
    out_dir, results = tmp_path / "out", tmp_path / "r"
    out = shell("tools/gpu_run.sh", cwd=tmp_path, timeout=900, DEVICE="cpu", SKIP_INSTALL="1", CARRY=str(tmp_path / "carry"),
                SCRATCH=str(tmp_path / "scratch"), OUT=str(out_dir), RESULTS=str(results), SPECS=str(spec), PROCS="3",
                LAUNCH_FOR="600", STOP_AFTER="800")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = (out_dir / "run.log").read_text()
    assert "round" in log and "never started" in log
    parts = sorted(out_dir.glob("new.tar.xz.part-*"))
    assert parts
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(f"cat {' '.join(map(str, parts))} | xz -d | tar x -C {back}", shell=True, check=True)
    runs = pl.read_parquet(back / "tiny" / "runs" / "*.parquet")
    assert runs.height >= 5 and set(runs["status"]) == {"done"} and set(runs["corpus_fingerprint"]) == {fingerprint}
    assert all(d.startswith("cpu") for d in runs["device"])
    assert f"{runs.height} ended ({runs.height} done)" in log
    assert not (back / "families").exists()  # the kept stores copied in before the run are not sent back
    assert json.loads((tmp_path / "scratch" / "stdlib" / "meta.json").read_text())["fingerprint"] == fingerprint


def test_quoted_intervals_names_each_interval_no_report_row_gives(tmp_path: Path) -> None:
    """tools/quoted_intervals.py: a quote a report row prints passes (either reading, twins too, "-" or "−",
    and an arm difference's rows written beside the report), a quote 0.01 off is named with its line, and
    lines outside --start/--stop are not read."""
    report = tmp_path / "report"
    report.mkdir()
    pl.DataFrame({"slope": [0.1647], "slope_low": [0.1521], "slope_high": [0.1867],
                  "slope_interpolated": [-0.0261], "slope_low_interpolated": [-0.0436],
                  "slope_high_interpolated": [-0.0079]}).write_csv(report / "optimum_slopes.csv")
    pl.DataFrame({"difference": [1.28], "ci_low": [0.88], "ci_high": [1.68]}).write_csv(report / "twins.csv")
    pl.DataFrame({"difference": [0.702], "difference_low": [0.551], "difference_high": [0.873], "slope_a": [0.84],
                  "slope_a_low": [0.66], "slope_a_high": [1.05], "slope_b": [0.14], "slope_b_low": [0.09],
                  "slope_b_high": [0.19]}).write_csv(report / "arm_difference_steps.csv")  # fmt: skip
    doc = tmp_path / "doc.md"
    doc.write_text("+9.99 [+9.98, +9.99] before the section\n## Width\n"
                   "line +0.16 [+0.15, +0.19]; interpolated −0.03 [−0.04, −0.01], ascii -0.03 [-0.04, -0.01]\n"
                   "twin log +1.28 [+0.88, +1.68]; drifted +0.17 [+0.15, +0.19]; arms +0.70 [+0.55, +0.87], a +0.84 "
                   "[+0.66, +1.05], b +0.14 [+0.09, +0.19]\n## Next\n+7.00 [+6.00, +8.00]\n")

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "tools/quoted_intervals.py"), str(doc), str(report), *extra],
                              capture_output=True, text=True)

    named = run("--start", "## Width", "--stop", "## Next")
    assert named.returncode == 1 and named.stdout.splitlines() == [f"{doc}:4: +0.17 [+0.15, +0.19]"]
    (report / "arm_difference_steps.csv").rename(report / "arms.csv")  # not an arm_difference*.csv: not read
    assert run("--start", "## Width", "--stop", "## Next").stdout.count("\n") == 1 + 3
    (report / "arms.csv").rename(report / "arm_difference_steps.csv")
    doc.write_text(doc.read_text().replace("drifted +0.17", "drifted +0.16"))
    assert run("--start", "## Width", "--stop", "## Next").returncode == 0
    assert run().stdout.splitlines() == [f"{doc}:1: +9.99 [+9.98, +9.99]", f"{doc}:6: +7.00 [+6.00, +8.00]"]
    missing_start = run("--start", "## Nowhere")
    assert missing_start.returncode == 2 and "--start '## Nowhere': no line of" in missing_start.stderr


def test_arm_difference_prints_what_the_documents_quote(tmp_path: Path) -> None:
    """docs/scripts/arm_difference.py on the two kept fixed-step stores prints the arm differences the
    README and docs/results.md quote, both readings, each with its verdict."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "POLARS_MAX_THREADS": "1"}
    out = subprocess.run([sys.executable, str(REPO / "docs/scripts/arm_difference.py"),
                          str(REPO / "docs/stores/width_fixed_batch_dense"), str(REPO / "docs/stores/width_fixed_steps_dense")],
                         capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    line = "adam − rotated_adam (sp), kurtosis / null, line: a +0.14 [+0.09, +0.19], b +0.06 [+0.01, +0.12], a − b {}"
    assert line.format("+0.07 [+0.02, +0.15]: larger in a") in out
    assert "kurtosis / null, interpolated: a +0.12 [+0.05, +0.19], b +0.07 [−0.00, +0.14], a − b +0.05 [−0.02, +0.10]: undecided" in out
    quoted = (REPO / "README.md").read_text() + (REPO / "docs/results.md").read_text()
    assert "+0.07 [+0.02, +0.15]" in quoted and "+0.05 [−0.02, +0.10]" in quoted
    # OUT_CSV: both readings' rows, which tools/quoted_intervals.py reads; the steps' share the documents quote
    csv = tmp_path / "arm_difference_steps.csv"
    steps = subprocess.run([sys.executable, str(REPO / "docs/scripts/arm_difference.py"), str(REPO / "docs/stores/width_dense"),
                            str(REPO / "docs/stores/width_fixed_batch_dense"), str(csv)],
                           capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    assert "kurtosis / null, line: a +0.84 [+0.66, +1.05], b +0.14 [+0.09, +0.19], a − b +0.70 [+0.55, +0.87]: larger in a" in steps
    rows = pl.read_csv(csv).filter(pl.col("measure") == "kurtosis / null").sort("reading")
    assert rows.get_column("reading").to_list() == ["interpolated", "line"]
    assert [f"{v:+.2f}" for v in rows.get_column("difference")] == ["+0.85", "+0.70"]
    assert "+0.70 [+0.55, +0.87]" in quoted and "+0.85 [+0.63, +0.93]" in quoted
    bad = subprocess.run([sys.executable, str(REPO / "docs/scripts/arm_difference.py"), "/no/such/store",
                          str(REPO / "docs/stores/width_fixed_steps_dense")], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "/no/such/store: no such folder" in bad.stderr and "Traceback" not in bad.stderr
    nowhere = subprocess.run([sys.executable, str(REPO / "docs/scripts/arm_difference.py"), str(REPO / "docs/stores/width_dense"),
                              str(REPO / "docs/stores/width_fixed_batch_dense"), str(tmp_path / "no" / "x.csv")],
                             capture_output=True, text=True, env=env)  # fmt: skip
    assert nowhere.returncode == 2 and f"OUT_CSV {tmp_path / 'no' / 'x.csv'}: " in nowhere.stderr
    assert "Traceback" not in nowhere.stderr and not (tmp_path / "no").exists()
