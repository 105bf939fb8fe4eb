"""Optional packages (the [track] and [data] extras): imported where they are used, and named,
with the extra that installs them, when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["need"]


def need(module: str, extra: str, error: type[Exception], context: str = "") -> ModuleType:
    """`module`, imported; else `error` with one line (after `context`) naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise error(f"{context}the {module} package is not installed "
                    f"(pip install 'privileged-bases-sweep[{extra}]')") from None
