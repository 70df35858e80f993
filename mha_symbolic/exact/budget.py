"""A budget of exact work shared by every computation of one worked-example file.

Each exact computation is bounded on its own (``engine.MAX_WORK`` terms, counted before
any arithmetic), but a file of 500 examples each just inside that limit would still
take minutes: the work of a file is the sum of its examples'.  While a file is loaded,
:func:`file_budget` holds a budget; the engine charges each computation's estimate
(:func:`charge`, called with the same count that is compared with ``MAX_WORK``, after
the entries were read and before any arithmetic) and the charge that would pass the
budget is refused with one line.  Outside a :func:`file_budget` nothing is counted.

>>> with file_budget(100, "f.toml"):
...     charge(60)
...     charge(60)
Traceback (most recent call last):
...
mha_symbolic.errors.SpecError: the examples of f.toml together would build or walk about 120 terms; ...
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ..errors import SpecError

__all__ = ["charge", "file_budget"]

_BUDGET: contextvars.ContextVar[list[object] | None] = contextvars.ContextVar(
    "mha_symbolic_file_budget", default=None)


@contextlib.contextmanager
def file_budget(limit: int, what: str) -> Iterator[None]:
    """Charge every exact computation inside the block against ``limit`` terms in all."""
    token = _BUDGET.set([0, limit, what])
    try:
        yield
    finally:
        _BUDGET.reset(token)


def charge(terms: int) -> None:
    """Count ``terms`` against the current file's budget (none: nothing happens)."""
    budget = _BUDGET.get()
    if budget is None:
        return
    spent, limit, what = budget
    assert isinstance(spent, int) and isinstance(limit, int)
    spent += terms
    budget[0] = spent
    if spent > limit:
        raise SpecError(f"the examples of {what} together would build or walk about {spent:,} "
                        f"terms; the limit for one file is {limit:,} (split the file into "
                        "smaller ones)")
