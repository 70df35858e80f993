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
  scaled ones printed);
* when none of these fits, the **small edits** of a typed input (:mod:`.edits`: one
  entry negated, two neighbouring entries swapped, a digit dropped, two digits swapped,
  a last digit off by one), kind by kind.

The slip is stated only when **proved** — the claim holds at its printed precision for
the computation on X′ (certified, :func:`verdicts.holds`) — and only for claims of at
least two significant digits (a one-digit answer fits too many arrays).  Alternatives
that are the same array are tried once; when distinct ones fit, they are reported
together, never one picked.

Each alternative is an exact computation (about 0.1 s for 8 tokens), first screened in
Arb balls (:mod:`.alternative_screen`: one that the balls prove cannot give the printed
digits is not built; the counts below are unchanged by the screen), so the work is
bounded: at most :data:`MAX_ALTERNATIVES` per claim, on examples of at most
:data:`MAX_SCORES` score entries, and at most :data:`MAX_FILE_BUILDS` in one
:func:`check_examples` run (:func:`file_allowance`); past them the diagnosis is not
tried (a diagnosis not tried is never a verdict).  The small edits have their own
bounds: at most :data:`MAX_EDITS` per claim, on examples of at most
:data:`MAX_EDIT_SCORES` score entries, :data:`MAX_FILE_EDITS` per run, and only for
printouts of at least :data:`EDIT_DIGITS` significant digits together (or an exact
expression), so that a chance fit among the 24 is unlikely (about 24 · 10^−5).

A printout read transposed or gathered over the batch or heads axis is judged as its
claim is (``value_of``); over the batch axis, an input is replaced in every element.

An alternative moves entries of the example into places where they were not (a value
entry into the keys: into an exponential).  SymPy expands a power a^(n + c) (``c`` not
an integer) into a^n · a^c whenever it asks for the real and imaginary parts of e^x or
tanh(x) (the score of ``0.6698^(99999 + π)`` in the keys: a 400,000-digit rational,
over a minute, issue 30).  The grammar refuses such a power in typed text and the
engine in a SymPy value (:func:`mha_symbolic.exact.grammar.costly_power`); the
diagnosis checks first and does not try them.  So an alternative is tried only when none of its
entries holds a power a^y, y not an integer, whose a^⌊|y|⌋ is beyond the grammar's
bounds on an exact power (:func:`costly_power`: more than ``MAX_POWER_DIGITS`` digits
for a rational a, an expansion costlier than ``MAX_EXPANSION_WORK`` otherwise); an
alternative with one is skipped (the diagnosis is advice: the verdict is unchanged).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..errors import MhaSymbolicError
from ..exact.grammar import costly_power
from .alternative_screen import may_fit
from .claims import PrintedAnswer, parse_printed
from .inputs import shape_of
from .quantities import parse_quantity, quantity_value
from .verdicts import holds

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .examples import Claim, WorkedExample

__all__ = ["EDIT_DIGITS", "MAX_ALTERNATIVES", "MAX_EDITS", "MAX_EDIT_SCORES", "MAX_FILE_BUILDS",
           "MAX_FILE_EDITS", "MAX_SCORES", "costly_power", "file_allowance",
           "other_input_diagnosis"]

MAX_ALTERNATIVES = 6
MAX_SCORES = 64
MAX_FILE_BUILDS = 48
#: Small edits of a typed input (:mod:`.edits`): at most MAX_EDITS per claim, on
#: examples of at most MAX_EDIT_SCORES score entries, MAX_FILE_EDITS per run, for
#: printouts of at least EDIT_DIGITS significant digits (:func:`_informative`).
MAX_EDITS = 24
MAX_EDIT_SCORES = 16
MAX_FILE_EDITS = 4 * MAX_FILE_BUILDS
EDIT_DIGITS = 5
_BUILDS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "mha_symbolic_alternative_builds", default=None)
_EDITS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "mha_symbolic_alternative_edits", default=None)


@contextlib.contextmanager
def file_allowance(builds: int = MAX_FILE_BUILDS, edits: int | None = None) -> Iterator[None]:
    """Allow at most ``builds`` alternative computations and ``edits`` computations on
    small edits inside the block (``None``: 4 per build, :data:`MAX_FILE_EDITS` by
    default)."""
    token = _BUILDS.set([builds])
    token_e = _EDITS.set([4 * builds if edits is None else edits])
    try:
        yield
    finally:
        _EDITS.reset(token_e)
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


def _edit_candidates(ex: WorkedExample, claim: Claim) -> list[tuple[str, str, list[list[Any]]]]:
    """(input key, description, edited input) for the small edits of the example's typed
    inputs (:mod:`.edits`), kind by kind across the inputs."""
    from .edits import EDIT_KINDS, edits_by_kind

    own = {k: v for k, v in ex.engine_inputs()[claim.batch - 1].items()
           if k in _REPLACEABLE and _is_matrix(v)}
    per_input = {k: edits_by_kind(v) for k, v in own.items()}
    return [(k, f"{k} with {text}", m) for kind in EDIT_KINDS for k, by_kind in per_input.items()
            for text, m in by_kind[kind]]


def _informative(p: PrintedAnswer) -> bool:
    """Whether a chance fit of one of :data:`MAX_EDITS` edits is unlikely: the printout
    is an exact expression, or its decimals carry at least :data:`EDIT_DIGITS`
    significant digits together (a chance fit about MAX_EDITS · 10^−digits)."""
    if any(part.kind == "expression" for part in p.entries):
        return True
    return sum(part.significant_digits for part in p.entries
               if part.kind == "decimal") >= EDIT_DIGITS


def other_input_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer,
                          siblings: Sequence[WorkedExample] = (), *,
                          value_of: Callable[[Callable[[int], Any]], Any] | None = None
                          ) -> str | None:
    """'the printed values are what input X′ gives: …' when exactly the computations on
    the alternatives above reproduce the claim (several: said together).

    ``value_of(att_of)`` lays the claim's value out as its printout is (transposed,
    gathered over the batch or heads axis), ``att_of(b)`` giving batch element b's
    attention; without it the claim's own quantity of one batch element is used.  For
    a printout over the batch axis, an input is replaced in every batch element: a
    transposition of each element's own, another array only where every element shows
    the same array (a batch of one tensor stacked)."""
    name, _, idx = parse_quantity(claim.quantity)
    if not ex.has_attention or name in ("shape", "dim", "params", "expr", "x", "mask",
                                        "mask_out", "scale"):
        return None
    if value_of is None:
        if p.kind == "array" and len(p.shape) > 2 and not idx:
            return None  # a printout over the batch or heads: needs value_of

        def value_of(att_of: Callable[[int], Any]) -> Any:
            return quantity_value(ex, claim, att_of(claim.batch - 1))
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
    spans = p.kind == "array" and len(p.shape) > 2 and not idx and ex.batch_size > 1
    batches = range(ex.batch_size) if spans else range(claim.batch - 1, claim.batch)
    per_batch = ex.engine_inputs()
    b0 = claim.batch - 1
    base = per_batch[b0]
    att0 = ex.attention(b0)
    # every batch element has the same shapes: its score entries, once per element spanned
    scores = len(batches) * sum(h.scaled.rows * h.scaled.cols for h in att0.heads)
    if scores > MAX_SCORES:
        return None

    def changes_of(b: int, key: str, m: list[list[Any]], transposition: bool) -> dict[str, Any]:
        if b != b0:
            own: Any = per_batch[b].get(key)
            if own is None or key not in base:
                raise MhaSymbolicError("not an input of every batch element")
            if transposition and _is_matrix(own) and len(own) == len(own[0]):
                m = _transpose(own)
            elif _exact(own) != _exact(base[key]):
                raise MhaSymbolicError("batch elements differ")  # not one array stacked
        changes: dict[str, Any] = {key: m}
        if key not in base:  # printed scores in place of the queries and keys
            changes.update(query=None, key=None, scale=att0.scale)
        return changes

    found: list[str] = []
    seen: list[tuple[str, Any]] = []
    allowance = _BUILDS.get()
    edits = _EDITS.get()

    def tries(key: str, text: str, m: list[list[Any]], budget: list[int],
              file_budget: list[int] | None) -> None:
        if budget[0] <= 0 or (file_budget is not None and file_budget[0] <= 0):
            return
        try:
            exact = _exact(m)
            if (key in base and exact == _exact(base[key])) or (key, exact) in seen:
                return  # the shown array itself, or an alternative already tried
            if any(costly_power(e) for e in exact):
                return  # SymPy's expansion of an entry is not bounded (module text)
            seen.append((key, exact))
            budget[0] -= 1
            if file_budget is not None:
                file_budget[0] -= 1
            transposition = text.startswith(f"{key} transposed")
            changes = {b: changes_of(b, key, m, transposition) for b in batches}
            if not may_fit(name or "", {b: {**per_batch[b], **changes[b]} for b in batches},
                           value_of, p, claim.rtol):
                return  # Arb proves the claim cannot hold for X′: not built (module text)
            alts = {b: ex.attention(b, **changes[b]) for b in batches}

            def att_of(b: int) -> Any:
                if b not in alts:  # an element the variant was not built for
                    raise MhaSymbolicError(f"batch element {b + 1} was not replaced")
                return alts[b]

            value = value_of(att_of)
        except MhaSymbolicError:
            return
        if holds(value, p, claim.rtol):
            found.append(text)

    whole = [MAX_ALTERNATIVES]
    for key, text, m in _candidates(ex, claim, siblings):
        tries(key, text, m, whole, allowance)
    if not found and _informative(p) and scores <= MAX_EDIT_SCORES:
        small = [MAX_EDITS]
        for key, text, m in _edit_candidates(ex, claim):
            tries(key, text, m, small, edits)
    if not found:
        return None
    if len(found) == 1:
        return f"the printed values are what another input gives: {found[0]}"
    return ("the printed values are what another input gives, and several fit (which one the "
            "text used is not decided here): " + "; or ".join(found))
