"""Line numbers in a worked-example file, for messages of the form ``FILE:LINE: …``.

``tomllib`` gives values, not positions, so the text is scanned once, line by line,
for the headers ``[[example]]`` and ``[[example.claim]]`` (and sub-tables such as
``[example.init]``) and for the ``key =`` lines under them.  The scan is linear in
the file and never parses TOML itself: where a file is written in a form the scan
does not follow (inline tables, ``claim = [{…}]``), the line of the nearest header
it did find is used, and where the headers' count differs from the parsed tables'
the line is left out rather than guessed.

>>> loc = locate("[[example]]\\nname = 'A'\\nscores = [[1]]\\n[[example.claim]]\\nquantity = 'x'\\n")
>>> loc.example(0), loc.key(0, "scores"), loc.claim(0, 0), loc.claim_key(0, 0, "quantity")
(1, 3, 4, 5)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Locations", "locate"]

_EXAMPLE = re.compile(r"^\s*\[\[\s*example\s*\]\]\s*(#.*)?$")
_CLAIM = re.compile(r"^\s*\[\[\s*example\s*\.\s*claim\s*\]\]\s*(#.*)?$")
_SUBTABLE = re.compile(r"^\s*\[\s*example\s*\.\s*(\w+)\s*\]\s*(#.*)?$")
_OTHER_HEADER = re.compile(r"^\s*\[\[?\s*[A-Za-z_][\w.\s\"'-]*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*=")


@dataclass
class _Table:
    line: int
    keys: dict[str, int] = field(default_factory=dict)


@dataclass
class _Example(_Table):
    claims: list[_Table] = field(default_factory=list)


@dataclass
class Locations:
    """Where each example, claim and key starts (1-based lines; 0 when unknown)."""

    examples: list[_Example] = field(default_factory=list)
    top_keys: dict[str, int] = field(default_factory=dict)
    trusted: bool = True

    def example(self, i: int) -> int:
        return self.examples[i].line if self.trusted and i < len(self.examples) else 0

    def key(self, i: int, key: str) -> int:
        if not self.trusted or i >= len(self.examples):
            return 0
        ex = self.examples[i]
        return ex.keys.get(key, ex.line)

    def claim(self, i: int, j: int) -> int:
        if not self.trusted or i >= len(self.examples):
            return 0
        ex = self.examples[i]
        return ex.claims[j].line if j < len(ex.claims) else ex.line

    def claim_key(self, i: int, j: int, key: str) -> int:
        if not self.trusted or i >= len(self.examples):
            return 0
        ex = self.examples[i]
        if j >= len(ex.claims):
            return ex.line
        return ex.claims[j].keys.get(key, ex.claims[j].line)

    def check_counts(self, examples: int, claims: list[int]) -> None:
        """Trust the scan only where it found as many tables as TOML parsed."""
        if len(self.examples) != examples:
            self.trusted = False
            return
        for ex, n in zip(self.examples, claims, strict=True):
            if len(ex.claims) != n:
                ex.claims = []  # claims then point at their example's header


def locate(text: str) -> Locations:
    """Scan ``text`` once for example and claim headers and their keys."""
    loc = Locations()
    current: _Table | None = None
    quote: str | None = None  # inside a multi-line string opened by this delimiter
    for number, line in enumerate(text.splitlines(), start=1):
        if quote is not None:
            if line.count(quote) % 2 == 1:
                quote = None
            continue
        if _EXAMPLE.match(line):
            ex = _Example(number)
            loc.examples.append(ex)
            current = ex
        elif _CLAIM.match(line):
            if not loc.examples:
                current = None
                continue
            claim = _Table(number)
            loc.examples[-1].claims.append(claim)
            current = claim
        elif m := _SUBTABLE.match(line):
            # [example.init] and the like: its keys are reported at the table's line
            current = None
            if loc.examples:
                loc.examples[-1].keys.setdefault(m.group(1), number)
        elif _OTHER_HEADER.match(line):
            current = None
        elif (m := _KEY.match(line)) is not None:
            key = m.group(1)
            if current is None and not loc.examples:
                loc.top_keys.setdefault(key, number)
            elif current is not None:
                current.keys.setdefault(key, number)
        for delim in ('"""', "'''"):
            if line.count(delim) % 2 == 1:
                quote = delim
                break
    return loc
