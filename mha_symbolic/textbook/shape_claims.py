"""Shape claims, read in the layout the text uses.

A printed shape names sizes along axes the text chose: ``torch.Size([2, 6, 2])`` may be
batch × tokens × d_k, or heads × tokens × d_k for a heads-first tensor without a batch
axis; ``torch.Size([2, 6, 4, 2])`` may be batch × heads × tokens × d_k, or
batch × tokens × heads × d_k (the ``view`` before ``transpose(1, 2)``);
``keys.permute(0, 2, 1).shape`` swaps rows and columns.  The claim's ``axes`` key states
the layout (``axes = "heads × columns × rows"``: the axis names ``batch``, ``heads``,
``rows``, ``columns`` of the quantity's matrix, in the order printed), decided from the
code that printed it.  Without ``axes`` every reading the number of sizes allows is
tried; when the readings disagree on the verdict the claim is **ambiguous** (never
counted as wrong, never as holding), and the record names each reading and its verdict.

A one-dimensional shape (``torch.Size([2])``) is a vector's: a bias (``shape.b_q``) or
one row of a matrix (``shape.q[2]``: the second token's query, d_k long).

>>> from mha_symbolic.textbook import check_examples
>>> r = check_examples('''
... [[example]]
... n_q = 6
... d_model = 72
... heads = 3
... [[example.claim]]
... quantity = "shape.k"
... claimed = "torch.Size([3, 6, 24])"
... axes = "heads × rows × columns"
... ''').records[0]
>>> r.verdict, r.exact
('exact', '3 × 6 × 24')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ClaimError
from .claims import parse_printed
from .examples import Claim, WorkedExample
from .quantities import AXIS_NAMES, PER_HEAD_SHAPES, WEIGHT_SHAPES, parse_axes, parse_quantity
from .reports import AMBIGUOUS, ClaimRecord
from .sizes import NotWhole, is_division, parse_size, size_value

__all__ = ["AMBIGUOUS", "AXIS_NAMES", "parse_axes", "shape_record"]

#: Shapes that are vectors (one size): the biases.
BIAS_SHAPES = ("b_q", "b_k", "b_v", "b_o", "b_qkv")


@dataclass(frozen=True)
class _Reading:
    axes: tuple[str, ...]
    expected: tuple[Any, ...]
    ok: bool


def _readings(n: int, per_head: bool, vector: bool) -> list[tuple[str, ...]]:
    """The layouts a claim of ``n`` sizes may be in, the book's usual one first
    (``per_head``: the quantity exists per head and there is more than one)."""
    out: list[tuple[str, ...]] = []
    if vector:
        out = [("columns",)] if n == 1 else [("rows", "columns")] if n == 2 else []
    elif n == 2:
        out = [("rows", "columns")]
    elif n == 3:
        out = [("batch", "rows", "columns")]
        if per_head:
            out.append(("heads", "rows", "columns"))
    elif n == 4 and per_head:
        out = [("batch", "heads", "rows", "columns"), ("batch", "rows", "heads", "columns")]
    return out


def shape_record(ex: WorkedExample, claim: Claim, value: Any) -> ClaimRecord:
    """Judge a shape claim against the shape ``value`` of its quantity."""
    import sympy as sp

    from ..exact.shapes import Shape, _text, same_size

    p = parse_printed(claim.claimed, shape=True, vector=True)
    _, sub, idx = parse_quantity(claim.quantity)
    sub = sub or ""
    vector = sub in BIAS_SHAPES or bool(idx)
    if idx:
        if len(idx) != 1:
            raise ClaimError(f"{claim.quantity}: a shape takes one index, the row")
        rows = value.rows
        if isinstance(rows, int) and not 1 <= idx[0] <= rows:
            raise ClaimError(f"{claim.quantity}: row {idx[0]} is out of range 1..{rows}")
        value = Shape(1, value.cols)
    per_head = sub in PER_HEAD_SHAPES
    heads = ex.spec.heads
    n = len(p.sizes)
    if claim.axes:
        if len(claim.axes) != n:
            raise ClaimError(f"{claim.quantity}: axes names {len(claim.axes)} axes but "
                             f"{claim.claimed.strip()[:40]!r} has {n} sizes")
        if "heads" in claim.axes and not per_head:
            raise ClaimError(f"{claim.quantity} is not per head: its axes have no heads")
        if "columns" not in claim.axes or ("rows" not in claim.axes and not vector):
            raise ClaimError(f"{claim.quantity}: axes must name rows and columns"
                             + (" (a vector: columns)" if vector else ""))
        layouts = [claim.axes]
    else:
        # a heads axis is read only where there are heads to lay out (a single head's
        # tensor has none: (2, 1, 4) is batch × rows × columns)
        layouts = _readings(n, per_head and heads != 1, vector)
        if not layouts:
            hint = ("1 size (a vector)" if vector else
                    "2 sizes (rows × columns) or 3 (batch × rows × columns)"
                    + (", 4 (batch × heads × rows × columns)" if per_head else "")
                    + "; a row's shape is shape.NAME[i]")
            raise ClaimError(f"{claim.quantity}: {n} sizes do not fit; claim {hint}, or state "
                             "the layout with axes = \"…\"")

    not_whole: list[str] = []

    def size(x: Any) -> Any:
        if isinstance(x, int):
            return x
        if is_division(x):  # n_embd/n_head, d_model // h: exact; a numeric one must divide
            try:
                return size_value(x, {})
            except NotWhole as exc:
                (num, den), _ = parse_size(x) or (((), ()), False)
                d = sp.Mul(*[int(f) for f in den])
                if d == 0:
                    raise ClaimError(f"claimed={claim.claimed.strip()[:40]!r}: {x} divides by "
                                     "zero") from None
                not_whole.append(str(exc))
                return sp.Rational(sp.Mul(*[int(f) for f in num]), d)
        factors = [int(f) if f.isdigit() else sp.Symbol(f, integer=True, positive=True)
                   for f in x.split("·")]
        return sp.Mul(*factors)

    batch = ex.batch_size if ex.has_attention or "batch" in ex.dims else sp.Symbol(
        "batch", integer=True, positive=True)
    along = {"batch": batch, "heads": ex.spec.heads, "rows": value.rows, "columns": value.cols}
    claimed = [size(x) for x in p.sizes]
    readings = []
    for axes in layouts:
        expected = tuple(along[a] for a in axes)
        ok = all(same_size(a, b) for a, b in zip(claimed, expected, strict=True))
        readings.append(_Reading(axes, expected, ok))

    def text(r: _Reading) -> str:
        return " × ".join(_text(x) for x in r.expected)

    first = next((r for r in readings if r.ok), readings[0])
    verdicts = {r.ok for r in readings}
    detail = None
    diagnosis = None
    if len(verdicts) > 1:
        verdict, ok = AMBIGUOUS, False
        detail = ("the readings disagree: " + "; ".join(
            f"{' × '.join(r.axes)} = {text(r)} ({'holds' if r.ok else 'wrong'})" for r in readings)
            + "; state the layout with the claim's axes = \"…\"")
    else:
        ok = readings[0].ok
        verdict = "exact" if ok else "wrong"
        if not ok:
            diagnosis = (f"a size that is not whole: {not_whole[0]}" if not_whole
                         else _transposed(ex, sub, claimed, readings)
                         or _other_size(ex, claimed, readings))
        if len(readings) > 1:
            detail = "every reading agrees: " + ", ".join(" × ".join(r.axes) for r in readings)
    shown = text(first)
    return ClaimRecord(ex.name, claim.quantity, claim.head, claim.claimed, shown, "",
                       None if ok or verdict == AMBIGUOUS else shown, "shape", verdict, ok,
                       None, diagnosis, claim.note, value, file=ex.source, line=claim.line,
                       batch=claim.batch, detail=detail)


def _transposed(ex: WorkedExample, sub: str, claimed: list[Any],
                readings: list[_Reading]) -> str | None:
    """'transposed' when some reading with rows and columns swapped holds."""
    from ..exact.shapes import same_size

    for r in readings:
        if "rows" not in r.axes:
            continue
        i, j = r.axes.index("rows"), r.axes.index("columns")
        swapped = list(r.expected)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        if swapped != list(r.expected) and all(same_size(a, b) for a, b in
                                               zip(claimed, swapped, strict=True)):
            diagnosis = "transposed: rows and columns swapped"
            if sub not in WEIGHT_SHAPES:
                diagnosis += (" (if the text printed a transposed view, .T, transpose or "
                              "permute, state it: axes = \"" + " × ".join(
                                  "columns" if a == "rows" else "rows" if a == "columns" else a
                                  for a in r.axes) + "\")")
            else:
                diagnosis += (" (torch's nn.Linear stores its weight as (out, in); this example "
                              "uses " + ("torch's" if ex.options.get("layout") == "torch"
                                         else "the book's (in, out)") + " layout)")
            return diagnosis
    return None


#: The named sizes of an example a wrong size may be (in the order they are listed).
_SIZE_NAMES = ("d_model", "d_k", "d_v", "n_q", "n_k", "heads", "h·d_k", "h·d_v", "batch")


def _named_sizes(ex: WorkedExample) -> dict[str, Any]:
    spec = ex.spec
    out = {"d_model": spec.d_model, "d_k": spec.d_k, "d_v": spec.d_v, "n_q": spec.n_q,
           "n_k": spec.n_k, "heads": spec.heads}
    if spec.heads != 1:  # h·d_k is d_k itself for one head
        out["h·d_k"] = spec.heads * spec.d_k if spec.d_k is not None else None
        out["h·d_v"] = spec.heads * spec.d_v if spec.d_v is not None else None
    if ex.has_attention or "batch" in ex.dims:
        out["batch"] = ex.batch_size
    return {k: v for k, v in out.items() if v is not None}


def _other_size(ex: WorkedExample, claimed: list[Any], readings: list[_Reading]) -> str | None:
    """'a size of another axis' when, in the only reading, every wrong size is one of the
    example's named sizes (d_model where one head's d_v is meant, n_k for n_q, …): a
    proved statement of which sizes the printed ones are, every name that fits listed.
    Sizes 1 are not named (too many axes are 1)."""
    from ..exact.shapes import _text, same_size

    if len(readings) != 1:
        return None
    r = readings[0]
    named = _named_sizes(ex)
    parts, several = [], False
    for axis, got, want in zip(r.axes, claimed, r.expected, strict=True):
        if same_size(got, want):
            continue
        if got == 1:
            return None
        names = [n for n in _SIZE_NAMES if n in named and same_size(got, named[n])
                 and not same_size(named[n], want)]
        if not names:
            return None
        several = several or len(names) > 1
        parts.append(f"the {axis} are {_text(got)} = {' = '.join(names)}, where this axis has "
                     f"{_text(want)}")
    if not parts:
        return None
    return ("a size of another axis: " + "; ".join(parts)
            + (" (several names fit: which one the text meant is not decided here)"
               if several else ""))
