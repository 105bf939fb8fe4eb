"""Live progress for `sweep run`: a Ray Tune callback driving a rich progress bar.

The bar is weighted by each trial's training FLOPs, so its ETA means something when model sizes
differ by 100x. Where the console is not a terminal (a log file under nohup, a batch job), rich
draws no bar, so the same progress is printed as a plain line at most every `every_s` seconds.
Imported only when a sweep runs (it imports Ray)."""

from __future__ import annotations

import time

from ray.tune import Callback
from rich.progress import Progress

from analysis.labels import labels_for
from study.config import TrialConfig
from sweep.console import duration

__all__ = ["ProgressCallback"]

class ProgressCallback(Callback):
    def __init__(self, trials: list[TrialConfig], progress: Progress, sweep_trials: list[TrialConfig] | None = None,
                 every_s: float = 600.0):
        """`trials`: those to run; `sweep_trials` (default: the same): the whole grid, whose
        varying axes the labels name, so a rerun of one lr of a ladder still says its lr.
        `every_s`: the least time between two plain progress lines where there is no terminal."""
        self.flops = {t.trial_id: t.flops_per_token * t.total_tokens for t in trials}
        self.steps = {t.trial_id: t.total_steps for t in trials}
        self.labels = {tid: f" ({label})" if label else "" for tid, label in labels_for(sweep_trials or trials).items()}
        self.last: dict[str, dict] = {}
        self.progress = progress
        self.task = progress.add_task("starting Ray", total=sum(self.flops.values()) or 1.0)
        self.done, self.failed, self.running, self.at_step = 0, 0, set(), {}
        self.every_s, self.started = every_s, time.monotonic()
        self.printed_at = self.started

    def __getstate__(self) -> dict:
        return {}  # Tune pickles its callbacks with the experiment; the live console stays here

    def _refresh(self) -> None:
        completed = sum(self.flops[t] * min(1.0, s / self.steps[t]) for t, s in self.at_step.items())
        failed = f" · [red]{self.failed} failed[/]" if self.failed else ""
        self.progress.update(self.task, completed=completed, description=(
            f"{self.done}/{len(self.flops)} trials done · {len(self.running)} running{failed}"))
        if not self.progress.console.is_terminal and time.monotonic() - self.printed_at >= self.every_s:
            self.printed_at = time.monotonic()
            task = next(t for t in self.progress.tasks if t.id == self.task)
            share = task.completed / task.total if task.total else 0.0
            # rich's own estimate needs updates within 30 s of each other; trials report every few minutes
            left = (self.printed_at - self.started) * (1 - share) / share if share > 0 else None
            self.progress.console.print(
                f"{time.strftime('%H:%M')} {self.done}/{len(self.flops)} trials done · {len(self.running)} running"
                f"{f' · {self.failed} failed' if self.failed else ''} · {task.percentage:.0f}% of the FLOPs"
                + (f" · about {duration(left)} left at this rate" if left else ""), highlight=False, markup=False)

    @staticmethod
    def _id(trial) -> str:
        return trial.config["point"]["trial_id"]

    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(self._id(trial))
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
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        tid = self._finish(trial)
        self.failed += 1
        self.progress.console.print(f"[red]failed[/] {tid}{self.labels[tid]} (its error: `sweep status`)")
        self._refresh()
