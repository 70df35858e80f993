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
             | "." digits

Every number is exact: ``0.707`` is 707/1000, ``1/3`` a third, ``1e-3`` is
1/1000.  ``e^x`` is ``exp(x)``.  Unicode minus (−), times (×, ·, ⋅) and √ are
accepted.  Sizes are bounded (length, nesting, and the size of exact integer
powers) so that no input can make the parser hang or exhaust memory.

>>> from mha_symbolic.exact.grammar import parse_number
>>> parse_number("1 − e^(−32)")
1 - exp(-32)
>>> parse_number("0.6698")
3349/5000
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import MhaSymbolicError, ParseError

if TYPE_CHECKING:
    import sympy

__all__ = ["parse_number"]

MAX_LENGTH = 2000
MAX_DEPTH = 60
MAX_DIGITS = 2000
# An exact power a^b with rational a and integer b is expanded by SymPy; keep the
# result below this many decimal digits.
MAX_POWER_DIGITS = 20_000
# A parsed value may not hold a rational with more digits than this (Python's str()
# of an int stops at 4300 digits, and no book prints such a number).
MAX_VALUE_DIGITS = 4000
# exp(x) and a^x (x irrational) are refused when |x| (resp. |x ln a|) exceeds this.
MAX_LOG = 10**5

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
    (?P<ws>\s+)
  | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+(?![\w.]))?)
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


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r} at position {pos} in {text!r}")
        kind = m.lastgroup or ""
        if kind != "ws":
            toks.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    return toks


class _Parser:
    def __init__(self, text: str, toks: list[_Tok]) -> None:
        import sympy

        self.sp = sympy
        self.text = text
        self.toks = toks
        self.i = 0
        self.depth = 0

    # -- helpers -------------------------------------------------------------
    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise ParseError(f"unexpected end of {self.text!r}")
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.peek()
        if tok is None or tok.text != text:
            where = f"at position {tok.pos}" if tok else "at the end"
            raise ParseError(f"expected {text!r} {where} in {self.text!r}")
        self.i += 1

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError(f"expression nested deeper than {MAX_DEPTH} levels: {self.text[:60]!r}")

    def leave(self) -> None:
        self.depth -= 1

    # -- grammar -------------------------------------------------------------
    def expr(self) -> Any:
        self.enter()
        value = self.term()
        while (tok := self.peek()) is not None and tok.text in "+-":
            self.take()
            rhs = self.term()
            value = value + rhs if tok.text == "+" else value - rhs
        self.leave()
        return value

    def term(self) -> Any:
        value = self.factor()
        while (tok := self.peek()) is not None:
            if tok.text in ("*", "/"):
                self.take()
                rhs = self.factor()
                if tok.text == "/":
                    if rhs == 0 or _is_zero(rhs):
                        raise ParseError(f"division by zero in {self.text!r}")
                    value = value / rhs
                else:
                    value = value * rhs
            elif tok.kind == "number" and self.toks[self.i - 1].kind == "number":
                # "1.2.3", "10 000", "1 2": two numbers side by side are not a product
                raise ParseError(
                    f"two numbers side by side at position {tok.pos} in {self.text!r}; "
                    "write * between them (digit groups are not accepted)"
                )
            elif tok.kind in ("number", "name") or tok.text in ("(", "√"):
                value = value * self.factor()  # juxtaposition: "2 sqrt(2)", "3e^2"
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
        base = self.postfix()
        tok = self.peek()
        if tok is not None and tok.text in ("^", "**"):
            self.take()
            self.enter()
            exponent = self.factor()
            self.leave()
            return self._pow(base, exponent)
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
            return self._sqrt(value)
        if tok.kind == "name":
            name = tok.text
            if name in _FUNCTIONS:
                self.expect("(")
                arg = self.expr()
                self.expect(")")
                if name == "sqrt":
                    return self._sqrt(arg)
                if name == "exp":
                    return self._exp(arg)
                if name == "tanh":  # bounded in (-1, 1): no size limit needed
                    return sp.tanh(arg)
                if arg.is_positive is False or arg == 0:
                    raise ParseError(f"{name}({arg}) is not defined: the argument must be positive")
                return sp.log(arg)
            if name == "e":
                return sp.E
            if name == "pi":
                return sp.pi
            raise ParseError(
                f"unknown name {name!r} at position {tok.pos} in {self.text!r}; "
                f"allowed: numbers, e, pi, {', '.join(_FUNCTIONS)}, + - * / ^ ( ) %"
            )
        raise ParseError(f"unexpected {tok.text!r} at position {tok.pos} in {self.text!r}")

    # -- exact values --------------------------------------------------------
    def _number(self, tok: _Tok) -> Any:
        text = tok.text
        mantissa, _, exp_text = text.lower().partition("e")
        if len(mantissa) > MAX_DIGITS:
            raise ParseError(f"number with more than {MAX_DIGITS} digits in {self.text[:60]!r}...")
        exponent = int(exp_text) if exp_text else 0
        if abs(exponent) > MAX_POWER_DIGITS:
            raise ParseError(f"exponent {exponent} too large in {text!r}")
        whole, _, frac = mantissa.partition(".")
        numerator = int((whole or "0") + frac)
        return self.sp.Rational(numerator, 10 ** len(frac)) * self.sp.Rational(10) ** exponent

    def _exp(self, arg: Any) -> Any:
        self._bound_log(arg, f"exp({_short(arg)})")
        return self.sp.exp(arg)

    def _bound_log(self, log_value: Any, what: str) -> None:
        """Refuse a^x or e^x whose natural logarithm exceeds MAX_LOG in size
        (e^(10^5) has 43430 digits: no book prints such a number)."""
        from .certified import to_arb

        try:
            ball = to_arb(log_value, 64)
        except MhaSymbolicError:
            return  # not a number we can bound here: left to later stages
        if not ball.is_finite() or abs(ball) > MAX_LOG:
            raise ParseError(f"{what} is beyond e^±{MAX_LOG} in {self.text[:60]!r}")

    def _sqrt(self, value: Any) -> Any:
        if value.is_negative:
            raise ParseError(f"sqrt of a negative number ({value}) in {self.text!r}")
        return self.sp.sqrt(value)

    def _pow(self, base: Any, exponent: Any) -> Any:
        sp = self.sp
        if base == sp.E:
            return self._exp(exponent)
        if base.is_negative and exponent.is_integer is not True:
            raise ParseError(f"{_short(base)}^{_short(exponent)} is not a real number in "
                             f"{self.text[:60]!r}")
        if exponent.is_Rational and abs(exponent) > MAX_POWER_DIGITS:
            # SymPy expands some powers of algebraic bases (sqrt(2)^(10^100) = 2^(5·10^99))
            raise ParseError(
                f"exponent {_short(exponent)} is larger than {MAX_POWER_DIGITS} "
                f"in {self.text[:60]!r}"
            )
        if base == 0 and (exponent.is_negative or exponent == 0):
            raise ParseError(f"0^{exponent} is undefined in {self.text!r}")
        if exponent.is_Rational and not exponent.is_Integer and base.is_negative:
            raise ParseError(f"{base}^{exponent} is not a real number in {self.text!r}")
        if not (exponent.is_Rational and base.is_Rational):
            # a^x with irrational x: keep it symbolic, but bound its magnitude
            if base.is_positive and base != 1:
                self._bound_log(exponent * sp.log(base), f"{_short(base)}^{_short(exponent)}")
            return sp.Pow(base, exponent)
        # Exact rational power: bound the size of what SymPy would expand.
        size = abs(exponent) * max(_digits(base.p), _digits(base.q))
        if size > MAX_POWER_DIGITS:
            raise ParseError(
                f"{_short(base)}^{_short(exponent)} would have about {int(size)} digits "
                f"(limit {MAX_POWER_DIGITS}) in {self.text[:60]!r}"
            )
        return sp.Pow(base, exponent)


def _is_zero(x: Any) -> bool:
    """Whether a parsed number is exactly 0 in disguise (log(6) - log(2) - log(3))."""
    if x.is_Rational or x.free_symbols:
        return bool(x == 0)
    from .certified import certify

    try:
        return certify(x).sign() == 0
    except MhaSymbolicError:
        return False


def _digits(n: int) -> int:
    """Decimal digits of n, rounded up (no str(): Python refuses str() beyond 4300 digits)."""
    return int(abs(int(n)).bit_length() * 0.30103) + 1


def short_text(x: Any, limit: int = 80) -> str:
    """A number or expression for an error message: never thousands of digits long,
    and printed without evaluating it."""
    import sympy as sp

    if isinstance(x, sp.Basic):
        big = [r for r in x.atoms(sp.Rational) if max(_digits(r.p), _digits(r.q)) > 30]
        if big:
            n = max(max(_digits(r.p), _digits(r.q)) for r in big)
            return (f"<a number of about {n} digits>" if x.is_Rational
                    else f"<an expression holding a number of about {n} digits>")
    text = str(x)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    if len(text) > MAX_LENGTH:
        raise ParseError(f"expression longer than {MAX_LENGTH} characters")
    normalized = text.translate(_TRANSLATE).strip()
    if not normalized:
        raise ParseError("empty expression")
    toks = _tokenize(normalized)
    parser = _Parser(normalized, toks)
    try:
        value = parser.expr()
    except RecursionError:
        raise ParseError(f"expression too deeply nested: {text[:60]!r}") from None
    if parser.peek() is not None:
        tok = parser.peek()
        assert tok is not None
        raise ParseError(f"unexpected {tok.text!r} at position {tok.pos} in {normalized!r}")
    for r in value.atoms(parser.sp.Rational):
        if max(_digits(r.p), _digits(r.q)) > MAX_VALUE_DIGITS:
            raise ParseError(f"{text[:60]!r} holds a number of more than "
                             f"{MAX_VALUE_DIGITS} digits")
    if value.has(parser.sp.zoo, parser.sp.nan, parser.sp.oo, -parser.sp.oo):
        raise ParseError(f"{text!r} is not a finite number")
    if value.is_real is False:
        raise ParseError(f"{text!r} is not a real number")
    return value
