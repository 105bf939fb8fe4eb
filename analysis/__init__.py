"""Results -> numbers -> pictures for the privileged-basis scaling study.

    import analysis
    r = analysis.load("results/scaling")          # lazy Polars tables
    analysis.layer_profile(r, "kurtosis").collect()
    analysis.write_report("results/scaling")      # fits + charts + index.html

Never imports torch or ray. The light modules (load, schema, labels, identity, queries, selection,
power_law, fits: polars and numpy; scipy inside the fits that use it) are imported with the package and their ``__all__`` re-exported; the heavy
ones (charts, report: Altair, vl-convert) load on first use (``analysis.charts``,
``analysis.write_report``).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from analysis import fits, identity, labels, power_law, queries, schema, selection
from analysis import load as _load_module  # the submodule; ``analysis.load`` is its function
from analysis.fits import *  # noqa: F403
from analysis.identity import *  # noqa: F403
from analysis.labels import *  # noqa: F403
from analysis.load import *  # noqa: F403
from analysis.power_law import *  # noqa: F403
from analysis.queries import *  # noqa: F403
from analysis.schema import *  # noqa: F403
from analysis.selection import *  # noqa: F403

if TYPE_CHECKING:  # seen by type checkers; imported on first use at run time
    from analysis import charts, report
    from analysis.report import *  # noqa: F403

_EAGER = (_load_module, schema, labels, identity, queries, selection, power_law, fits)
_LAZY = ("charts", "report")
__all__ = sorted({*(n for m in _EAGER for n in m.__all__), *_LAZY})
"""The eager modules' names and the lazy modules themselves; ``report``'s own ``__all__``
(``write_report``, ``ReportResult``, ...) resolves on first use through ``__getattr__``."""


def __getattr__(name: str) -> Any:
    # A submodule not yet imported (`from analysis import counts` inside the report's own
    # modules) is that submodule; resolving it through `report` would import the report
    # machinery half-way through its own import.
    if name in _LAZY or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    report = importlib.import_module(f"{__name__}.report")
    if name in report.__all__:
        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
