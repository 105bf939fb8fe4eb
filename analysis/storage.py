"""Results paths and URIs, re-exported for analysis: they live in resultstore/uri.py."""

from resultstore.uri import *  # noqa: F401,F403
from resultstore.uri import __all__  # noqa: F401
