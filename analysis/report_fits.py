"""Moved to ``analysis.report.fits``; this path stays for old imports."""
from analysis.report.fits import *  # noqa: F401,F403
