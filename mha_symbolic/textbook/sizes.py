"""Sizes written with a division, as books write them: ``n_embd/n_head``,
``d_model // h``, ``512/8``, read exactly and never evaluated as code.

A size is a product of at most four factors (a number or a name: ``h·d_v``,
``3*d_model``), optionally divided by another such product, with ``/`` or ``//``
(``(n_embd/n_head)`` may stand in parentheses).  Its value:

* numbers only: the quotient, which must be a whole number; ``//`` (Python's floor
  division) must divide too, since a head width that drops a remainder does not tile
  the model width.  :class:`NotWhole` says which quotient fails and by how much;
* with names: the SymPy quotient of positive integer symbols (``//`` read as ``/``: the
  sizes of an attention block divide, which is what ``//`` assumes of them).  A name
  that is one of the example's stated sizes (``d_model``, ``heads``, …) takes its value
  where one is given (:func:`size_value`'s ``known``).

>>> parse_size("n_embd // n_head")
((('n_embd',), ('n_head',)), True)
>>> size_value("d_model // heads", {"d_model": 384, "heads": 6})
64
>>> size_value("n_embd/n_head", {})
n_embd/n_head
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import ExampleFileError, MhaSymbolicError
from ..exact.spec import MAX_DIM

__all__ = ["SIZE_KEYS", "NotWhole", "is_division", "parse_size", "resolve_divisions", "size_value"]

_FACTOR = r"(?:\d{1,10}|[A-Za-z_]\w{0,31})"
_PRODUCT = rf"{_FACTOR}(?:\s*[·*]\s*{_FACTOR}){{0,3}}"
_DIVISION = re.compile(rf"^\(?\s*(?P<num>{_PRODUCT})\s*(?P<op>//|/)\s*"
                       rf"(?P<den>{_PRODUCT}|\(\s*{_PRODUCT}\s*\))\s*\)?$")
_PLAIN = re.compile(rf"^{_PRODUCT}$")


class NotWhole(MhaSymbolicError, ValueError):
    """A numeric quotient in a size that is not a whole number (the book's slip)."""


def is_division(text: Any) -> bool:
    """Whether ``text`` is a size with a division (``a/b``, ``a // b``)."""
    return isinstance(text, str) and len(text) <= 200 and _DIVISION.match(text.strip()) is not None


def _factors(product: str) -> tuple[str, ...]:
    return tuple(f.strip() for f in re.split(r"[·*]", product.strip("() \t")))


def parse_size(text: str) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], bool] | None:
    """((numerator factors, denominator factors), floor division?) of a size with a
    division, or None for any other text."""
    m = _DIVISION.match(text.strip()) if isinstance(text, str) and len(text) <= 200 else None
    if m is None:
        return None
    return (_factors(m.group("num")), _factors(m.group("den"))), m.group("op") == "//"


def size_value(text: str, known: dict[str, Any]) -> Any:
    """The value of a size with or without a division: an int when every factor is a
    number (or a name in ``known`` with a number), else a SymPy expression.  Raises
    :class:`NotWhole` for a numeric quotient that does not divide."""
    import sympy as sp

    found = parse_size(text)
    parts: tuple[tuple[str, ...], tuple[str, ...]]
    if found is None:
        if not isinstance(text, str) or not _PLAIN.match(text.strip()):
            raise ValueError(f"not a size: {text!r}")
        parts, floor = (_factors(text), ()), False
    else:
        parts, floor = found

    def factor(f: str) -> Any:
        if f.isdigit():
            return int(f)
        v = known.get(f)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, sp.Basic):
            return v
        return sp.Symbol(f, integer=True, positive=True)

    num = sp.Mul(*[factor(f) for f in parts[0]])
    den = sp.Mul(*[factor(f) for f in parts[1]])
    if den == 0:
        raise NotWhole(f"{text.strip()}: division by zero")
    if num.is_Integer and den.is_Integer:
        n, d = int(num), int(den)
        if n % d:
            shown = f"{n} // {d}" if floor else f"{n}/{d}"
            named = "" if all(f.isdigit() for f in parts[0] + parts[1]) else f" ({text.strip()})"
            raise NotWhole(f"{shown}{named} does not divide: {n} = {n // d}·{d} + {n % d}, "
                           f"so the quotient {sp.Rational(n, d)} is not a whole number of rows "
                           "or columns")
        return n // d
    return num / den


#: The size keys of a worked example a quotient may stand for and name
#: (``d_k = "d_model // heads"``).
SIZE_KEYS = ("n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim", "vdim")


def resolve_divisions(dims: dict[str, Any], options: dict[str, Any], at: Any,
                      show: Any = repr) -> None:
    """A worked example's sizes written as a quotient (``d_k = "d_model // heads"``,
    ``d_v = "n_embd/n_head"``) take their value, in place: names of the example's other
    sizes take those sizes (a size that is itself a quotient is not referred to), other
    names stay symbols; a numeric quotient must divide.  ``at(key)`` is the key's place
    for a message, ``show`` how a value is echoed in it."""
    import sympy as sp

    tables = [dims, options]
    known = {k: (v if isinstance(v, int) else sp.Symbol(v, integer=True, positive=True)
                 if isinstance(v, str) else v)
             for t in tables for k, v in t.items() if k in SIZE_KEYS and not is_division(v)}
    for t in tables:
        for k, v in list(t.items()):
            if k in SIZE_KEYS and is_division(v):
                try:
                    value = size_value(v, known)
                except NotWhole as exc:
                    raise ExampleFileError(f"{at(k)}: {k}={show(v)}: {exc}") from None
                if isinstance(value, int) and not 1 <= value <= MAX_DIM:
                    raise ExampleFileError(f"{at(k)}: {k}={show(v)} = {value} must be from 1 "
                                           f"to {MAX_DIM:,}")
                t[k] = value
