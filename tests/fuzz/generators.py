"""Generators of hostile input, written once against a tiny :class:`Source` interface.

A generator draws every choice from a ``Source``: :class:`RandomSource` (a seeded
PRNG: the long run, where input ``i`` is reproducible from its index alone) or
:class:`DataSource` (hypothesis's ``data``: the quick run in the test suite, which
shrinks a failure to a small input).  Four families:

* :func:`number_text` — strings for the number grammar: book notation, random
  expressions, and the hostile snippets of issue 15 (huge exponents, radicals that
  SymPy simplifies at unbounded cost, zeros in disguise, foreign digits, control
  characters, TeX);
* :func:`printed_text` — printed answers (decimals, tuples, shapes, formulas, junk);
* :func:`document_text` — whole worked-example TOML documents, including TeX and
  terminal payloads in names, titles and notes, extreme options, and mutated bytes;
* :func:`cli_call` — command lines (check, derive, plot, shapes, params, prove) with
  the files they read, output paths inside and outside the output folder, and
  terminal encodings.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Source(Protocol):
    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...

    def chance(self, p: float) -> bool: ...


class RandomSource:
    """Choices from a seeded PRNG (input ``i`` of a run is ``RandomSource((seed, i))``)."""

    def __init__(self, seed: Any) -> None:
        self.r = random.Random(repr(seed))

    def integer(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.r.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.r.random() < p


class DataSource:
    """Choices drawn from hypothesis (``st.data()``), so that failures shrink."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st

        self.data = data
        self.st = st

    def integer(self, lo: int, hi: int) -> int:
        return int(self.data.draw(self.st.integers(lo, hi)))

    def choice(self, options: Sequence[T]) -> T:
        return options[self.integer(0, len(options) - 1)]

    def chance(self, p: float) -> bool:
        return self.integer(0, 9999) < int(p * 10000)


# -- pieces -------------------------------------------------------------------------

CONTROL = ["\x1b[31m", "\x1b]0;pwned\x07", "\x1b[2J", "\r", "\n", "\t", "\x00", "\x07", "\x08",
           "\x7f", "\x9b31m", "\x85", "\u202e", "\u2066", "\u2069", "\u200f", "\u2028", "\x0c"]
TEX = [r"\input{/etc/passwd}", r"\immediate\openout5=pwned.txt\immediate\write5{x}"
       r"\immediate\closeout5", r"\write18{touch shell-escape}", r"^^5cinput{/etc/passwd}",
       r"\catcode`\^^M=13", r"$\input{/etc/hostname}$", r"\def\x{\x}\x", r"\csname input\endcsname",
       "$x$", "$", "{", "}", "%", "#", "&", "_", "~", "\\", r"\end{document}", r"\special{x}",
       r"\openin1=/etc/passwd", "^^M", "^^[", "$$", r"\(\)"]
MARKUP = ["<script>alert(1)</script>", "| a | b |", "`code`", "**bold**", "[x](javascript:1)",
          "&amp;", "<!--", "![i](/etc/passwd)", "# h", "\\$"]
UNICODE = ["\u0661\u0662", "\u06f5", "\u00b2", "\ud800", "\udcff", "\ufeff", "e\u0301", "\U0001f600",
           "\u2212", "\u00d7", "\u221a", "\u03c0", "\u2009", "\u00a0", "\uffff", "\u0000"]
NASTY = CONTROL + TEX + MARKUP + UNICODE

BOOK_NUMBERS = ["0.6698", "≈ 0.3302", "1/3", "sqrt(2)", "√2", "e^3", "1 − e^(−32)", "70%", "4.85 × 10^8",
                "1.5e-3", ".5", "2^-1", "e^(sqrt(2)/2)/(e^(sqrt(2)/2)+1)", "ln(2)", "log(10)", "pi",
                "2 pi", "-inf", "−∞", "0", "-0", "1", "2^20", "4 × 512^2", "12.5%", "3e^2", "2e"]

ZERO_FACTORS = "(1+sqrt(2))*(1+sqrt(3))*(1+sqrt(5))*(1+sqrt(7))*(1+sqrt(11))"
ZERO_TERMS = ("(1+sqrt(3))*(1+sqrt(2))*(sqrt(5)+1)*(1+sqrt(7))*(sqrt(11)+1)")
ZERO = f"({ZERO_FACTORS}-{ZERO_TERMS})"
ZERO2 = "((1+sqrt(2))*(1+sqrt(3))-(1+sqrt(2)+sqrt(3)+sqrt(6)))"

HOSTILE_NUMBERS = [
    "sqrt(-1e4400)", "ln(-1e5000)", "0^(-1e-4400)", "524296^0.56998", "7" * 360 + "^(4/5)",
    "(-1)^(1/2)", "1e5e5", "\u0661\u0662\u0663", "\u06f5", ZERO, f"sqrt({ZERO})", f"1/{ZERO}",
    f"ln({ZERO}+1)", f"{ZERO}^2", f"e^{ZERO}", f"sqrt({ZERO}+1e-200)", f"ln({ZERO2}+1e-300)",
    f"sqrt({ZERO2})", f"2^({ZERO2})", f"({ZERO2})^(1/3)", f"(-2)^({ZERO2})",
    "(2^(1/3))^20000", "10^10^10", "9^9^9", "2^(10^10)", "e^(1e5)", "e^(99999.9)", "e^(100001)",
    "exp(exp(exp(2)))", "(1+sqrt(2))^20000", "1e20000*1e-19999", "1e20000*1e20000",
    "(" * 70 + "1" + ")" * 70, "-" * 1999 + "1", "sqrt(" + "9" * 1990 + ")", "9" * 2001,
    "2^0.5678", "524296^(1/49999)*524296^(1/50001)", "sqrt(" + "7" * 200 + ")*sqrt(" + "3" * 200 + ")",
    "1e-99999999", "1e" + "9" * 30, "10^20001", "(1/2)^(-100000)", "sqrt(2)^(10^100)",
    "__import__('os').system('x')", "lambda: 1", "0x10", "1_000", "1,000", "1 000", "2.36M",
    "tensor([[0.4419, 0.6515]])", "inf", "nan", "oo", "zoo", "I", "x", "", "   ", "()", "%%",
    "e^(i)", "ln(0)", "log(-1)", "0^0", "1/0", "1/(1-1)", f"1/({ZERO2})", "sqrt(1e-400)",
    "e^(sqrt(2)^2000)", "(e^(1e5))^2", "(e^50000)^(3/2)", "2^(sqrt(2)*1e5)", "0.1^(1e5)",
    "(sqrt(2)+sqrt(3))^40", "exp(" * 30 + "1" + ")" * 30, "√" * 500 + "2",
    "1e5e", "2e5pi", "1.2.3", "1..5", "3e^2e^2", "2^^2", "2**-**2", "1e+", "e^-", "+-+-+-1",
]

_OPS = ["+", "-", "*", "/", "^", "**", " × ", "·", "−", " ", "⋅", "∕", "%"]
_FUNCS = ["sqrt", "exp", "ln", "log", "√", "sin", "abs", "Sqrt", "e^", "tanh"]


def _digits(src: Source, n: int) -> str:
    return "".join(src.choice("0123456789") for _ in range(n))


def _size(src: Source) -> int:
    """Digit counts: mostly short, sometimes hundreds or thousands."""
    return src.choice([1, 1, 1, 2, 2, 3, 4, 6, 10, 20, 40, 100, 310, 1000, 2000, 4400])


def number_atom(src: Source) -> str:
    k = src.integer(0, 11)
    if k == 0:
        return src.choice(["e", "pi", "π", "E", "e", "1", "0"])
    if k <= 4:
        return str(src.integer(0, 10 ** src.choice([1, 1, 2, 3, 6])))
    if k <= 6:
        return f"{src.integer(0, 99)}.{_digits(src, src.integer(1, 6))}"
    if k == 7:
        exponent = src.choice(["3", "-3", "+2", "-32", "1000", "-4400", "20000", "20001", "99999"])
        return f"{src.integer(1, 9)}.{_digits(src, 2)}e{exponent}"
    if k == 8:
        return _digits(src, _size(src)) or "0"
    if k == 9:
        return f"{src.integer(0, 99)}%"
    if k == 10:
        return src.choice(BOOK_NUMBERS)
    return src.choice(HOSTILE_NUMBERS[:40])


def number_expr(src: Source, depth: int = 4) -> str:
    if depth <= 0 or src.chance(0.3):
        return number_atom(src)
    k = src.integer(0, 7)
    a = number_expr(src, depth - 1)
    if k <= 2:
        b = number_expr(src, depth - 1)
        return f"{a}{src.choice(_OPS)}{b}"
    if k == 3:
        return f"{src.choice(['-', '+', '−', '--'])}{a}"
    if k == 4:
        f = src.choice(_FUNCS)
        return f"{f}{a}" if f in ("√", "e^") else f"{f}({a})"
    if k == 5:
        b = number_expr(src, depth - 1)
        return f"({a})^({b})"
    if k == 6:
        return f"({a})"
    return f"{a} {number_expr(src, depth - 1)}"


def mutate(src: Source, text: str, rate: float = 0.5) -> str:
    """Insert, delete or duplicate pieces of ``text`` (the classic mutations)."""
    for _ in range(src.integer(1, 3)):
        if not src.chance(rate):
            continue
        pos = src.integer(0, len(text))
        k = src.integer(0, 4)
        if k == 0:
            text = text[:pos] + src.choice(NASTY) + text[pos:]
        elif k == 1 and text:
            end = min(len(text), pos + src.integer(1, 5))
            text = text[:pos] + text[end:]
        elif k == 2:
            text = text[:pos] + src.choice("()^*/+-.eE%√×−,;[]{}=\"'\\$") + text[pos:]
        elif k == 3:
            text = text[:pos] + text[pos:pos + 20] * src.integer(2, 6) + text[pos:]
        else:
            text = text[:pos] + chr(src.integer(0, 0x2FFF)) + text[pos:]
    return text


def number_text(src: Source) -> str:
    """A string for :func:`mha_symbolic.exact.grammar.parse_number`."""
    k = src.integer(0, 9)
    if k <= 1:
        return src.choice(HOSTILE_NUMBERS)
    if k == 2:
        return src.choice(BOOK_NUMBERS)
    text = number_expr(src, src.integer(1, 5))
    if k >= 8:
        text = mutate(src, text)
    return text


# -- printed answers ------------------------------------------------------------------

_PREFIXES = ["", "", "", "≈ ", "≈", "~", "= ", "about ", "approx. ", "approximately ", "==", "≈ ≈ "]


def hostile(src: Source) -> bool:
    """Whether this document may hold input that the loader refuses (about a third of
    them); the others reach the checker, with nasty names, titles and notes only."""
    return bool(getattr(src, "hostile", True))


def decimal_text(src: Source) -> str:
    sign = src.choice(["", "", "-", "−", "+"])
    whole = str(src.integer(0, src.choice([1, 9, 99, 999, 10**6])))
    places = src.choice([0, 1, 2, 3, 4, 4, 6, 10, 20])
    return sign + whole + (("." + _digits(src, places)) if places else "")


def printed_text(src: Source) -> str:
    """A printed answer for :func:`mha_symbolic.textbook.claims.parse_printed`."""
    k = src.integer(0, 13)
    prefix = src.choice(_PREFIXES)
    if k <= 3:
        body = decimal_text(src)
    elif k == 4:
        body = (f"{decimal_text(src)} {src.choice(['×', 'x', '*', '·'])} 10^"
                f"{src.choice(['8', '-2', '(-3)', '1000', '1001', '-1000', '99999999', '٣'])}")
    elif k == 5:
        body = f"{decimal_text(src)}e{src.choice(['-2', '+3', '1000', '1001', '-99999999'])}"
    elif k == 6:
        body = f"{decimal_text(src)}%"
    elif k == 7:
        parts = [printed_text(src) if src.chance(0.2) else decimal_text(src)
                 for _ in range(src.integer(1, 4))]
        body = "(" + src.choice([", ", ",", "; "]).join(parts) + ")"
    elif k == 8:
        body = (f"{src.choice(['3', 'n', 'd_k', '0', '4096', '9' * 30, 'x y'])} "
                f"{src.choice(['×', 'x', '*'])} {src.choice(['5', 'd_v', 'n', '1'])}")
    elif k == 9:
        body = src.choice(["-inf", "−∞", "NaN", "nan", "-oo", "inf", "∞", "-Inf"])
    elif k == 10:
        body = number_text(src)
    elif k == 11:
        body = src.choice(["2,360,064", "2 360 064", "2’360’064", "2.36M", "2.36 million",
                           "2359296 parameters", "tensor([[0.4419, 0.6515]])",
                           "array([0.5, 0.5], dtype=float32)", "(0.5, 0.5,)", "((0.5))", "()",
                           "(", ")", ",", "1,", "0.5 0.5", "½", "0.5…", "0.50 ± 0.01"])
    elif k == 12:
        body = mutate(src, decimal_text(src), 0.9)
    else:
        body = "x" * src.choice([1, 499, 500, 501, 5000])
    text = prefix + body
    if src.chance(0.1):
        text = mutate(src, text)
    return text


# -- documents ----------------------------------------------------------------------------


def toml_string(text: str) -> str:
    """A TOML basic string for any Python string (control characters as \\uXXXX; lone
    surrogates, which TOML cannot hold, as U+FFFD)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\ufffd")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def free_text(src: Source, short: bool = False) -> str:
    k = src.integer(0, 5)
    if k == 0:
        return src.choice(["A", "B", "Example 1", "softmax of (1, 0)", "x_1", "d_k & 50% #1 ≈ ∞ ✓"])
    if k <= 2:
        return "".join(src.choice([*NASTY, "a", " ", "b"]) for _ in range(src.integer(1, 6)))
    if k == 3:
        return src.choice(TEX)
    if k == 4:
        return "x" * src.choice([1, 99, 100, 101, 300 if short else 5000])
    return mutate(src, src.choice(["Example", "notes on $x$", "weights"]), 0.9)


#: Entries that are numbers a book prints (the grammar reads them all).
GOOD_ENTRIES = ["0.5", "-1.25", "0.1", "1e-3", "2.5e2", '"1/3"', '"sqrt(2)"', '"e^(1/2)"',
                '"ln(3)"', '"0.6698"', '"1 − e^(−32)"', '"70%"', '"2^-1"', '"-2"', '"pi/4"', '"e"']


def entry(src: Source) -> str:
    """One matrix entry as TOML: mostly an integer, a float or a number string a book
    prints; rarely a hostile one (so that most documents reach the checker)."""
    k = src.integer(0, 99 if hostile(src) else 91)
    if k < 70:
        return str(src.integer(-3, 5))
    if k < 92:
        return src.choice(GOOD_ENTRIES)
    if k < 95:
        return toml_string(number_text(src))
    if k < 96:
        return src.choice(["1e308", "5e-324", "nan", "inf", "-inf", "1.7976931348623157e308", "-0.0"])
    if k < 97:
        return src.choice(["true", "[]", "{}", "[1]", '"-inf"', '"-oo"'])
    if k < 98:
        return src.choice(["1" + "0" * src.choice([30, 300, 3999, 4000, 4200]), "-" + "9" * 50])
    return toml_string(src.choice(HOSTILE_NUMBERS))


def matrix(src: Source, rows: int, cols: int) -> str:
    if hostile(src) and src.chance(0.02):
        cols2 = src.integer(0, cols + 1)
        return "[" + ", ".join("[" + ", ".join(entry(src) for _ in range(cols2 if r else cols)) + "]"
                               for r in range(rows)) + "]"
    return "[" + ", ".join("[" + ", ".join(entry(src) for _ in range(cols)) + "]"
                           for _ in range(rows)) + "]"


def _dim(src: Source, typical: int) -> int:
    if hostile(src) and src.chance(0.01):
        return src.choice([0, 65, 80, 128])
    return max(1, typical)


_QUANTITIES = ["score", "scaled_score", "weight", "head_output", "concat", "output", "q", "k", "v",
               "bias"]
_SHAPES = ["x", "x_kv", "w_q", "w_k", "w_v", "q", "k", "v", "scores", "weights", "head", "concat",
           "w_o", "output", "bogus"]
_DIMS = ["n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim", "vdim", "concat_width"]
_PARAMS = ["total", "weights", "biases", "w_q", "w_k", "w_v", "w_o", "w_q_head", "qkv"]


_ROW = "\uffffrow="  # marks a row claim's width inside the generator (never in output)


def quantity(src: Source, n: int, m: int, *, values: bool = True, inputs: bool = True,
             projected: bool = False) -> str:
    """A claim's quantity; for a benign document, one that the example can compute
    (``values``: it gives values; ``inputs``: it gives inputs, not only sizes;
    ``projected``: it has queries and keys, so q, k, v exist)."""
    n, m = max(n, 1), max(m, 1)
    if hostile(src) and src.chance(0.15):
        if src.chance(0.5):
            return src.choice(["weight[0,1]", "weight[" + "9" * 5000 + ",1]", "weight[١,1]",
                               "weight[1,1,1]", "nope", "", " ", "weight[-1]", "params.", "shape",
                               "weight[5,5]", "output[1,9]"])
        return mutate(src, src.choice(_QUANTITIES) + "[1,1]", 0.9)
    if not inputs or src.chance(0.15):
        return src.choice(["shape." + src.choice(_SHAPES[:-1]), "dim." + src.choice(_DIMS),
                           "params." + src.choice(_PARAMS), "expr"])
    if src.chance(0.1):
        return (src.choice(["weight_sum", "gap", "sink_weight"] if m > 1 else ["weight_sum", "sink_weight"])
                + f"[{src.integer(1, n)}]")
    names = ["score", "scaled_score", "weight"]
    if values:
        names += ["head_output", "concat", "output"]
    if projected:
        names += ["q", "k"] + (["v"] if values else [])
    name = src.choice(names)
    rows = m if name in ("k", "v") else n
    if name in ("score", "scaled_score", "weight") and src.chance(0.3):
        return f"{name}[{src.integer(1, rows)}]{_ROW}{m}"  # a row of m entries
    cols = m if name in ("score", "scaled_score", "weight") else 1
    return f"{name}[{src.integer(1, rows)},{src.integer(1, cols)}]"


def _plausible_claim(src: Source, q: str) -> str:
    """A claim of the kind the quantity needs (a tuple for a row, a shape for shape.*)."""
    if q.startswith("shape."):
        return f"{src.integer(1, 4)} × {src.choice(['1', '2', '3', '4', 'n', 'd_k'])}"
    if _ROW in q:
        width = int(q.split(_ROW)[1])
        return "(" + ", ".join(decimal_text(src) for _ in range(width)) + ")"
    if "[" in q and "," not in q and not q.startswith(("weight_sum", "gap", "sink_weight")):
        return "(" + ", ".join(decimal_text(src) for _ in range(src.integer(1, 4))) + ")"
    return src.choice(_PREFIXES[:6]) + src.choice([decimal_text(src), "0.5", "1", "0", "-inf",
                                                   "e^2/(1+e^2)", "1/3", "≈ 1 − e^(−32)"])


def _other_mask(src: Source, n: int, m: int, bad: bool) -> str:
    """D2L's valid_lens, a boolean ``masked`` (true removes a key), or the stage at which
    a mask_fill value replaces scores (issue 14)."""
    k = src.integer(0, 2)
    if k == 0:
        lens = [str(src.integer(0, m + (1 if bad else 0))) for _ in range(max(n, 1))]
        forms = [f"[{lens[0]}]", "[[" + ", ".join(lens) + "]]"]
        forms += [f"[{huge_int(src)}]", '["2"]', "[-1]", "[[1], [2]]", "2", "[1.5]"] if bad else []
        return f"valid_lens = {src.choice(forms)}"
    if k == 1:
        rows = ["[" + ", ".join(src.choice(["true", "false", "false"]) for _ in range(m)) + "]"
                for _ in range(n)]
        if bad and rows and src.chance(0.3):
            rows[0] = "[" + ", ".join([src.choice(["1", '"x"', "0.5", "[]"])] * m) + "]"
        return "masked = [" + ", ".join(rows) + "]"
    stages = ["scaled", "raw"] + (["x", "both"] if bad else [])
    return f"mask_fill_stage = {toml_string(src.choice(stages))}"


def _variant(src: Source, heads: int, bad: bool) -> str:
    """Issue 13's attention variants: a sliding window, a softcap, ALiBi slopes, sinks."""
    k = src.integer(0, 3)
    if k == 0:
        sides = ["-1", "0", "1", "2"] + (["-2", '"1"', "1.5", huge_int(src)] if bad else [])
        form = src.choice(["[{}, {}]"] * 9 + (["{}", "[{}]", "[{}, {}, 1]"] if bad else []))
        return "window = " + form.format(src.choice(sides), src.choice(sides))
    if k == 1:
        caps = ["30", "1", '"3/2"', "0.5", "50.0", "0"] + (
            ["-1", '"sqrt(2) - sqrt(2)"', "true", "[1]", toml_string(src.choice(HOSTILE_NUMBERS)),
             '"1e-4000"', '"tanh(1)"'] if bad else [])
        return f"softcap = {src.choice(caps)}"
    entries = ["0.5", "0.25", '"1/8"', "1", "-2", "0"] + (
        ['"1e6"', "1" + "0" * 2000, toml_string(number_text(src)), '"-inf"'] if bad else [])
    count = heads if not bad or src.chance(0.8) else src.integer(0, heads + 1)
    key = "alibi_slopes" if k == 2 else "sinks"
    return f"{key} = [" + ", ".join(src.choice(entries) for _ in range(count)) + "]"


def _init_table(src: Source) -> str:
    """``init`` (issue 14's seeded draws), always refused or sent to a cache that cannot
    be read, so that no input imports torch (seconds, against the per-input limit)."""
    seed = src.choice(["0", "123", "-1", huge_int(src), '"1"', "9223372036854775808"])
    draws = src.choice(['["x = rand(2, 3)"]', '["x = rand(\u0662, 3)"]', "[]", '["q = rand(2)"]',
                        '["w_q = Linear(2, 3, bias=True)"]', '["x = rand(100000, 100000)"]',
                        '["x = rand(' + "9" * 150 + ')"]', "[" + '"x = rand(1)", ' * 70 + "]",
                        toml_string("x = rand(2, 2)" * 30)])
    cache = src.choice([', cache = "c.npz"', ', cache = "../c.npz"', ', cache = 1',
                        ", cache = " + toml_string("c" * 300)])
    return f"init = {{torch_seed = {seed}, draws = {draws}{cache}}}"


def huge_int(src: Source) -> str:
    """An integer literal of many digits: decimal (tomllib refuses more than 4300) or
    hexadecimal, octal or binary (which it reads at any length)."""
    k = src.choice([10, 100, 1000, 3330, 3999, 4000, 4001, 5000, 20000, 300000])
    base = src.integer(0, 3)
    if base == 0:
        return src.choice(["", "-"]) + "1" + "0" * min(k, 4400)
    return ["", "0x", "0o", "0b"][base] + ["", "f", "7", "1"][base] * k


def toml_attack(src: Source, text: str) -> str:
    """A document with one construct aimed at the TOML reader itself: long dotted keys and
    table names (tomllib's cost grows as their square), deep nesting, integers of a
    million digits in hexadecimal, and dots inside strings (which are no keys)."""
    k = src.integer(0, 8)
    parts = src.choice([3, 7, 8, 9, 16, 40, 1000, 30000, 150000])
    if k == 0:
        line = "a" + ".a" * (parts - 1) + " = 1"
    elif k == 1:
        return text + "[" + ".".join(["example"] + ["x"] * (parts - 1)) + "]\n"
    elif k == 2:
        return text + "[[a" + ".b" * (parts - 1) + "]]\n"
    elif k == 3:
        line = 'x = {' + '"a" . ' * (parts - 1) + '"a" = 1}'
    elif k == 4:
        depth = src.choice([50, 500, 5000, 100000])
        line = "deep = " + "[" * depth + "]" * depth
    elif k == 5:
        depth = src.choice([50, 500, 5000, 100000])
        line = "deep = " + "{a = " * depth + "1" + "}" * depth
    elif k == 6:
        key = src.choice(["heads", "batch", "n_q", "d_k", "kv_heads", "scale", "d_model"])
        line = f"{key} = {huge_int(src)}"
    elif k == 7:
        line = f"notes = {toml_string('.'.join(['a'] * min(parts, 5000)))}"
    else:
        return text + f"head = {huge_int(src)}\n"  # lands in the last table: a claim or example
    head, sep, rest = text.partition("[[example]]\n")
    return head + sep + line + "\n" + rest if sep else line + "\n" + text


def example_table(src: Source, index: int) -> str:
    bad = hostile(src)
    lines = ["[[example]]"]
    if src.chance(0.9):
        name = free_text(src, short=True) if src.chance(0.3) else f"E{index}"
        lines.append(f"name = {toml_string(name if name.strip() or bad else 'E')}")
    if src.chance(0.4):
        lines.append(f"title = {toml_string(free_text(src))}")
    if src.chance(0.3):
        lines.append(f"notes = {toml_string(free_text(src))}")
    heads = 1
    if src.chance(0.3):
        heads = src.choice([1, 2, 2, 4, 2, 4, 3] * 5 + ([0, -1] if bad else []))
        lines.append(f"heads = {toml_string(str(heads)) if bad and src.chance(0.01) else heads}")
    h = heads if heads > 0 else 1
    n = _dim(src, src.integer(1, 4))
    m = _dim(src, src.integer(1, 4))
    d = _dim(src, src.integer(1, 3)) * h
    level = src.integer(0, 9)
    values = inputs = True
    if level <= 3:
        if h > 1:
            lines.append("scores = [" + ", ".join(matrix(src, n, m) for _ in range(h)) + "]")
        else:
            lines.append(f"scores = {matrix(src, n, m)}")
        values = src.chance(0.6)
        if values:
            lines.append(f"value = {matrix(src, m, src.integer(1, 3) * h)}")
    elif level <= 6:
        lines.append(f"query = {matrix(src, n, d)}")
        lines.append(f"key = {matrix(src, m, d)}")
        values = src.chance(0.7)
        if values:
            lines.append(f"value = {matrix(src, m, d)}")
    elif level <= 8:
        dm = _dim(src, src.integer(1, 3))
        lines.append(f"x = {matrix(src, n, dm)}")
        m = n
        if src.chance(0.2):
            m = _dim(src, src.integer(1, 4))
            lines.append(f"x_kv = {matrix(src, m, dm)}")
        if src.chance(0.05):  # a fused projection, as torch stores it (issue 14)
            lines.append(f"w_qkv = {matrix(src, dm, 3 * d)}")
            layouts = ["stacked", "per_head"] + (["x", "interleaved"] if bad else [])
            lines.append(f"qkv_layout = {toml_string(src.choice(layouts))}")
        else:
            for w in ("w_q", "w_k", "w_v"):
                if not bad or src.chance(0.97):
                    lines.append(f"{w} = {matrix(src, dm, d)}")
        if src.chance(0.4):
            lines.append(f"w_o = {matrix(src, d, dm)}")
        for b, width in (("b_q", d), ("b_k", d), ("b_v", d), ("b_o", dm)):
            if src.chance(0.1) and (b != "b_o" or any(x.startswith("w_o") for x in lines)):
                lines.append(f"{b} = {matrix(src, 1, width)}")
    else:
        inputs = False
        good = ["4", "512", "8", "1", toml_string("n"), toml_string("d_k")]
        worse = ["0", "-3", "1000000001", toml_string("x y"), toml_string("α"), "1" + "0" * 50,
                 "true", toml_string("a" * 40)]
        lines.append(f"d_model = {src.choice(['8', '512', '4', toml_string('d')])}")
        for key in ("n_q", "d_v", "n_k"):
            if src.chance(0.5):
                lines.append(f"{key} = {src.choice(good + (worse if bad else []))}")
        if src.chance(0.3):
            lines.append(f"bias = {src.choice(['true', 'false'] + (['1'] if bad else []))}")
    if inputs and src.chance(0.25):
        worse = ["inf", "nan", "-inf", "true", toml_string(number_text(src)), "1e308", "1" + "0" * 300]
        lines.append("scale = " + src.choice(["1", "0", "0.5", "-1", "2", '"1/sqrt(2)"', '"1/8"',
                                              '"sqrt(3)"'] * 4 + (worse if bad else [])))
    if inputs and src.chance(0.2):
        k = src.integer(0, 3)
        if k == 0 or (k == 3 and not bad):
            lines.append('mask = "causal"')
        elif k == 1:
            lines.append("mask = [" + ", ".join(
                "[" + ", ".join(src.choice(["true", "false", "true"]) for _ in range(m)) + "]"
                for _ in range(n)) + "]")
        elif k == 2:
            lines.append("mask = [" + ", ".join(
                "[" + ", ".join(src.choice(["0", '"-inf"', "-1e9", "-1e6", "1", '"-oo"', "0", "-2"])
                                for _ in range(m)) + "]" for _ in range(n)) + "]")
        else:
            lines.append(f"mask = {toml_string(free_text(src, short=True))}")
    if inputs and src.chance(0.1):
        align = src.choice(["top_left", "bottom_right"] * 5 + (["x"] if bad else []))
        lines.append(f"causal_alignment = {toml_string(align)}")
    if inputs and src.chance(0.1):
        rows = src.choice(["zero", "nan", "error"] * 5 + (["x"] if bad else []))
        lines.append(f"masked_rows = {toml_string(rows)}")
    if bad and src.chance(0.03):
        lines.append(f"{src.choice(['kv_heads', 'd_k'])} = {src.choice(['1', '2', '0', '7'])}")
    # issue 14's inputs as books give them: replacing masks, torch layout, printed inputs
    if inputs and src.chance(0.05):
        if not any(x.startswith("mask =") for x in lines):
            lines.append('mask = "causal"')
        fills = ["-1e9", "-1e6", '"-inf"', "-9e15", "-1e4"] + (["1e31", '"x"'] if bad else [])
        lines.append(f"mask_fill = {src.choice(fills)}")
    if inputs and src.chance(0.03):
        lines.append(f"layout = {toml_string(src.choice(['torch', 'book'] + (['x'] if bad else [])))}")
    if inputs and src.chance(0.03):
        lines.append('inputs = "printed"')
    if inputs and src.chance(0.05):
        lines.append(_other_mask(src, n, m, bad))
    if inputs and src.chance(0.06):
        lines.append(_variant(src, h, bad))
    if bad and src.chance(0.01):  # a seeded recipe that fails before torch is ever imported
        lines.append(_init_table(src))
    grads = level in (4, 5, 6) and values and src.chance(0.08)  # issue 12: backward claims
    if grads:
        lines.append(f"grad_output = {matrix(src, n, d)}")
    if bad and src.chance(0.03):
        where = src.choice(["../../etc/passwd", "/etc/passwd", "x.npz", "in.toml", "../in.toml",
                            "a" * 300])
        lines.append(f"arrays = {toml_string(where)}")
    for _ in range(src.integer(0, 5)):
        lines.append("[[example.claim]]")
        q = quantity(src, n, m, values=values, inputs=inputs, projected=level >= 4)
        if grads and src.chance(0.5):
            q = (f"{src.choice(['grad_query', 'grad_score', 'grad_value', 'grad_key'])}"
                 f"[1,1]")
        lines.append(f"quantity = {toml_string(q.split(_ROW)[0])}")
        if not bad or src.chance(0.995):
            claimed = printed_text(src) if bad and src.chance(0.3) else _plausible_claim(src, q)
            lines.append(f"claimed = {toml_string(claimed) if not bad or src.chance(0.995) else '0.5'}")
        if q == "expr" or (bad and src.chance(0.01)):
            expr = number_text(src) if bad and src.chance(0.3) else src.choice(BOOK_NUMBERS[:12])
            lines.append(f"expr = {toml_string(expr)}")
        if inputs and src.chance(0.1):
            choices = [str(src.integer(1, h))] + (["0", "99", "1" + "0" * 40] if bad else [])
            lines.append(f"head = {src.choice(choices)}")
        if src.chance(0.05):
            lines.append(f"batch = {src.choice(['1', '1', '2'] + (['0', '9' * 30] if bad else []))}")
        if src.chance(0.05):
            choices = ["0.01", "1e-30", "0.5", "0.1"] + (["0", "1", "nan"] if bad else [])
            lines.append(f"rtol = {src.choice(choices)}")
        if src.chance(0.1):
            lines.append(f"note = {toml_string(free_text(src))}")
    return "\n".join(lines)


def document_text(src: Source) -> str:
    """A worked-example file (TOML text), sometimes damaged."""
    parts = []
    src.hostile = src.chance(0.35)  # type: ignore[attr-defined]
    if src.chance(0.2):
        parts.append(f"title = {toml_string(free_text(src))}")
    if hostile(src) and src.chance(0.01):
        parts.append(f"{src.choice(['bogus', 'examples', 'x'])} = 1")
    for i in range(src.integer(1, 3)):
        parts.append(example_table(src, i))
    text = "\n".join(parts) + "\n"
    if hostile(src) and src.chance(0.03):
        text = toml_attack(src, text)
    if hostile(src) and src.chance(0.05):
        text = mutate(src, text, 0.9)
    if hostile(src) and src.chance(0.02):
        text = "".join(chr(src.integer(0, 0x10FF)) for _ in range(src.integer(0, 200)))
    return text


# -- authors' sources (issue 26) ----------------------------------------------------------

LATEX_ATOMS = ["0.707", "1", "2", "512", "0.6698", "e", r"\pi", "d_k", "d_{model}", "w_{11}",
               "x", r"e^{5}", r"e^{-3}", r"10^{8}", r"1{,}048{,}576", "51 2", "1,048,576",
               r"\infty", r"\sum_i", "O(n)", r"\text{cat}", r"\mathrm{softmax}", r"\log 2",
               r"e^{10^{6}}", r"2^{10^{9}}", r"10^{-4000}", r"\sqrt[3]{8}", r"\unknown",
               r"\left(", r"\right)", r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}",
               r"\begin{pmatrix} 1 & ", r"\frac{1}{0}", r"\sqrt{-1}", r"\ln(0)", "(2, 0)",
               "70\\%", r"\,", "{", "}", "^", "_", "&", r"\\", "'", r"\label{eq:x}"]
LATEX_OPS = [" + ", " - ", r" \times ", r" \cdot ", " / ", " ", "^", r" = ", r" \approx ",
             r" \le ", " < ", r" \to ", r" \in ", ", ", r" \quad ", "; "]


def latex_math(src: Source, depth: int = 3) -> str:
    """A math span: atoms, operators, fractions, roots, deep nesting, hostile payloads."""
    k = src.integer(0, 9)
    if depth <= 0 or k == 0:
        return src.choice(LATEX_ATOMS)
    if k == 1:
        return rf"\frac{{{latex_math(src, depth - 1)}}}{{{latex_math(src, depth - 1)}}}"
    if k == 2:
        return rf"\sqrt{{{latex_math(src, depth - 1)}}}"
    if k == 3:
        return f"{src.choice(LATEX_ATOMS)}^{{{latex_math(src, depth - 1)}}}"
    if k == 4 and hostile(src):
        return "{" * src.choice([50, 500, 5000]) + "1" + "}" * src.choice([0, 50, 5000])
    if k == 5 and hostile(src):
        return src.choice(NASTY)
    parts = [latex_math(src, depth - 1) for _ in range(src.integer(1, 4))]
    return "".join(p + src.choice(LATEX_OPS) for p in parts[:-1]) + parts[-1]


def _statement(src: Source) -> str:
    k = src.integer(0, 5)
    if k == 0:
        return (rf"\frac{{e^{{5}}}}{{e^{{5}}+e^{{1}}}} \approx "
                f"{src.choice(['0.9820', '0.982', '0.9821', '1'])}")
    if k == 1:
        return f"{src.choice(['d_k', 'n', 'w_1'])} = {src.choice(['64', '2', '0.707', 'x'])}"
    if k == 2:
        return rf"\sqrt{{d_k}} = {src.choice(['8', '1.41', '0.707'])}"
    if k == 3 and src.chance(0.5):  # what real sources write (docs/books.md, "Real sources")
        return src.choice([r"e=d-y=0.3", r"x(0)=3.0", r"n < 0", r"2D = T", r"1/8000=0.125$ ms",
                           r"2 * 28672 / 2550 = 22", r"\begin{align*} N > 128 = 81 \end{align*}",
                           r"\frac{1}{3} (10) = 3", r"e^{10} = 22,026"])
    return latex_math(src)


def _block(src: Source) -> str:
    if src.chance(0.5):
        return document_text(src)
    ref = src.choice(['"w_{11}"', '"w_1"', "3", '""', "'x"])
    if src.chance(0.4):  # a claim that points at its statement by its quantity (no key)
        q = src.choice(["weight[1,1]", "weight[1,2]", "score[1,1]", "head_output[1]",
                        "weight[99999999999,1]", "weight[]", "params.total", "x" * 200])
        tail = src.choice(["", "\n", "head = 2\n", "head = 'x'\n", "\n[[example.claim]]\n"])
        return ('[[example]]\nname = "A"\nd_k = 2\nscores = [[1, 0]]\n\n[[example.claim]]\n'
                f"quantity = {toml_string(q)}\n" + tail)
    return ('[[example]]\nname = "A"\nd_k = 2\nscores = [[1, 0]]\n\n[[example.claim]]\n'
            'quantity = "weight[1,1]"\nstatement = ' + ref + "\n")


def source_text(src: Source) -> tuple[str, str]:
    """An author's file (text, format: markdown, rst, latex, notebook), sometimes damaged."""
    src.hostile = src.chance(0.35)  # type: ignore[attr-defined]
    fmt = src.choice(["markdown", "markdown", "rst", "latex", "notebook"])
    pieces: list[str] = []
    for _ in range(src.integer(1, 8)):
        math = _statement(src)
        k = src.integer(0, 9)
        if k == 0:
            pieces.append({"markdown": "## ", "rst": "", "latex": "\\section{", "notebook": "# "}[fmt]
                          + free_text(src, short=True) + ("}" if fmt == "latex" else "")
                          + ("\n=====" if fmt == "rst" else ""))
        elif k == 1:
            fence = {"markdown": "```{mha-check}\n%s\n```", "notebook": "```mha-check\n%s\n```",
                     "rst": ".. mha-check::\n\n%s", "latex": "\\begin{mhacheck}\n%s\\end{mhacheck}"}[fmt]
            body = _block(src)
            if fmt == "rst":
                body = "\n".join("   " + ln for ln in body.split("\n"))
            pieces.append(fence % body)
        elif k == 2:
            pieces.append(f"$${math}$$")
        elif k == 3 and fmt == "rst":
            pieces.append(f".. math::\n\n   {math}")
        elif k == 3:
            pieces.append("\\begin{align}\n" + math + " \\\\\n &= " + _statement(src)
                          + "\n\\end{align}")
        elif k == 4:
            pieces.append(free_text(src))
        else:
            role = ":math:`%s`" if fmt == "rst" else "$%s$"
            pieces.append(f"Text {role % math} more.")
    text = "\n\n".join(pieces) + "\n"
    if hostile(src) and src.chance(0.05):
        text = mutate(src, text, 0.9)
    if fmt == "notebook":
        import json

        cells = [{"cell_type": "markdown", "metadata": {}, "source": text.split("\n")},
                 {"cell_type": "code", "metadata": {}, "source": [], "execution_count": 1,
                  "outputs": [{"output_type": "stream", "name": "stdout",
                               "text": [src.choice(["2**20 = 1048576\n", "x = 0.5\n",
                                                    "sqrt(2)/2 = 0.7071\n", free_text(src)])]}]}]
        if src.chance(0.2):
            cells.append({"cell_type": "raw", "metadata": {"tags": ["mha-check"]},
                          "source": _block(src)})
        text = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells})
        if hostile(src) and src.chance(0.2):
            text = src.choice([text[:src.integer(0, len(text))], "[" * 5000, '{"cells": 1}',
                               text.replace('"source"', '"source": 3, "x"', 1)])
    return text, fmt


# -- command lines ------------------------------------------------------------------------


@dataclass
class CliCall:
    """A command line, the files it reads (relative to the sandbox's ``in/``) and its
    standard input; output paths point into ``out/`` unless the case tests otherwise."""

    argv: list[str]
    files: dict[str, str] = field(default_factory=dict)
    stdin: str = ""
    encoding: str = "utf-8"


def _size_arg(src: Source) -> str:
    return src.choice(["512", "8", "1", "0", "-1", "3", "n", "d", "1000000001", "9" * 5000,
                       "\u0661\u0662", "²", "x y", "1e3", "64", "4", "a" * 40, "", "nan", "α"])


def cli_call(src: Source) -> CliCall:
    """One command line with its input files."""
    doc = document_text(src)
    files = {"in.toml": doc}
    infile = src.choice(["in/in.toml"] * 8 + ["-", "in/missing.toml", "in", "/dev/null", "out",
                                              "a\x00b", "\ud800", "in/in.toml\x1b[31m", ""])
    stdin = doc if infile == "-" else ""
    k = src.integer(0, 19)
    argv: list[str]
    if k <= 7:
        argv = ["check", infile]
        if src.chance(0.5):
            argv += ["--format", src.choice(["text", "json", "markdown", "html", "x"])]
        if src.chance(0.2):
            argv += ["--only", src.choice(["E0", "E1", "A", "\x1b[31m", "$x$", ""])]
    elif k <= 11:
        argv = ["derive", infile]
        fmt = src.choice(["tex", "fragment", "markdown", "pdf"])
        if src.chance(0.7):
            argv += ["--format", fmt]
        if src.chance(0.7):
            argv += ["-o", src.choice(["out/d.tex", "out/d.md", "", "-", "in/in.toml", "/dev/full",
                                       "out", "out/missing/d.tex", "out/a b$%.tex"])]
        if src.chance(0.02):
            argv.append("--pdf")
        if src.chance(0.02):
            argv.append("--figures")
        if src.chance(0.2):
            argv += ["--only", src.choice(["E0", "E1", "\x1b]0;x\x07"])]
    elif k <= 13:
        argv = ["plot", src.choice(["collapse", "collapse", "heatmap", "bogus"]),
                "-o", src.choice(["out/f.png", "out/f.pdf", "out/f.svg", "", "in/in.toml",
                                  "/dev/full", "out/f.pgf" if src.chance(0.05) else "out/g.png"])]
        if src.chance(0.5):
            argv += ["--file", infile]
        if src.chance(0.5):
            argv += ["--gap", src.choice(["20", "0", "-1", "1000", "1001", "1e400", "7" * 360 + "^(4/5)",
                                          number_text(src)])]
        if src.chance(0.3):
            argv += ["--only", src.choice(["E0", "E1", "x"])]
        if src.chance(0.2):
            argv += ["--format", src.choice(["png", "svg", "pdf", "jpg", "", "SVG"])]
        if src.chance(0.2):
            argv += ["--dpi", src.choice(["50", "72", "0", "-5", "1201", "9" * 400, "nan",
                                          "72.5", "", "\u0661\u0662"])]
    elif k <= 16:
        argv = [src.choice(["shapes", "params"])]
        for opt in ("--d-model", "--heads", "--kv-heads", "--d-k", "--d-v", "--kdim", "--vdim",
                    "--n-q", "--n-k"):
            if src.chance(0.3):
                argv += [opt, _size_arg(src)]
        if src.chance(0.3):
            argv += ["--format", src.choice(["text", "json", "latex", "x"])]
        if argv[0] == "params" and src.chance(0.2):
            argv.append(src.choice(["--no-bias", "--add-bias-kv"]))
    elif k == 17:
        argv = ["prove", "--only", src.choice(["t01", "softmax_sum", "bogus", "\x1b[31m"])]
    else:
        argv = [src.choice(["", "bogus", "--version", "-h", "check", "--debug"])]
        if src.chance(0.5):
            argv.append(src.choice(NASTY))
    if src.chance(0.05):
        argv.insert(0, "--debug")
    encoding = src.choice(["utf-8"] * 5 + ["ascii", "cp1252", "latin-1"])
    return CliCall(argv, files, stdin, encoding)


def describe(value: Any) -> str:
    """A generated input as one JSON line (for the crash log)."""
    if isinstance(value, CliCall):
        return json.dumps({"argv": value.argv, "files": value.files, "stdin": value.stdin,
                           "encoding": value.encoding}, ensure_ascii=True)
    return json.dumps(value, ensure_ascii=True)
