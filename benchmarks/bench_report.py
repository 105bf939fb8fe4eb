"""Benchmark: a full `write_report` over a ~10M-row metrics table.

Budget (docs/architecture.md "Budgets"): "a report over 10M metric rows in seconds (lazy)".

Run from the repository root, with the project's environment active:

    python benchmarks/bench_report.py                 # ~10M rows, svg+png, prints timings
    python benchmarks/bench_report.py --rows 2e6      # smaller
    python benchmarks/bench_report.py --keep /tmp/big # keep the store and report to look at
    python benchmarks/bench_report.py --store /tmp/big/bench --against /tmp/old --repeat 3
        # side by side: this checkout's write_report and the one whose analysis/ is under
        # /tmp/old (e.g. `git archive <rev> analysis | tar -x -C /tmp/old`), alternating, each
        # in a fresh process on the same store; wall and CPU seconds, and their ratios

It writes a synthetic store in the results store's layout (tests/synthetic_store.py, the
tests' fixture module; the per-trial files are written directly with the store's Arrow schema,
as ``ResultsStore`` would name them, because ~10M row dicts through it take minutes:
5 sizes x 4 optimisers (sgd on a 3-lr ladder: 6 optimiser points) x 2 norms x 3 rotations
x 3 seeds = 540 trials, 8 layers, every site/basis/metric plus the quantisation penalty, as
many eval steps as it takes to reach --rows) into a temporary folder, then times separately: the two core lazy queries (scale_table + layer_profile,
collected), and the whole report (load, best-lr selection, queries, fits, 10 charts
rendered to each format, tables, index.html). Generation is not timed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the product, and the tests' fixture module

from analysis import queries  # noqa: E402
from analysis.load import load  # noqa: E402
from analysis.report import write_report  # noqa: E402
from synthetic_store import SITE_METRICS, Synthetic  # noqa: E402

SIZES = (64, 96, 128, 192, 256)
OPTIMIZERS = ("adam", "sgd", "rotated_adam", "muon")
LRS = {"sgd": (0.1, 0.3, 1.0)}  # a ladder, so the report's best-lr selection has work to do
NORMS = ("layernorm", "rmsnorm_scalar")
ROTATIONS = ("none", "shared", ("partial", 2))
SEEDS = (0, 1, 2)
LAYERS = 8


def rows_per_eval() -> int:
    sites = 2 * (LAYERS + 1) + 3 * LAYERS  # resid x {stored, random} incl. embeddings; 3 block sites
    return sites * len(SITE_METRICS) + 1  # + the model-level dettmers count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=10e6, help="target metric rows (default 10M)")
    ap.add_argument("--parts", type=int, default=2, help="flushed step ranges per trial")
    ap.add_argument("--formats", default="svg,png", help="report formats (default svg,png)")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per fit")
    ap.add_argument("--keep", type=Path, default=None, help="write here and keep (default: a temp dir)")
    ap.add_argument("--store", type=Path, default=None, help="an existing sweep folder: skip generating")
    ap.add_argument("--against", type=Path, default=None, help="a folder holding another analysis/ to compare")
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs per side with --against")
    args = ap.parse_args()
    if args.against is not None:
        if args.store is None:
            ap.error("--against needs --store (a store written by an earlier --keep run)")
        side_by_side(args.store, args.against, args.repeat, args.formats, args.n_boot)
        return

    points = sum(len(LRS.get(o, (None,))) for o in OPTIMIZERS)
    trials = len(SIZES) * points * len(NORMS) * len(ROTATIONS) * len(SEEDS)
    n_steps = max(2, round(args.rows / (trials * rows_per_eval())))
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_report_"))
    print(f"writing a synthetic store: {trials} trials x {n_steps} evals x {rows_per_eval()} rows ...")
    t0 = time.perf_counter()
    truth = (Synthetic("bench", seed=0)
             .trials(sizes=SIZES, n_layers=LAYERS, optimizers=OPTIMIZERS, lrs=LRS, norms=NORMS, rotations=ROTATIONS,
                     seeds=SEEDS, failed=3)
             .planted(best_lrs={"sgd": 0.3}, exponents={"adam": 0.5, "sgd": None, "rotated_adam": 0.2, "muon": None})
             .rows(steps=tuple(range(0, 100 * n_steps, 100)))
             .write(root, parts=args.parts, through_store=False))
    size_mb = sum(f.stat().st_size for f in Path(truth.path).rglob("*.parquet")) / 1e6
    print(
        f"  {truth.n_metric_rows / 1e6:.2f}M metric rows in {args.parts} parts per trial, "
        f"{size_mb:.0f} MB on disk, generated in {time.perf_counter() - t0:.1f} s (not timed)"
    )

    t0 = time.perf_counter()
    r = load(truth.path)
    scale = queries.scale_table(r, "kurtosis").collect()
    prof = queries.layer_profile(r, "kurtosis").collect()
    t_queries = time.perf_counter() - t0
    print(f"scale_table + layer_profile: {t_queries:.2f} s ({scale.height} + {prof.height} rows)")

    formats = tuple(f for f in args.formats.split(",") if f)
    t0 = time.perf_counter()
    rep = write_report(truth.path, formats=formats, n_boot=args.n_boot)  # type: ignore[arg-type]
    t_report = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"write_report ({', '.join(formats)}; {len(rep.charts)} charts, {rep.fits.height} fits): "
        f"{t_report:.2f} s -> {rep.index}"
    )
    print(f"peak RSS {peak_mb:.0f} MB, {os.cpu_count()} CPUs")
    if args.keep is None:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


_ONE_RUN = """
import resource, sys, tempfile, time
from analysis.report import write_report
t = time.perf_counter()
write_report(sys.argv[1], tempfile.mkdtemp(), formats=tuple(sys.argv[2].split(",")), n_boot=int(sys.argv[3]))
u, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(time.perf_counter() - t, u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime)  # + the render workers
"""


def side_by_side(store: Path, against: Path, repeat: int, formats: str, n_boot: int) -> None:
    """write_report of this checkout (new) and of ``against`` (old), alternating, each in a
    fresh process (CPU seconds include vl-convert's threads and the import)."""
    import statistics
    import subprocess

    sides = {"new": str(REPO), "old": str(against)}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    for i in range(repeat):
        for name, path in sides.items():
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, str(REPO / "tests")])}
            done = subprocess.run(
                # -P: `python -c` would put the working directory (this checkout) ahead of
                # PYTHONPATH, and the old side would run the new code
                [sys.executable, "-P", "-c", _ONE_RUN, str(store), formats, str(n_boot)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            wall, cpu = map(float, done.stdout.split()[-2:])
            times[name].append((wall, cpu))
            print(f"run {i + 1} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    for k, (w, c) in med.items():
        print(f"{k}: median {w:.2f} s wall, {c:.2f} s CPU")
    print(f"new/old: wall {med['new'][0] / med['old'][0]:.2f}, CPU {med['new'][1] / med['old'][1]:.2f}")


if __name__ == "__main__":
    main()
