"""Package attributes whose module loads on first use (PEP 562).

A package lists what its heavy or rarely needed modules export; importing the package costs
only the rest, and the first ``package.name`` (or ``from package import name``) imports the
module and keeps the value in the package from then on:

    __getattr__ = lazy_attributes(__name__, {"serve_viewer": "_serve"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_attributes(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``where`` maps a name to its submodule."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
