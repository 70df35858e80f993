"""A bounded grammar for the math of an author's text: LaTeX math (``\\frac{e^{5}}{e^{5}+e^{1}}``,
``4.85 \\times 10^{8}``, ``\\sqrt{d_k}``, ``\\begin{bmatrix}…``) and the plain text of printed
notebook outputs (``sqrt(2)/2``, ``2**20``).

Nothing read here is evaluated, sympified or handed to SymPy's ``parse_latex``: the text is
cut into tokens by one regular expression, a recursive descent (depth-bounded) builds a
small tree of tuples, and :mod:`.statements` writes each scalar of that tree in the
restricted number grammar of :mod:`mha_symbolic.exact.grammar` (whose bounds then apply:
exponent sizes, radicals, digits).  The tree::

    ("num", "0.707")        a number as printed (thousands separators removed)
    ("const", "e" | "pi")   Euler's number (a lone ``e``), π
    ("sym", "d_k")          a name (letters, a subscript, a label superscript, an index)
    ("add", [(+1, a), (-1, b)])   ("mul", [a, b])   ("div", a, b)   ("pow", a, b)
    ("neg", a)   ("pct", a)   ("func", "exp" | "sqrt" | "ln" | "tanh", a)   ("root", n, a)
    ("tuple", [a, b, …])    ("matrix", [[a, b], [c, d]])

Notation outside the grammar raises :class:`NotJudged` with a reason (a limit, a sum,
O(·), an unknown command): such a statement is reported as not judged, never as wrong.

TeX ignores spaces in math mode, so ``51 2^{2}`` is 512² and ``1 0^{8}`` is 10⁸, as a
reader of the typeset page sees them.

>>> parse_member(tokenize(r"\\frac{e^{5}}{e^{5}+e^{1}}"))[0]
'div'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..._text import echo
from ...errors import MhaSymbolicError

__all__ = ["RELATIONS", "NotJudged", "Tok", "parse_member", "tokenize"]

#: Longest statement read (characters); a longer one is not judged.
MAX_STATEMENT = 2000
#: Deepest nesting of groups, fractions and parentheses.
MAX_DEPTH = 40
#: Most entries of a tuple or matrix.
MAX_ENTRIES = 256


class NotJudged(MhaSymbolicError, ValueError):
    """A statement outside the grammar (or with free symbols): reported, never judged."""


@dataclass(frozen=True)
class Tok:
    kind: str  # num, name, cmd, op, rel, text, sep
    text: str
    pos: int
    end: int = -1  # where it ends in the source (a joined number spans more than its text)


#: Relations, by their spellings; only "=", "≈" and the order relations are judged.
RELATIONS: dict[str, str] = {
    "=": "=", "\\approx": "≈", "≈": "≈", "\\simeq": "≈", "\\thickapprox": "≈", "\\doteq": "≈",
    "<": "<", ">": ">", "\\lt": "<", "\\gt": ">", "\\le": "≤", "\\leq": "≤", "\\leqslant": "≤",
    "≤": "≤", "\\ge": "≥", "\\geq": "≥", "\\geqslant": "≥", "≥": "≥", "\\ne": "≠", "\\neq": "≠",
    "≠": "≠", "!=": "≠", "==": "=", "<=": "≤", ">=": "≥",
    # not judged: limits, membership, asymptotics, implications, proportionality
    "\\to": "→", "→": "→", "\\rightarrow": "→", "\\longrightarrow": "→", "\\mapsto": "→",
    "\\in": "∈", "∈": "∈", "\\notin": "∉", "\\sim": "∼", "\\propto": "∝", "\\equiv": "≡",
    "\\Rightarrow": "⇒", "\\implies": "⇒", "\\iff": "⇔", "\\Leftrightarrow": "⇔",
    ":=": "≔", "\\coloneqq": "≔", "\\gg": "≫", "\\ll": "≪", "\\subset": "⊂", "\\subseteq": "⊆",
}
JUDGED_RELATIONS = frozenset("=≈<>≤≥≠")

_IGNORED = frozenset(["\\left", "\\right", "\\big", "\\Big", "\\bigg", "\\Bigg", "\\bigl", "\\bigr",
                      "\\Bigl", "\\Bigr", "\\biggl", "\\biggr", "\\displaystyle", "\\textstyle",
                      "\\scriptstyle", "\\limits", "\\nolimits", "\\,", "\\;", "\\:", "\\!", "\\quad",
                      "\\qquad", "\\", "\\nonumber", "\\notag", "\\middle", "\\phantom"]) | {"\\ "}
_SEPARATORS = frozenset({"\\quad", "\\qquad", "\\text{and}", ";", "\\\\"})
_FUNCS = {"\\exp": "exp", "\\sqrt": "sqrt", "\\ln": "ln", "\\tanh": "tanh",
          "exp": "exp", "sqrt": "sqrt", "ln": "ln", "tanh": "tanh"}
_MUL = frozenset({"\\times", "\\cdot", "*", "×", "·", "⋅", "\\ast", "\\cdotp"})
_NAME_CMDS = frozenset(["\\text", "\\textrm", "\\mathrm", "\\operatorname", "\\mathit", "\\mathbf",
                        "\\mathbb", "\\boldsymbol", "\\mathcal", "\\textbf", "\\textit", "\\mathsf",
                        "\\bm", "\\vec", "\\hat", "\\tilde", "\\bar"])
_GREEK = frozenset(["alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
                    "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau",
                    "upsilon", "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta",
                    "Lambda", "Xi", "Sigma", "Upsilon", "Phi", "Psi", "Omega"])
_UNSUPPORTED = {
    "\\sum": "a sum (Σ)", "\\prod": "a product (Π)", "\\int": "an integral", "\\lim": "a limit",
    "\\infty": "infinity", "∞": "infinity", "\\max": "max", "\\min": "min", "\\arg": "arg",
    "\\argmax": "argmax", "\\log": "\\log (its base is not stated: write \\ln)",
    "\\ldots": "an ellipsis", "\\cdots": "an ellipsis", "\\dots": "an ellipsis", "…": "an ellipsis",
    "\\vdots": "an ellipsis", "\\ddots": "an ellipsis", "\\partial": "a derivative",
    "\\nabla": "a gradient", "\\mid": "a bar", "∣": "a bar", "|": "a bar", "\\|": "a norm",
    "\\pm": "±", "±": "±", "\\mp": "∓", "\\circ": "∘", "\\odot": "⊙", "\\otimes": "⊗",
    "\\oplus": "⊕", "\\sin": "sin", "\\cos": "cos", "\\tan": "tan", "\\det": "det",
    "\\binom": "a binomial", "\\choose": "a binomial", "!": "a factorial", "\\sigma": "σ",
}

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<text>\\(?:text|textrm|mbox|mathrm|operatorname)\s*\{[^{}]{0,80}\})
  | (?P<cmd>\\(?:[A-Za-z]+|.))
  | (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+(?![\w.]))?)
  | (?P<op>\*\*|<=|>=|!=|==|:=|[-+*/^_(){}\[\],=<>&'|!~%;:.]|[≈×·⋅−–≤≥≠→∈∞∣…⊤√±∼])
  | (?P<name>[A-Za-z]+[0-9]*(?![.0-9]))
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_GROUP3 = re.compile(r"(?:\{,\}|\\,|,|\s)(\d{3})(?!\d)")


def tokenize(text: str, base: int = 0) -> list[Tok]:
    """Tokens of one math span; digit runs split only by spaces, ``{,}`` or ``\\,`` in groups
    of three are joined (1{,}048{,}576; TeX's ``51 2`` is 512); a plain ``,`` joins groups
    of three only outside parentheses and brackets (inside, it separates entries)."""
    if len(text) > 50 * MAX_STATEMENT:
        raise NotJudged(f"math longer than {50 * MAX_STATEMENT} characters")
    toks: list[Tok] = []
    pos, depth = 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m is not None  # (?P<other>.) matches anything
        kind = m.lastgroup or "other"
        t = m.group()
        if kind == "num":
            end = m.end()
            while True:  # join "51 2", "1{,}048", "1\,048", "1,048,576" (outside brackets)
                sp = re.match(r"\s+(\d+(?:\.\d*)?)", text[end:])
                if sp and "." not in t and not (toks and toks[-1].text == "^"):
                    t += sp.group(1)
                    end += sp.end()
                    continue
                g = _GROUP3.match(text, end)
                if g and "." not in t and (g.group().startswith(("{", "\\")) or
                                           (g.group().startswith(",") and depth == 0)):
                    t += g.group(1)
                    end = g.end()
                    continue
                break
            toks.append(Tok("num", t, base + pos, base + end))
            pos = end
            continue
        if kind == "text":
            inner = t[t.index("{") + 1:-1].strip()
            toks.append(Tok("text", inner, base + pos, base + m.end()))
        elif kind == "cmd":
            if t in ("\\{", "\\}"):
                toks.append(Tok("op", t[1], base + pos, base + m.end()))
            elif t == "\\%":
                toks.append(Tok("op", "%", base + pos, base + m.end()))
            elif t in ("\\\\",):
                toks.append(Tok("sep", t, base + pos, base + m.end()))
            elif t not in _IGNORED:
                toks.append(Tok("rel" if t in RELATIONS else "cmd", t, base + pos, base + m.end()))
        elif kind == "op" and t == "~":
            pass  # a tie (an unbreakable space) in TeX
        elif kind == "op":
            if t in "([{":
                depth += 1
            elif t in ")]}":
                depth -= 1
            if t in ("−", "–"):
                t = "-"
            toks.append(Tok("rel" if t in RELATIONS else ("sep" if t == ";" else "op"), t,
                            base + pos, base + m.end()))
        elif kind == "name":
            toks.append(Tok("name", t, base + pos, base + m.end()))
        elif kind == "other":
            toks.append(Tok("op", t, base + pos, base + m.end()))
        pos = m.end()
    return toks


class _Parser:
    def __init__(self, toks: list[Tok]) -> None:
        self.toks = toks
        self.i = 0
        self.depth = 0
        self.labels: list[str] = []

    def peek(self, k: int = 0) -> Tok | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def take(self) -> Tok:
        t = self.peek()
        if t is None:
            raise NotJudged("the statement ends too early")
        self.i += 1
        return t

    def expect(self, text: str) -> None:
        t = self.peek()
        if t is None or t.text != text:
            raise NotJudged(f"expected {text!r}" + (f" before {echo(t.text, 20)}" if t else ""))
        self.i += 1

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise NotJudged(f"nested deeper than {MAX_DEPTH} levels")

    # expr := ["+"|"-"] term (("+"|"-") term)*
    def expr(self) -> Any:
        self.enter()
        terms: list[tuple[int, Any]] = []
        sign = 1
        t = self.peek()
        if t is not None and t.text in "+-":
            self.take()
            sign = -1 if t.text == "-" else 1
        terms.append((sign, self.term()))
        while (t := self.peek()) is not None and t.text in ("+", "-"):
            self.take()
            terms.append((-1 if t.text == "-" else 1, self.term()))
        self.depth -= 1
        if len(terms) == 1:
            return terms[0][1] if terms[0][0] == 1 else ("neg", terms[0][1])
        return ("add", terms)

    def term(self) -> Any:
        factors = [self.factor()]
        while (t := self.peek()) is not None:
            if t.text in _MUL:
                self.take()
                factors.append(self.factor())
            elif t.text in ("/", "\\div", "÷"):
                self.take()
                factors = [("div", _product(factors), self.factor())]
            elif t.kind in ("num", "name") or t.text in ("(", "{", "\\frac", "\\dfrac", "\\tfrac",
                                                        "\\sqrt", "√", "\\exp", "\\pi", "\\ln",
                                                        "\\tanh", "\\begin") \
                    or (t.kind == "cmd" and t.text[1:] in _GREEK) or t.kind == "text":
                if t.kind == "num" and self.toks[self.i - 1].kind == "num":
                    raise NotJudged("two numbers side by side")
                if t.text == "(" and factors[-1][0] == "sym":
                    raise NotJudged("a name followed by (…): a function or a product?")
                factors.append(self.factor())
            else:
                break
        return _product(factors)

    def factor(self) -> Any:
        t = self.peek()
        if t is not None and t.text in ("-", "+"):
            self.take()
            self.enter()
            value = self.factor()
            self.depth -= 1
            return ("neg", value) if t.text == "-" else value
        return self.postfix()

    def postfix(self) -> Any:
        base = self.atom()
        t = self.peek()
        if t is not None and t.text in ("^", "**"):
            self.take()
            self.enter()
            exponent = self.group() if t.text == "^" else self.factor()
            self.depth -= 1
            base = ("pow", base, exponent)
        t = self.peek()
        if t is not None and t.text == "%":
            self.take()
            base = ("pct", base)
        return base

    def group(self) -> Any:
        """A TeX argument: ``{…}`` or one token (``^2 3`` is 2 then 3; ``e^-3`` is refused
        by TeX too, but read as e^{-3} here only when braced)."""
        t = self.peek()
        if t is None:
            raise NotJudged("an argument is missing")
        if t.text == "{":
            self.take()
            value = self.expr()
            self.expect("}")
            return value
        if t.kind == "num":
            self.take()
            if len(t.text) > 1:  # ^23 is ^{2} followed by 3
                self.toks[self.i - 1] = Tok("expnum", t.text[0], t.pos, t.pos + 1)
                self.toks.insert(self.i, Tok("num", t.text[1:], t.pos + 1, t.end))
                if t.text[1] == ".":
                    raise NotJudged("a one-character exponent followed by a decimal point")
            return ("num", t.text[0])
        if t.text == "(":  # plain-text outputs: 2^(1/2)
            return self.atom()
        if t.text == "-":  # plain text e^-3
            self.take()
            return ("neg", self.group())
        return self.atom()

    def atom(self) -> Any:
        t = self.take()
        if t.kind == "num":
            return ("num", t.text)
        if t.kind == "text":
            return self._name_from(t.text, t)
        if t.text in ("(", "[", "{"):
            close = {"(": ")", "[": "]", "{": "}"}[t.text]
            self.enter()
            items = [self.expr()]
            while (n := self.peek()) is not None and n.text == ",":
                self.take()
                items.append(self.expr())
                if len(items) > MAX_ENTRIES:
                    raise NotJudged(f"more than {MAX_ENTRIES} entries")
            n = self.peek()
            if t.text != "{" and n is not None and n.text in (")", "]") and n.text != close:
                raise NotJudged("a half-open interval")
            self.expect(close)
            self.depth -= 1
            if len(items) == 1:
                return items[0]
            if t.text == "[":
                raise NotJudged("a bracketed list (an interval or a matrix row?)")
            return ("tuple", items)
        if t.text in ("\\frac", "\\dfrac", "\\tfrac", "\\cfrac"):
            a = self.group()
            b = self.group()
            return ("div", a, b)
        if t.text in ("\\sqrt", "√", "sqrt"):
            n = self.peek()
            if n is not None and n.text == "[":
                self.take()
                degree = self.expr()
                self.expect("]")
                return ("root", degree, self.group())
            return ("func", "sqrt", self.group() if t.text != "sqrt" else self.atom())
        if t.text in _FUNCS or (t.kind == "name" and t.text in _FUNCS):
            name = _FUNCS[t.text]
            n = self.peek()
            if n is not None and n.text in ("^", "_"):
                raise NotJudged(f"{t.text} with a superscript or subscript")
            if n is not None and n.text == "{":
                return ("func", name, self.group())
            if n is None or n.text != "(":
                raise NotJudged(f"{t.text} without parentheses")
            return ("func", name, self.atom())
        if t.text == "\\pi" or t.text == "π":
            return ("const", "pi")
        if t.text == "\\begin":
            return self.environment()
        if t.text in _UNSUPPORTED:
            raise NotJudged(_UNSUPPORTED[t.text])
        if t.text == "O" and (n := self.peek()) is not None and n.text in ("(", "\\left"):
            raise NotJudged("O(·) notation")
        if t.text in _NAME_CMDS:
            return self._name_from(self._raw_group(), t)
        if t.kind == "cmd" and t.text[1:] in _GREEK:
            return self.name(t.text[1:])
        if t.kind == "name":
            if t.text == "e" and not self._subscripted():
                return ("const", "e")
            if t.text == "O" and self.peek() is not None and self.peek().text == "(":  # type: ignore[union-attr]
                raise NotJudged("O(·) notation")
            return self.name(t.text)
        if t.kind == "cmd":
            raise NotJudged(f"unknown notation {echo(t.text, 20)}")
        raise NotJudged(f"unexpected {echo(t.text, 20)}")

    def _subscripted(self) -> bool:
        n = self.peek()
        return n is not None and n.text == "_"

    def _raw_group(self) -> str:
        """The text of a braced argument, flattened (names in \\mathrm{…})."""
        n = self.peek()
        if n is None or n.text != "{":
            t = self.take()
            return t.text
        self.take()
        parts: list[str] = []
        level = 1
        while True:
            t = self.take()
            if t.text == "{":
                level += 1
            elif t.text == "}":
                level -= 1
                if level == 0:
                    break
            parts.append(t.text)
            if len(parts) > 80:
                raise NotJudged("a name longer than 80 tokens")
        return "".join(parts)

    def _name_from(self, text: str, t: Tok) -> Any:
        if not text.strip():
            raise NotJudged("an empty \\text{}")
        return self.name(re.sub(r"\s+", "", text))

    def name(self, base: str) -> Any:
        """A name with its subscript, label superscripts (W^{O}, K^{⊤}, j^{'}) and index."""
        name = base
        while (n := self.peek()) is not None:
            if n.text == "_":
                self.take()
                name += "_" + self._raw_group()
            elif n.text == "'":
                self.take()
                name += "'"
            elif n.text == "^" and self._label_superscript():
                self.take()
                name += "^" + self._raw_group()
            elif n.text == "[" and (n2 := self.peek(1)) is not None and n2.kind == "num" \
                    and (n3 := self.peek(2)) is not None and n3.text in ("]", ","):
                start = self.i
                self.take()
                idx = [self.take().text]
                while (n4 := self.peek()) is not None and n4.text == ",":
                    self.take()
                    idx.append(self.take().text)
                if self.peek() is None or self.peek().text != "]":  # type: ignore[union-attr]
                    self.i = start
                    break
                self.take()
                name += "[" + ",".join(idx) + "]"
            else:
                break
        if len(name) > 80:
            raise NotJudged("a name longer than 80 characters")
        return ("sym", name)

    def _label_superscript(self) -> bool:
        """^{O}, ^{Q}, ^T, ^{\\top}, ^{(i)}, ^{'}: a label, not a power (numbers, names
        bound to numbers and sums are powers: d_{model}^{2})."""
        n = self.peek(1)
        if n is None:
            return False
        if n.text == "{":
            inner = self.peek(2)
            after = self.peek(3)
            if inner is None:
                return False
            if inner.text in ("\\top", "⊤", "T", "'", "\\prime", "(", "*"):
                return True
            return bool(inner.kind == "name" and len(inner.text) == 1 and inner.text.isupper()
                        and after is not None and after.text == "}")
        return n.text in ("\\top", "⊤", "T", "\\prime", "*") or (
            n.kind == "name" and n.text.isupper() and len(n.text) == 1)

    def environment(self) -> Any:
        env = self._raw_group()
        if env not in ("bmatrix", "pmatrix", "matrix", "Bmatrix", "smallmatrix"):
            raise NotJudged(f"the environment {echo(env, 20)}")
        rows: list[list[Any]] = [[]]
        while True:
            n = self.peek()
            if n is None:
                raise NotJudged(f"\\begin{{{env}}} without \\end")
            if n.text == "\\end":
                self.take()
                self._raw_group()
                break
            if n.text == "&":
                self.take()
                continue
            if n.kind == "sep" and n.text == "\\\\":
                self.take()
                rows.append([])
                continue
            rows[-1].append(self.expr())
            if sum(len(r) for r in rows) > MAX_ENTRIES:
                raise NotJudged(f"a matrix of more than {MAX_ENTRIES} entries")
        rows = [r for r in rows if r]
        if not rows or len({len(r) for r in rows}) != 1:
            raise NotJudged("a matrix with rows of different lengths")
        return ("matrix", rows)


def _product(factors: list[Any]) -> Any:
    return factors[0] if len(factors) == 1 else ("mul", factors)


def parse_member(toks: list[Tok]) -> Any:
    """The tree of one side of a statement (its tokens, relations already split off)."""
    if not toks:
        raise NotJudged("an empty side")
    parser = _Parser(list(toks))
    try:
        value = parser.expr()
    except RecursionError:
        raise NotJudged("nested too deeply") from None
    if parser.peek() is not None:
        t = parser.peek()
        assert t is not None
        if t.text in _UNSUPPORTED:
            raise NotJudged(_UNSUPPORTED[t.text])
        raise NotJudged(f"unexpected {echo(t.text, 20)}")
    return value


def _exact(shape: tuple[int, ...], texts: list[str]) -> Any:
    """The exact SymPy value (nested tuples for vectors and matrices)."""
    from ...errors import ParseError
    from ...exact.grammar import parse_number

    try:
        values = [parse_number(t) for t in texts]
    except ParseError as exc:
        raise NotJudged(f"cannot be read exactly: {_short(exc)}") from None
    if shape == ():
        return values[0]
    if len(shape) == 1:
        return tuple(values)
    return tuple(tuple(values[r * shape[1]:(r + 1) * shape[1]]) for r in range(shape[0]))


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:159] + "…"
