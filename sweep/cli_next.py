"""`sweep next`: what to run next for each lr ladder of a spec (sweep.ladder decides), and with
--out, those trials written as specs that `sweep run` takes."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from sweep.axes import axis
from sweep.cli_store import ResultsOpt, SpecArg, load, open_store
from sweep.console import bad_input, err, out, q, refuse

__all__ = ["next_ladders"]  # sweep.cli adds it as `sweep next`

_STYLE = {"waiting": "dim", "extend": "yellow", "seeds": "cyan", "complete": "green"}


def next_ladders(
    spec_path: SpecArg,
    results: ResultsOpt = "results",
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds wanted at each best lr, in all (the spec's "
                                       "own first, then the smallest unused; 1 to 1000).")] = 3,
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the next trials as specs into this "
                                                    "folder, one per model shape and kind (edges, seeds).")] = None,
    neighbours: Annotated[bool, typer.Option("--neighbours", help="Also seed the lr either side of an inside best "
                                             "(the fitted loss-optimal lr reads all three).")] = False,
) -> None:
    """What to run next for each lr ladder of the spec: one more lr beyond the edge where the best
    (lowest seed-mean final val loss) is the smallest or largest tried; more seeds at the best
    where it is strictly inside; nothing while a ladder's trials are unfinished."""
    from sweep.bounds import MAX_SEEDS, bounded
    from sweep.ladder import HEADER, next_specs, plan_next
    from sweep.spec_yaml import read_yaml
    from sweep.store_health import REPAIR, check as check_store

    refuse(bounded("--seeds", seeds, 1, MAX_SEEDS, why="seeds per best lr"))
    spec, trials = load(spec_path, unprepared_ok=True)
    if out_dir is not None:  # the one rule for written paths (resultstore.paths), then: a folder
        from resultstore.paths import output_problem

        refuse(output_problem("--out", str(out_dir)) or _out_problem(out_dir, HEADER))
    store = open_store(results, spec.name)
    health = check_store(store)
    refuse(health.refusal("next", store.uri) if health.damaged else None)
    for line in health.problems:
        err.print(f"[yellow]warning:[/] {q(line)}", highlight=False, soft_wrap=True)
    if health.problems:
        err.print(REPAIR, highlight=False)
    started = health.status.unfinished if health.status is not None else []
    ladders = plan_next(trials, health.runs, spec.grid.seed, seeds, started, neighbours)
    out.print(_table(spec.name, ladders))
    counts = {v: sum(lad.verdict == v for lad in ladders) for v in _STYLE}
    new = sum(len(lad.new) for lad in ladders)
    out.print(f"{len(ladders)} ladders: {counts['waiting']} waiting, {counts['extend']} to extend, {counts['seeds']} "
              f"to seed, {counts['complete']} complete · {new} trials next", highlight=False)
    if not new:
        return
    if out_dir is None:
        out.print("--out DIR writes them as specs for `sweep run`", highlight=False)
        return
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = (f"sweep next {spec_path} --results {results} --seeds {seeds}{' --neighbours' * neighbours} "
               f"--out {out_dir} ({stamp})")
    written = next_specs(read_yaml(spec_path)[0], spec.name, ladders, spec.grid.seed, command)
    clash = [s.name for s in written if (out_dir / s.name).exists() and not _ours(out_dir / s.name, HEADER)]
    if clash:  # checked for every file before any is written
        raise bad_input(f"--out {out_dir}: {', '.join(clash)} exist and were not written by `sweep next`; "
                        "move them or choose another folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    for s in written:
        (out_dir / s.name).write_text(s.text)
        out.print(f"wrote {q(str(out_dir / s.name))}: {len(s.trials)} trials · sweep run {out_dir / s.name} "
                  f"--results {results}", highlight=False)


def _out_problem(out_dir: Path, header: str) -> str | None:
    if out_dir.exists() and not out_dir.is_dir():
        return f"--out {out_dir}: is a file, not a folder"
    return None


def _ours(path: Path, header: str) -> bool:
    try:
        with path.open() as f:
            return f.readline().startswith(header)
    except (OSError, UnicodeDecodeError):
        return False


def _table(name: str, ladders) -> Table:
    table = Table(title=f"{name}: {len(ladders)} lr ladders (seed-mean final val loss per lr)")
    for col in ("model (d×L×h)", "ladder", "lr: val loss", "best", "next"):
        table.add_column(col, justify="right" if col == "best" else "left")
    for lad in ladders:
        m = lad.template.model
        points = "  ".join(
            (f"[bold]{lr:g}: {loss:.3f}[/]" if lr == lad.best else f"{lr:g}: {loss:.3f}") if loss is not None
            else f"{lr:g}: diverged" for lr, loss in lad.losses.items())
        table.add_row(axis("model").label(m), lad.label, points or "-",
                      f"{lad.best:g}" if lad.best is not None else "-",
                      f"[{_STYLE[lad.verdict]}]{lad.verdict}[/]: {lad.why}")
    return table
