"""Altair chart builders: a query's DataFrame in, a paper-ready Chart out, no I/O.

Every builder takes the frame of the matching query in ``analysis.queries`` (or fit curves
from ``analysis.fits.fit_curves``), and returns a chart sized for one paper column (about
300 px = 3.3 in at 72 dpi; faceted charts grow by panel). Optimisers always get the same
colour-blind-safe Okabe-Ito colour (``OPTIMIZER_COLORS``); the other config axes (norm,
rotation) become facets or line dashes. ``configure=False`` returns the chart without the
shared theme so it can still be layered or concatenated; apply ``apply_theme`` at the end.
Every chart is titled, with a caption saying what its marks are under the title, inside the
image (``caption=`` replaces a builder's own; ``with_caption`` replaces it on a built chart).
"""

from __future__ import annotations

from analysis.charts import style
from analysis.charts.layers import with_caption
from analysis.charts.size import *  # noqa: F403
from analysis.charts.size import __all__ as _size
from analysis.charts.sharing import *  # noqa: F403
from analysis.charts.sharing import __all__ as _sharing
from analysis.charts.style import *  # noqa: F403
from analysis.charts.training import *  # noqa: F403
from analysis.charts.training import __all__ as _training
from analysis.charts.versus import *  # noqa: F403
from analysis.charts.versus import __all__ as _versus

__all__ = sorted({*style.__all__, *_sharing, *_size, *_training, *_versus, "with_caption"})
