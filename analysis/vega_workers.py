"""Chart specs -> SVG/PNG/PDF bytes through vl-convert, in worker processes.

vl-convert holds the GIL while it renders, so threads do not overlap it; processes do. The
workers are started first (``VegaWorkers(...)``), import vl-convert and start its JavaScript
runtime while the report is being computed, then render each chart as soon as it is
submitted, while the next one is computed.
Each worker is this file run as a script, so it imports neither ``analysis`` nor the user's
main module (no ``if __name__ == "__main__"`` needed in scripts that write reports).
Where a worker cannot start or dies, its charts are rendered in this process instead.

This module imports only the standard library at the top: the worker must start fast.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ChartError", "VegaWorkers", "render_spec"]

VECTOR = ("svg", "png", "pdf")
"""The formats rendered from the spec (the others, html and json, come from the chart object)."""


def render_spec(spec: dict[str, Any], formats: Sequence[str], png_scale: float, vl: str | None) -> dict[str, bytes]:
    """One Vega-Lite spec as svg and each of ``formats`` among svg/png/pdf: Vega renders the SVG
    once; PNG and PDF are converted from it (what vl-convert's own PNG/PDF paths do)."""
    import vl_convert as vlc

    svg = str(vlc.vegalite_to_svg(spec, vl_version=vl))
    out = {"svg": svg.encode()}
    if "png" in formats:
        out["png"] = bytes(vlc.svg_to_png(svg, scale=png_scale))
    if "pdf" in formats:
        out["pdf"] = bytes(vlc.svg_to_pdf(svg))
    return out


def default_workers() -> int:
    """One per usable core, at most 4 (ten charts do not keep more busy)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


class VegaWorkers:
    """Worker processes rendering charts as they are submitted; ``collect`` waits for all.
    A context manager that stops the workers."""

    def __init__(self, formats: Sequence[str], png_scale: float, vl: str | None, workers: int | None = None) -> None:
        self.formats, self.png_scale, self.vl = [f for f in formats if f in VECTOR], png_scale, vl
        self.folder = tempfile.mkdtemp(prefix="vega-")
        self.specs: dict[str, dict[str, Any]] = {}
        self.done: dict[str, dict[str, bytes]] = {}
        self.errors: list[Exception] = []
        self.jobs: queue.Queue[str | None] = queue.Queue()
        self.procs: list[subprocess.Popen] = []
        for _ in range(default_workers() if workers is None else workers):
            try:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-P", str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                ))  # fmt: skip
            except OSError:  # no interpreter to start (embedded Python): render in-process
                break
        self.threads = [threading.Thread(target=self._feed, args=(p,), daemon=True) for p in self.procs]
        for t in self.threads:
            t.start()

    def submit(self, name: str, chart: Any) -> None:
        """Queue a chart (an Altair chart, or its Vega-Lite dict) for rendering; returns at once."""
        self.specs[name] = chart if isinstance(chart, dict) else chart.to_dict(validate=False)
        self.jobs.put(name)

    def collect(self) -> dict[str, dict[str, bytes]]:
        """``{name: {format: bytes}}`` for every submitted chart (svg always), in submit order;
        raises the first chart's error."""
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join()
        for name in self.specs:  # no workers, or charts a dead worker left behind
            if name not in self.done and not self.errors:
                self.done[name] = render_spec(self.specs[name], self.formats, self.png_scale, self.vl)
        if self.errors:
            raise self.errors[0]
        return {name: self.done[name] for name in self.specs}

    def _feed(self, proc: subprocess.Popen) -> None:
        while (name := self.jobs.get()) is not None:
            if proc.poll() is not None or self.errors:
                continue  # left for collect, or not needed any more
            try:
                self.done[name] = self._remote(proc, name)
            except ChartError as exc:
                self.errors.append(exc)
            except (OSError, ValueError, RuntimeError):  # the worker is gone: collect renders its share
                proc.kill()

    def _remote(self, proc: subprocess.Popen, name: str) -> dict[str, bytes]:
        out = os.path.join(self.folder, name)
        job = {"spec": self.specs[name], "formats": self.formats, "png_scale": self.png_scale, "vl": self.vl, "out": out}
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        reply = json.loads(proc.stdout.readline() or "null")  # "" once the worker has died
        if reply is None:
            raise RuntimeError("worker exited")
        if reply["error"]:  # the chart itself failed, not the worker: raised to the caller
            raise ChartError(f"rendering chart {name!r}: {reply['error']}")
        return {fmt: Path(f"{out}.{fmt}").read_bytes() for fmt in reply["formats"]}

    def close(self) -> None:
        for t in self.threads:
            if t.is_alive():
                self.jobs.put(None)
        for p in self.procs:
            if p.poll() is None:
                p.stdin.close()  # the worker's loop ends at end of input
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> VegaWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChartError(Exception):
    """vl-convert refused a chart in a worker (not a worker failure: not retried here)."""


def _serve() -> None:
    """The worker: warm vl-convert up, then one JSON job per stdin line, one reply per job."""
    import vl_convert as vlc

    vlc.vegalite_to_svg({"mark": "point"})  # start the JavaScript runtime while the report computes
    for line in sys.stdin:
        job = json.loads(line)
        try:
            files = render_spec(job["spec"], job["formats"], job["png_scale"], job["vl"])
            for fmt, data in files.items():
                Path(f"{job['out']}.{fmt}").write_bytes(data)
            reply = {"error": None, "formats": sorted(files)}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            reply = {"error": f"{type(exc).__name__}: {exc}", "formats": []}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
