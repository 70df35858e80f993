"""Tensors and arrays as torch and numpy print them, read without evaluating anything.

A worked example copied from a notebook shows what ``print`` gave::

    tensor([[0.4421, 0.5931, 0.5790],
            [0.4419, 0.6515, 0.5683]], grad_fn=<MmBackward0>)
    array([[0.44, 0.65]], dtype=float32)
    [[0.44 0.65]
     [0.1  0.2 ]]

:func:`read_printout` reads such text into a nested structure of entry strings and
its shape; each entry is then read as a printed number by
:mod:`mha_symbolic.textbook.claims` (its printed digits state its precision:
torch prints 4 decimals, ``-9.1476e-02`` is good to 10^-6, ``2.`` is the integer 2).

The grammar (a bounded recursive descent, never ``eval``)::

    printout := "tensor(" body {"," keyword} ")" | "array(" body {"," keyword} ")" | body
    body     := list | entry
    list     := "[" [item {sep item}] "]"        sep := "," | whitespace (numpy omits commas)
    item     := list | entry
    keyword  := NAME "=" (<...> | '...' | "..." | NAME | NUMBER)   grad_fn, device, dtype, requires_grad
    entry    := a number as printed (0.4419, -9.1476e-02, 2., -inf, nan)

Refused with one line naming the problem: ``...`` (torch and numpy elide the middle of
large tensors), ragged rows, nesting deeper than :data:`MAX_DEPTH`, more than
:data:`MAX_ENTRIES` entries, an unknown keyword.

>>> p = read_printout("tensor([[0.4419, 0.6515]], grad_fn=<MmBackward0>)")
>>> p.shape, p.entries, p.wrapper
((1, 2), ('0.4419', '0.6515'), 'tensor')
>>> read_printout("[[0.44 0.65]\\n [0.1  0.2 ]]").shape
(2, 2)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._text import echo
from ..errors import ClaimError

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "Printout", "looks_like_printout", "read_printout"]

#: Deepest nesting accepted (batch × heads × rows × columns, and one more).
MAX_DEPTH = 5
#: Most entries in one printout (the symbolic engine's own limit on score entries).
MAX_ENTRIES = 4096
#: Keywords torch and numpy print after the data; their values are not used.
KEYWORDS = ("grad_fn", "device", "dtype", "requires_grad", "layout", "size", "names")

_WRAPPER = re.compile(r"^(tensor|array|Parameter containing:\s*tensor)\s*\(", re.IGNORECASE)
_KEYWORD = re.compile(
    r"""\s*,\s*(?P<name>[A-Za-z_]+)\s*=\s*
        (?:<[^<>]{0,200}>|'[^']{0,200}'|"[^"]{0,200}"|[A-Za-z_][\w.]{0,60}|[-+\w.]{1,60})\s*""",
    re.VERBOSE,
)
_ENTRY = re.compile(r"[^\s,\[\]()]+")


@dataclass(frozen=True)
class Printout:
    """A printed tensor or array: its shape and its entries (row-major, as printed)."""

    shape: tuple[int, ...]
    entries: tuple[str, ...]
    wrapper: str  # "tensor", "array" or "list"
    keywords: tuple[tuple[str, str], ...] = ()


def looks_like_printout(text: str) -> bool:
    """Whether ``text`` is a tensor/array printout or a bracketed list (not a tuple)."""
    s = text.strip()
    return bool(_WRAPPER.match(s)) or s.startswith("[")


def read_printout(text: str) -> Printout:
    """Read a torch/numpy printout or a bracketed (nested) list of numbers."""
    s = text.strip()
    wrapper = "list"
    keywords: list[tuple[str, str]] = []
    m = _WRAPPER.match(s)
    if m:
        wrapper = "array" if m.group(1).lower() == "array" else "tensor"
        if not s.endswith(")"):
            raise ClaimError(f"{_short(text)}: a {wrapper}( printout must end with ')'")
        inner = s[m.end():-1]
        data, keywords = _split_keywords(inner, text)
    else:
        data = s
    if "..." in data or "…" in data:
        raise ClaimError(
            f"{_short(text)}: the printout elides entries ('...'); paste the full tensor "
            "(torch.set_printoptions(profile='full') or numpy.set_printoptions(threshold=sys.maxsize))")
    reader = _Reader(data, text)
    shape, entries = reader.read()
    return Printout(shape, tuple(entries), wrapper, tuple(keywords))


def _split_keywords(inner: str, text: str) -> tuple[str, list[tuple[str, str]]]:
    """Split ``data, grad_fn=<...>, dtype=float32`` into the data and its keywords."""
    depth = 0
    end = len(inner)
    for i, ch in enumerate(inner):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                end = i + 1
                break
        elif ch == "," and depth == 0:  # a scalar: tensor(0.9544, grad_fn=...)
            end = i
            break
    data, rest = inner[:end], inner[end:]
    keywords: list[tuple[str, str]] = []
    pos = 0
    while pos < len(rest):
        if not rest[pos:].strip():
            break
        km = _KEYWORD.match(rest, pos)
        if km is None:
            raise ClaimError(f"{_short(text)}: cannot read {echo(rest[pos:pos + 40].strip(), 40)} "
                             "after the data")
        name = km.group("name")
        if name not in KEYWORDS:
            raise ClaimError(f"{_short(text)}: unknown keyword {echo(name, 40)} in the printout; "
                             f"known: {', '.join(KEYWORDS)}")
        keywords.append((name, km.group(0).split("=", 1)[1].strip()))
        pos = km.end()
    return data, keywords


class _Reader:
    """Recursive descent over ``[ ... ]`` with commas or whitespace between items."""

    def __init__(self, data: str, text: str) -> None:
        self.s = data
        self.text = text
        self.i = 0
        self.entries: list[str] = []

    def fail(self, what: str) -> ClaimError:
        return ClaimError(f"{_short(self.text)}: {what}")

    def skip(self, commas: bool = False) -> bool:
        """Skip whitespace (and at most one comma if ``commas``); whether a separator was seen."""
        seen = False
        comma = False
        while self.i < len(self.s) and (self.s[self.i].isspace() or (commas and self.s[self.i] == ",")):
            if self.s[self.i] == ",":
                if comma:
                    raise self.fail("two commas in a row (an empty entry)")
                comma = True
            seen = True
            self.i += 1
        return seen

    def read(self) -> tuple[tuple[int, ...], list[str]]:
        self.skip()
        if self.i < len(self.s) and self.s[self.i] == "[":
            shape = self.list(1)
        else:
            self.entry()
            shape = ()
        self.skip()
        if self.i != len(self.s):
            raise self.fail(f"unexpected {echo(self.s[self.i:self.i + 20], 20)} after the data")
        return shape, self.entries

    def entry(self) -> None:
        m = _ENTRY.match(self.s, self.i)
        if m is None:
            raise self.fail(f"expected a number at {echo(self.s[self.i:self.i + 20], 20)}")
        self.entries.append(m.group())
        if len(self.entries) > MAX_ENTRIES:
            raise self.fail(f"more than {MAX_ENTRIES} entries")
        self.i = m.end()

    def list(self, depth: int) -> tuple[int, ...]:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels")
        assert self.s[self.i] == "["
        self.i += 1
        self.skip()
        shapes: list[tuple[int, ...]] = []
        separated = True
        while True:
            if self.i >= len(self.s):
                raise self.fail("unbalanced '[': missing ']'")
            ch = self.s[self.i]
            if ch == "]":
                self.i += 1
                break
            if shapes and not separated:
                raise self.fail(f"entries must be separated by ',' or spaces near "
                                f"{echo(self.s[self.i:self.i + 20], 20)}")
            if ch == "[":
                shapes.append(self.list(depth + 1))
            else:
                self.entry()
                shapes.append(())
            separated = self.skip(commas=True)
        if not shapes:
            raise self.fail("an empty list holds no entries")
        if len(set(shapes)) != 1:
            raise self.fail("rows of different lengths (a ragged printout)")
        return (len(shapes), *shapes[0])


def _short(text: str) -> str:
    return f"claimed={echo(' '.join(text.split()), 60)}"
