r"""The math in a worked example's own text (its title, notes, the claims' quotations,
the checker's diagnoses), typeset as math.

Authors write notes in plain text with code-like math: ``Q1 K1^T = [[1, 0], [0, 1]]``,
``e^2 / (3 e^2)``, ``1/sqrt(d_k)``, ``1e-3``.  A textbook prints :math:`Q_1 K_1^{\top}
= \left[\begin{smallmatrix}1&0\\0&1\end{smallmatrix}\right]`, :math:`e^{2}/(3e^{2})`,
:math:`1/\sqrt{d_k}`, :math:`10^{-3}`.  This module finds those runs and writes them as
LaTeX from a small grammar of its own, *never* by passing the text on:

* tokens: numbers (``2``, ``0.707``, ``1e-3``), names with an optional subscript and
  superscript (``d_k``, ``d_model``, ``K1^T``, ``e^40``, ``e^(0.707)``), ``sqrt(…)``,
  matrix literals of numbers (``[[1, 0], [0, 1]]``), the operators ``= + - * / ^ ≈ ×
  · ≤ ≥ < >``, parentheses and commas;
* a run becomes math when it holds a *strong* token (a subscript or superscript, an
  ``=``, a ``/``, ``sqrt``, a matrix, an exponent literal, a signed number ``-1.5``)
  and grows over the numbers, one-letter names, operators and balanced parentheses
  around it; an English word (two or more letters, no subscript) ends it; a range of
  numbers (``1-2``) stays text, with an en dash;
* every piece of LaTeX written is built from the token's characters after they were
  matched by the grammar (letters, digits, ``.``, ``-``), so nothing the author wrote
  reaches TeX as a command; the text between runs is escaped by the caller.

Numbers keep the author's digits (they are what the text says); only the exponent
literal ``1e-3`` becomes :math:`10^{-3}`.

>>> pieces("scaled by 1/sqrt(d_k).")
[(False, 'scaled by '), (True, '1/\\sqrt{d_{k}}'), (False, '.')]
>>> pieces("w_j = e^2 / (3 e^2) shows")[0]
(True, 'w_{j} = e^{2} / (3 e^{2})')
"""

from __future__ import annotations

import re

__all__ = ["pieces"]

_TOKEN = re.compile(
    r"(?P<matrix>\[\[[0-9.,\s\[\]+\-−]{1,400}\]\])"
    r"|(?P<sqrt>sqrt\((?P<sqrt_arg>[^()]{1,60})\))"
    r"|(?P<range>\d+[-–]\d+)(?![\d.])"
    r"|(?P<signed>(?<![\w.)\]])[-−+]\d+(?:\.\d+)?)(?![\d.]|[eE]\d)"
    r"|(?P<sci>\d+(?:\.\d+)?[eE][-+−]?\d+)(?![A-Za-z0-9_])"
    r"|(?P<atom>(?P<base>[A-Za-z]+\d*|\d+(?:\.\d+)?)"
    r"(?:_(?P<sub>[A-Za-z0-9]+))?"
    r"(?:\^(?P<sup>[-−]?(?:\d+(?:\.\d+)?|[A-Za-z0-9]+)|\((?P<sup_group>[^()]{1,60})\))"
    r"(?:_(?P<sub2>[A-Za-z0-9]+))?)?)"
    r"|(?P<op>[=+*/·×≈<>≤≥−\-])"
    r"|(?P<open>\()"
    r"|(?P<close>\))"
    r"|(?P<comma>,)"
    r"|(?P<space>[ \t]+)"
    r"|(?P<other>.)",
    re.S,
)

#: Names set as operators (upright, with TeX's spacing), and names set upright as text.
_FUNCTIONS = {"exp": r"\exp", "log": r"\log", "ln": r"\ln", "max": r"\max",
              "min": r"\min", "tanh": r"\tanh", "sin": r"\sin", "cos": r"\cos"}
#: The sizes' multi-letter names (PyTorch's): math on their own, set upright.
_SIZE_NAMES = {"kdim", "vdim"}
#: Multi-letter names that join a math run (others end it: they are English words).
_JOINING = {"softmax"}
_OPS = {"=": "=", "+": "+", "-": "-", "−": "-", "*": r"\cdot", "·": r"\cdot",
        "×": r"\times", "/": "/", "≈": r"\approx", "<": "<", ">": ">", "≤": r"\le",
        "≥": r"\ge"}
#: Operators that make a run math on their own (``+`` and ``-`` also join words).
_STRONG_OPS = set("=*/·×≈≤≥<>")
#: At most this many characters of a text are scanned (a note is a paragraph).
LIMIT = 20_000


class _Tok:
    __slots__ = ("kind", "m", "text")

    def __init__(self, m: re.Match[str]) -> None:
        self.kind = "other"
        for k in ("matrix", "sqrt", "range", "signed", "sci", "atom", "op", "open", "close", "comma", "space",
                  "other"):
            if m.group(k) is not None:
                self.kind = k
                break
        self.text = m.group(0)
        if self.kind == "atom" and _is_code(m):
            self.kind = "code"  # a program's identifier (context_length): text, as written
        self.m = m

    @property
    def strong(self) -> bool:
        if self.kind in ("matrix", "sqrt", "sci", "signed"):
            return True
        if self.kind == "atom":
            return (self.m.group("sub") is not None or self.m.group("sup") is not None
                    or self.m.group("base") in _SIZE_NAMES)
        return self.kind == "op" and self.text in _STRONG_OPS

    @property
    def joins(self) -> bool:
        """Whether the token may be part of a math run next to a strong one."""
        if self.strong or self.kind in ("op", "open", "close", "space"):
            return True
        if self.kind == "atom":
            base = self.m.group("base")
            letters = re.match(r"[A-Za-z]*", base)
            n = len(letters.group(0)) if letters else 0
            return (n == 0 or (n == 1 and base != "a") or base in _FUNCTIONS
                    or base in _JOINING)
        return False


def _is_code(m: re.Match[str]) -> bool:
    """``num_heads``, ``qkv_bias``: a name of two or more letters with a subscript of two
    or more letters is a program's identifier, not mathematics (``d_model``, ``head_1``
    and ``W_query`` are mathematics: a one-letter name, or a numbered one)."""
    base, sub = m.group("base"), m.group("sub")
    return (sub is not None and len(sub) > 1 and not sub.isdigit()
            and bool(re.fullmatch(r"[A-Za-z]{2,}", base)) and base not in _FUNCTIONS)


def _tokens(text: str) -> list[_Tok]:
    return [_Tok(m) for m in _TOKEN.finditer(text)]


def pieces(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into (is_math, piece): math pieces are LaTeX (math mode) built by
    the grammar above; the others are the author's text, to be escaped by the caller."""
    text = text[:LIMIT]
    toks = _tokens(text)
    math = [False] * len(toks)
    for k, tok in enumerate(toks):
        if tok.strong and not math[k]:
            lo, hi = _grow(toks, k)
            for j in range(lo, hi):
                math[j] = True
    out: list[tuple[bool, str]] = []
    k = 0
    while k < len(toks):
        j = k
        while j < len(toks) and math[j] == math[k]:
            j += 1
        run = toks[k:j]
        if math[k]:
            out.append((True, _latex(run)))
        else:
            # a range of numbers (1-2) takes an en dash, as a book sets it
            out.append((False, "".join(t.text.replace("-", "–") if t.kind == "range"
                                       else t.text for t in run)))
        k = j
    return _merge(out)


def _merge(out: list[tuple[bool, str]]) -> list[tuple[bool, str]]:
    merged: list[tuple[bool, str]] = []
    for is_math, piece in out:
        if merged and merged[-1][0] == is_math:
            merged[-1] = (is_math, merged[-1][1] + piece)
        elif piece:
            merged.append((is_math, piece))
    return merged


def _grow(toks: list[_Tok], k: int) -> tuple[int, int]:
    """The run of tokens around the strong token ``k``: [lo, hi)."""
    # left: stop at a word, at a comma outside parentheses; a '(' left open is included
    lo, depth = k, 0
    while lo > 0:
        t = toks[lo - 1]
        if t.kind == "close":
            depth += 1
        elif t.kind == "open":
            depth -= 1
        elif (t.kind == "comma" and depth <= 0) or not (t.joins or (t.kind == "comma" and depth > 0)):
            break
        lo -= 1
    opened = sum(1 for t in toks[lo:k] if t.kind == "open") - \
        sum(1 for t in toks[lo:k] if t.kind == "close")
    hi, depth = k + 1, max(opened, 0)
    while hi < len(toks):
        t = toks[hi]
        if t.kind == "open":
            depth += 1
        elif t.kind == "close":
            if depth == 0:
                break
            depth -= 1
        elif (t.kind == "comma" and depth == 0) or not (t.joins or (t.kind == "comma" and depth > 0)):
            break
        hi += 1
    # trim spaces, dangling operators and commas from both ends
    while (lo < k and toks[lo].kind in ("space", "comma")) or (
            lo < k and toks[lo].kind == "op" and toks[lo].text not in "-−"):
        lo += 1
    while hi > k + 1 and toks[hi - 1].kind in ("space", "comma", "op", "open"):
        hi -= 1
    balance = sum((t.kind == "open") - (t.kind == "close") for t in toks[lo:hi])
    # an unmatched '(' at the left edge (a parenthesis of the sentence): leave it out
    while balance > 0 and lo < k and toks[lo].kind in ("open", "space"):
        balance -= toks[lo].kind == "open"
        lo += 1
    while balance < 0 and hi > k + 1 and toks[hi - 1].kind in ("close", "space"):
        balance += toks[hi - 1].kind == "close"
        hi -= 1
    if balance != 0:
        lo, hi = k, k + 1
    if hi - lo == 1 and toks[k].kind == "op":
        return k, k  # an operator between words ("key/value"): text
    return lo, hi


def _latex(run: list[_Tok]) -> str:
    parts = [_tok_latex(t) for t in run]
    return re.sub(r"\s+", " ", "".join(parts)).strip()


def _name(base: str) -> str:
    if base in _FUNCTIONS:
        return _FUNCTIONS[base]
    m = re.fullmatch(r"([A-Za-z]+)(\d*)", base)
    if m is None:  # a number: the author's digits, grouped in threes (siunitx-style)
        from .numbers import group_digits

        whole, dot, frac = base.partition(".")
        return group_digits(whole) + dot + group_digits(frac, from_left=True)
    letters, digits = m.groups()
    if len(letters) == 1:
        return letters + (f"_{{{digits}}}" if digits else "")
    return rf"\mathrm{{{letters}{digits}}}"


def _sub(text: str) -> str:
    if re.fullmatch(r"[A-Za-z]|\d+", text):
        return text
    return rf"\mathrm{{{text}}}"


def _sup(m: re.Match[str]) -> str:
    group = m.group("sup_group")
    if group is not None:
        # the group's tokens set together (an operator keeps its spaces: "\\le w", never
        # "\\lew"); characters outside the grammar are dropped
        return _latex([x for x in _tokens(group) if x.kind != "other"])
    sup = m.group("sup").replace("−", "-")
    if sup == "T":
        return r"\top"
    return sup if re.fullmatch(r"-?[0-9.]+|-?[A-Za-z]", sup) else rf"\mathrm{{{sup}}}"


def _tok_latex(t: _Tok) -> str:
    m = t.m
    if t.kind == "matrix":
        rows = re.findall(r"\[([^\[\]]*)\]", t.text[1:-1])
        cells = [[c.strip().replace("−", "-") for c in row.split(",")] for row in rows]
        if not rows or any(not re.fullmatch(r"[+-]?\d+(?:\.\d+)?", c)
                           for row in cells for c in row):
            return r"\text{[matrix]}"
        # rows ended by \cr, not a double backslash: inline in Markdown, GitHub's pass
        # would eat one backslash of a pair (and pdflatex's smallmatrix takes \cr too)
        body = r" \cr ".join(" & ".join(row) for row in cells)
        return rf"\left[\begin{{smallmatrix}}{body}\end{{smallmatrix}}\right]"
    if t.kind == "sqrt":
        inner = _latex([x for x in _tokens(m.group("sqrt_arg")) if x.kind != "other"])
        return rf"\sqrt{{{inner}}}"
    if t.kind == "signed":  # a signed number: a minus sign, not a hyphen
        return ("-" if t.text[0] in "-−" else "+") + _name(t.text[1:])
    if t.kind == "sci":
        mant, _, exp = re.split(r"([eE])", t.text)
        exp = exp.replace("−", "-").lstrip("+")
        exp = ("-" if exp.startswith("-") else "") + (exp.lstrip("-").lstrip("0") or "0")
        return (f"10^{{{exp}}}" if mant == "1" else rf"{mant} \times 10^{{{exp}}}")
    if t.kind == "atom":
        out = _name(m.group("base"))
        has_sub = "_{" in out  # Q1: the digits are already a subscript
        if m.group("sub") is not None:
            # a second subscript of one base is a TeX error: a new (empty) base first
            out += ("{}" if has_sub else "") + f"_{{{_sub(m.group('sub'))}}}"
            has_sub = True
        if m.group("sup") is not None:
            out += f"^{{{_sup(m)}}}"
        if m.group("sub2") is not None:  # W^Q_i
            out += ("{}" if has_sub else "") + f"_{{{_sub(m.group('sub2'))}}}"
        return out
    if t.kind == "op":
        return f" {_OPS[t.text]} " if t.text not in "/" else "/"
    if t.kind in ("open", "close"):
        return t.text
    if t.kind == "comma":
        return ", "
    if t.kind == "space":
        return " "
    return ""  # never reached: 'other' tokens are never inside a run
