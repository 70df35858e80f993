"""The diagnosis "the printed values are what another input X′ gives" (issue 25).

A text that prints the softmax of one array beside another (a cell run on an earlier
tensor, the input before a transpose, the keys where the queries were meant) prints
numbers that are right for X′ and wrong for the X it shows.  For a wrong claim, the
plausible alternatives a book could have used are tried, each by the exact computation
with that one input replaced:

* the input transposed (a square X, Xᵀ ≠ X): the input before a transpose;
* another input of the same example with the same shape (the keys for the queries …);
* an array of the same shape printed by another claim of the example (its printed
  digits read exactly: a tensor the text printed in an earlier or later cell);
* the same input of another example of the file (the previous cell's tensor);
* for a raw ``score`` claim, the scaled scores (the un-normalised scores claimed, the
  scaled ones printed).

The slip is stated only when **proved** — the claim holds at its printed precision for
the computation on X′ (certified, :func:`verdicts.holds`) — and only for claims of at
least two significant digits (a one-digit answer fits too many arrays).  Alternatives
that are the same array are tried once; when distinct ones fit, they are reported
together, never one picked.

Each alternative is an exact computation (about 0.1 s for 8 tokens), so the work is
bounded: at most :data:`MAX_ALTERNATIVES` per claim, on examples of at most
:data:`MAX_SCORES` score entries, and at most :data:`MAX_FILE_BUILDS` in one
:func:`check_examples` run (:func:`file_allowance`); past them the diagnosis is not
tried (a diagnosis not tried is never a verdict).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..errors import MhaSymbolicError
from .claims import PrintedAnswer, parse_printed
from .inputs import shape_of
from .quantities import parse_quantity, quantity_value
from .verdicts import holds

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .examples import Claim, WorkedExample

__all__ = ["MAX_ALTERNATIVES", "MAX_FILE_BUILDS", "MAX_SCORES", "file_allowance",
           "other_input_diagnosis"]

MAX_ALTERNATIVES = 6
MAX_SCORES = 64
MAX_FILE_BUILDS = 48
_BUILDS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "mha_symbolic_alternative_builds", default=None)


@contextlib.contextmanager
def file_allowance(builds: int = MAX_FILE_BUILDS) -> Iterator[None]:
    """Allow at most ``builds`` alternative computations inside the block."""
    token = _BUILDS.set([builds])
    try:
        yield
    finally:
        _BUILDS.reset(token)
#: The engine inputs an alternative may replace (matrices, one batch element).
_REPLACEABLE = ("x", "x_kv", "query", "key", "value", "scores", "w_q", "w_k", "w_v", "w_o")
#: The claim quantities whose value a printed tensor may stand in for, and the input
#: key it can replace (an array the text printed is an input of a later cell).
_PRINTED_AS = {"x": "x", "q": "query", "k": "key", "v": "value", "score": "scores"}


def _is_matrix(v: Any) -> bool:
    return (isinstance(v, list) and len(v) > 0 and isinstance(v[0], list) and len(v[0]) > 0
            and not isinstance(v[0][0], list))


def _transpose(m: list[list[Any]]) -> list[list[Any]]:
    return [list(col) for col in zip(*m, strict=True)]


def _exact(m: list[list[Any]]) -> Any:
    from ..exact.engine import exact_matrix

    return exact_matrix(m, "alternative")


def _printed_matrix(c: Claim) -> list[list[Any]] | None:
    """A claim's printed 2-D tensor as exact numbers (its digits), or None."""
    try:
        p = parse_printed(c.claimed)
    except MhaSymbolicError:
        return None
    if p.kind != "array" or len(p.shape) != 2:
        return None
    vals = [part.value for part in p.parts]
    if any(not isinstance(v, Fraction) for v in vals):
        return None
    rows, cols = p.shape
    return [[vals[r * cols + j] for j in range(cols)] for r in range(rows)]


def _candidates(ex: WorkedExample, claim: Claim, siblings: Sequence[WorkedExample]
                ) -> list[tuple[str, str, list[list[Any]]]]:
    """(input key, description, replacement) for every plausible X′, nearest first."""
    kwargs = ex.engine_inputs()[claim.batch - 1]
    own = {k: v for k, v in kwargs.items() if k in _REPLACEABLE and _is_matrix(v)}
    out: list[tuple[str, str, list[list[Any]]]] = []
    for k, v in own.items():
        if len(v) == len(v[0]):
            out.append((k, f"{k} transposed ({k}ᵀ: the input before a transpose)", _transpose(v)))
    for k, v in own.items():
        for k2, v2 in own.items():
            if k2 != k and shape_of(v2) == shape_of(v):
                out.append((k, f"{k2} in place of {k}", v2))
    heads = len(ex.attention(claim.batch - 1).heads)
    for c in ex.claims:
        name, _, idx = _parse(c.quantity)
        key = _PRINTED_AS.get(name or "")
        if c is claim or idx or key is None or c.batch != claim.batch or (heads > 1 and key != "x"):
            continue
        m = _printed_matrix(c)
        at = f" at line {c.line}" if c.line else ""
        if m is None:
            continue
        if key in own and shape_of(m) == shape_of(own[key]):
            out.append((key, f"{key} replaced by the {c.quantity} the text prints{at}", m))
        elif key == "scores" and "query" in own and "key" in own and "x" not in own:
            # the raw scores printed (wrongly) and the next cell run on them
            att = ex.attention(claim.batch - 1)
            if shape_of(m) == (att.heads[0].scaled.rows, att.heads[0].scaled.cols):
                out.append((key, f"the scores the text prints{at} in place of Q Kᵀ", m))
    for sib in siblings:
        if sib is ex or not sib.has_attention:
            continue
        try:
            per_batch = sib.engine_inputs()
        except MhaSymbolicError:
            continue
        for b, skw in enumerate(per_batch):
            for k2, v2 in skw.items():
                if k2 not in _REPLACEABLE or not _is_matrix(v2):
                    continue
                for k, v in own.items():
                    if k2 == k and shape_of(v2) == shape_of(v):
                        which = f" (batch element {b + 1})" if len(per_batch) > 1 else ""
                        where = f", line {sib.line}" if sib.line else ""
                        out.append((k, f"{k} replaced by {k2} of example {sib.name!r}{which}"
                                       f"{where}", v2))
    return out


def _parse(q: str) -> tuple[str | None, str | None, tuple[int, ...]]:
    try:
        return parse_quantity(q)
    except MhaSymbolicError:
        return None, None, ()


def other_input_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer,
                          siblings: Sequence[WorkedExample] = ()) -> str | None:
    """'the printed values are what input X′ gives: …' when exactly the computations on
    the alternatives above reproduce the claim (several: said together)."""
    name, _, idx = parse_quantity(claim.quantity)
    if not ex.has_attention or name in ("shape", "dim", "params", "expr", "x", "mask",
                                        "mask_out", "scale"):
        return None
    if p.kind == "array" and len(p.shape) > 2 and not idx:
        return None  # a printout over the batch or heads: one element's value cannot pair
    if all(part.kind == "decimal" and part.significant_digits < 2 for part in p.entries):
        return None
    if name == "score" and ex.options.get("scale") != 1:
        # the scaled scores printed where the raw ones are claimed (the printout of a later
        # step of the same cell): no computation beyond the example's own
        import dataclasses

        scaled = dataclasses.replace(claim, quantity="scaled_" + claim.quantity.strip())
        try:
            if holds(quantity_value(ex, scaled), p, claim.rtol):
                return ("the printed values are the scaled scores (scale · Q Kᵀ), not the raw "
                        "scores Q Kᵀ the claim names")
        except MhaSymbolicError:
            pass
    att = ex.attention(claim.batch - 1)
    if sum(h.scaled.rows * h.scaled.cols for h in att.heads) > MAX_SCORES:
        return None
    base = ex.engine_inputs()[claim.batch - 1]
    found: list[str] = []
    tried = 0
    seen: list[tuple[str, Any]] = []
    allowance = _BUILDS.get()
    for key, text, m in _candidates(ex, claim, siblings):
        if tried >= MAX_ALTERNATIVES or (allowance is not None and allowance[0] <= 0):
            break
        try:
            exact = _exact(m)
            if (key in base and exact == _exact(base[key])) or (key, exact) in seen:
                continue  # the shown array itself, or an alternative already tried
            seen.append((key, exact))
            tried += 1
            if allowance is not None:
                allowance[0] -= 1
            changes: dict[str, Any] = {key: m}
            if key not in base:  # printed scores in place of the queries and keys
                changes.update(query=None, key=None, scale=att.scale)
            alt = ex.attention(claim.batch - 1, **changes)
            value = quantity_value(ex, claim, alt)
        except MhaSymbolicError:
            continue
        if holds(value, p, claim.rtol):
            found.append(text)
    if not found:
        return None
    if len(found) == 1:
        return f"the printed values are what another input gives: {found[0]}"
    return ("the printed values are what another input gives, and several fit (which one the "
            "text used is not decided here): " + "; or ".join(found))
