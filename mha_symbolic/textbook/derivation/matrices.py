"""Matrices and aligned chains of forms as LaTeX (bmatrix, column blocks, long sums)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .model import EXACT_MATRIX_CHARS, LINE_CHARS, MATRIX_DIGITS, MATRIX_WIDTH, SHORT, WIDE
from .numbers import _digits, _is_rational, _leaves, _tex, _tidy, exp_latex


def _matrix_tex(m: Any, limit: int | None = None) -> str | None:
    """An exact matrix: each entry printed by SymPy, in amsmath's bmatrix.

    With ``limit``, None as soon as the LaTeX grows longer than ``limit``."""
    cells: list[list[str]] = []
    used = 0
    for r in range(m.rows):
        row = []
        for c in range(m.cols):
            e = m[r, c]
            if limit is not None and _leaves(e, limit) > limit:
                return None
            text = _tex(_tidy(e))
            used += len(text) + 3
            if limit is not None and used > limit:
                return None
            row.append(text)
        cells.append(row)
    return _bmatrix(cells)


def _operand_tex(m: Any) -> str:
    """A matrix written as a factor of a product: bracketed like every other matrix."""
    import sympy as sp

    if all(_is_rational(e) or e in (sp.oo, -sp.oo) for e in m):
        return _bmatrix([[_tex(m[r, c]) for c in range(m.cols)] for r in range(m.rows)])
    text = _matrix_tex(m)
    assert text is not None  # no limit: always a text
    return text


def _cells(m: Any, digits: int = MATRIX_DIGITS) -> list[list[str]] | None:
    """Each entry as LaTeX: exact when rational or infinite, else certified digits.
    None when an entry is symbolic (it has no digits)."""
    import sympy as sp

    rows = []
    for r in range(m.rows):
        row = []
        for c in range(m.cols):
            e = m[r, c]
            if _is_rational(e) or e in (sp.oo, -sp.oo):
                row.append(_tex(e))
                continue
            d = _digits(e, digits)
            if d is None:
                return None
            row.append(d)
        rows.append(row)
    return rows


def _printed(latex: str) -> int:
    """Rough printed width of a LaTeX line, in characters (a matrix counts its widest row)."""
    rows = latex.split("\\\\")
    return max(len(re.sub(r"\\[a-zA-Z]+|[{}&\\ ]", "", row)) for row in rows)


def _visual(cell: str) -> int:
    """Rough printed width of a cell, in digits."""
    return len(cell.replace(r"\ldots", "...").replace(r"\infty", "oo").replace("\\", ""))


def _column_chunks(cells: list[list[str]]) -> list[tuple[int, int]]:
    """Split the columns into runs that fit the line (MATRIX_WIDTH digits each)."""
    widths = [max(_visual(row[c]) for row in cells) + 2 for c in range(len(cells[0]))]
    chunks: list[tuple[int, int]] = []
    start, used = 0, 0
    for c, wd in enumerate(widths):
        if c > start and used + wd > MATRIX_WIDTH:
            chunks.append((start, c))
            start, used = c, 0
        used += wd
    chunks.append((start, len(widths)))
    return chunks


def _bmatrix(cells: list[list[str]], lo: int = 0, hi: int | None = None) -> str:
    body = r" \\ ".join(" & ".join(row[lo:hi]) for row in cells)
    return r"\begin{bmatrix}" + body + r"\end{bmatrix}"


def _matrix_chain(name: str, m: Any, *, symbolic: str | None = None) -> list[str]:
    """Display rows ``name = symbolic = exact = decimals`` for a matrix.

    Rational (and masked, infinite) entries are exact as printed; other entries
    show their exact form when it is short, then certified digits.  A matrix too
    wide for the line is shown in blocks of columns."""
    import sympy as sp

    rhs: list[str] = []
    if symbolic:
        rhs.append(symbolic)
    cells = _cells(m)
    exact_cells = cells is not None and all(_is_rational(e) or e in (sp.oo, -sp.oo) for e in m)
    if not exact_cells:
        exact = _matrix_tex(m, EXACT_MATRIX_CHARS if cells is None else SHORT * max(1, m.rows))
        if exact is not None:
            rhs.append(exact)
        elif cells is None:
            rhs.append(r"\text{(exact form too long to print)}")
    if cells is None:
        return _chain(name, rhs)
    chunks = _column_chunks(cells)
    if len(chunks) == 1:
        rhs.append(_bmatrix(cells))
        return _chain(name, rhs)
    rows = _chain(name, rhs) if rhs else []
    for lo, hi in chunks:
        label = rf"{name}\,[\text{{columns }} {lo + 1}\text{{--}}{hi}]"
        rows.append(f"{label} &= {_bmatrix(cells, lo, hi)}")
    return rows


def _chain(lhs: str, rhs: Sequence[str]) -> list[str]:
    """Aligned rows ``lhs &= a``, ``&= b``... one form per row when long."""
    if not rhs:
        return [lhs]
    one_line = f"{lhs} &= " + " = ".join(rhs)
    if len(one_line) <= WIDE // 2 + 20 or len(rhs) == 1:
        return [one_line]
    rows = [f"{lhs} &= {rhs[0]}"]
    rows += [f"&= {r}" for r in rhs[1:]]
    return rows


def _sum_rows(lhs: str, terms: Sequence[str]) -> list[str]:
    """``lhs &= t1 + t2 + …``, broken before a line's LaTeX passes LINE_CHARS."""
    chunks: list[list[str]] = [[]]
    for term in terms:
        if chunks[-1] and len(" + ".join([*chunks[-1], term])) > LINE_CHARS:
            chunks.append([])
        chunks[-1].append(term)
    first = f"{lhs} &= " if lhs else "&= "
    return [first + " + ".join(c) if k == 0 else "&\\quad + " + " + ".join(c)
            for k, c in enumerate(chunks)]


def _exp_tex(t: Any) -> str:
    """e^t as written in a softmax (e^{0} stays: it shows the score)."""
    return exp_latex(t)


def _vec_tex(items: Sequence[str]) -> str:
    return r"\left(" + r",\ ".join(items) + r"\right)"


