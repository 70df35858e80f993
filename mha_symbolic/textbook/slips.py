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


def _claimed_weights(ex: WorkedExample, upto: int, batch: int = 1) -> _PrintedWeights:
    """Weights printed by the example's earlier claims: (head, row, col) -> value (0-based).

    The values are :class:`_Printed` fractions, which remember the text as printed.  The
    claims are read once per example (reading them again for every claim made a file
    of 5000 claims quadratic: 12.5 million readings)."""
    cache = ex.__dict__.get("_printed_weights")
    if cache is None or cache[0] != len(ex.claims):
        printed: dict[tuple[int, int, int, int], list[tuple[int, _Printed]]] = {}
        for k, claim in enumerate(ex.claims):
            try:
                name, _, idx = parse_quantity(claim.quantity)
                if name != "weight":
                    continue
                p = parse_printed(claim.claimed)
            except MhaSymbolicError:
                continue
            h, b = claim.head - 1, claim.batch
            if len(idx) == 2 and p.kind == "decimal" and p.value is not None:
                printed.setdefault((b, h, idx[0] - 1, idx[1] - 1), []).append(
                    (k, _Printed(p.value, p.text)))
            elif len(idx) == 1 and p.kind in ("tuple", "array") and len(p.shape) <= 1:
                for c, part in enumerate(p.parts):
                    if part.kind == "decimal" and part.value is not None:
                        printed.setdefault((b, h, idx[0] - 1, c), []).append(
                            (k, _Printed(part.value, part.text)))
        cache = (len(ex.claims), printed)
        ex.__dict__["_printed_weights"] = cache
    return _PrintedWeights(cache[1], upto, batch)


class _PrintedWeights:
    """The weights printed before claim ``upto``: the latest printing of each entry."""

    def __init__(self, printed: dict[tuple[int, int, int, int], list[tuple[int, Any]]],
                 upto: int, batch: int) -> None:
        self.printed, self.upto, self.batch = printed, upto, batch

    def get(self, key: tuple[int, int, int], default: Any = None) -> Any:
        import bisect

        seen = self.printed.get((self.batch, *key), [])
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
    if not idx or not 0 < claim.batch <= ex.batch_size:
        return None
    att = ex.attention(claim.batch - 1)
    if att is None or name not in ("head_output", "weight", "weight_sum", "output", "concat"):
        return None
    h = claim.head - 1
    weights = _claimed_weights(ex, index, claim.batch)
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
    if not 0 < claim.batch <= ex.batch_size:
        return None
    att = ex.attention(claim.batch - 1)
    if att is None or name in ("q", "k", "v") or (name == "score" and not _square_weights(ex, "qk")):
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
    if (_square_weights(ex) and name not in ("score", "scaled_score", "weight")) or _square_weights(
            ex, "qk"):
        torch_now = ex.options.get("layout") == "torch"
        other = "the book's (in, out)" if torch_now else "torch's (out, in)"
        setting = "'book'" if torch_now else "'torch'"
        variants.append(("matches with the weight matrices transposed: they were probably "
                         f"pasted in {other} layout (set layout = {setting})",
                         {"_transposed": True}))
    parts = p.entries
    # A one-digit answer matches too many variants to single one out, unless a
    # variant gives it exactly.
    coarse = all(part.kind == "decimal" and part.significant_digits < 2 for part in parts)
    from .screening import may_hold

    for text, changes in variants:
        if name == "score" and "_transposed" not in changes:
            continue
        if not may_hold(ex, claim, p, changes):  # Arb proves the variant cannot give it
            continue
        try:
            alt = ex.attention(claim.batch - 1, **changes)
            value = quantity_value(ex, claim, alt)
            if holds(value, p, claim.rtol, exactly=coarse):
                return text
        except MhaSymbolicError:
            continue
    return None


def _square_weights(ex: WorkedExample, which: str = "qkvo") -> bool:
    """Whether the example gives square projection weights (a transposition that still
    multiplies: the slip nothing else would reveal)."""
    keys = [f"w_{c}" for c in which]
    given = [ex.inputs[k] for k in keys if k in ex.inputs]
    if not given or "x" not in ex.inputs:
        return False
    from .inputs import shape_of

    return all(len(shape_of(w)) == 2 and len(w) == len(w[0]) for w in given)


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
    """A miscounted ``params.total``: the biases counted or left out (which ones), W^O
    left out, one head's projections, GQA counted as MHA (kv_heads ignored)."""
    name, sub, _ = parse_quantity(claim.quantity)
    if name != "params" or sub != "total" or p.kind not in ("decimal", "expression"):
        return None
    import dataclasses
    import itertools

    from ..exact.params import parameter_count

    spec = ex.spec
    claimed = p.value if p.kind == "decimal" else p.expr
    pc = parameter_count(spec)
    wo = dict((n, c) for n, _, c in pc.parts)["W^O"]
    have = spec.bias_parts
    candidates: dict[str, Any] = {}
    if spec.kv_heads != spec.heads:
        mha = dataclasses.replace(spec, kv_heads=spec.heads)
        candidates[f"counts K and V for all {spec.heads} heads: kv_heads={spec.kv_heads} ignored "
                   "(GQA counted as MHA)"] = parameter_count(mha).total
    for flags in itertools.product((False, True), repeat=4):
        parts = dict(zip(("q", "k", "v", "o"), flags, strict=True))
        if parts == have:
            continue
        alt = dataclasses.replace(spec, bias=flags)
        candidates[_bias_text(parts, have)] = parameter_count(alt).total
    candidates["leaves W^O out (counts only W^Q, W^K, W^V)"] = pc.total - wo
    candidates["counts one head's projections instead of all heads"] = (
        spec.d_model * spec.d_k * 3 + wo)
    for text, value in candidates.items():
        if value == claimed:
            return text
    return None


def _bias_text(counted: dict[str, bool], have: dict[str, bool]) -> str:
    """'counts the biases too' / 'counts biases on q, k, v (the example has a bias on o only)'."""
    def names(flags: dict[str, bool]) -> list[str]:
        return [k for k, v in flags.items() if v]

    if all(counted.values()) and not any(have.values()):
        return "counts the biases too"
    if not any(counted.values()) and all(have.values()):
        return "leaves the biases out"
    c, h = names(counted), names(have)
    said = f"counts biases on {', '.join(c)}" if c else "counts no biases"
    has = (f"a bias on {', '.join(h)} only" if h and len(h) < 4 else "biases on q, k, v, o"
           if h else "no biases")
    return f"{said} (the example has {has})"


def index_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    """The claim matches the entry one further along each index: the text counts from 0."""
    import dataclasses

    name, _, idx = parse_quantity(claim.quantity)
    if not idx or name not in MATRIX_QUANTITIES or p.kind == "array":
        return None
    shifted = f"{name}[{','.join(str(i + 1) for i in idx)}]"
    try:
        value = quantity_value(ex, dataclasses.replace(claim, quantity=shifted))
        if holds(value, p, claim.rtol):
            zero = f"{name}[{','.join(str(i - 1) for i in idx)}]"
            return (f"matches {shifted}: 0-based? (the text's {claim.quantity} counts from 0; "
                    f"1-based it is {shifted}, and {zero} in 0-based terms)")
    except MhaSymbolicError:
        return None
    return None
