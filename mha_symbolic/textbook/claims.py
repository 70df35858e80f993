"""Printed answers: how a number "as the text prints it" is read, and judged.

Semantics (the printed digits define the precision of a claim):

==========================  ==========================================  =====================
printed                     read as                                     holds when
==========================  ==========================================  =====================
``0.6698``, ``≈ 198.20``    decimal, unit 10^-places (1e-4, 1e-2)       the exact value rounds
                                                                        to it (half-even; an
                                                                        exact tie accepts both
                                                                        neighbours)
``29.99999994``, ``30``     same; an integer has unit 1                 same
``4.85 × 10^8``, ``1.8e-2``  scientific, unit 10^(8-2), 10^(-2-1)      same
``≈ 10^6``                  1 × 10^6, unit 10^6                         same
``70%``                     0.70, unit 0.01                             same
``1/3``, ``2^20``,          an exact expression                         it equals the value
``4 × 512^2``, ``e^2/3``                                                exactly
``≈ 1 − e^(−32)``           an approximation formula                    its certified relative
                                                                        error is <= rtol
                                                                        (default 1e-6)
``(1.3396, 1.3208)``        a tuple, each part read as above            every part holds
``3 × 5``                   a shape (for shape quantities)              sizes equal
``-inf``, ``−∞``, ``NaN``   a masked score, a NaN row                   the entry is that
==========================  ==========================================  =====================

A leading ``≈``, ``~``, ``approx.`` or ``about`` is noted and stripped; a
leading ``=`` is stripped (books write ``= 198.20`` for a rounded result, so a
printed decimal is always judged at its printed precision).  The
verdicts are ``exact``, ``correctly rounded``, ``approximation`` (a formula
within rtol) and ``wrong``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .._text import echo
from ..errors import ClaimError, ParseError
from ..exact.certified import _pow10

__all__ = ["PrintedAnswer", "parse_printed"]

_APPROX = ("≈", "~", "approximately", "approx.", "approx", "about")
#: Largest power of ten a printed answer may use (10^±1000 is far beyond any book).
MAX_EXPONENT = 1000
_DECIMAL = re.compile(r"^[+-]?(\d+)(?:\.(\d+))?$")
_SCIENTIFIC = re.compile(
    r"^([+-]?\d+(?:\.(\d+))?)\s*(?:×|x|\*|·)\s*10\s*\^\s*\(?\s*([+-]?\d+)\s*\)?$"
)
_POWER10 = re.compile(r"^10\s*\^\s*\(?\s*([+-]?\d+)\s*\)?$")
_ENOTATION = re.compile(r"^([+-]?\d+(?:\.(\d+))?)[eE]([+-]?\d+)$")
_PERCENT = re.compile(r"^([+-]?\d+(?:\.(\d+))?)\s*%$")
_SHAPE = re.compile(r"^\(?\s*(\w+)\s*(?:×|x|\*)\s*(\w+)\s*\)?$")
MAX_CLAIM_LENGTH = 500


def _normalize(text: str) -> str:
    return (text.replace("\u2212", "-").replace("\u2013", "-").replace("\u00a0", " ")
            .replace("\u2009", " ").strip())


@dataclass(frozen=True)
class PrintedAnswer:
    """One printed answer, read.

    ``kind`` is ``"decimal"`` (a rounded number: ``value`` and ``unit``),
    ``"expression"`` (an exact SymPy value), ``"tuple"`` (``parts``),
    ``"shape"`` (``sizes``) or ``"special"`` (``expr`` is ``"-inf"`` or ``"nan"``).
    """

    text: str
    kind: str
    approx: bool = False
    value: Fraction | None = None
    unit: Fraction | None = None
    expr: Any = None
    parts: tuple[PrintedAnswer, ...] = ()
    sizes: tuple[Any, ...] = ()

    @property
    def significant_digits(self) -> int:
        """How many significant digits the printed answer shows (for decimals)."""
        if self.kind != "decimal" or self.value is None or self.unit is None:
            return 0
        if self.value == 0:
            return 1
        n = abs(self.value) / self.unit
        return len(str(int(n))) if n.denominator == 1 else len(str(round(n)))

    def describe_precision(self) -> str:
        if self.kind == "decimal" and self.unit is not None:
            places = _places(self.unit)
            if places > 0:
                return f"{places} decimal place{'s' if places != 1 else ''}"
            if self.unit == 1:
                return "units"
            return f"multiples of {_plain(self.unit)}"
        if self.kind == "expression":
            return "approximation formula" if self.approx else "exact claim"
        if self.kind == "special":
            return ""
        return self.kind


def _places(unit: Fraction) -> int:
    """-log10(unit) for a power of ten (may be negative)."""
    if unit >= 1:
        return -(len(str(unit.numerator)) - 1)
    return len(str(unit.denominator)) - 1


def _plain(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else str(x)


def parse_printed(text: str, *, shape: bool = False) -> PrintedAnswer:
    """Read a printed answer.  ``shape=True`` reads ``3 × 5`` as a shape.

    >>> p = parse_printed("≈ 0.6698")
    >>> p.kind, p.value, p.unit, p.approx
    ('decimal', Fraction(3349, 5000), Fraction(1, 10000), True)
    >>> parse_printed("4.85 × 10^8").unit
    Fraction(1000000, 1)
    >>> parse_printed("3 × 5", shape=True).sizes
    (3, 5)
    """
    if not isinstance(text, str):
        raise ClaimError(f"claimed={echo(text)} must be a string (the answer as printed)")
    if len(text) > MAX_CLAIM_LENGTH:
        raise ClaimError(f"claimed answer longer than {MAX_CLAIM_LENGTH} characters")
    raw = text
    s = _normalize(text)
    approx = False
    changed = True
    while changed:
        changed = False
        for prefix in (*_APPROX, "="):
            if s.lower().startswith(prefix):
                approx = approx or prefix != "="
                s = s[len(prefix):].strip()
                changed = True
    if not s:
        raise ClaimError(f"claimed={echo(raw)} holds no answer")
    if s.startswith("(") and s.endswith(")") and _balanced(s[1:-1]) and not _top_level_comma(
            s[1:-1]) and not shape:
        # "(17.311)": a one-entry tuple reads as its entry
        inner = parse_printed(s[1:-1])
        return PrintedAnswer(raw, inner.kind, approx or inner.approx, inner.value, inner.unit,
                             inner.expr, inner.parts, inner.sizes)

    if shape:
        m = _SHAPE.match(s)
        if not m:
            raise ClaimError(f"claimed={echo(raw)} is not a shape like '3 × 5'")
        sizes = tuple(int(g) if g.isascii() and g.isdigit() else g for g in m.groups())
        return PrintedAnswer(raw, "shape", approx, sizes=sizes)

    if s.startswith("(") and s.endswith(")") and _top_level_comma(s[1:-1]):
        try:
            parts = tuple(parse_printed(p) for p in _split_top(s[1:-1]))
        except ClaimError as exc:
            raise ClaimError(f"in claimed={echo(raw)}: {exc}") from None
        return PrintedAnswer(raw, "tuple", approx, parts=parts)

    special = _SPECIAL.get(s.replace(" ", "").lower())
    if special is not None:
        return PrintedAnswer(raw, "special", approx, expr=special)
    if m := _DECIMAL.match(s):
        places = len(m.group(2) or "")
        value = Fraction(s)
        return PrintedAnswer(raw, "decimal", approx, value=value, unit=_pow10(-places))
    if m := (_SCIENTIFIC.match(s) or _ENOTATION.match(s)):
        mant, frac, exp = m.groups()
        places = len(frac or "")
        k = _exponent(exp, raw)
        return PrintedAnswer(raw, "decimal", approx, value=Fraction(mant) * _pow10(k),
                             unit=_pow10(k - places))
    if approx and (m := _POWER10.match(s)):
        k = _exponent(m.group(1), raw)
        return PrintedAnswer(raw, "decimal", approx, value=_pow10(k), unit=_pow10(k))
    if m := _PERCENT.match(s):
        places = len(m.group(2) or "")
        return PrintedAnswer(raw, "decimal", approx, value=Fraction(m.group(1)) / 100,
                             unit=_pow10(-places) / 100)

    from ..exact.grammar import parse_number

    try:
        expr = parse_number(s)
    except ParseError as exc:
        raise ClaimError(f"cannot read claimed={echo(raw)}: {exc}") from None
    return PrintedAnswer(raw, "expression", approx, expr=expr)


#: Printed answers for masked entries (a scaled score of −∞) and NaN rows.
_SPECIAL = {"-inf": "-inf", "-∞": "-inf", "-oo": "-inf", "nan": "nan"}


def _exponent(text: str, raw: str) -> int:
    if len(text) > 6 or abs(int(text)) > MAX_EXPONENT:
        raise ClaimError(f"claimed={echo(raw)}: the power of ten is outside ±{MAX_EXPONENT}")
    return int(text)


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            return False
    return depth == 0


def _top_level_comma(s: str) -> bool:
    return len(_split_top(s)) > 1


def _split_top(s: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch in ",;" and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return [p.strip() for p in parts]
