"""The values of a worked example's fields: input matrices (nested lists, or a pasted
torch/numpy printout), sizes and options, each checked as the file gives it.  Split from
:mod:`.examples`, which reads the file and builds the examples from these values."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from .._text import decimal_digits, echo, int_text
from ..errors import ClaimError, ExampleFileError
from ..exact.grammar import MAX_VALUE_DIGITS
from ..exact.spec import MAX_DIM
from .inputs import shape_of
from .sizes import is_division

__all__ = ["printout_matrix"]

_BIAS_PARTS = ("q", "k", "v", "o")


def _show(value: Any) -> str:
    """A value from a file for a message: short, quoted, safe for a terminal."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int_text(value)
    if isinstance(value, (list, dict)):
        return f"<a TOML {'array' if isinstance(value, list) else 'table'}>"
    return echo(repr(value), 40)[1:-1]


_MAX_INPUT_DEPTH = 4


def _is_printout(text: str) -> bool:
    from .printouts import looks_like_printout

    return looks_like_printout(text)


def printout_matrix(text: str, where: str) -> Any:
    """A pasted torch/numpy printout as an input: nested lists of its entries as printed
    (``"0.3367"`` keeps its digits, so ``inputs = "printed"`` reads its precision;
    ``True``/``False`` become booleans for masks).

    >>> printout_matrix("tensor([[ 0.3367,  0.1288]])", "query")
    [['0.3367', '0.1288']]
    """
    from .printouts import read_printout

    try:
        p = read_printout(text)
    except ClaimError as exc:
        raise ExampleFileError(f"{where}: {exc}".replace("claimed=", "")) from None

    def entry(e: str) -> Any:
        return {"True": True, "False": False}.get(e, e)

    flat = [entry(e) for e in p.entries]
    if not p.shape:
        raise ExampleFileError(f"{where}: a single number is not a matrix")

    def nest(items: list[Any], shape: tuple[int, ...]) -> Any:
        if len(shape) == 1:
            return items
        step = len(items) // shape[0]
        return [nest(items[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]

    return nest(flat, p.shape)


def _matrix_input(value: Any, where: str) -> Any:
    """Matrices stay as nested lists of TOML numbers/strings; the engine reads them exactly."""
    depth = 0
    v = value
    while isinstance(v, list):
        if not v:
            raise ExampleFileError(f"{where} is empty")
        v = v[0]
        depth += 1
    if depth == 0 or depth > _MAX_INPUT_DEPTH:
        raise ExampleFileError(f"{where} must be a vector or matrix (nested arrays; a batch or "
                               "per-head list adds a dimension)")

    shape = shape_of(value)

    def walk(x: Any, level: int, path: tuple[int, ...] = ()) -> None:
        if isinstance(x, list):
            if level >= depth:
                raise ExampleFileError(f"{where}: nested deeper than its first entry")
            if len(x) != shape[level]:
                # every reader slices rows by the first row's length (a ragged w_qkv
                # raised IndexError in the per-head split; found by the long fuzz run)
                n = len(x)
                raise ExampleFileError(
                    f"{where} must be rectangular: row {', '.join(map(str, path))} has {n} "
                    f"entr{'y' if n == 1 else 'ies'}, the first has {shape[level]}")
            for i, y in enumerate(x, 1):
                walk(y, level + 1, (*path, i))
        elif level != depth:
            raise ExampleFileError(f"{where}: entry {_show(x)} sits at a different depth than the "
                                   "first entry (ragged nesting)")
        elif isinstance(x, Fraction):
            pass
        elif isinstance(x, bool) or not isinstance(x, (int, float, str)):
            raise ExampleFileError(f"{where}: entry {_show(x)} is not a number or a number string")
        elif isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
            raise ExampleFileError(f"{where}: entry {_show(x)} is not a finite number")
        elif isinstance(x, int) and decimal_digits(x) > MAX_VALUE_DIGITS:
            raise ExampleFileError(f"{where}: entry {int_text(x)} has more than "
                                   f"{MAX_VALUE_DIGITS} digits")

    walk(value, 0)
    return value


def _dim(key: str, value: Any, where: str) -> Any:
    if key == "bias":
        if isinstance(value, dict):
            unknown = set(value) - set(_BIAS_PARTS)
            if unknown or not all(isinstance(v, bool) for v in value.values()):
                raise ExampleFileError(f"{where}: bias must be true, false or a table of "
                                       "q, k, v, o = true/false (as nn.Linear(..., bias=...))")
            return {p: value.get(p, True) for p in _BIAS_PARTS}
        if not isinstance(value, bool):
            raise ExampleFileError(f"{where}: bias must be true or false, or a table "
                                   "{ q = false, k = false, v = false, o = true }")
        return value
    if key == "add_bias_kv":
        if not isinstance(value, bool):
            raise ExampleFileError(f"{where}: {key} must be true or false")
        return value
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if is_int and 1 <= value <= MAX_DIM:
        return value
    if isinstance(value, str) and value.isidentifier() and value.isascii() and len(value) <= 32:
        return value
    if is_division(value):
        return value.strip()  # resolved with the other sizes: resolve_divisions
    raise ExampleFileError(f"{where}: {key}={_show(value)} must be an integer from 1 to "
                           f"{MAX_DIM:,}, a symbol name (ASCII letters, digits, _; "
                           "at most 32) or a quotient of them (\"d_model // heads\")")


def _option(key: str, value: Any, where: str) -> Any:
    if key in ("heads", "kv_heads", "d_k"):
        if isinstance(value, str) and value.isidentifier() and value.isascii() and len(value) <= 32:
            return value  # a symbol, for examples that state sizes only
        if is_division(value):
            return value.strip()  # d_k = "d_model // heads": resolve_divisions
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise ExampleFileError(f"{where}: {key}={_show(value)} must be an integer from 1 to "
                                   f"{MAX_DIM:,}, a quotient such as \"d_model // heads\" "
                                   "(or, for an example without inputs, a symbol name)")
        return value
    if key in ("scale", "mask_fill"):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ExampleFileError(f"{where}: {key}={_show(value)} must be a number or number "
                                   "string")
        if isinstance(value, float) and value != value:
            raise ExampleFileError(f"{where}: {key}={_show(value)} is not a number")
        if isinstance(value, float) and not math.isfinite(value) and (
                key == "scale" or value > 0):
            raise ExampleFileError(f"{where}: {key}={_show(value)} is not finite: the {key} must be "
                                   "a finite number")
        if isinstance(value, int) and decimal_digits(value) > MAX_VALUE_DIGITS:
            raise ExampleFileError(f"{where}: {key}={int_text(value)} has more than "
                                   f"{MAX_VALUE_DIGITS} digits")
        return "-inf" if isinstance(value, float) and value == float("-inf") else value
    if key in ("mask", "masked") and isinstance(value, str) and _is_printout(value):
        return printout_matrix(value, f"{where}: {key}")
    if key == "mask":
        if isinstance(value, str):
            if value != "causal":
                raise ExampleFileError(f"{where}: mask={_show(value)} must be 'causal' or a matrix")
            return value
        if not isinstance(value, list):
            raise ExampleFileError(f"{where}: mask must be 'causal' or a matrix")
        return value
    if key == "masked":
        if not isinstance(value, list):
            raise ExampleFileError(f"{where}: masked must be a boolean matrix (true = masked out)")
        return value
    if key == "valid_lens":
        if not isinstance(value, (list, int)) or isinstance(value, bool):
            raise ExampleFileError(f"{where}: valid_lens must be a list (one length per batch "
                                   "element, or per batch element and query)")
        return value
    if key in ("causal_alignment", "masked_rows", "mask_fill_stage", "layout", "qkv_layout"):
        if not isinstance(value, str):
            raise ExampleFileError(f"{where}: {key} must be a string")
        allowed = {"layout": ("book", "torch"), "qkv_layout": ("stacked", "per_head"),
                   "mask_fill_stage": ("scaled", "raw")}.get(key)
        if allowed and value not in allowed:
            raise ExampleFileError(f"{where}: {key}={_show(value)} must be one of "
                                   f"{', '.join(repr(a) for a in allowed)}")
        return value
    if key == "window":  # the engine checks the values (integers >= 0 or -1)
        if not isinstance(value, list) or len(value) != 2:
            raise ExampleFileError(f"{where}: window={_show(value)} must be [left, right] "
                                   "(integers, -1 for unbounded)")
        return tuple(value)
    if key == "softcap":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ExampleFileError(f"{where}: softcap={_show(value)} must be a number or number "
                                   "string")
        return value
    if key in ("alibi_slopes", "sinks"):  # one entry per head
        if not isinstance(value, list) or not value or any(
                isinstance(x, bool) or not isinstance(x, (int, float, str)) for x in value):
            raise ExampleFileError(f"{where}: {key} must be a list of numbers, one per head")
        return value
    raise AssertionError(key)  # pragma: no cover
