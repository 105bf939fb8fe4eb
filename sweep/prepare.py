"""Moved to study.corpus.prepare (beside the format it writes); this name stays for old imports."""
from study.corpus.prepare import *  # noqa: F401,F403
from study.corpus.prepare import __all__  # noqa: F401
