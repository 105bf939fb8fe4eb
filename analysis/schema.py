"""The results-store schema, re-exported for analysis: it lives in resultstore/schema.py."""

from resultstore.schema import *  # noqa: F401,F403
from resultstore.schema import __all__  # noqa: F401
