"""Moved to ``analysis.report.sae``; this path stays for old imports."""
from analysis.report.sae import *  # noqa: F401,F403
