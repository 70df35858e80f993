"""Text that reaches a person: messages, reports, terminals.

Everything here is about *showing* untrusted input safely:

* :func:`sanitize` makes control characters visible (``ESC`` becomes ``\\x1b``), so
  that no name, title or claim read from a file can move the cursor, recolour the
  terminal, rewrite an earlier line (``\\r``, ``\\n``) or reorder what is shown
  (the bidirectional overrides U+202A–U+202E and isolates U+2066–U+2069);
* :func:`echo` quotes a piece of input for an error message, cut to about 80
  characters with an ellipsis;
* :func:`markdown_text` and :func:`markdown_code` put such text into Markdown as
  text (no link, image, raw HTML, emphasis or math can come from a file);
* :func:`int_text` and :func:`expr_text` print numbers without Python's
  4300-digit limit on ``str(int)`` (and without printing thousands of digits);
* :func:`ascii_fallback` is a codec error handler that writes ✓ ✗ ≈ − × … as ASCII
  on a terminal whose encoding cannot show them (``PYTHONIOENCODING=ascii``).

Nothing here imports SymPy at module level.

>>> sanitize("red\\x1b[31m text")
'red\\\\x1b[31m text'
>>> echo("x" * 100, limit=10)
"'xxxxxxxxxx…'"
>>> int_text(10**5000)
'<an integer of 5001 digits>'
"""

from __future__ import annotations

import codecs
import functools
import re
from typing import Any

__all__ = [
    "ASCII_FALLBACK",
    "CONTROL",
    "ascii_fallback",
    "decimal_digits",
    "echo",
    "expr_text",
    "has_control",
    "int_text",
    "markdown_code",
    "markdown_text",
    "register_ascii_fallback",
    "sanitize",
]

#: Characters that must never reach a terminal raw: C0 controls (tab and newline
#: included: a single-line field must stay one line), DEL, C1 controls, the
#: bidirectional embeddings/overrides U+202A–U+202E, the isolates U+2066–U+2069,
#: the implicit marks U+200E/U+200F/U+061C, and the line/paragraph separators
#: U+2028/U+2029 (which some terminals and editors treat as newlines).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character that :func:`sanitize` would replace.

    >>> has_control("a\\u202eb"), has_control("≈ 0.5")
    (True, False)
    """
    return CONTROL.search(text) is not None


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(m: re.Match[str]) -> str:
    c = m.group(0)
    if c in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def sanitize(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character written as a visible escape.

    ``keep_newlines=True`` keeps ``\\n`` (for multi-line free text such as notes);
    every other control character, ``\\r`` and tabs included, becomes ``\\xNN`` or
    ``\\uNNNN``.  A backslash is left alone: an escape shown here is only ever one
    that this function wrote or one the input itself contained as text.

    >>> sanitize("a\\tb\\u202ec")
    'a\\\\tb\\\\u202ec'
    >>> sanitize("two\\nlines", keep_newlines=True)
    'two\\nlines'
    """
    if keep_newlines:
        return "\n".join(CONTROL.sub(_visible, line) for line in text.split("\n"))
    return CONTROL.sub(_visible, text)


def echo(text: Any, limit: int = 80) -> str:
    """A piece of input quoted for an error message: control characters made visible,
    cut after ``limit`` characters with an ellipsis.

    >>> echo("(-1)^(1/2)")
    "'(-1)^(1/2)'"
    >>> echo("a\\x00" * 10, limit=12)
    "'a\\\\x00a\\\\x00a…'"
    """
    s = text if isinstance(text, str) else str(text)
    # as repr() quotes a string: backslashes doubled, so that an escape shown is unambiguous;
    # cut by what is *shown* (an escape such as \x00 shows 4 characters for 1), never
    # inside an escape
    shown, width, cut = [], 0, False
    for ch in s:
        piece = sanitize(ch.replace("\\", "\\\\"))
        if width + len(piece) > limit:
            cut = True
            break
        shown.append(piece)
        width += len(piece)
    s = "".join(shown)
    quote = '"' if "'" in s and '"' not in s else "'"
    if quote in s:
        s = s.replace(quote, "\\" + quote)
    return f"{quote}{s}{'…' if cut else ''}{quote}"


#: Every character Markdown (CommonMark, GitHub's tables and its ``$`` math) may read
#: as markup; a backslash before any ASCII punctuation makes it a literal character.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#$~!&])")


def markdown_text(text: str) -> str:
    """Text from a file as Markdown text: control characters made visible and every
    character Markdown would interpret escaped, so that no link, image, raw HTML,
    emphasis, table cell break or ``$`` math can come from it.

    >>> print(markdown_text("[x](javascript:1) <b>|</b> $a$"))
    \\[x\\](javascript:1) \\<b\\>\\|\\</b\\> \\$a\\$
    """
    return _MD_SPECIAL.sub(r"\\\1", sanitize(text))


def markdown_code(text: str) -> str:
    """Text from a file as an inline code span that is safe in a Markdown table cell:
    control characters made visible, ``|`` escaped (GitHub reads ``\\|`` as a pipe
    inside code), and a text holding a backtick (which would end the span) written as
    escaped text instead.

    >>> print(markdown_code("weight[1,2]"), markdown_code("a`b"))
    `weight[1,2]` a\\`b
    """
    if "`" in text:
        return markdown_text(text)
    return "`" + sanitize(text).replace("|", "\\|") + "`"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and the noun in the number it agrees with: the plural is ``many`` (default
    ``word + "s"``) for every count but exactly 1.

    >>> plural(1, "claim"), plural(0, "claim"), plural(3, "entry", "entries")
    ('1 claim', '0 claims', '3 entries')
    """
    return f"{n} {word if n == 1 else (many or word + 's')}"


def decimal_digits(n: int) -> int:
    """The number of decimal digits of ``|n|`` (1 for 0), exactly, without ``str(n)``.

    >>> decimal_digits(0), decimal_digits(999), decimal_digits(1000), decimal_digits(-10**4400)
    (1, 3, 4, 4401)
    """
    n = abs(int(n))
    if n < 10:
        return 1
    # log10(2) < 0.30103: the estimate is at most one too small; one comparison fixes it
    k = int((n.bit_length() - 1) * 0.30102999566398) + 1  # 10^(k-1) <= n holds
    return k + 1 if n >= 10**k else k


def int_text(n: int, limit: int = 40) -> str:
    """An integer for a message: exact when it has at most ``limit`` digits, else its
    size (``<an integer of 5001 digits>``).  Never raises for huge integers.

    >>> int_text(-12345), int_text(2**200, limit=20)
    ('-12345', '<an integer of 61 digits>')
    """
    n = int(n)
    digits = decimal_digits(n)
    if digits <= limit:
        return str(n)
    return f"<{'a negative' if n < 0 else 'an'} integer of {digits} digits>"


def _plain(x: Any, ordered: bool = True) -> str:
    """SymPy's ``str`` of ``x`` with Euler's number written ``e`` (SymPy writes ``E``, a
    name no reader of a report knows); ``ordered=False``: terms in canonical order.

    >>> import sympy as sp
    >>> _plain(sp.E / (sp.exp(-3) + sp.E))
    'e/(exp(-3) + e)'
    """
    return _e_printer()({} if ordered else {"order": "none"}).doprint(x)


@functools.cache
def _e_printer() -> Any:
    """SymPy's StrPrinter, but ``exp(1)`` printed ``e`` (built once, when first needed)."""
    from sympy.printing.str import StrPrinter

    class _Printer(StrPrinter):
        def _print_Exp1(self, expr: Any) -> str:
            return "e"

    return _Printer


def expr_text(x: Any, limit: int = 80) -> str:
    """A number or SymPy expression for a message: never thousands of digits long (a
    number with more than 30 digits is shown by its size), ``**`` written ``^``,
    cut at ``limit`` characters.  Nothing is evaluated.

    >>> import sympy as sp
    >>> expr_text(sp.Rational(10**5000, 3))
    '<a number of about 5001 digits>'
    >>> expr_text(sp.sqrt(2) / 2)
    'sqrt(2)/2'
    """
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return int_text(x)
    try:
        import sympy as sp
    except ImportError:  # pragma: no cover - SymPy is a core dependency
        sp = None
    if sp is not None and isinstance(x, sp.Basic):
        # printing a huge expression costs seconds: count its nodes first (cheaply, at most
        # a few hundred), and describe it instead of printing it when it is long
        nodes = 0
        for _node in sp.preorder_traversal(x):
            nodes += 1
            if nodes > 4 * limit:
                return "<a long expression>"
        big = [max(decimal_digits(r.p), decimal_digits(r.q)) for r in x.atoms(sp.Rational)]
        big = [b for b in big if b > 30]
        if big:
            n = max(big)
            return (f"<a number of about {n} digits>" if x.is_Rational
                    else f"<an expression holding a number of about {n} digits>")
        # a long sum is printed in its canonical order: ordering it for printing makes
        # SymPy evaluate every term numerically
        text = _plain(x, nodes <= 60).replace("**", "^")
    else:
        from fractions import Fraction

        if isinstance(x, Fraction):
            size = max(decimal_digits(x.numerator), decimal_digits(x.denominator))
            if size > 30:
                return f"<a number of about {size} digits>"
        text = str(x)
    text = sanitize(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- ASCII fallback for terminals that cannot show the report's symbols -----------------

#: What each symbol the reports print becomes on an ASCII-only stream.
ASCII_FALLBACK: dict[str, str] = {
    "✓": "ok", "✗": "XX", "≈": "~", "−": "-", "–": "-", "—": "--", "×": "x", "·": "*",
    "⋅": "*", "…": "...", "√": "sqrt", "∞": "inf", "≤": "<=", "≥": ">=", "≠": "!=",
    "→": "->", "←": "<-", "π": "pi", "²": "^2", "³": "^3", "ᵀ": "^T", "⊤": "^T",
    "‘": "'", "’": "'", "“": '"', "”": '"', "\u00a0": " ", "\u2009": " ", "\u202f": " ",
    "±": "+/-", "Σ": "sum", "∑": "sum", "∈": "in", "µ": "u", "°": "deg",
}


def ascii_fallback(exc: UnicodeError) -> tuple[str, int]:
    """Codec error handler: a known symbol as ASCII, anything else as ``\\uXXXX``.

    >>> register_ascii_fallback()
    'mha_symbolic_ascii'
    >>> "✓ 0.5 ≈ ½".encode("ascii", "mha_symbolic_ascii")
    b'ok 0.5 ~ \\\\u00bd'
    """
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start:exc.end]
    out = []
    for ch in bad:
        if ch in ASCII_FALLBACK:
            out.append(ASCII_FALLBACK[ch])
        else:
            code = ord(ch)
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out), exc.end


_HANDLER = "mha_symbolic_ascii"


def register_ascii_fallback() -> str:
    """Register :func:`ascii_fallback` under its codec name (idempotent); return the name."""
    try:
        codecs.lookup_error(_HANDLER)
    except LookupError:
        codecs.register_error(_HANDLER, ascii_fallback)
    return _HANDLER
