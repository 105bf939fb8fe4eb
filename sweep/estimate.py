"""How long a sweep takes: trial FLOPs / a sustained FLOP/s, and where that rate comes from.

The rate, in order of preference:
1. measured by this sweep's finished runs of the trial's size (median of flops_per_token x
   tokens_per_s over the done rows with its parameter count);
2. for a size no finished run has: the table's rate at that size (below), scaled by the median
   ratio of the measured rates to the table's at the sizes that did finish: small models run
   further from the peak than large ones, so one rate for every size misjudged both ends (a d128
   trial was planned at 13 min from the d192 runs' rate; it took 18);
3. the per-device throughput table (sweep/throughput.json, filled by
   benchmarks/bench_throughput.py): sustained training FLOP/s measured at a few model sizes,
   interpolated log-log in parameters; beyond the measured sizes the nearest point's rate is
   used and the estimate says it is extrapolating;
4. no measurement for the device: its peak (study.device.PEAK_FLOPS) x ASSUMED_MFU for a GPU,
   ASSUMED_CPU_FLOPS for a CPU: an extrapolation, and the estimate says so.

CPU rates are per thread in the table and scale with the trial's threads (resources.cpu). A
trial's wall time is FLOPs / rate; its device-hours are wall x its GPU share (a 0.25-GPU trial
that runs 4 h costs 1 GPU-hour), which assumes a small trial's rate is the same alone or packed.
A trial with W workers (resources.workers) runs at W x DATA_PARALLEL_EFFICIENCY x one worker's
rate and costs W x its share per hour: an assumption, so the estimate says it extrapolates.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from resultstore.schema import FINISHED
from study.config import TrialConfig
from study.device import peak_flops

__all__ = [
    "TABLE", "ASSUMED_MFU", "ASSUMED_CPU_FLOPS", "DATA_PARALLEL_EFFICIENCY", "DEFAULT_GPU", "Rate",
    "Estimate", "load_table", "table_rate", "measured_flops_per_s", "estimate", "planned_seconds", "uses_gpu",
]

TABLE = Path(__file__).with_name("throughput.json")
ASSUMED_MFU = 0.35
"""Share of the peak assumed for a GPU nobody has measured yet."""
ASSUMED_CPU_FLOPS = 1.5e10
"""FLOP/s per CPU thread assumed when the table has no CPU row."""
DATA_PARALLEL_EFFICIENCY = 0.9
"""Share of W x one worker's rate a W-worker (DDP) trial is assumed to reach; nobody measured it yet."""
DEFAULT_GPU = "NVIDIA H200"
"""The device GPU specs are estimated for unless `sweep plan --device` names another."""


@dataclass(frozen=True)
class Rate:
    flops_per_s: float
    basis: str
    """How it was obtained, for the reader."""
    extrapolating: bool


@dataclass(frozen=True)
class Estimate:
    device: str
    trial_s: list[float]
    """Estimated wall seconds of each trial, in the order given."""
    total_flops: float
    pending_s: float
    """Trial-seconds of the trials not done (summed, not divided by parallelism)."""
    pending_device_hours: float
    """GPU share x trial time of the trials not done (GPU specs); CPU specs: CPU-thread hours."""
    basis: str
    extrapolating: bool


def load_table(path: Path | str | None = None) -> dict:
    path = Path(path) if path is not None else TABLE
    return json.loads(path.read_text()) if path.exists() else {"devices": {}}


def table_rate(table: dict, device: str, params: int, threads: int = 1) -> Rate:
    """Sustained FLOP/s of one trial of `params` on `device` (per the module docstring)."""
    row = table.get("devices", {}).get(device, {})
    points = sorted((p["params"], p["flops_per_s"]) for p in row.get("measured", []))
    scale = max(1, threads) / row.get("threads", 1) if device == "cpu" else 1.0
    if not points:
        if device == "cpu":
            return Rate(ASSUMED_CPU_FLOPS * max(1, threads), f"assuming {ASSUMED_CPU_FLOPS:.3g} FLOP/s per CPU thread "
                        "(no measurement in the throughput table)", True)
        peak = peak_flops(device)
        if peak is None:
            raise ValueError(f"--device {device!r}: not in the throughput table or study.device.PEAK_FLOPS")
        return Rate(peak * ASSUMED_MFU, f"extrapolating: {device} not measured yet, assuming {ASSUMED_MFU:.0%} MFU "
                    f"of its {peak / 1e12:.0f} TFLOP/s peak", True)
    lo, hi = points[0], points[-1]
    if params <= lo[0] or params >= hi[0] or len(points) == 1:
        near = lo if params <= lo[0] else hi
        inside = params == near[0]
        return Rate(near[1] * scale, f"{device} throughput table" + ("" if inside else
                    f" (extrapolating beyond its measured {lo[0]:.3g}-{hi[0]:.3g} parameters)"), not inside)
    for (p0, r0), (p1, r1) in zip(points, points[1:]):
        if p0 <= params <= p1:
            w = (math.log(params) - math.log(p0)) / (math.log(p1) - math.log(p0))
            return Rate(math.exp(math.log(r0) + w * (math.log(r1) - math.log(r0))) * scale,
                        f"{device} throughput table (interpolated)", False)
    raise AssertionError("unreachable")


def measured_flops_per_s(runs, gpu: bool | None = None) -> dict[int, float]:
    """FLOP/s this sweep's finished runs sustained, per model size: {params: median of
    flops_per_token x tokens_per_s over the done rows of a runs DataFrame}; empty before any finished.
    ``gpu``: only the rows run on that kind of device (the runs row's ``device``: "cpu (...)" or a
    GPU's name), so a store with GPU and CPU trials does not time a CPU plan at GPU speed."""
    import polars as pl

    done = runs.filter(pl.col("status") == "done")
    if gpu is not None and "device" in done.columns:
        on_cpu = pl.col("device").fill_null("cpu").str.starts_with("cpu")
        done = done.filter(~on_cpu if gpu else on_cpu)
    if not done.height:
        return {}
    rates = done.group_by("params").agg((pl.col("flops_per_token") * pl.col("tokens_per_s")).median().alias("rate"))
    return {int(p): float(r) for p, r in rates.iter_rows()}


def _rate(params: int, measured: Mapping[int, float] | float | None, resources, table: dict, device: str) -> Rate:
    """One size's rate, per the module docstring's order."""
    if isinstance(measured, (int, float)):  # one rate for every size (a caller's own figure)
        return Rate(float(measured), "measured from finished runs", False)
    if measured and params in measured:
        return Rate(measured[params], "measured from this sweep's finished runs", False)
    own = table_rate(table, device, params, threads=int(resources(params)["cpu"]))
    if not measured:
        return own
    ratio = statistics.median(rate / table_rate(table, device, p, threads=int(resources(p)["cpu"])).flops_per_s
                              for p, rate in measured.items())
    return Rate(own.flops_per_s * ratio, f"{own.basis}, scaled x{ratio:.2f} to this sweep's finished runs",
                own.extrapolating)


def estimate(trials: list[TrialConfig], resources, statuses: dict[str, str],
             measured_flops_per_s: Mapping[int, float] | float | None, gpu: bool, device: str | None = None,
             table: dict | None = None) -> Estimate:
    """Per-trial time and the totals. `resources(params) -> {"cpu", "gpu"}` gives each trial's share;
    `measured_flops_per_s`: {params: FLOP/s} from this sweep's finished runs (see measured_flops_per_s),
    or one rate for every size."""
    table = table if table is not None else load_table()
    device = device or (DEFAULT_GPU if gpu else "cpu")
    trial_s, total, pending_s, pending_hours, bases, extrapolating = [], 0.0, 0.0, 0.0, set(), False
    by_size: dict[int, tuple[dict, Rate]] = {}  # grids repeat a few sizes many times
    for t in trials:
        flops = t.flops_per_token * t.total_tokens
        params = t.params
        if params not in by_size:
            want = resources(params)
            by_size[params] = (want, _rate(params, measured_flops_per_s, resources, table, device))
        want, rate = by_size[params]
        workers = int(want.get("workers", 1))
        speedup = workers * DATA_PARALLEL_EFFICIENCY if workers > 1 else 1.0
        seconds = flops / (rate.flops_per_s * speedup)
        trial_s.append(seconds)
        total += flops
        if not statuses or statuses.get(t.trial_id) not in FINISHED:  # ids cost a hash each
            pending_s += seconds
            share = want["gpu"] if gpu else want["cpu"]
            pending_hours += seconds * share * workers / 3600
            bases.add(rate.basis)
            extrapolating |= rate.extrapolating
            if workers > 1:
                bases.add(f"multi-worker trials at an assumed {DATA_PARALLEL_EFFICIENCY:.0%} data-parallel efficiency")
                extrapolating = True
    basis = "; ".join(sorted(bases)) or "nothing left to run"
    return Estimate(device, trial_s, total, pending_s, pending_hours, basis, extrapolating)


def uses_gpu(spec) -> bool:
    """A spec's trials run on GPUs (a GPU share anywhere, or a cuda device)."""
    r = spec.resources
    return r.gpu > 0 or any(o.gpu > 0 for o in r.by_size) or spec.device.startswith("cuda")


def planned_seconds(spec, trials: list[TrialConfig], table: dict | None = None) -> dict[str, float]:
    """{trial id: the plan's wall seconds} by the throughput table alone (what `sweep plan`
    shows before any trial finished): the start of the progress line's time left."""
    est = estimate(trials, spec.resources.for_params, {}, None, uses_gpu(spec), table=table)
    return {t.trial_id: s for t, s in zip(trials, est.trial_s)}
