"""TOML from an untrusted file, read at a bounded cost.

``tomllib`` reads a megabyte in about a second, with two exceptions that a hostile
file can reach, both refused here *before* or right after ``tomllib`` runs:

* **Long dotted keys.**  For a key ``a.b.c…`` of k parts ``tomllib`` checks every
  prefix against the tables defined so far, slicing the key each time: time and memory
  grow as k² (a 400 KB line ``a.a.a…`` of 200,000 parts ran for minutes and took
  tens of GB).  A key or table header of more than :data:`MAX_KEY_PARTS` parts is
  refused after one linear scan of the text (:func:`longest_dotted_key`); no worked
  example needs more than two (``example.claim``, ``example.init``).  Within the
  limit, a megabyte of 8-part table names still costs tomllib a few CPU seconds
  (bench/bench_limits.py: 3.7–5.2 s at 8 parts), which is why the limit is 4.
* **Huge integers in hexadecimal, octal or binary.**  Python refuses ``int()`` of a
  decimal string beyond 4300 digits (``tomllib`` then raises ``ValueError``), but not
  in base 16, 8 or 2: ``0xfff…`` of a megabyte is an integer of a million digits,
  whose ``str()`` raises and whose arithmetic is slow.  Every integer of the parsed
  document with more than :data:`~mha_symbolic.exact.grammar.MAX_VALUE_DIGITS` digits
  is refused, naming where it is (:func:`_check_integers`).

Deep nesting (``[[[[…]]]]``) ends in ``RecursionError`` inside ``tomllib``, reported
as one line too.

>>> parse_toml("a.b = 1", "f.toml")
{'a': {'b': 1}}
>>> parse_toml("k" + ".k" * 40 + " = 1", "f.toml")
Traceback (most recent call last):
...
mha_symbolic.errors.ExampleFileError: f.toml:1: a dotted key or table name of 41 parts; at most 4
"""

from __future__ import annotations

import re
import sys
from typing import Any

from .._text import sanitize
from ..errors import ExampleFileError

__all__ = ["MAX_KEY_PARTS", "longest_dotted_key", "parse_toml"]

#: Most parts of a dotted key or table name (``example.claim`` has 2).
MAX_KEY_PARTS = 4

# One TOML token: a comment, a string of each of the four kinds (a multi-line string may
# end in up to two extra quotes, which belong to its content), a bare word, or one
# other character.  Only the dots *between* key parts matter; strings are skipped
# whole so that a dot inside a string (a note "see §3.2.1") never counts.  A string
# left open runs to the end of the text (or line), so that its content is not taken
# for keys: tomllib then reports it.
_TOKEN = re.compile(r'''
    (?P<comment>\#[^\n]*)
  | (?P<string>"""(?:[^\\]|\\.)*?(?:"""(?:""?)?|\Z)
             | \'\'\'.*?(?:\'\'\'(?:\'\'?)?|\Z)
             | "(?:[^"\\\n]|\\.)*(?:"|(?=\n)|\Z)
             | '[^'\n]*(?:'|(?=\n)|\Z))
  | (?P<bare>[A-Za-z0-9_+\-:]+)
  | (?P<dot>\.)
  | (?P<space>[ \t]+)
  | (?P<other>.)
''', re.DOTALL | re.VERBOSE)


def longest_dotted_key(text: str) -> tuple[int, int]:
    """(parts, line) of the longest chain ``part.part.…`` outside strings and comments.

    A float (``0.5``) or a time (``07:32:00.999``) counts as a chain of 2 parts, which
    is harmless: the bound is on keys of many parts.

    >>> longest_dotted_key('x = "a.b.c.d"\\n[example.claim]\\ny = 0.5  # e.g. a.b.c')
    (2, 2)
    """
    best, best_line = 1, 0
    parts, after_dot = 0, False
    line = 1
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind in ("bare", "string"):
            parts = parts + 1 if after_dot else 1
            after_dot = False
            if parts > best:
                best, best_line = parts, line
        elif kind == "dot":
            if parts and not after_dot:
                after_dot = True
            else:
                parts, after_dot = 0, False
        elif kind != "space":
            parts, after_dot = 0, False
        line += m.group().count("\n")
    return best, best_line


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML text as a dict; every failure of the TOML reader, and every input beyond
    the bounds above, is an :class:`~mha_symbolic.errors.ExampleFileError` of one line."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    from ..exact.grammar import MAX_VALUE_DIGITS

    # a key of more than MAX_KEY_PARTS parts has that many dots on one line (no key spans
    # lines): most files are passed by this count alone
    many_dots = any(ln.count(".") >= MAX_KEY_PARTS for ln in text.split("\n"))
    parts, line = longest_dotted_key(text) if many_dots else (1, 0)
    if parts > MAX_KEY_PARTS:
        raise ExampleFileError(f"{source}:{line}: a dotted key or table name of {parts} parts; "
                               f"at most {MAX_KEY_PARTS}")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExampleFileError(f"{source}: not valid TOML: {sanitize(str(exc))}") from None
    except RecursionError:
        raise ExampleFileError(f"{source}: TOML nested too deeply") from None
    except ValueError as exc:
        # tomllib lets int() refuse literals beyond Python's 4300-digit limit
        if "integer string conversion" in str(exc):
            raise ExampleFileError(f"{source}: an integer literal of more than 4300 digits "
                                   f"(Python's limit; entries may have at most "
                                   f"{MAX_VALUE_DIGITS})") from None
        raise ExampleFileError(f"{source}: not valid TOML: {sanitize(str(exc))[:200]}") from None
    _check_integers(doc, source, MAX_VALUE_DIGITS)
    return doc


def _check_integers(doc: dict[str, Any], source: str, digits: int) -> None:
    """Refuse an integer of more than ``digits`` decimal digits anywhere in ``doc``
    (a hexadecimal, octal or binary literal; decimal ones stop at 4300 digits in
    ``tomllib`` already).  Iterative: the document may be nested as deep as ``tomllib``
    allows.  An integer has more than ``digits`` digits iff it is ≥ 10^digits; its bit
    length tells most cases at once (10^d has ⌊d·log2 10⌋ + 1 bits)."""
    bits = int(digits * 3.321928094887362) + 1  # bit length of 10^digits
    limit = 10**digits
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        elif (isinstance(value, int) and not isinstance(value, bool)
              and value.bit_length() >= bits and abs(value) >= limit):
            raise ExampleFileError(f"{source}: {sanitize(where)[:80]}: an integer of more than "
                                   f"{digits} digits (entries may have at most that many)")
