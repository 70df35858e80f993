"""Every docstring example of the package runs and prints what it says.

The examples are documentation: a stale one (a number that is no longer what the code
prints) misleads a reader as much as a wrong page.  Each module is imported and its
examples run with :func:`doctest.testmod`; a module that needs an optional dependency
missing here (numba, torch, jax, matplotlib) is skipped with that reason.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import pkgutil
import re

import pytest

import mha_symbolic

OPTIONAL = {"numba", "torch", "jax", "matplotlib"}
#: modules that run the program when imported
NOT_IMPORTED = {"mha_symbolic.__main__"}

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(mha_symbolic.__path__, "mha_symbolic.")
    if m.name not in NOT_IMPORTED)


def _import(name: str) -> object:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs the optional {exc.name}")
        raise


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = _import(name)
    src = inspect.getsource(module)
    for dep in sorted(OPTIONAL):
        if (re.search(rf">>> .*\b(import {dep}|from {dep}\b)", src)
                and importlib.util.find_spec(dep) is None):
            pytest.skip(f"{name}'s examples need the optional {dep}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False,
                             report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name}"


def test_the_package_has_examples() -> None:
    """The walk finds the wings and their examples (a walk that found nothing would
    pass every test above)."""
    assert len(MODULES) > 100
    attempted = sum(doctest.testmod(importlib.import_module(n), verbose=False,
                                    report=False).attempted
                    for n in ("mha_symbolic.oracle.conventions", "mha_symbolic.testing.tolerance",
                              "mha_symbolic.textbook.examples"))
    assert attempted >= 10
