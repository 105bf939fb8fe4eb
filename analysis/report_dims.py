"""Moved to ``analysis.report.dims``; this path stays for old imports."""
from analysis.report.dims import *  # noqa: F401,F403
