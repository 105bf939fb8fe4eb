"""Results -> numbers -> pictures for the privileged-basis scaling study.

    import analysis
    r = analysis.load("results/scaling")          # lazy Polars tables
    analysis.layer_profile(r, "kurtosis").collect()
    analysis.write_report("results/scaling")      # fits + charts + index.html

Never imports torch or ray. The light modules (load, labels, identity, queries, selection,
power_law, fits: polars and numpy; scipy inside the fits that use it) are imported with the
package and their names listed below; the heavy ones (charts, report: Altair, vl-convert) load on
first use (``analysis.charts``, ``analysis.write_report``).

``analysis.load`` is the function ``load``, not the module of that name: the explicit
``from analysis.load import load`` below binds it over the submodule attribute the import sets.
The module is ``sys.modules["analysis.load"]``; ``from analysis.load import Results`` reads it
as usual (only ``import analysis.load as m`` would give the function).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from analysis import fits, identity, labels, power_law, queries, selection
from analysis.fits import (
    FamilyComparison, compare_exponents, compare_families, compare_family_values, fit_curves, fit_each,
    fit_groups, fits_table,
)  # fmt: skip
from analysis.identity import ID_COLUMNS, science_hash, with_ids
from analysis.labels import BASIS_SERIES, SITE_NAMES, label_axes, trial_label, trial_labels, varying_axes
from analysis.load import (
    CONFIG_ID,
    SIZE_COLUMNS,
    NoSweepError,
    Results,
    axis_labels,
    config_label,
    find_sweep,
    label_columns,
    load,
    rotation_label,
)
from analysis.power_law import (
    ExponentComparison,
    PowerLawFit,
    between_seed_halfwidth,
    fit_power_law,
    n_label,
    seed_exponents,
    t_critical,
)
from analysis.queries import (
    CONTROL,
    QueryError,
    basis_comparison,
    carried,
    config_keys,
    layer_profile,
    loss_table,
    metric_over_training,
    per_trial,
    runs_table,
    scale_table,
    sql,
    summarise,
)
from analysis.selection import (
    best_lr, best_lr_results, group_size_table, line_labels, onset, quant_penalty, unrotated_table, untuned_choices, versus,
)
from resultstore.schema import (
    ARROW,
    CHECKS_SCHEMA,
    CURVES_SCHEMA,
    DIMS_SCHEMA,
    FINISHED,
    METRICS_SCHEMA,
    RUNS_SCHEMA,
    SAE_SCHEMA,
    SCHEMAS,
    STATUSES,
    TABLES,
    UNSUCCESSFUL,
    Status,
)

if TYPE_CHECKING:  # seen by type checkers; imported on first use at run time
    from analysis import charts, report
    from analysis.report import DEFAULT_FITS, FitSpec, ReportResult, write_report

__all__ = [
    "ARROW",
    "BASIS_SERIES",
    "CHECKS_SCHEMA",
    "CONFIG_ID",
    "CONTROL",
    "CURVES_SCHEMA",
    "DIMS_SCHEMA",
    "ExponentComparison",
    "FamilyComparison",
    "FINISHED",
    "ID_COLUMNS",
    "METRICS_SCHEMA",
    "NoSweepError",
    "PowerLawFit",
    "QueryError",
    "RUNS_SCHEMA",
    "Results",
    "SAE_SCHEMA",
    "SCHEMAS",
    "SITE_NAMES",
    "SIZE_COLUMNS",
    "STATUSES",
    "Status",
    "TABLES",
    "UNSUCCESSFUL",
    "axis_labels",
    "basis_comparison",
    "best_lr",
    "best_lr_results",
    "between_seed_halfwidth",
    "carried",
    "charts",
    "compare_exponents",
    "compare_families",
    "compare_family_values",
    "config_keys",
    "config_label",
    "find_sweep",
    "fit_curves",
    "fit_each",
    "fit_groups",
    "fit_power_law",
    "n_label",
    "fits_table",
    "group_size_table",
    "label_axes",
    "label_columns",
    "layer_profile",
    "line_labels",
    "load",
    "loss_table",
    "metric_over_training",
    "onset",
    "per_trial",
    "quant_penalty",
    "report",
    "rotation_label",
    "runs_table",
    "scale_table",
    "science_hash",
    "seed_exponents",
    "sql",
    "summarise",
    "t_critical",
    "trial_label",
    "trial_labels",
    "unrotated_table",
    "untuned_choices",
    "varying_axes",
    "versus",
    "with_ids",
]
"""The light modules' names and the two heavy modules themselves; the report's own names
(``_FROM_REPORT``) resolve on first use through ``__getattr__`` and are not listed, as before."""

_LAZY_MODULES = ("charts", "report")
_FROM_REPORT = ("DEFAULT_FITS", "FitSpec", "ReportResult", "write_report")


def __getattr__(name: str) -> Any:
    # A submodule not yet imported (`from analysis import counts` inside the report's own
    # modules) is that submodule; resolving it through `report` would import the report
    # machinery half-way through its own import.
    if name in _LAZY_MODULES or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _FROM_REPORT:
        return getattr(importlib.import_module(f"{__name__}.report"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
