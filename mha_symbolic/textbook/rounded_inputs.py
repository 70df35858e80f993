"""Diagnoses of wrong claims that come from rounded inputs (issue 25), both ways round.

**Inputs rounded for readability, outputs computed from them** (*premature rounding of
the inputs*): a text shows an input to d decimals — the example prints ``x``, ``q``,
``k``, ``v`` or the scores at d decimals — and then computes the later numbers from the
rounded digits rather than from the inputs themselves.  The diagnosis recomputes the
claim exactly with the inputs rounded to those d decimals (every printed input at once
first, then each alone) and states the slip only when that computation reproduces the
printed answer at its printed precision (certified, :func:`verdicts.holds`).

**Inputs shown rounded, outputs computed from the unrounded ones**: an example types its
inputs as a text printed them (``0.3367``, torch's 4 decimals) and takes them as exact,
while the text computed with the unrounded tensors.  The claim is then wrong for the
typed digits and right for *some* inputs within half a unit of each typed last digit.
The diagnosis runs the interval reading of ``inputs = "printed"``
(:func:`intervals.consistent_with_printed`: an intermediate-value witness per wrong
entry, Arb-certified) and is stated only when it proves the printed answer reachable,
and only where a rounding of the inputs can plausibly be the cause: the inputs carry at
least :data:`MIN_INPUT_DECIMALS` decimals, and each wrong entry is less than
:data:`MAX_REACH` units of its last digit from the typed inputs' exact value (certified):
a printed digit farther off is a typo's, not a rounding's.

Both are tried after every other diagnosis (a slip of the computation is the nearer
root) and at most :data:`MAX_ROUNDINGS` exact computations per claim, on examples of at
most :data:`MAX_SCORES` score entries.

>>> from mha_symbolic.textbook import check_examples, load_examples
>>> text = '''
... [[example]]
... name = "rounded x"
... scale = 1
... x = [["1/3", "2/3"], ["1", "0"]]
... w_q = [[1, 0], [0, 1]]
... w_k = [[1, 0], [0, 1]]
... w_v = [[1, 0], [0, 1]]
... [[example.claim]]
... quantity = "x"
... claimed = "[[0.33, 0.67], [1.00, 0.00]]"
... [[example.claim]]
... quantity = "head_output[1]"
... claimed = "(0.6270, 0.3730)"
... '''
>>> rec = check_examples(load_examples(text=text)).records[1]
>>> rec.verdict, rec.diagnosis.split(":")[0]
('wrong', 'premature rounding of the inputs')
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..errors import MhaSymbolicError
from .claims import PrintedAnswer, parse_printed
from .quantities import parse_quantity
from .verdicts import holds, judge, pairs

if TYPE_CHECKING:
    from collections.abc import Callable

    from .examples import Claim, WorkedExample

__all__ = ["MAX_ROUNDINGS", "MIN_INPUT_DECIMALS", "rounded_inputs_diagnosis",
           "unrounded_inputs_diagnosis"]

#: Exact computations on rounded inputs tried per claim.
MAX_ROUNDINGS = 4
#: Most score entries of an example whose rounded inputs are tried.
MAX_SCORES = 64
#: Fewest decimals of typed inputs read as a text's rounded printout.
MIN_INPUT_DECIMALS = 2
#: Most units of its last digit by which a wrong entry may differ from the typed inputs'
#: value for "inputs shown rounded" (farther off, a printed digit is a typo's).
MAX_REACH = 2
#: The claim quantities that print an input, and the engine input they show.
_PRINTED_INPUT = {"x": "x", "q": "query", "k": "key", "v": "value", "score": "scores"}
#: The quantities a computation from the inputs produces.
_COMPUTED = ("score", "scaled_score", "weight", "head_output", "concat", "output", "weight_sum",
             "weighted_value", "q", "k", "v")


def _places(unit: Fraction) -> int | None:
    """d for a unit 10^−d (d ≥ 0), else None."""
    d = 0
    while unit < 1 and d < 30:
        unit *= 10
        d += 1
    return d if unit == 1 else None


def _printed_inputs(ex: WorkedExample, claim: Claim) -> list[tuple[str, int, str]]:
    """(input key, decimals, where) for each whole input matrix an earlier or later claim
    of the example prints at one number of decimals (one head, the claim's batch)."""
    out: list[tuple[str, int, str]] = []
    heads = len(ex.attention(claim.batch - 1).heads)
    for c in ex.claims:
        try:
            name, _, idx = parse_quantity(c.quantity)
            key = _PRINTED_INPUT.get(name)
            if c is claim or key is None or idx or c.batch != claim.batch or (
                    heads > 1 and key != "x"):
                continue
            p = parse_printed(c.claimed)
        except MhaSymbolicError:
            continue
        if p.kind != "array" or len(p.shape) != 2 or any(
                part.kind != "decimal" or part.unit is None for part in p.parts):
            continue
        units = {part.unit for part in p.parts if part.unit is not None}
        d = _places(units.pop()) if len(units) == 1 else None
        if d is not None:
            out.append((key, d, f"line {c.line}" if c.line else c.quantity))
    return out


def _rounded(m: list[list[Any]], d: int) -> list[list[Fraction]] | None:
    """Every entry correctly rounded to d decimals (certified; None at a tie)."""
    import sympy as sp

    from ..exact.certified import certify
    from ..exact.engine import exact_matrix

    exact = exact_matrix(m, "rounded input")
    out: list[list[Fraction]] = []
    for r in range(exact.rows):
        row = []
        for c in range(exact.cols):
            cv = certify(sp.sympify(exact[r, c]))
            if cv.is_tie(d):
                return None  # half-way: which way the text rounded is not known
            row.append(cv.round_places(d))
        out.append(row)
    return out


def rounded_inputs_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer,
                             value_of: Callable[[Callable[[int], Any]], Any]) -> str | None:
    """'premature rounding of the inputs: …' when the claim is what the inputs rounded as
    the text prints them give (every printed input together, else one alone; several
    that fit are said together).  ``value_of(att_of)`` lays the claim's value out as its
    printout is (see :func:`alternatives.other_input_diagnosis`)."""
    from .alternatives import _informative

    name, _, _ = parse_quantity(claim.quantity)
    if name not in _COMPUTED or not ex.has_attention or not _informative(p):
        return None
    if p.kind == "array" and len(p.shape) > 2:
        return None  # a printout over the batch or heads: one element's inputs are rounded
    b = claim.batch - 1
    att = ex.attention(b)
    if sum(h.scaled.rows * h.scaled.cols for h in att.heads) > MAX_SCORES:
        return None
    base = ex.engine_inputs()[b]
    shown = [(k, d, at) for k, d, at in _printed_inputs(ex, claim) if k in base
             and k != _PRINTED_INPUT.get(name)]
    if not shown:
        return None
    from ..exact.engine import exact_matrix

    roundings: dict[str, tuple[list[list[Fraction]], str]] = {}
    for key, d, at in shown:
        if key in roundings:
            continue
        try:
            r = _rounded(base[key], d)
            if r is None or exact_matrix(r, key) == exact_matrix(base[key], key):
                continue  # a tie, or the input already has those digits
        except MhaSymbolicError:
            continue
        roundings[key] = (r, f"{key} rounded to {d} decimals (as the text prints it, {at})")
    candidates = ([dict(roundings)] if len(roundings) > 1 else []) + [
        {k: v} for k, v in roundings.items()]
    found: list[str] = []
    for n, cand in enumerate(candidates[:MAX_ROUNDINGS]):
        try:
            alt = ex.attention(b, **{k: m for k, (m, _) in cand.items()})

            def att_of(bb: int, alt: Any = alt) -> Any:
                return alt if bb == b else _other(bb)

            fits = holds(value_of(att_of), p, claim.rtol)
        except MhaSymbolicError:
            continue
        if fits:
            found.append(" and ".join(text for _, text in cand.values()))
            if n == 0 and len(cand) > 1:
                break  # every printed input rounded fits: the single ones are its parts
    if not found:
        return None
    if len(found) == 1:
        return ("premature rounding of the inputs: the printed values are those computed "
                f"from {found[0]}; computed from the inputs themselves they differ")
    return ("premature rounding of the inputs, and several roundings fit (which one the text "
            "used is not decided here): the printed values are those computed from "
            + "; or from ".join(found))


def _other(b: int) -> Any:
    raise MhaSymbolicError(f"batch element {b + 1} was not rounded")


def unrounded_inputs_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer
                               ) -> str | None:
    """'inputs shown rounded: …' when the typed decimal inputs, read as printed (each
    within half a unit of its last digit), provably give the claim, and each wrong entry
    is less than :data:`MAX_REACH` units of its last digit from the typed digits' value."""
    if ex.printed_inputs or not ex.has_attention:
        return None  # read as printed, the claim was already judged that way
    if not 1 <= claim.batch <= ex.batch_size:
        return None  # a quantity not of the inputs (params, dims) with any batch= (seed 61)
    if p.kind == "array" and len(p.shape) > 2:
        return None
    from .intervals import _printed_inputs as typed_inputs
    from .intervals import consistent_with_printed, input_decimals
    from .quantities import quantity_value
    from .reports import CONSISTENT

    kwargs = ex.engine_inputs()[claim.batch - 1]
    typed = typed_inputs(kwargs)
    if not typed or max(half for *_, half in typed) > Fraction(1, 2 * 10 ** MIN_INPUT_DECIMALS):
        return None
    if sum(h.scaled.rows * h.scaled.cols for h in ex.attention(claim.batch - 1).heads) > MAX_SCORES:
        return None
    import sympy as sp

    value = quantity_value(ex, claim)
    items = pairs(value, p, claim.quantity)
    judgements = [judge(sp.sympify(v), part, claim.rtol) for v, part in items]
    wrong = [i for i, j in enumerate(judgements) if not j.ok]
    if not wrong or any(p.entries[i].kind != "decimal" or p.entries[i].unit is None
                        for i in wrong):
        return None
    from ..exact.certified import certify

    for i in wrong:  # a printed digit far off is a typo's, not a rounding's
        part, cv = p.entries[i], certify(sp.sympify(items[i][0]))
        assert part.value is not None and part.unit is not None
        reach = MAX_REACH * part.unit
        if not (cv.compare(part.value - reach) > 0 and cv.compare(part.value + reach) < 0):
            return None
    verdict, _ = consistent_with_printed(ex, claim, value, p, judgements)
    if verdict != CONSISTENT:
        return None
    what = ("the printed value" if len(p.entries) == 1 else
            "the entry the typed digits miss" if len(wrong) == 1 else
            "each entry the typed digits miss (a witness per entry)")
    return (f"inputs shown rounded: the typed inputs read as printed to "
            f"{input_decimals(kwargs)} decimals (each within half a unit of its last digit) give "
            + what
            + "; the text computed with the unrounded inputs (read them with inputs = "
            "\"printed\")")
