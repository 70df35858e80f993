"""numpy's integer draws, read from the text a book writes and replayed with numpy.

``np.random.randint`` (the legacy ``RandomState`` after ``np.random.seed(s)``) and
``rng.integers`` (a ``Generator`` from ``np.random.default_rng(s)``) take their bounds,
size and dtype in several spellings; every one a book writes is read here, without
evaluating anything:

* ``randint(high, size=…)`` (also ``np.random.randint``, ``random.randint``,
  ``rs.randint``, ``rng.integers``: the prefix is read and dropped) draws from
  [0, high); ``randint(low, high, size)`` from [low, high) (``high=None`` or absent: [0, low));
* ``integers(high, size=…)``, ``integers(low, high, size, dtype=…, endpoint=True)``
  (``endpoint=True``: [low, high] closed);
* the size as ``size=(3, 3)``, ``size=[3, 3]``, ``size=3`` or a positional third
  argument; keywords ``low=``, ``high=``, ``size=``, ``dtype=`` (and ``endpoint=`` for
  ``integers``);
* the dtype as ``int``, ``bool``, ``np.int8`` … ``np.int64``, ``np.uint8`` …
  ``np.uint64`` (also ``numpy.``-prefixed or quoted, ``"int32"``).  ``int`` is numpy's
  default integer ``np.int_`` (int64 where numpy ≥ 2 runs, and on 64-bit Linux and
  macOS with numpy 1): legacy ``randint`` consumes the bit stream differently for each
  dtype, so the dtype is part of the recipe.

The size is bounded (:data:`MAX_ENTRIES` entries, 1 to 4 axes) before anything is
drawn, and bounds are at most 20 digits; numpy itself refuses bounds outside the dtype
(``high is out of bounds for int8``) or an empty range (``low >= high``), and that
refusal is reported as the file's error.

>>> parse_integer_draw("randint(3, size=(3, 3))")
IntegerDraw(fn='randint', low=0, high=3, size=(3, 3), dtype='int64', endpoint=False)
>>> parse_integer_draw("integers(-5, 5, (2,), dtype=np.int8, endpoint=True)")
IntegerDraw(fn='integers', low=-5, high=5, size=(2,), dtype='int8', endpoint=True)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ExampleFileError

__all__ = ["MAX_ENTRIES", "IntegerDraw", "parse_integer_draw", "replay_integer_draw"]

MAX_ENTRIES = 65_536
#: dtype spellings → numpy's name for it; "int" is np.int_ (see the module's text)
_DTYPES = {"int": "int64", "bool": "bool", **{t: t for t in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}}
_INT = re.compile(r"^[+-]?[0-9]{1,20}$")
_SIZE = re.compile(r"^[(\[]\s*([0-9]{1,6}(?:\s*,\s*[0-9]{1,6})*)?\s*,?\s*[)\]]$")
#: the call, with the module or generator it is made on as the book writes it
#: (``np.random.randint``, ``random.randint`` after ``from numpy import random``,
#: ``rng.integers``); the recipe's seed key says which generator it is
_CALL = re.compile(r"^\s*(?:[A-Za-z_]\w{0,31}\s*\.\s*){0,3}(?P<fn>randint|integers)\s*\("
                   r"(?P<args>[^()]*(?:\([^()]*\)[^()]*)*|[^()]*(?:\[[^\]]*\][^()]*)*)\)\s*$")
_NAMES = {"randint": ("low", "high", "size", "dtype"),
          "integers": ("low", "high", "size", "dtype", "endpoint")}


@dataclass(frozen=True)
class IntegerDraw:
    """One integer draw: the half-open (or, ``endpoint``, closed) range, the shape and
    numpy's dtype name."""

    fn: str
    low: int
    high: int
    size: tuple[int, ...]
    dtype: str
    endpoint: bool

    @property
    def entries(self) -> int:
        return math.prod(self.size)


def _split(args: str) -> list[str]:
    """Arguments split at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in args:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _bad(text: str, why: str) -> ExampleFileError:
    return ExampleFileError(f"draw {text[:80]!r}: {why}")


def parse_integer_draw(call: str) -> IntegerDraw:
    """The draw ``randint(…)`` or ``integers(…)`` (the right side of ``TARGET = …``)."""
    m = _CALL.match(call) if isinstance(call, str) and len(call) <= 200 else None
    if m is None:
        raise _bad(str(call), "not randint(…) or integers(…) with numbers, a size and a dtype")
    fn = m.group("fn")
    names = _NAMES[fn]
    got: dict[str, str] = {}
    positional = True
    for k, arg in enumerate(_split(m.group("args"))):
        key, eq, val = arg.partition("=")
        if eq and re.fullmatch(r"\s*[a-z_]+\s*", key):
            key, val = key.strip(), val.strip()
            positional = False
        elif not positional:
            raise _bad(call, "a positional argument after a keyword")
        else:
            if k >= len(names):
                raise _bad(call, f"too many arguments; {fn} takes {', '.join(names)}")
            key, val = names[k], arg.strip()
        if key not in names:
            raise _bad(call, f"unknown argument {key!r}; {fn} takes {', '.join(names)}")
        if key in got:
            raise _bad(call, f"{key} given twice")
        got[key] = val

    def bound(key: str) -> int | None:
        v = got.get(key)
        if v is None or v == "None":
            return None
        if not _INT.match(v):
            raise _bad(call, f"{key}={v[:30]!r} must be an integer (at most 20 digits)")
        return int(v)

    low, high = bound("low"), bound("high")
    if low is None:
        raise _bad(call, f"{fn} needs a bound")
    if high is None:
        low, high = 0, low
    size_text = got.get("size")
    if size_text is None or size_text == "None":
        raise _bad(call, "give size= (a single number is not a matrix input)")
    size: tuple[int, ...]
    if re.fullmatch(r"[0-9]{1,6}", size_text):
        size = (int(size_text),)
    elif (s := _SIZE.match(size_text)) and s.group(1):
        size = tuple(int(x) for x in s.group(1).split(","))
    else:
        raise _bad(call, f"size={size_text[:30]!r} must be a number or a tuple of numbers")
    if not 1 <= len(size) <= 4 or any(n < 1 for n in size) or math.prod(size) > MAX_ENTRIES:
        raise _bad(call, f"size must have 1 to 4 positive sizes and at most {MAX_ENTRIES} entries")
    dt = got.get("dtype", "int").strip("'\"")
    dt = re.sub(r"^(?:np|numpy)\.", "", dt)
    if dt not in _DTYPES:
        raise _bad(call, f"dtype={dt[:30]!r}: one of int, bool, np.int8 … np.int64, np.uint8 … "
                   "np.uint64")
    endpoint_text = got.get("endpoint", "False")
    if endpoint_text not in ("True", "False"):
        raise _bad(call, "endpoint= must be True or False")
    return IntegerDraw(fn, low, high, size, _DTYPES[dt], endpoint_text == "True")


def replay_integer_draw(gen: Any, d: IntegerDraw, text: str) -> Any:
    """The draw made with numpy's generator ``gen`` (a ``RandomState`` for ``randint``,
    a ``Generator`` for ``integers``): an int64 array (bool draws as 0/1)."""
    import numpy as np

    dtype = np.dtype(d.dtype)
    try:
        if d.fn == "randint":
            out = gen.randint(d.low, d.high, size=d.size, dtype=dtype)
        else:
            out = gen.integers(d.low, d.high, size=d.size, dtype=dtype, endpoint=d.endpoint)
    except (ValueError, OverflowError) as exc:  # numpy's own refusal: bounds vs dtype, empty range
        raise _bad(text, f"numpy refuses it: {str(exc)[:100]}") from None
    if out.dtype == np.uint64 and out.size and int(out.max()) > 2**63 - 1:
        return np.array(out.tolist(), dtype=object)  # beyond int64: kept exact as Python ints
    return out.astype(np.int64)
