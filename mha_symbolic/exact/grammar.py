"""A small, restricted grammar for numbers written as a book writes them.

Strings from files and command lines are parsed here, never with ``eval``,
``exec``, ``sympify`` or ``parse_expr``.  The grammar::

    expr    := term (("+" | "-") term)*
    term    := factor (("*" | "×" | "·" | "/") factor | factor)*   # juxtaposition = product
    factor  := ("-" | "+") factor | power
    power   := postfix (("^" | "**") factor)?                      # right associative
    postfix := atom "%"?
    atom    := NUMBER | "e" | "pi" | "π" | FUNC "(" expr ")" | "√" atom | "(" expr ")"
    FUNC    := "sqrt" | "exp" | "ln" | "log" | "tanh"          # tanh: softcapped scores
    NUMBER  := digits ["." digits] [("e" | "E") ["+" | "-"] digits]   # 1.5e-3
             | "." digits                                          # digits: ASCII 0-9

Every number is exact: ``0.707`` is 707/1000, ``1/3`` a third, ``1e-3`` is
1/1000.  ``e^x`` is ``exp(x)``.  Unicode minus (−), times (×, ·, ⋅) and √ are
accepted.  Digits are ASCII only: ``١٢٣`` (Arabic-Indic) or ``۵`` (which looks like
``0``) are refused with their Unicode names, so that what is checked is what a reader
of the book sees.  A number in e-notation may not run straight into more letters or
digits (``1e5e5`` is refused, not read as 10^5 · e · 5): ``2e`` and ``3e^2`` are
products with Euler's number.

Every cost is bounded before SymPy is asked to do the work:

* lengths, nesting, and the size of every exact rational built along the way;
* ``e^x`` and ``a^x`` by the size of their logarithm (:data:`MAX_LOG`);
* fractional powers of rationals (``√2``, ``524296^0.56998``): SymPy simplifies a
  radical by factoring its base and building integers of up to (root degree) ×
  (digits of the base) digits, so the least common multiple of the root degrees
  times the total digits under roots is capped (:data:`MAX_RADICAL_WORK`);
* signs (``sqrt`` of a negative, ``ln`` of zero, a zero divisor) are decided with
  Arb enclosures at rising precision (:mod:`mha_symbolic.exact.certified`), never by
  SymPy's assumptions, which can fall back on ``minimal_polynomial`` (exponential in
  the number of radicals) for a zero in disguise.  A sign that cannot be decided is
  a :class:`~mha_symbolic.errors.ParseError`, not a hang.

>>> from mha_symbolic.exact.grammar import parse_number
>>> parse_number("1 − e^(−32)")
1 - exp(-32)
>>> parse_number("0.6698")
3349/5000
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._text import decimal_digits, echo, expr_text, int_text
from ..errors import MhaSymbolicError, ParseError
from .certified import certify, to_arb

if TYPE_CHECKING:
    import sympy

__all__ = ["check_radicals", "costly_power", "foreign_digit", "parse_number", "radical_work",
           "short_text"]

#: Longest number string (characters).
MAX_LENGTH = 2000
#: Deepest nesting of parentheses, signs and functions.
MAX_DEPTH = 60
#: Most digits of one number token.
MAX_DIGITS = 2000
#: Largest |k| in e-notation (``1e-3``) and largest |n| of an exact power a^n; an exact
#: rational built along the way (``1e20000 · 1e-19999``) may not exceed this many digits.
MAX_POWER_DIGITS = 20_000
#: A parsed value may not hold a rational with more digits than this (Python's str()
#: of an int stops at 4300 digits, and no book prints such a number).
MAX_VALUE_DIGITS = 4000
#: exp(x) and a^x (x irrational) are refused when |x| (resp. |x ln a|) exceeds this.
MAX_LOG = 10**5
#: Fractional powers of rationals: lcm(root degrees) × (digits under the roots) at most
#: this (the size of the integers SymPy may build while simplifying the radicals).
MAX_RADICAL_WORK = 1000
# bound on the work of expanding an integer power of a sum ((1 + √2 + √3)^n): terms of
# the multinomial expansion × the exponent (the coefficients' digits grow with it); see
# expansion_cost()
MAX_EXPANSION_WORK = 1_000_000
#: The sign of a non-rational argument of sqrt, ln or a fractional power must be decided
#: at this precision (bits), below SymPy's own 333-bit evalf.
ARGUMENT_BITS = 256

_TRANSLATE = str.maketrans({
    "\u2212": "-",  # minus sign
    "\u2013": "-",  # en dash, as sometimes typeset for minus
    "\u00d7": "*",  # multiplication sign
    "\u00b7": "*",  # middle dot
    "\u22c5": "*",  # dot operator
    "\u2217": "*",  # asterisk operator
    "\u2044": "/",  # fraction slash
    "\u2215": "/",  # division slash
    "\u03c0": "pi",  # greek pi
    "\u00a0": " ",  # no-break space
    "\u2009": " ",  # thin space
    "\u202f": " ",  # narrow no-break space
})

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\n\r\f\v]+)
  | (?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<exp>[eE][+-]?[0-9]+)?)
  | (?P<name>[A-Za-z_]+)
  | (?P<op>\*\*|[-+*/^()%√])
    """,
    re.VERBOSE,
)

_FUNCTIONS = ("sqrt", "exp", "ln", "log", "tanh")
_CONSTANTS = ("e", "pi")


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def foreign_digit(text: str) -> str | None:
    """A description of the first non-ASCII decimal digit in ``text`` (``'١' (ARABIC-INDIC
    DIGIT ONE) at position 0``), or None.  Every reader of numbers refuses them.

    >>> foreign_digit("12") is None, foreign_digit("1\u0662")
    (True, "'\u0662' (ARABIC-INDIC DIGIT TWO) at position 1")
    """
    for pos, ch in enumerate(text):
        if ch.isdecimal() and not "0" <= ch <= "9":
            name = unicodedata.name(ch, f"U+{ord(ch):04X}")
            return f"{ch!r} ({name}) at position {pos}"
    return None


def _tokenize(text: str, shown: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            foreign = foreign_digit(text[pos])
            if foreign is not None:
                raise ParseError(f"non-ASCII digit {foreign.rsplit(' at ', 1)[0]} at position "
                                 f"{pos} in {shown}: only the digits 0-9 are read")
            raise ParseError(f"unexpected character {echo(text[pos])} at position {pos} "
                             f"in {shown}")
        kind = m.lastgroup or ""
        if kind == "exp":  # pragma: no cover - the inner group never ends a match
            kind = "number"
        if kind == "number":
            nxt = text[m.end():m.end() + 1]
            if nxt == "." or nxt.isdecimal() or (m.group("exp") and (nxt.isalnum() or nxt == "_")):
                end = m.end() + 1
                while end < len(text) and (text[end].isalnum() or text[end] in "._"):
                    end += 1
                raise ParseError(f"malformed number {echo(text[pos:end], 40)} at position {pos} "
                                 f"in {shown}")
        if kind != "ws":
            toks.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    return toks


class _Parser:
    def __init__(self, text: str, toks: list[_Tok]) -> None:
        import sympy

        self.sp = sympy
        self.text = text
        self.shown = echo(text)
        self.toks = toks
        self.i = 0
        self.depth = 0

    # -- helpers -------------------------------------------------------------
    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise ParseError(f"unexpected end of {self.shown}")
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.peek()
        if tok is None or tok.text != text:
            where = f"at position {tok.pos}" if tok else "at the end"
            raise ParseError(f"expected {text!r} {where} in {self.shown}")
        self.i += 1

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError(f"expression nested deeper than {MAX_DEPTH} levels: {self.shown}")

    def leave(self) -> None:
        self.depth -= 1

    def here(self) -> int:
        """The position of the next token (the end of the text when there is none)."""
        tok = self.peek()
        return tok.pos if tok is not None else len(self.text)

    def within(self, what: str) -> str:
        """' in <the whole text>', or nothing when ``what`` is the whole text."""
        return "" if what.strip() == self.text.strip() else f" in {self.shown}"

    def source(self, start: int, end_tok: int) -> str:
        """The text of tokens ``start`` (a position) up to token index ``end_tok``."""
        end = self.toks[end_tok - 1].pos + len(self.toks[end_tok - 1].text) if end_tok else 0
        return self.text[start:end].strip()

    # -- grammar -------------------------------------------------------------
    def expr(self) -> Any:
        self.enter()
        value = self.term()
        while (tok := self.peek()) is not None and tok.text in "+-":
            self.take()
            rhs = self.term()
            value = self._arith(lambda a, b: a + b if tok.text == "+" else a - b, value, rhs)
        self.leave()
        return value

    def term(self) -> Any:
        value = self.factor()
        while (tok := self.peek()) is not None:
            if tok.text in ("*", "/"):
                self.take()
                start = self.here()
                rhs = self.factor()
                if tok.text == "/":
                    self._nonzero_divisor(rhs, self.source(start, self.i))
                    value = self._product(value, rhs, divide=True)
                else:
                    value = self._product(value, rhs)
            elif tok.kind == "number" and self.toks[self.i - 1].kind == "number":
                # "10 000", "1 2": two numbers side by side are not a product
                raise ParseError(
                    f"two numbers side by side at position {tok.pos} in {self.shown}; "
                    "write * between them (digit groups are not accepted)"
                )
            elif tok.kind in ("number", "name") or tok.text in ("(", "√"):
                value = self._product(value, self.factor())  # "2 sqrt(2)", "3e^2"
            else:
                break
        return value

    def factor(self) -> Any:
        tok = self.peek()
        if tok is not None and tok.text in "+-":
            self.take()
            self.enter()
            value = self.factor()
            self.leave()
            return -value if tok.text == "-" else value
        return self.power()

    def power(self) -> Any:
        start = self.here()
        base = self.postfix()
        base_text = self.source(start, self.i)
        tok = self.peek()
        if tok is not None and tok.text in ("^", "**"):
            self.take()
            self.enter()
            start = self.here()
            exponent = self.factor()
            exponent_text = self.source(start, self.i)
            self.leave()
            return self._pow(base, exponent, f"{base_text}^{exponent_text}")
        return base

    def postfix(self) -> Any:
        value = self.atom()
        tok = self.peek()
        if tok is not None and tok.text == "%":
            self.take()
            value = value / 100
        return value

    def atom(self) -> Any:
        sp = self.sp
        start = self.here()
        tok = self.take()
        if tok.kind == "number":
            return self._number(tok)
        if tok.text == "(":
            value = self.expr()
            self.expect(")")
            return value
        if tok.text == "√":
            self.enter()
            value = self.atom()
            self.leave()
            return self._root(value, self.source(start, self.i))
        if tok.kind == "name":
            name = tok.text
            if name in _FUNCTIONS:
                self.expect("(")
                arg = self.expr()
                self.expect(")")
                what = self.source(start, self.i)
                if name == "sqrt":
                    return self._root(arg, what)
                if name == "exp":
                    return self._exp(arg, what)
                if name == "tanh":
                    return self._tanh(arg)
                return self._log(arg, what)
            if name == "e":
                return sp.E
            if name == "pi":
                return sp.pi
            raise ParseError(
                f"unknown name {echo(name, 30)} at position {tok.pos} in {self.shown}; "
                f"allowed: numbers, e, pi, {', '.join(_FUNCTIONS)}, + - * / ^ ( ) %"
            )
        raise ParseError(f"unexpected {echo(tok.text, 30)} at position {tok.pos} in {self.shown}")

    # -- exact values --------------------------------------------------------
    def _number(self, tok: _Tok) -> Any:
        text = tok.text
        mantissa, _, exp_text = text.lower().partition("e")
        if len(mantissa) > MAX_DIGITS:
            raise ParseError(f"number with more than {MAX_DIGITS} digits in {self.shown}")
        digits = exp_text.lstrip("+-").lstrip("0")
        if len(digits) > 6 or (exp_text and abs(int(exp_text)) > MAX_POWER_DIGITS):
            raise ParseError(f"the exponent of {echo(text, 40)} is beyond "
                             f"±{MAX_POWER_DIGITS} in {self.shown}")
        exponent = int(exp_text) if exp_text else 0
        whole, _, frac = mantissa.partition(".")
        numerator = int((whole or "0") + frac)
        value = self.sp.Rational(numerator, 10 ** len(frac)) * self.sp.Rational(10) ** exponent
        self._check_size(value)
        return value

    def _check_size(self, value: Any) -> None:
        """Refuse intermediate rationals beyond MAX_POWER_DIGITS digits (cheap: bit lengths)."""
        sp = self.sp
        atoms = [value] if value.is_Rational else value.atoms(sp.Rational)
        for r in atoms:
            bits = max(int(r.p).bit_length(), int(r.q).bit_length())
            if bits > MAX_POWER_DIGITS * 3.33:
                raise ParseError(f"{self.shown} builds a number of more than "
                                 f"{MAX_POWER_DIGITS} digits")
            if bits > _PRIME_TEST_BITS:
                _primality_unknown(r)

    def _arith(self, op: Any, a: Any, b: Any) -> Any:
        """``op(a, b)`` for + and −; SymPy errors become ParseErrors."""
        try:
            value = op(a, b)
        except (ArithmeticError, ValueError, RecursionError) as exc:
            raise ParseError(f"cannot evaluate {self.shown} exactly: {type(exc).__name__}"
                             ) from None
        self._check_size(value)
        return value

    def _product(self, a: Any, b: Any, *, divide: bool = False) -> Any:
        """a·b or a/b, after bounding what SymPy will do with their radicals and with
        the expansion of the product."""
        check_radicals(_radicals(a) + _radicals(b), self.shown)
        if expansion_cost(a) * expansion_cost(b) > MAX_EXPANSION_WORK:
            raise ParseError(f"{self.shown} is too costly to expand exactly (terms × "
                             f"exponents exceed {MAX_EXPANSION_WORK:,})")
        return self._arith(lambda x, y: x / y if divide else x * y, a, b)

    def _nonzero_divisor(self, rhs: Any, what: str) -> None:
        sign = self._sign(rhs, f"the divisor {echo(what, 40)}")
        if sign == 0:
            raise ParseError(f"division by zero in {self.shown}")

    def _sign(self, x: Any, what: str, *, argument: bool = False) -> int:
        """-1, 0 or 1, decided exactly for rationals and by Arb (bounded) otherwise.

        ``argument=True`` (the argument of sqrt, ln or a fractional power) also needs the
        sign decided within :data:`ARGUMENT_BITS`: SymPy later asks for that sign itself
        through a 333-bit ``evalf``, and where that fails it falls back on
        ``minimal_polynomial``, exponential in the number of radicals.  A zero in
        disguise, or a value that cancels to less than 2^-256 of its terms, is refused.
        """
        if x.is_Rational:
            return (int(x.p) > 0) - (int(x.p) < 0)

        try:
            sign = certify(x).sign(max_bits=ARGUMENT_BITS if argument else None)
        except MhaSymbolicError as exc:
            raise ParseError(f"cannot decide the sign of {what} in {self.shown} "
                             f"({_reason(exc)})") from None
        if argument and sign == 0:
            raise ParseError(f"{what} is zero in disguise in {self.shown}: write it as 0")
        return sign

    def _exp(self, arg: Any, what: str) -> Any:
        self._bound_log(arg, what)
        try:
            return self.sp.exp(arg)
        except (ArithmeticError, ValueError, RecursionError) as exc:
            raise ParseError(f"cannot evaluate {echo(what, 40)} exactly: "
                             f"{type(exc).__name__}") from None

    def _tanh(self, arg: Any) -> Any:
        """tanh(x), for softcapped scores: within (−1, 1) whatever x is, so no size limit.
        Built unevaluated for an irrational x: SymPy's tanh() asks whether x is zero, which
        for a zero in disguise runs minimal_polynomial (exponential in the radicals)."""
        sp = self.sp
        return sp.tanh(arg) if arg.is_Rational else sp.tanh(arg, evaluate=False)

    def _log(self, arg: Any, what: str) -> Any:
        sp = self.sp
        if arg == sp.E:
            return sp.Integer(1)
        if isinstance(arg, sp.exp):
            return arg.args[0]  # ln(e^x) = x for real x (every value here is real)
        if self._sign(arg, f"the argument of {echo(what, 40)}", argument=True) <= 0:
            raise ParseError(f"{echo(what, 40)} is not defined: the argument must be positive"
                             f"{self.within(what)}")
        if arg.is_Rational:
            return sp.log(arg)
        # evaluate=False: SymPy's log() asks whether a non-rational argument is negative,
        # which may run minimal_polynomial; the sign is already decided above.
        return sp.log(arg, evaluate=False)

    def _bound_log(self, log_value: Any, what: str) -> None:
        """Refuse a^x or e^x whose natural logarithm exceeds MAX_LOG in size
        (e^(10^5) has 43430 digits: no book prints such a number)."""

        try:
            ball = to_arb(log_value, 64)
        except MhaSymbolicError:
            return  # not a number we can bound here: left to later stages
        if not ball.is_finite() or abs(ball) > MAX_LOG:
            raise ParseError(f"{echo(what, 40)} is beyond e^±{MAX_LOG}{self.within(what)}")

    def _root(self, value: Any, what: str) -> Any:
        if self._sign(value, f"the argument of {echo(what, 40)}", argument=True) < 0:
            raise ParseError(f"square root of a negative number: {echo(what, 40)}"
                             f"{self.within(what)}")
        return self._pow(value, self.sp.Rational(1, 2), what, checked=True)

    def _pow(self, base: Any, exponent: Any, what: str, *, checked: bool = False) -> Any:
        sp = self.sp
        shown = echo(what, 40)
        if base == sp.E:
            return self._exp(exponent, what)
        if exponent.is_Integer:
            n = int(exponent)
            if abs(n) > MAX_POWER_DIGITS:
                # SymPy expands some powers of algebraic bases (sqrt(2)^(10^100) = 2^(5·10^99))
                raise ParseError(f"the exponent of {shown} is beyond ±{MAX_POWER_DIGITS}"
                                 f"{self.within(what)}")
            if base == 0 and n <= 0:
                raise ParseError(f"{shown} is undefined (0 to the power {n}){self.within(what)}")
            if base.is_Rational:
                size = abs(n) * max(decimal_digits(base.p), decimal_digits(base.q))
                if size > MAX_POWER_DIGITS:
                    raise ParseError(f"{shown} would have about {int_text(size)} digits "
                                     f"(limit {MAX_POWER_DIGITS}){self.within(what)}")
            elif abs(n) > 1 and base != 0:
                # |base|^n stays within e^±MAX_LOG (exp(x)^n is rewritten as exp(n·x))
                self._bound_magnitude(base, exponent, what)
                check_radicals([(b, e * n) for b, e in _radicals(base)], self.shown)
                if power_cost(expansion_cost(base), abs(n)) > MAX_EXPANSION_WORK:
                    # SymPy expands such a power whenever it asks for real and imaginary
                    # parts (exp, tanh of it): (1+√2)^20000 took minutes (found by fuzzing)
                    raise ParseError(f"{shown} is too costly to expand exactly (terms × "
                                     f"exponent exceeds {MAX_EXPANSION_WORK:,})"
                                     f"{self.within(what)}")
            return self._arith(lambda a, b: a**b, base, exponent)
        sign = 1 if checked else self._sign(base, f"the base of {shown}", argument=True)
        if sign < 0:
            raise ParseError(f"{shown} is not a real number (a negative base needs an "
                             f"integer exponent){self.within(what)}")
        if sign == 0:
            if self._sign(exponent, f"the exponent of {shown}") <= 0:
                raise ParseError(f"{shown} is undefined (0 to a power that is not positive)"
                                 f"{self.within(what)}")
            return sp.Integer(0)
        if not exponent.is_Rational:
            # a^x with irrational x: keep it symbolic, but bound its magnitude, and its
            # integer part as a^n's: SymPy splits a^(n + c) into a^n · a^c (a power of
            # 0.6698^(99999 + pi) was a 400,000-digit rational, found by fuzzing)
            if base == 1:
                return sp.Integer(1)
            self._bound_magnitude(base, exponent, what)
            self._bound_integer_part(base, exponent, shown, what)
            if base.is_Rational:
                # a positive rational to an irrational power: SymPy's own evaluation
                # leaves it as it is, but may first ask whether the base is prime (6 s
                # for 481633^816, found by fuzzing): built unevaluated, the same object
                return self._arith(lambda a, b: sp.Pow(a, b, evaluate=False), base, exponent)
            return self._arith(lambda a, b: sp.Pow(a, b), base, exponent)
        # a non-integer rational power: bound the integer part and the radical's cost
        if base.is_Rational:
            size = abs(exponent) * max(decimal_digits(base.p), decimal_digits(base.q))
            if size > MAX_POWER_DIGITS:
                raise ParseError(f"{shown} would have about {int_text(int(size))} digits "
                                 f"(limit {MAX_POWER_DIGITS}){self.within(what)}")
            check_radicals([(base, exponent)], self.shown)
        else:
            self._bound_magnitude(base, exponent, what)
            inner = _radicals(base) + [(r, exponent) for r in _rational_factors(base)]
            check_radicals([(b, e * exponent) for b, e in _radicals(base)] + inner, self.shown)
        return self._arith(lambda a, b: sp.Pow(a, b), base, exponent)

    def _bound_integer_part(self, base: Any, exponent: Any, shown: str, what: str) -> None:
        """Refuse a^x (x irrational) whose a^⌊|x|⌋ is beyond the bounds on a^n."""
        try:
            excess = _integer_part_excess(base, exponent, 10 * MAX_POWER_DIGITS)
        except MhaSymbolicError:
            return  # not a number we can bound here: left to later stages
        if excess is None:
            return
        kind, size = excess
        if kind == "exponent":
            raise ParseError(f"the exponent of {shown} is beyond ±{MAX_POWER_DIGITS}"
                             f"{self.within(what)}")
        if kind == "digits":
            raise ParseError(f"{shown} would have about {int_text(size)} digits "
                             f"(limit {MAX_POWER_DIGITS}){self.within(what)}")
        raise ParseError(f"{shown} is too costly to expand exactly (terms × "
                         f"exponent exceeds {MAX_EXPANSION_WORK:,}){self.within(what)}")

    def _bound_magnitude(self, base: Any, exponent: Any, what: str) -> None:
        """Refuse |base|^exponent beyond e^±MAX_LOG, with Arb (base must be non-zero)."""

        try:
            b = to_arb(base, 64)
            x = to_arb(exponent, 64)
        except MhaSymbolicError:
            return
        if b.is_finite() and not b.contains(0):
            log = abs(b).log() * x
            if not log.is_finite() or abs(log) > MAX_LOG:
                raise ParseError(f"{echo(what, 40)} is beyond e^±{MAX_LOG}{self.within(what)}")


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 120 else text[:119] + "…"


def _radicals(x: Any) -> list[tuple[Any, Any]]:
    """The fractional powers of rationals in ``x``: (base, exponent) pairs."""
    import sympy as sp

    if not isinstance(x, sp.Basic):
        return []
    return [(p.base, p.exp) for p in x.atoms(sp.Pow)
            if p.base.is_Rational and p.exp.is_Rational and not p.exp.is_Integer]


def _rational_factors(x: Any) -> list[Any]:
    """Rational numbers that a power of ``x`` may distribute over (coefficients in x)."""
    import sympy as sp

    return [r for r in x.atoms(sp.Rational) if abs(r) != 1]


def radical_work(radicals: list[tuple[Any, Any]]) -> int:
    """W = lcm(root degrees) × Σ digits(distinct bases), capped just above
    :data:`MAX_RADICAL_WORK` (see :func:`check_radicals`)."""
    lcm = 1
    digits: dict[Any, int] = {}
    for base, exponent in radicals:
        q = int(exponent.q)
        lcm = min(lcm * q // math.gcd(lcm, q), MAX_RADICAL_WORK + 1)
        if base not in digits:
            digits[base] = decimal_digits(base.p) + (decimal_digits(base.q) if base.q != 1 else 0)
    return lcm * max(sum(digits.values()), 1)


def costly_power(x: Any) -> bool:
    """Whether the exact number ``x`` holds a power a^y, y not an integer, whose integer
    part a^⌊|y|⌋ is beyond the grammar's bounds on an exact power a^n (SymPy builds it
    when it expands a^y = a^n · a^c inside e^x or tanh(x)).  Typed text with such a power
    is refused by :func:`parse_number`; this is the check for a SymPy value given as it
    is (the engine's ``exact_number``).  Cheap: one 64-bit Arb enclosure per
    such power; a power whose exponent cannot be enclosed counts as costly.

    >>> import sympy as sp
    >>> costly_power(sp.Rational(3349, 5000) ** (99999 + sp.pi)), costly_power(sp.sqrt(2))
    (True, False)
    """
    import sympy as sp

    if not isinstance(x, sp.Basic):
        return False
    for p in x.atoms(sp.Pow):
        if p.exp.is_Integer:
            continue  # bounded by the grammar itself
        try:
            if _integer_part_excess(p.base, p.exp, 10**9) is not None:
                return True
        except MhaSymbolicError:
            return True
    return False


#: integers longer than this are never tested for primality (see _primality_unknown)
_PRIME_TEST_BITS = 512


def _primality_unknown(r: Any) -> None:
    """Mark the rational ``r`` as of unknown primality, so that SymPy does not decide it.

    SymPy's assumption system may answer a cheap question about an integer (is it zero,
    is it positive: ``log(n)`` asks) by first asking whether it is prime, in an order
    that depends on the hash seed, and a strong BPSW test of a 5,800-digit integer costs
    12 s (``log(949661^967)``, found by fuzzing).  No exact question of this package
    needs primality: recording it as unknown (None) on the object stops the test."""
    facts = r._assumptions
    if facts is r.default_assumptions:
        facts = r._assumptions = facts.copy()
    for fact in ("prime", "composite"):
        facts.setdefault(fact, None)


def _integer_part_excess(base: Any, y: Any, cap: int) -> tuple[str, int] | None:
    """Why a^⌊|y|⌋ (y not an integer) is beyond the bounds on an exact power a^n:
    ("exponent", 0) for |y| beyond ``cap`` (or not finite), ("digits", size) for a
    rational a of more than MAX_POWER_DIGITS digits, ("terms", 0) for an expansion
    costlier than MAX_EXPANSION_WORK; None within them.  Raises the library's error when
    y cannot be enclosed (one 64-bit Arb enclosure)."""
    ball = to_arb(y, 64)
    if not ball.is_finite() or abs(ball) > cap:
        return "exponent", 0
    top = abs(ball).upper().floor().unique_fmpz()
    if top is None:
        return "exponent", 0
    n = int(top)
    if base.is_Rational:
        size = n * max(decimal_digits(base.p), decimal_digits(base.q))
        return ("digits", size) if size > MAX_POWER_DIGITS else None
    if n > 1 and power_cost(expansion_cost(base), n) > MAX_EXPANSION_WORK:
        return "terms", 0
    return None


def expansion_cost(x: Any, cap: int = MAX_EXPANSION_WORK) -> int:
    """An upper estimate of the work of ``sympy.expand(x)``, capped at cap + 1: the number
    of terms, each power weighted by its exponent (the digits of the multinomial
    coefficients grow with it).

    Sums add, products multiply, an integer power b^n of something of cost t costs
    C(n + t − 1, t − 1) · n (the multinomial count of (a₁ + … + a_t)^n, times n);
    anything else (atoms, functions, fractional powers) costs 1.  SymPy expands such
    powers whenever it asks for real and imaginary parts (exp or tanh of them):
    (1 + √2)^20000 took minutes.  1.0e6 is (1 + √2)^999 (0.3 s) or (1 + √2 + √3)^~110
    (under 1 s).

    >>> import sympy as sp
    >>> expansion_cost((1 + sp.sqrt(2)) ** 10)
    110
    >>> expansion_cost(sp.sqrt(2) ** 7 + 3)
    2
    """
    import sympy as sp

    if not isinstance(x, sp.Basic) or x.is_Atom:
        return 1
    if x.is_Add or x.is_Mul:
        total = 0 if x.is_Add else 1
        for a in x.args:
            t = expansion_cost(a, cap)
            total = total + t if x.is_Add else total * t
            if total > cap:
                return cap + 1
        return total
    if x.is_Pow and x.exp.is_Integer and abs(int(x.exp)) > 1:
        return power_cost(expansion_cost(x.base, cap), abs(int(x.exp)), cap)
    return 1


def power_cost(t: int, n: int, cap: int = MAX_EXPANSION_WORK) -> int:
    """C(n + t − 1, t − 1) · n capped at cap + 1 (see :func:`expansion_cost`); 1 when
    t = 1 (a power of one term expands to one term).

    >>> power_cost(2, 999), power_cost(1, 10**9)
    (999000, 1)
    """
    if t <= 1:
        return 1
    count = 1
    for i in range(1, t):
        count = count * (n + i) // i
        if count * n > cap:
            return cap + 1
    return count * n


def check_radicals(radicals: list[tuple[Any, Any]], where: str = "") -> None:
    """Refuse fractional powers of rationals whose simplification SymPy cannot do cheaply.

    SymPy rewrites b^(p/q) by factoring b (trial division to 2^15) and building the
    integer ∏ pᵢ^((eᵢ·p mod q)/g), which has up to q × digits(b) digits; products of
    such powers add their exponents (denominators dividing the lcm of the q's) and
    multiply their bases (digits add up).  So every integer SymPy builds while
    combining them has at most

        W = lcm(q over all radicals) × Σ digits(distinct bases)

    digits, and W ≤ MAX_RADICAL_WORK (1000) keeps its factoring to milliseconds.
    ``524296^0.56998`` = 524296^(28499/50000) has W ≥ 50000 × 6: refused.

    >>> import sympy as sp
    >>> check_radicals([(sp.Integer(2), sp.Rational(1, 2)), (sp.Integer(3), sp.Rational(1, 3))])
    >>> check_radicals([(sp.Integer(524296), sp.Rational(28499, 50000))])
    Traceback (most recent call last):
    ...
    mha_symbolic.errors.ParseError: fractional powers too costly to simplify exactly: ...
    """
    if radicals and radical_work(radicals) > MAX_RADICAL_WORK:
        suffix = f" in {where}" if where else ""
        raise ParseError("fractional powers too costly to simplify exactly: lcm(root degrees) "
                         f"× digits under the roots exceeds {MAX_RADICAL_WORK}{suffix}")


def short_text(x: Any, limit: int = 80) -> str:
    """A number or expression for an error message: never thousands of digits long,
    and printed without evaluating it (see :func:`mha_symbolic._text.expr_text`)."""
    return expr_text(x, limit)


_short = short_text


def parse_number(text: str) -> sympy.Expr:
    """Parse a number written as a book writes it into an exact SymPy expression.

    Raises :class:`~mha_symbolic.errors.ParseError` (one line, naming the
    problem) for anything outside the grammar.

    >>> parse_number("4.85 × 10^8")
    485000000
    >>> parse_number("e^(sqrt(2)/2)")
    exp(sqrt(2)/2)
    >>> parse_number("70%")
    7/10
    """
    if not isinstance(text, str):
        raise ParseError(f"expected a string, got {type(text).__name__}")
    return _parse(text)


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> sympy.Expr:
    """parse_number's work, cached: a matrix entry is read once however often it is used
    (the engine reads its inputs once to bound their radicals, once to compute)."""
    if len(text) > MAX_LENGTH:
        raise ParseError(f"expression longer than {MAX_LENGTH} characters: {echo(text)}")
    normalized = text.translate(_TRANSLATE).strip()
    if not normalized:
        raise ParseError("empty expression")
    shown = echo(normalized)
    foreign = foreign_digit(normalized)
    if foreign is not None:
        raise ParseError(f"non-ASCII digit {foreign} in {shown}: only the digits 0-9 are read")
    toks = _tokenize(normalized, shown)
    parser = _Parser(normalized, toks)
    try:
        value = parser.expr()
    except RecursionError:
        raise ParseError(f"expression too deeply nested: {shown}") from None
    if parser.peek() is not None:
        tok = parser.peek()
        assert tok is not None
        raise ParseError(f"unexpected {echo(tok.text, 20)} at position {tok.pos} in {shown}")
    sp = parser.sp
    for r in ([value] if value.is_Rational else value.atoms(sp.Rational)):
        if max(decimal_digits(r.p), decimal_digits(r.q)) > MAX_VALUE_DIGITS:
            raise ParseError(f"{shown} holds a number of more than "
                             f"{MAX_VALUE_DIGITS} digits")
    if value.has(sp.zoo, sp.nan, sp.oo, -sp.oo, sp.I):
        raise ParseError(f"{shown} is not a finite real number")
    return value
