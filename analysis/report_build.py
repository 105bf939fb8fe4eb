"""Moved to ``analysis.report.content``; this path stays for old imports."""
from analysis.report.content import *  # noqa: F401,F403
from analysis.report.content import _quant_floor_note  # noqa: F401
