"""Results -> numbers -> pictures for the privileged-basis scaling study.

    import analysis
    r = analysis.load("results/scaling")          # lazy Polars tables
    analysis.layer_profile(r, "kurtosis").collect()
    analysis.write_report("results/scaling")      # fits + charts + index.html

Never imports torch or ray. Only ``analysis.load`` (and so polars) is imported with the
package; the other submodules (numpy, altair, vl-convert) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported eagerly so that ``analysis.load`` is the function, not the submodule of that name.
from analysis.load import NoSweepError, Results, config_label, load

_EXPORTS = {
    "queries": [
        "basis_comparison",
        "best_lr",
        "best_lr_results",
        "layer_profile",
        "loss_table",
        "metric_over_training",
        "onset",
        "per_trial",
        "quant_penalty",
        "scale_table",
        "sql",
        "versus",
    ],
    "identity": ["with_ids"],
    "fits": [
        "ExponentComparison",
        "PowerLawFit",
        "compare_exponents",
        "fit_curves",
        "fit_each",
        "fit_groups",
        "fit_power_law",
    ],
    "report": ["ReportResult", "write_report"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted([*_WHERE, "NoSweepError", "Results", "config_label", "load"])


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    if name in ("charts", "fits", "identity", "queries", "report"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
