"""Diagnoses of wrong claims: each slip (premature rounding, truncation, a wrong
scale, softmax over the wrong axis, a miscounted parameter) is stated only after
it provably reproduces the printed answer."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..errors import MhaSymbolicError
from .claims import PrintedAnswer, parse_printed
from .quantities import MATRIX_QUANTITIES, parse_quantity, quantity_value
from .verdicts import decimal_text, holds, special_value

if TYPE_CHECKING:
    from .examples import Claim, WorkedExample


def _claimed_weights(ex: WorkedExample, upto: int) -> _PrintedWeights:
    """Weights printed by the example's earlier claims: (head, row, col) -> value (0-based).

    The values are :class:`_Printed` fractions, which remember the text as printed.  The
    claims are read once per example (reading them again for every claim made a file
    of 5000 claims quadratic: 12.5 million readings)."""
    cache = ex.__dict__.get("_printed_weights")
    if cache is None or cache[0] != len(ex.claims):
        printed: dict[tuple[int, int, int], list[tuple[int, _Printed]]] = {}
        for k, claim in enumerate(ex.claims):
            try:
                name, _, idx = parse_quantity(claim.quantity)
                if name != "weight":
                    continue
                p = parse_printed(claim.claimed)
            except MhaSymbolicError:
                continue
            h = claim.head - 1
            if len(idx) == 2 and p.kind == "decimal" and p.value is not None:
                printed.setdefault((h, idx[0] - 1, idx[1] - 1), []).append(
                    (k, _Printed(p.value, p.text)))
            elif len(idx) == 1 and p.kind == "tuple":
                for c, part in enumerate(p.parts):
                    if part.kind == "decimal" and part.value is not None:
                        printed.setdefault((h, idx[0] - 1, c), []).append(
                            (k, _Printed(part.value, part.text)))
        cache = (len(ex.claims), printed)
        ex.__dict__["_printed_weights"] = cache
    return _PrintedWeights(cache[1], upto)


class _PrintedWeights:
    """The weights printed before claim ``upto``: the latest printing of each entry."""

    def __init__(self, printed: dict[tuple[int, int, int], list[tuple[int, Any]]],
                 upto: int) -> None:
        self.printed, self.upto = printed, upto

    def get(self, key: tuple[int, int, int], default: Any = None) -> Any:
        import bisect

        seen = self.printed.get(key, [])
        k = bisect.bisect_left(seen, self.upto, key=lambda item: item[0])
        return seen[k - 1][1] if k else default


class _Printed(Fraction):
    """A Fraction that remembers how it was printed ("0.0900", not "0.09")."""

    text: str

    def __new__(cls, value: Fraction, text: str) -> _Printed:
        self = super().__new__(cls, value)
        self.text = text.strip().lstrip("≈~= ").strip()
        return self


def premature(ex: WorkedExample, index: int, claim: Claim, p: PrintedAnswer) -> str | None:
    """Does the claim equal the computation redone with earlier printed (rounded) weights?"""
    name, _, idx = parse_quantity(claim.quantity)
    att = ex.attention()
    if att is None or name not in ("head_output", "weight", "weight_sum", "output", "concat"):
        return None
    h = claim.head - 1
    weights = _claimed_weights(ex, index)
    r = idx[0] - 1
    n_k = att.heads[h].weights.cols
    if name == "weight" and len(idx) == 2:
        # the complement: w_rc = 1 - (sum of the other printed weights of the row)
        others = [weights.get((h, r, j)) for j in range(n_k) if j != idx[1] - 1]
        if any(o is None for o in others) or not others:
            return None
        value = 1 - sum(o for o in others if o is not None)
        how = "1 − (the other printed weights of the row)"
        candidates = [value]
    else:
        if name in ("output", "concat") and (len(att.heads) != 1 or att.output is not None):
            return None
        row = [weights.get((h, r, j)) for j in range(n_k)]
        exact_row = att.heads[h].weights.row(r)
        for j, w in enumerate(row):
            if w is None and exact_row[j] == 0:
                row[j] = Fraction(0)
        if any(w is None for w in row):
            return None
        if name == "weight_sum":
            candidates = [sum(w for w in row if w is not None)]
        else:
            v = att.heads[h].v
            if name == "weight" or v is None:
                # a row of weights is not computed from other printed weights, and
                # without values there is no weighted sum to redo
                return None
            cols = [idx[1] - 1] if len(idx) == 2 else list(range(v.cols))
            candidates = []
            for c in cols:
                total = Fraction(0)
                for j, w in enumerate(row):
                    assert w is not None
                    vj = v[j, c]
                    if not vj.is_Rational:
                        return None
                    total += w * Fraction(int(vj.p), int(vj.q))
                candidates.append(total)
        how = "the rounded weights printed earlier (" + ", ".join(
            w.text if isinstance(w, _Printed) else decimal_text(w) for w in row
            if w is not None) + ")"
    parts = p.parts if p.kind == "tuple" else (p,)
    if len(parts) != len(candidates):
        return None
    for part, cand in zip(parts, candidates, strict=True):
        if part.kind != "decimal" or part.value is None or part.unit is None:
            return None
        import sympy as sp

        from ..exact.certified import certify
        from .claims import _places

        cv = certify(sp.Rational(cand.numerator, cand.denominator))
        if cv.round_places(_places(part.unit)) != part.value:
            return None
    exact = all(part.value == cand for part, cand in zip(parts, candidates, strict=True))
    return ("premature rounding: the printed answer is " + ("exactly " if exact else "")
            + f"what {how} give; computed from exact weights it differs")


def variant_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    """Does the claim match a classic slip (wrong scale, softmax over the wrong axis)?"""
    name, _, _ = parse_quantity(claim.quantity)
    if name not in MATRIX_QUANTITIES and name != "weight_sum":
        return None
    att = ex.attention()
    if att is None or name in ("score", "q", "k", "v"):
        return None
    import sympy as sp

    d_k = att.spec.d_k
    variants: list[tuple[str, dict[str, Any]]] = []
    if d_k is not None and ex.options.get("scale") is None:
        variants += [
            (f"scaled by 1/d_k = 1/{d_k} instead of 1/sqrt(d_k)", {"scale": sp.Rational(1, d_k)}),
            ("not scaled at all (the 1/sqrt(d_k) factor is missing)", {"scale": 1}),
            ("multiplied by sqrt(d_k) instead of divided", {"scale": sp.sqrt(d_k)}),
        ]
    if name not in ("scaled_score", "weight_sum") and att.spec.n_q > 1:
        variants.append(("softmax taken over the query axis (columns) instead of the keys",
                         {"softmax_over": "queries"}))
    parts = p.parts if p.kind == "tuple" else (p,)
    # A one-digit answer matches too many variants to single one out, unless a
    # variant gives it exactly.
    coarse = all(part.kind == "decimal" and part.significant_digits < 2 for part in parts)
    for text, changes in variants:
        try:
            alt = ex.attention(**changes)
            value = quantity_value(ex, claim, alt)
            if holds(value, p, claim.rtol, exactly=coarse):
                return text
        except MhaSymbolicError:
            continue
    return None


def digit_diagnosis(value: Any, p: PrintedAnswer) -> str | None:
    """Truncation, or rounding the wrong way, for one decimal claim."""
    if special_value(value) == "-inf":
        return "the entry is masked out (−∞): no finite score is right, and its weight is exactly 0"
    if p.kind != "decimal" or p.value is None or p.unit is None or special_value(value):
        return None
    from ..exact.certified import certify
    from .claims import _places

    cv = certify(value)
    places = _places(p.unit)
    if cv.truncate_places(places) == p.value:
        return "digits truncated instead of rounded"
    err = cv.compare(p.value - p.unit) > 0 and cv.compare(p.value + p.unit) < 0
    if err:
        return "rounded in the wrong direction (within one unit of the last digit)"
    return None


def count_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    name, sub, _ = parse_quantity(claim.quantity)
    if name != "params" or p.kind not in ("decimal", "expression"):
        return None
    import dataclasses

    from ..exact.params import parameter_count

    spec = ex.spec
    claimed = p.value if p.kind == "decimal" else p.expr
    flipped = dataclasses.replace(spec, bias=not spec.bias)
    pc, pf = parameter_count(spec), parameter_count(flipped)
    wo = dict((n, c) for n, _, c in pc.parts)["W^O"]
    candidates = {
        ("counts the biases too" if not spec.bias else "leaves the biases out"): pf.total,
        "leaves W^O out (counts only W^Q, W^K, W^V)": pc.total - wo,
        "counts one head's projections instead of all heads": spec.d_model * spec.d_k * 3 + wo,
    }
    if sub == "total":
        for text, value in candidates.items():
            if value == claimed:
                return text
    return None
