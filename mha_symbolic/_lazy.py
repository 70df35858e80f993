"""PEP 562 lazy re-exports, so that importing a package loads none of its modules
(and none of SymPy, python-flint, numpy, torch or jax) until a name is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any],
                                                                Callable[[], list[str]], list[str]]:
    """(``__getattr__``, ``__dir__``, ``__all__``) for ``package``, whose public
    ``names`` map to the submodule (relative to ``package``) that defines each."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__, sorted(names)
