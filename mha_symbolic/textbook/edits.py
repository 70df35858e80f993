"""Small edits of a typed input: the arrays a book may have computed with by a typo.

A text that shows X and prints what X′ gives, X′ one keystroke away from X, made one
of these slips (each edit changes one or two entries of one input matrix):

* a sign: one entry negated (``-0.55`` for ``0.55``; zeros are skipped);
* two entries transposed: neighbours along a row or a column swapped;
* a digit dropped: one digit of one entry's decimal text left out (``0.4`` for ``0.43``);
* two digits transposed: neighbouring digits of one entry swapped (``0.34`` for ``0.43``);
* a digit off by one: one entry's last digit one more or one less (``4`` for ``5``).

Only *typed* inputs are edited: entries written as short decimals (ints, decimal floats
and strings of at most :data:`MAX_TEXT` characters), in matrices of at most
:data:`MAX_ENTRIES` entries; replayed draws (float32 fractions) are nobody's typo.
An edit that gives the same matrix (dropping a trailing zero, swapping equal entries)
is left out.  The edits come kind by kind in the order above, row-major within a kind.

>>> [t for t, _ in small_edits([[5, 1]])][:3]
['entry [1,1] negated (-5 for 5)', 'entry [1,2] negated (-1 for 1)', 'entries [1,1] and [1,2] swapped']
>>> ('entry [1,1] off by one in its last digit (4 for 5)', [[4, 1]]) in small_edits([[5, 1]])
True
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any

__all__ = ["EDIT_KINDS", "MAX_ENTRIES", "MAX_TEXT", "edits_by_kind", "is_typed", "small_edits"]

MAX_ENTRIES = 16
MAX_TEXT = 8


def _text(e: Any) -> str | None:
    """The decimal text a person typed for entry ``e``, or None (not a typed entry)."""
    if isinstance(e, bool):
        return None
    if isinstance(e, int):
        t = str(e)
    elif isinstance(e, float):
        t = repr(e)
        if "e" in t or "n" in t:  # 1e-05, inf, nan: not a typed decimal
            return None
        t = t[:-2] if t.endswith(".0") else t
    elif isinstance(e, str):
        t = e.strip()
    else:
        return None
    if not t or len(t) > MAX_TEXT:
        return None
    try:
        Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None
    return t


def is_typed(m: list[list[Any]]) -> bool:
    """Whether every entry of ``m`` is a short typed decimal (and ``m`` is small)."""
    return (sum(len(r) for r in m) <= MAX_ENTRIES
            and all(_text(e) is not None for r in m for e in r))


def _like(original: Any, text: str) -> Any:
    """``text`` as an entry of the original's type."""
    if isinstance(original, int):
        return int(text)
    if isinstance(original, float):
        return float(text)
    return text


def _tidy(t: str) -> str | None:
    """A digit string after an edit as a decimal text, or None (no number left)."""
    neg = t.startswith("-")
    body = t[1:] if neg else t
    if body.startswith("."):
        body = "0" + body
    body = body.rstrip(".")
    if not body or not any(c.isdigit() for c in body):
        return None
    return ("-" if neg else "") + body


def _digit_edits(t: str) -> Iterator[tuple[str, str]]:
    """(kind, new text) of the one-digit edits of ``t``, kind 'dropped', 'swapped', 'off'."""
    digits = [i for i, c in enumerate(t) if c.isdigit()]
    for i in digits:
        new = _tidy(t[:i] + t[i + 1:])
        if new is not None:
            yield "dropped", new
    for i in digits:
        if i + 1 in digits and t[i] != t[i + 1]:
            yield "swapped", t[:i] + t[i + 1] + t[i] + t[i + 2:]
    last = digits[-1]
    for step in (-1, 1):
        d = int(t[last]) + step
        if 0 <= d <= 9:
            new = _tidy(t[:last] + str(d) + t[last + 1:])
            if new is not None:
                yield "off", new


#: The kinds of edit, in the order they are tried.
EDIT_KINDS = ("sign", "entries", "dropped", "swapped", "off")


def small_edits(m: list[list[Any]]) -> list[tuple[str, list[list[Any]]]]:
    """(description, edited copy) of every small edit of a typed matrix ``m``, kind by
    kind; [] for a matrix that is not typed (:func:`is_typed`)."""
    return [e for kind in EDIT_KINDS for e in edits_by_kind(m)[kind]]


def edits_by_kind(m: list[list[Any]]) -> dict[str, list[tuple[str, list[list[Any]]]]]:
    """The small edits of ``m`` by kind (:data:`EDIT_KINDS`); every list empty for a
    matrix that is not typed."""
    out: dict[str, list[tuple[str, list[list[Any]]]]] = {k: [] for k in EDIT_KINDS}
    if not is_typed(m):
        return out
    rows, cols = len(m), len(m[0])
    texts = [[_text(e) or "" for e in r] for r in m]
    value = [[Fraction(t) for t in r] for r in texts]
    seen = {tuple(map(tuple, value))}

    def add(kind: str, text: str, changes: dict[tuple[int, int], Any]) -> None:
        new = [list(r) for r in m]
        for (i, j), e in changes.items():
            new[i][j] = e
        key = tuple(tuple(Fraction(_text(e) or "0") for e in r) for r in new)
        if key not in seen:
            seen.add(key)
            out[kind].append((text, new))

    def at(i: int, j: int) -> str:
        return f"[{i + 1},{j + 1}]"

    for i in range(rows):
        for j in range(cols):
            t = texts[i][j]
            if value[i][j] != 0:
                neg = t[1:] if t.startswith("-") else "-" + t
                add("sign", f"entry {at(i, j)} negated ({neg} for {t})", {(i, j): _like(m[i][j], neg)})
    for i in range(rows):
        for j in range(cols):
            for i2, j2 in ((i, j + 1), (i + 1, j)):
                if i2 < rows and j2 < cols and value[i][j] != value[i2][j2]:
                    add("entries", f"entries {at(i, j)} and {at(i2, j2)} swapped",
                        {(i, j): m[i2][j2], (i2, j2): m[i][j]})
    words = {"dropped": "a digit dropped", "swapped": "two digits swapped",
             "off": "off by one in its last digit"}
    for i in range(rows):
        for j in range(cols):
            for kind, new in _digit_edits(texts[i][j]):
                add(kind, f"entry {at(i, j)} {words[kind]} ({new} for {texts[i][j]})",
                    {(i, j): _like(m[i][j], new)})
    return out
