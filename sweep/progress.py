"""Live progress for `sweep run`: a Ray Tune callback driving a rich progress bar.

The bar is weighted by each trial's training FLOPs, so its share means something when model sizes
differ by 100x. Where the console is not a terminal (a log file under nohup, a batch job), rich
draws no bar, so the same progress is printed as a plain line at most every `every_s` seconds and
whenever a trial ends.

The time left (`Eta`) starts from the plan's seconds per trial (sweep.estimate: the throughput
table) and is corrected by how the trials ran: the plan's seconds are scaled by the ratio of the
wall time the trials took (finished, and running ones so far) to the plan's time for the share of
steps they did. The scaled seconds are laid over the trials running at once (the most seen), the
running ones first with what is left of them, the rest in launch order, each to the first free
slot: the time left is when the last slot frees. Imported only when a sweep runs (it imports Ray)."""

from __future__ import annotations

import heapq
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable

from ray.tune import Callback
from rich.progress import Progress

from analysis.labels import labels_for
from study.config import TrialConfig
from sweep.console import duration

__all__ = ["Eta", "ProgressCallback", "ReportCallback"]


class Eta:
    """Time left of a sweep (the module docstring): the plan's seconds per trial, corrected by
    the trials' own wall time. `clock` is injectable so that tests can drive it."""

    def __init__(self, planned_s: dict[str, float], clock: Callable[[], float] = time.monotonic):
        self.planned = dict(planned_s)
        """trial id -> the plan's seconds, in launch order."""
        self.clock = clock
        self.began: dict[str, float] = {}
        self.ended: dict[str, tuple[float, float]] = {}
        """trial id -> (wall seconds, share of its steps done)."""
        self.slots = 1

    def start(self, tid: str) -> None:
        self.began[tid] = self.clock()
        self.slots = max(self.slots, sum(t not in self.ended for t in self.began))

    def end(self, tid: str, share: float) -> None:
        if tid in self.began and tid not in self.ended:
            self.ended[tid] = (self.clock() - self.began[tid], share)

    def drop(self, tid: str) -> None:
        """A trial that will not run (past the launch deadline)."""
        for table in (self.planned, self.began, self.ended):
            table.pop(tid, None)

    def scale(self, shares: dict[str, float]) -> float | None:
        """Wall seconds taken / the plan's seconds for the steps done, over the trials ended and
        those running with a share of their steps (`shares`) done; None before any."""
        now, took, plan = self.clock(), 0.0, 0.0
        for tid, (wall, share) in self.ended.items():
            if share > 0:  # a trial that failed at its start says nothing of the rate
                took, plan = took + wall, plan + share * self.planned.get(tid, 0.0)
        for tid, t0 in self.began.items():
            if tid not in self.ended and shares.get(tid, 0.0) > 0:
                took, plan = took + now - t0, plan + shares[tid] * self.planned.get(tid, 0.0)
        return took / plan if plan > 0 and took > 0 else None

    def left(self, shares: dict[str, float]) -> tuple[float, float | None]:
        """(seconds left, the correction applied to the plan, None while it is the plan's own)."""
        scale = self.scale(shares)
        k = scale if scale is not None else 1.0
        running = [tid for tid in self.began if tid not in self.ended and tid in self.planned]
        free = [k * self.planned[t] * (1 - min(1.0, shares.get(t, 0.0))) for t in running]
        free += [0.0] * max(0, self.slots - len(free))
        heapq.heapify(free)
        for tid, seconds in self.planned.items():
            if tid not in self.began:
                heapq.heappush(free, heapq.heappop(free) + k * seconds)
        return max(free, default=0.0), scale

    def line(self, shares: dict[str, float], planned: bool = True) -> str:
        """The time left as the progress line says it; `planned`: the seconds are the plan's (else
        stand-ins, e.g. FLOPs, that only the measured rate turns into time)."""
        seconds, scale = self.left(shares)
        if not planned:
            return f"about {duration(seconds)} left at this rate"
        if scale is None:
            return f"about {duration(seconds)} left by the plan's throughput table"
        return f"about {duration(seconds)} left (the plan's time x {scale:.2f}, as the trials so far ran)"


class ProgressCallback(Callback):
    def __init__(self, trials: list[TrialConfig], progress: Progress, sweep_trials: list[TrialConfig] | None = None,
                 every_s: float = 600.0, planned_s: dict[str, float] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """`trials`: those to run, in launch order; `sweep_trials` (default: the same): the whole
        grid, whose varying axes the labels name, so a rerun of one lr of a ladder still says its lr.
        `every_s`: the least time between two plain progress lines where there is no terminal.
        `planned_s`: the plan's seconds per trial (sweep.estimate.planned_seconds); without it the
        time left is given once a trial has run some steps (the FLOPs then stand in for the plan)."""
        self.flops = {t.trial_id: t.flops_per_token * t.total_tokens for t in trials}
        self.steps = {t.trial_id: t.total_steps for t in trials}
        self.labels = {tid: f" ({label})" if label else "" for tid, label in labels_for(sweep_trials or trials).items()}
        self.last: dict[str, dict] = {}
        self.progress = progress
        self.task = progress.add_task("starting Ray", total=sum(self.flops.values()) or 1.0)
        self.done, self.failed, self.running, self.at_step = 0, 0, set(), {}
        self.eta = Eta({t: (planned_s or self.flops)[t] for t in self.flops}, clock)
        self.from_plan = planned_s is not None
        self.every_s, self.clock = every_s, clock
        self.printed_at = clock()

    def __getstate__(self) -> dict:
        return {}  # Tune pickles its callbacks with the experiment; the live console stays here

    def _left(self) -> str:
        shares = {t: min(1.0, s / self.steps[t]) for t, s in self.at_step.items() if t in self.running}
        if not self.from_plan and self.eta.scale(shares) is None:
            return ""
        return " · " + self.eta.line(shares, planned=self.from_plan)

    def _refresh(self, ended: bool = False) -> None:
        completed = sum(self.flops[t] * min(1.0, s / self.steps[t]) for t, s in self.at_step.items())
        failed = f" · [red]{self.failed} failed[/]" if self.failed else ""
        left = self._left()
        self.progress.update(self.task, completed=completed, description=(
            f"{self.done}/{len(self.flops)} trials done · {len(self.running)} running{failed}{left}"))
        if not self.progress.console.is_terminal and (ended or self.clock() - self.printed_at >= self.every_s):
            self.printed_at = self.clock()
            task = next(t for t in self.progress.tasks if t.id == self.task)
            self.progress.console.print(
                f"{time.strftime('%H:%M')} {self.done}/{len(self.flops)} trials done · {len(self.running)} running"
                f"{f' · {self.failed} failed' if self.failed else ''} · {task.percentage:.0f}% of the FLOPs{left}",
                highlight=False, markup=False)

    @staticmethod
    def _id(trial) -> str:
        return trial.config["point"]["trial_id"]

    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(self._id(trial))
        self.eta.start(self._id(trial))
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        tid = self._id(trial)
        if "step" in result:
            self.at_step[tid] = result["step"]
        self.last[tid] = result
        self._refresh()

    def _finish(self, trial) -> str:
        tid = self._id(trial)
        self.running.discard(tid)
        self.eta.end(tid, min(1.0, self.at_step.get(tid, 0) / self.steps[tid]))  # a diverged trial did a share
        self.at_step[tid] = self.steps[tid]
        return tid

    def on_trial_complete(self, iteration, trials, trial, **info):
        tid = self._finish(trial)
        last = self.last.get(tid, {})
        if last.get("not_started"):  # past --stop-launching-at: out of this run's count and FLOPs
            self.progress.console.print(f"not started {tid}{self.labels[tid]}: past the launch deadline",
                                        highlight=False)
            for table in (self.flops, self.steps, self.at_step):
                table.pop(tid, None)
            self.eta.drop(tid)
            self.progress.update(self.task, total=sum(self.flops.values()) or 1.0)
            self._refresh()
            return
        self.done += 1
        loss, status = last.get("val_loss"), last.get("status", "done")
        if status == "diverged":  # its own line came with the result; a trial that ends diverged is not "done"
            self.progress.console.print(f"[yellow]diverged[/] {tid}{self.labels[tid]}: it stopped at step "
                                        f"{last.get('step')}", highlight=False)
        else:
            self.progress.console.print(f"done {tid}{self.labels[tid]}" + (f": val loss {loss:.3f}" if loss else ""),
                                        highlight=False)
        self._refresh(ended=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        tid = self._finish(trial)
        self.failed += 1
        self.progress.console.print(f"[red]failed[/] {tid}{self.labels[tid]} (its error: `sweep status`)")
        self._refresh(ended=True)


class ReportCallback(Callback):
    """`sweep run --report`: `sweep report` of the sweep after each trial that ends, in a process
    of its own (the run goes on meanwhile), so <sweep>/report/ grows as trials finish. One at a
    time: a trial that ends while one draws queues one more; the run's end waits for the last."""

    def __init__(self, uri: str, console, command: list[str] | None = None):
        self.command = command or [sys.executable, "-m", "sweep.cli", "report", uri]
        self.console, self.uri = console, uri
        self.proc: subprocess.Popen | None = None
        self.log = None
        self.queued, self.runs = False, 0

    def __getstate__(self) -> dict:
        return {}  # as ProgressCallback: the process handle stays here

    def _reap(self) -> bool:
        """True when no report is drawing (the last one's failure named)."""
        if self.proc is None:
            return True
        if self.proc.poll() is None:
            return False
        if self.proc.returncode != 0:
            self.console.print(f"warning: the report after a trial failed (exit {self.proc.returncode}; its output: "
                               f"{self.log.name}); the results are unaffected: sweep report {self.uri}",
                               highlight=False, markup=False)
        self.log.close()
        if self.proc.returncode == 0:
            os.unlink(self.log.name)
        self.proc = None
        return True

    def _draw(self) -> None:
        if not self._reap():
            self.queued = True
            return
        self.queued = False
        self.log = tempfile.NamedTemporaryFile(prefix="sweep-report-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.runs += 1

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._draw()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.queued and self._reap():
            self._draw()

    def on_experiment_end(self, trials, **info):
        self.finish()

    def finish(self) -> None:
        """Wait for the report drawing, then draw the queued one, if any."""
        if self.proc is not None:
            self.proc.wait()
        if self.queued:
            self._draw()
            self.proc.wait()
        self._reap()
