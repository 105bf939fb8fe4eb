"""What a report section is, and what it is handed.

- ``Section``: one part of the report: its name, the metrics it reads, whether it needs
  finished trials, and ``add(ctx)``, which builds its charts, captions, notes and tables.
- ``Context``: what every section is handed: the options, the views of the results (every
  step, the final step, the best-lr points), the model sizes, and the content built so far.
- ``ReportContent``: everything the report shows, computed (``render`` turns it into bytes).
- ``ReportTable``: one table a section adds (``ctx.table``): written as ``<name>.csv`` and, with a
  title, listed in index.html, in the order the sections add them.

``content.SECTIONS`` lists the sections in display order; ``content.build`` loops over it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analysis.labels import SITE_NAMES
from analysis.load import Results
from analysis.multiplicity import PrimaryContrast
from analysis.report.fits import FitSpec
from analysis.report.table import Table

__all__ = ["Context", "Options", "ReportContent", "ReportTable", "Section", "site_title", "varies"]


@dataclass(frozen=True)
class ReportTable:
    """A table of the report. ``frame`` is written as ``<name>.csv`` (every column) where it has
    rows, or always with ``keep_empty``. With a ``title`` it is also listed in index.html: the
    title, ``caption`` (with a link to the CSV unless ``link`` is False) and ``shown(frame)``, the
    readable subset of its columns (where it has rows)."""

    name: str
    frame: pl.DataFrame
    caption: str = ""
    title: str = ""
    shown: Callable[[pl.DataFrame], Table] | None = None
    link: bool = True
    keep_empty: bool = False


def _table(name: str, empty: Callable[[], Any] = pl.DataFrame) -> property:
    """``content.<name>``: the frame of the table ``name`` (``empty()`` where no section added it)."""
    return property(lambda self: self.tables[name].frame if name in self.tables else empty(),
                    doc=f"The {name} table's frame ({name}.csv).")


@dataclass
class ReportContent:
    """Everything the report shows, computed; ``charts[name]`` is an Altair chart with its
    caption in ``captions[name]``, ``tables[name]`` a ``ReportTable`` (each in display order)."""

    name: str
    path: str
    x: str
    sizes: list[Any] = field(default_factory=list)
    n_runs: int = 0
    n_done: int = 0
    n_failed: int = 0
    n_diverged: int = 0
    done: pl.DataFrame = field(default_factory=pl.DataFrame)
    failures: pl.DataFrame = field(default_factory=pl.DataFrame)
    charts: dict[str, Any] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)
    tables: dict[str, ReportTable] = field(default_factory=dict)
    skipped: pl.DataFrame = field(default_factory=pl.DataFrame)
    best_lr: pl.DataFrame = field(default_factory=pl.DataFrame)
    """The best-lr selection every section reads (the best_lr table is its CSV columns)."""
    check_summary: pl.DataFrame = field(default_factory=pl.DataFrame)
    """The invariance checks: shown in index.html, no CSV."""
    notes: list[str] = field(default_factory=list)

    fits = _table("fits", lambda: pl.DataFrame(schema={"fit": pl.String}))
    comparisons = _table("comparisons")
    family_comparisons = _table("family_comparisons")
    levels = _table("levels")
    family_levels = _table("family_levels")
    privilege = _table("privilege")
    optimum = _table("optimum")
    optimum_slopes = _table("optimum_slopes")
    optimum_families = _table("optimum_families")
    twins = _table("twins")
    lr_fit = _table("lr_fit")
    onsets = _table("onset", lambda: None)

    @property
    def best_lr_csv(self) -> pl.DataFrame:
        """``best_lr`` as written to best_lr.csv (the ladder joined into one string)."""
        keep = [c for c in _BEST_COLUMNS if c in self.best_lr.columns]
        return self.best_lr.select(keep).with_columns(pl.col("lrs").cast(pl.List(pl.String)).list.join(" "))


_BEST_COLUMNS = (
    "optimizer", "norm", "rotation_label", "d_model", "n_layers", "params_non_embedding", "lr",
    "mean", "ci_low", "ci_high", "n", "lrs", "n_lrs", "edge", "tie", "runner_up_lr", "runner_up_margin",
    "shared_seeds", "diverged",
    "flag", "config_id", "tuning_id",
)  # fmt: skip


@dataclass(frozen=True)
class Options:
    """The report's options, as ``write_report`` takes them."""

    x: str = "params_non_embedding"
    fit_specs: Sequence[FitSpec] = ()
    n_boot: int = 1000
    seed: int = 0
    confidence: float = 0.95
    onset_threshold: float = 3.5
    primary: PrimaryContrast | None = None


class Charts(dict):
    """The charts built so far, name -> (chart, caption), in display order; tells
    ``on_chart`` of each as it is added (to start rendering it)."""

    def __init__(self, on_chart: Callable[[str, Any], None]) -> None:
        super().__init__()
        self.on_chart = on_chart

    def __setitem__(self, name: str, chart_and_caption: tuple[Any, str]) -> None:
        super().__setitem__(name, chart_and_caption)
        self.on_chart(name, chart_and_caption[0])


@dataclass
class Context:
    """What a section is handed. ``results``: the final step of each metric series (every
    step where no trial finished); ``history``: every eval step; ``main`` and
    ``main_history``: the same at the best-lr points (``selection.best_lr_results``; None
    where no trial finished). ``have``: the (site, basis, metric) triples recorded.
    ``shown`` says in a caption which points the main charts show."""

    options: Options
    content: ReportContent
    built: Charts
    say: Callable[[str], None]
    runs: pl.DataFrame
    done: pl.DataFrame
    results: Results
    history: Results
    x: str
    sizes: list[Any]
    facet: str | None
    have: set[tuple[str, str, str]]
    main: Results | None = None
    main_history: Results | None = None
    tuned: bool = False
    shown: str = ""
    line: str = "tuned_line_id"
    """One config across sizes, at each size's best lr: the unit every fit is made per."""

    @property
    def confidence(self) -> float:
        return self.options.confidence

    @property
    def notes(self) -> list[str]:
        return self.content.notes

    def chart(self, name: str, chart: Any, caption: str) -> None:
        """Add a chart, in display order, with its caption."""
        self.built[name] = (chart, caption)

    def table(self, name: str, frame: pl.DataFrame, caption: str = "", *, title: str = "",
              shown: Callable[[pl.DataFrame], Table] | None = None, link: bool = True, keep_empty: bool = False) -> None:
        """Add a table (``ReportTable``), in display order."""
        self.content.tables[name] = ReportTable(name, frame, caption, title, shown, link, keep_empty)

    def retable(self, name: str, frame: pl.DataFrame) -> None:
        """The table ``name`` with a new frame, in its place, with its caption and listing."""
        self.content.tables[name] = dataclasses.replace(self.content.tables[name], frame=frame)

    def note(self, text: str) -> None:
        self.content.notes.append(text)


@dataclass(frozen=True)
class Section:
    """One part of the report. ``add(ctx)`` builds its charts (``ctx.chart``), notes
    (``ctx.note``) and tables (``ctx.table``). ``metrics``: the metrics it reads
    (the report keeps only those in its one pass over the metrics table); ``fit_metrics``: it
    also reads the fit specs' metrics. ``needs_done``: it runs only where some trial finished."""

    name: str
    add: Callable[[Context], None]
    metrics: tuple[str, ...] = ()
    fit_metrics: bool = False
    needs_done: bool = True

    def reads(self, options: Options) -> set[str]:
        """The metrics this section reads under ``options``."""
        fitted = {s.metric for s in options.fit_specs if s.site is not None} if self.fit_metrics else set()
        return {*self.metrics, *fitted}


def metrics_read(sections: Iterable[Section], options: Options) -> list[str]:
    """Every metric some section reads, sorted."""
    return sorted(set().union(*(s.reads(options) for s in sections)))


def varies(df: pl.DataFrame, col: str) -> bool:
    """Whether ``col`` takes two or more values in ``df``."""
    return col in df.columns and df.get_column(col).drop_nulls().n_unique() > 1


def site_title(site: str, basis: str | None) -> str:
    """E.g. ``Residual stream (stored basis)``, ``MLP input (computation basis)``."""
    name = SITE_NAMES.get((site, basis or ""), site).split(",")[0]
    return f"{name[:1].upper()}{name[1:]} ({basis} basis)" if basis else name
