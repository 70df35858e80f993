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
``2,360,064``, ``2 360 064``  one integer (thousands separators)        as a decimal
``2.36M``, ``2.36 million``  2.36 × 10^6, unit 10^4                     same
``2359296 parameters``      a number followed by a unit word            as the number
``tensor([[0.44, 0.65]])``  a printed tensor/array: each entry at its   every entry holds
                            own printed precision (see printouts.py)
==========================  ==========================================  =====================

Thousands separators versus tuples: a run of digits grouped in threes by one
separator used throughout (``,`` or a space, thin space, no-break space, ``’``,
``'`` or ``_``) with a first group of one to three digits is one number, *outside*
parentheses and brackets (``2,360,064``).  Inside ``( )`` or ``[ ]`` a comma always
separates entries, so ``(1,234)`` is the pair (1, 234); write ``(1 234)`` or
``1,234`` for the number.  Anything else with a comma outside parentheses
(``0,5``, ``1, 2``) is refused as ambiguous.

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
#: Longest claim read (a pasted 64 × 64 tensor printout is about 30,000 characters).
MAX_CLAIM_LENGTH = 40_000
#: Longest claim that is not a tensor printout.
MAX_SCALAR_LENGTH = 500

_DECIMAL = re.compile(r"^[+-]?(\d+)(?:\.(\d*))?$|^[+-]?\.(\d+)$")
# grouped in threes by one separator used throughout: 2,360,064  2 360 064  2’360’064
_GROUPED = re.compile(r"^[+-]?\d{1,3}(?P<sep>[,\u0020\u2009\u202f\u00a0\u2019'_])\d{3}"
                      r"(?:(?P=sep)\d{3})*(?:\.\d+)?$")
_SCIENTIFIC = re.compile(
    r"^([+-]?\d+(?:\.(\d*))?)\s*(?:×|x|\*|·)\s*10\s*\^\s*\(?\s*([+-]?\d+)\s*\)?$"
)
_POWER10 = re.compile(r"^10\s*\^\s*\(?\s*([+-]?\d+)\s*\)?$")
_ENOTATION = re.compile(r"^([+-]?\d+(?:\.(\d*))?)[eE]([+-]?\d+)$")
_PERCENT = re.compile(r"^([+-]?\d+(?:\.(\d+))?)\s*%$")
_SHAPE_SEP = re.compile(r"\s*(?:×|x|\*)\s*")
_FACTOR = r"(?:\d+|[A-Za-z_]\w{0,31})"
# a size: a number, a symbol, or a product of them (h·d_v, 3*d_model)
_SIZE = re.compile(rf"^{_FACTOR}(?:\s*[·*]\s*{_FACTOR}){{0,3}}$")
_SHAPE_WRAPPER = re.compile(r"^(?:torch\.Size\s*\(\s*\[(.*)\]\s*\)|\[(.*)\]|\((.*)\))$", re.DOTALL)

#: Scale words and suffixes: 2.36M is 2.36 × 10^6 (its unit 10^4, from its digits).
SCALES: dict[str, int] = {
    "k": 3, "K": 3, "thousand": 3,
    "M": 6, "mn": 6, "million": 6, "millions": 6,
    "B": 9, "bn": 9, "G": 9, "billion": 9, "billions": 9,
    "T": 12, "trillion": 12,
}
_SCALED = re.compile(r"^(?P<num>[+-]?\d+(?:\.\d+)?)\s*(?P<scale>[A-Za-z]+)$")
#: Unit words a book prints after a number; they are noted and do not change the value.
UNIT_WORDS = frozenset({
    "parameter", "parameters", "params", "param", "weights", "weight", "entries", "entry",
    "elements", "element", "numbers", "values", "tokens", "token", "dimensions", "dimension",
    "dims", "dim", "heads", "head", "rows", "row", "columns", "column", "flops", "flop",
    "multiply-adds", "mults", "additions", "exponentials", "trainable", "learnable",
})


def _normalize(text: str) -> str:
    return (text.replace("\u2212", "-").replace("\u2013", "-").replace("\u00a0", " ")
            .replace("\u2009", " ").replace("\u202f", " ").strip())


@dataclass(frozen=True)
class PrintedAnswer:
    """One printed answer, read.

    ``kind`` is ``"decimal"`` (a rounded number: ``value`` and ``unit``),
    ``"expression"`` (an exact SymPy value), ``"tuple"`` (``parts``),
    ``"array"`` (a printed tensor/array or bracketed list: ``parts`` row-major and
    ``shape``), ``"shape"`` (``sizes``) or ``"special"`` (``expr`` is ``"-inf"``,
    ``"inf"`` or ``"nan"``).  ``unit_word`` is a unit printed after the number
    (``"parameters"``).
    """

    text: str
    kind: str
    approx: bool = False
    value: Fraction | None = None
    unit: Fraction | None = None
    expr: Any = None
    parts: tuple[PrintedAnswer, ...] = ()
    sizes: tuple[Any, ...] = ()
    shape: tuple[int, ...] = ()
    unit_word: str = ""

    @property
    def significant_digits(self) -> int:
        """How many significant digits the printed answer shows (for decimals; the
        largest over the entries of a tuple or array)."""
        if self.kind in ("tuple", "array"):
            return max((p.significant_digits for p in self.parts), default=0)
        if self.kind != "decimal" or self.value is None or self.unit is None:
            return 0
        if self.value == 0:
            return 1
        n = abs(self.value) / self.unit
        return len(str(int(n))) if n.denominator == 1 else len(str(round(n)))

    @property
    def entries(self) -> tuple[PrintedAnswer, ...]:
        """The scalar answers it holds (itself for a single answer)."""
        return self.parts if self.kind in ("tuple", "array") else (self,)

    def describe_precision(self) -> str:
        if self.kind in ("tuple", "array"):
            kinds = [d for d in dict.fromkeys(p.describe_precision() for p in self.parts) if d]
            return "; ".join(kinds) if len(kinds) <= 2 else "each entry at its printed precision"
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


def parse_printed(text: str, *, shape: bool = False, vector: bool = False) -> PrintedAnswer:
    """Read a printed answer.  ``shape=True`` reads ``3 × 5``, ``(2, 4, 100)`` or
    ``torch.Size([2, 6, 2])`` as a shape; ``vector=True`` also a one-dimensional one
    (``torch.Size([2])``, ``(2,)``: inside brackets or parentheses only).

    >>> p = parse_printed("≈ 0.6698")
    >>> p.kind, p.value, p.unit, p.approx
    ('decimal', Fraction(3349, 5000), Fraction(1, 10000), True)
    >>> parse_printed("4.85 × 10^8").unit
    Fraction(1000000, 1)
    >>> parse_printed("3 × 5", shape=True).sizes
    (3, 5)
    >>> parse_printed("2,360,064").value, parse_printed("2.36M").unit
    (Fraction(2360064, 1), Fraction(10000, 1))
    >>> parse_printed("tensor([[0.4419, 0.6515]])").shape
    (1, 2)
    """
    if not isinstance(text, str):
        raise ClaimError(f"claimed={echo(text)} must be a string (the answer as printed)")
    if len(text) > MAX_CLAIM_LENGTH:
        raise ClaimError(f"claimed answer longer than {MAX_CLAIM_LENGTH} characters")
    from ..exact.grammar import foreign_digit

    foreign = foreign_digit(text)
    if foreign is not None:  # digits of other scripts are refused (docs: Limits, decisions)
        raise ClaimError(f"claimed={echo(text)}: non-ASCII digit {foreign}; only the digits "
                         "0-9 are read")
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
    if shape:
        return PrintedAnswer(raw, "shape", approx, sizes=_shape_sizes(s, raw, vector))

    from .printouts import looks_like_printout, read_printout

    if looks_like_printout(s):
        return _array(raw, s, approx, read_printout)
    if len(s) > MAX_SCALAR_LENGTH:
        raise ClaimError(f"claimed answer longer than {MAX_SCALAR_LENGTH} characters "
                         "(only tensor printouts may be longer)")

    if s.startswith("(") and s.endswith(")") and _balanced(s[1:-1]) and not _top_level_comma(
            s[1:-1]):
        # "(17.311)": a one-entry tuple reads as its entry
        inner = parse_printed(s[1:-1])
        return PrintedAnswer(raw, inner.kind, approx or inner.approx, inner.value, inner.unit,
                             inner.expr, inner.parts, inner.sizes, inner.shape, inner.unit_word)

    if s.startswith("(") and s.endswith(")") and _top_level_comma(s[1:-1]):
        try:
            parts = tuple(parse_printed(p) for p in _split_top(s[1:-1]))
        except ClaimError as exc:
            # one "in claimed=…" naming the whole claim, however deep the tuples nest
            detail = getattr(exc, "detail", str(exc))
            err = ClaimError(f"in claimed={echo(raw)}: {detail}")
            err.detail = detail  # type: ignore[attr-defined]
            raise err from None
        return PrintedAnswer(raw, "tuple", approx, parts=parts)

    s, unit_word = _unit_word(s)
    scalar = _scalar(s, raw, approx)
    if scalar is not None:
        return scalar if not unit_word else _with_unit_word(scalar, unit_word)
    if _top_level_comma(s):
        raise ClaimError(f"cannot read claimed={echo(raw)}: a comma outside parentheses is only "
                         "read as a thousands separator (2,360,064); write a tuple as (a, b)")

    from ..exact.grammar import parse_number

    try:
        expr = parse_number(s)
    except ParseError as exc:
        raise ClaimError(f"cannot read claimed={echo(raw)}: {exc}") from None
    return PrintedAnswer(raw, "expression", approx, expr=expr, unit_word=unit_word)


def _with_unit_word(p: PrintedAnswer, word: str) -> PrintedAnswer:
    return PrintedAnswer(p.text, p.kind, p.approx, p.value, p.unit, p.expr, p.parts, p.sizes,
                         p.shape, word)


def _unit_word(s: str) -> tuple[str, str]:
    """Split a trailing unit word ("2359296 parameters" → "2359296", "parameters")."""
    m = re.match(r"^(.*?\S)\s+([A-Za-z][A-Za-z\-]*)$", s)
    if m and m.group(2).lower() in UNIT_WORDS:
        return m.group(1), m.group(2)
    return s, ""


def _scalar(s: str, raw: str, approx: bool) -> PrintedAnswer | None:
    """A single printed number (decimal, grouped, scaled, scientific, percent, special)."""
    special = _SPECIAL.get(s.replace(" ", "").lower())
    if special is not None:
        return PrintedAnswer(raw, "special", approx, expr=special)
    if _DECIMAL.match(s):
        return _decimal(raw, s, approx, 0)
    if _GROUPED.match(s):
        # one separator used throughout, groups of three: thousands separators
        return _decimal(raw, re.sub(r"[,\s\u2019'_]", "", s), approx, 0)
    if m := _SCALED.match(s):
        k = SCALES.get(m.group("scale"))
        if k is None:
            k = SCALES.get(m.group("scale").lower()) if len(m.group("scale")) > 2 else None
        if k is not None:
            return _decimal(raw, m.group("num"), approx, k)
    if m := (_SCIENTIFIC.match(s) or _ENOTATION.match(s)):
        mant, _, exp = m.groups()
        return _decimal(raw, mant, approx, _exponent(exp, raw))
    if approx and (m := _POWER10.match(s)):
        k = _exponent(m.group(1), raw)
        return PrintedAnswer(raw, "decimal", approx, value=_pow10(k), unit=_pow10(k))
    if m := _PERCENT.match(s):
        places = len(m.group(2) or "")
        return PrintedAnswer(raw, "decimal", approx, value=Fraction(m.group(1)) / 100,
                             unit=_pow10(-places) / 100)
    return None


def _decimal(raw: str, digits: str, approx: bool, k: int) -> PrintedAnswer:
    """``digits`` (a plain decimal, perhaps ending in '.') times 10^k; its unit is the
    last printed digit's: 10^(k − decimals)."""
    body = digits[:-1] if digits.endswith(".") else digits
    places = len(body.split(".", 1)[1]) if "." in body else 0
    value = Fraction(body if not body.startswith((".", "-.", "+.")) else body.replace(".", "0.", 1))
    return PrintedAnswer(raw, "decimal", approx, value=value * _pow10(k), unit=_pow10(k - places))


def _array(raw: str, s: str, approx: bool, reader: Any) -> PrintedAnswer:
    printout = reader(s)
    parts = []
    for entry in printout.entries:
        p = _scalar(_normalize(entry), entry, approx)
        if p is None:
            raise ClaimError(f"in claimed={_brief(raw)}: cannot read the entry {echo(entry, 40)} "
                             "as a printed number")
        parts.append(p)
    if printout.shape == ():  # tensor(0.9544): one number
        p = parts[0]
        return PrintedAnswer(raw, p.kind, approx, p.value, p.unit, p.expr)
    return PrintedAnswer(raw, "array", approx, parts=tuple(parts), shape=printout.shape)


def _brief(text: str) -> str:
    return echo(" ".join(text.split()), 60)


def _shape_sizes(s: str, raw: str, vector: bool = False) -> tuple[Any, ...]:
    """Sizes of a printed shape: ``3 × 5``, ``2 × 4 × 100``, ``(2, 4, 100)``,
    ``torch.Size([2, 6, 2])``, ``[2, 6, 2]``."""
    m = _SHAPE_WRAPPER.match(s)
    inner = next((g for g in m.groups() if g is not None), s) if m else s
    inner = inner.strip()
    if "," in inner:
        items = [t.strip() for t in inner.split(",")]
        if items and items[-1] == "":  # (5,)
            items = items[:-1]
    elif "×" in inner:
        items = [t.strip() for t in inner.split("×")]
    else:
        items = [t.strip() for t in _SHAPE_SEP.split(inner)]
    least = 1 if vector and m else 2
    from .sizes import is_division

    if not least <= len(items) <= 4 or not all(_SIZE.match(t) or is_division(t) for t in items):
        raise ClaimError(f"claimed={echo(raw)} is not a shape like '3 × 5', '2 × 4 × 100' or "
                         "torch.Size([2, 6, 2]) (two to four sizes, each a number, a name, a "
                         "product or a quotient: h·d_v, n_embd/n_head"
                         + ("; one inside brackets, torch.Size([2])" if vector else "") + ")")
    return tuple(int(t) if t.isascii() and t.isdigit() else t if is_division(t)
                 else re.sub(r"\s*[·*]\s*", "·", t) for t in items)


#: Printed answers for masked entries (a scaled score of −∞) and NaN rows.
_SPECIAL = {"-inf": "-inf", "-∞": "-inf", "-oo": "-inf", "nan": "nan", "inf": "inf",
            "+inf": "inf", "∞": "inf"}


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


def numpy_printed(p: PrintedAnswer, precision: int) -> PrintedAnswer:
    """The answer as numpy printed it: numpy's default ``floatmode = "maxprec"`` strips
    trailing zeros (``0.5`` for 0.50000000 at ``precision`` 8), so a positional decimal
    with fewer digits than ``precision`` states the value to ``precision`` decimals.
    Scientific entries (``1.5e-05``) keep their own unit."""
    import dataclasses

    unit = Fraction(1, 10**precision)
    if p.kind in ("tuple", "array"):
        return dataclasses.replace(p, parts=tuple(numpy_printed(q, precision) for q in p.parts))
    if p.kind != "decimal" or p.unit is None or p.unit <= unit or re.search(r"[eE×^]", p.text):
        return p
    return dataclasses.replace(p, unit=unit)

