"""Diagnoses of wrong claims: each slip (premature rounding, truncation, a wrong
scale, softmax over the wrong axis, a miscounted parameter) is stated only after
it provably reproduces the printed answer."""

from __future__ import annotations

from collections.abc import Callable
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
            elif len(idx) == 1 and p.kind in ("tuple", "array") and (
                    len(p.shape) <= 1 or p.shape[0] == 1):
                for c, part in enumerate(p.parts):
                    if part.kind == "decimal" and part.value is not None:
                        printed.setdefault((b, h, idx[0] - 1, c), []).append(
                            (k, _Printed(part.value, part.text)))
            elif not idx and p.kind == "array" and len(p.shape) == 2:  # the whole matrix
                cols = p.shape[1]
                for n, part in enumerate(p.parts):
                    if part.kind == "decimal" and part.value is not None:
                        printed.setdefault((b, h, n // cols, n % cols), []).append(
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
        found = self.where(key)
        return found[1] if found else default

    def where(self, key: tuple[int, int, int]) -> tuple[int, Any] | None:
        """(the claim's index, the printed weight) of the latest printing, or None."""
        import bisect

        seen = self.printed.get((self.batch, *key), [])
        k = bisect.bisect_left(seen, self.upto, key=lambda item: item[0])
        return seen[k - 1] if k else None


class _Printed(Fraction):
    """A Fraction that remembers how it was printed ("0.0900", not "0.09")."""

    text: str

    def __new__(cls, value: Fraction, text: str) -> _Printed:
        self = super().__new__(cls, value)
        self.text = text.strip().lstrip("≈~= ").strip()
        return self


def premature(ex: WorkedExample, index: int, claim: Claim, p: PrintedAnswer,
              upstream: Callable[[int], str | None] | None = None) -> str | None:
    """Does the claim equal the computation redone with earlier printed weights?

    Every claim form is tried: one entry, a row (tuple, list or tensor), a whole matrix;
    head outputs, the concatenation and the block output (through W^O and b_o).  When
    the printed weights it uses are correct roundings, the slip is *premature rounding*;
    when some are themselves wrong, the slip is upstream: the diagnosis says the claim
    follows from those printed weights and names their root (``upstream(k)``: the
    diagnosis of claim k, or None)."""
    name, _, idx = parse_quantity(claim.quantity)
    if name not in ("head_output", "weight", "weight_sum", "output", "concat", "weighted_value"):
        return None
    if not 0 < claim.batch <= ex.batch_size or (not idx and name in ("weight", "weight_sum")):
        return None
    if name == "weighted_value" and len(idx) != 2:
        return None
    att = ex.attention(claim.batch - 1)
    if att is None:
        return None
    parts = p.entries
    if any(part.kind != "decimal" or part.value is None or part.unit is None for part in parts):
        return None
    h = claim.head - 1
    weights = _claimed_weights(ex, index, claim.batch)
    used: dict[tuple[int, int, int], tuple[int, Any]] = {}
    n_q, n_k = att.heads[h].weights.rows, att.heads[h].weights.cols

    def printed_row(hh: int, r: int) -> list[Fraction] | None:
        exact_row = att.heads[hh].weights.row(r)
        out: list[Fraction] = []
        for j in range(n_k):
            found = weights.where((hh, r, j))
            if found is None:
                if exact_row[j] != 0:
                    return None
                out.append(Fraction(0))
            else:
                used[(hh, r, j)] = found
                out.append(found[1])
        return out

    rows = [idx[0] - 1] if idx else list(range(n_q))
    candidates: list[Fraction] = []
    if name == "weight" and len(idx) == 2:
        # the complement: w_rc = 1 - (sum of the other printed weights of the row)
        others = []
        for j in range(n_k):
            if j != idx[1] - 1:
                found = weights.where((h, rows[0], j))
                if found is None:
                    return None
                used[(h, rows[0], j)] = found
                others.append(found[1])
        if not others:
            return None
        candidates = [1 - sum(others)]
        how = "1 − (the other printed weights of the row)"
    elif name == "weight":
        return None  # a row of weights is not computed from other printed weights
    elif name == "weighted_value":  # w_ij · v_j from the printed w_ij
        i, j = idx[0] - 1, idx[1] - 1
        found = weights.where((h, i, j))
        v = att.heads[h].v
        if found is None or v is None or not all(v[j, c].is_Rational for c in range(v.cols)):
            return None
        used[(h, i, j)] = found
        candidates = [found[1] * Fraction(int(v[j, c].p), int(v[j, c].q)) for c in range(v.cols)]
        how = _printed_list(used)
    elif name == "weight_sum":
        row = printed_row(h, rows[0])
        if row is None:
            return None
        candidates = [sum(row, Fraction(0))]
        how = _printed_list(used)
    else:
        block = _blend(ex, att, claim, name, rows, printed_row)
        if block is None:
            return None
        cols = [idx[1] - 1] if len(idx) == 2 else None
        candidates = [x for row_values in block for c, x in enumerate(row_values)
                      if cols is None or c in cols]
        how = _printed_list(used)
    if len(parts) != len(candidates):
        return None
    import sympy as sp

    from ..exact.certified import certify
    from .claims import _places

    for part, cand in zip(parts, candidates, strict=True):
        cv = certify(sp.Rational(cand.numerator, cand.denominator))
        assert part.unit is not None
        if cv.round_places(_places(part.unit)) != part.value:
            return None
    exact = all(part.value == cand for part, cand in zip(parts, candidates, strict=True))
    wrong = _wrong_printings(ex, att, used)
    if wrong:
        k = min(wrong)
        source = ex.claims[k]
        root = upstream(k) if upstream is not None else None
        where = f"{source.quantity}" + (f" at line {source.line}" if source.line else "")
        return ("follows from wrong printed weights: the printed answer is "
                + ("exactly " if exact else "")
                + f"what {how.replace('the rounded weights', 'the weights')} give, and those weights are "
                f"wrong ({where}" + (f": {root}" if root else ", not diagnosed")
                + "); the slip is upstream")
    return ("premature rounding: the printed answer is " + ("exactly " if exact else "")
            + f"what {how} give; computed from exact weights it differs")


def _printed_list(used: dict[tuple[int, int, int], tuple[int, Any]]) -> str:
    texts = [w.text if isinstance(w, _Printed) else decimal_text(w) for _, w in used.values()]
    shown = ", ".join(texts[:8]) + (f", … ({len(texts)} weights)" if len(texts) > 8 else "")
    return f"the rounded weights printed earlier ({shown})"


def _blend(ex: WorkedExample, att: Any, claim: Claim, name: str, rows: list[int],
           printed_row: Callable[[int, int], list[Fraction] | None]) -> list[list[Fraction]] | None:
    """Rows of head outputs (``head_output``), of the concatenation or of the block output
    computed exactly from printed weights (None when some weight or value is missing or
    not rational)."""
    heads = [claim.head - 1] if name == "head_output" else list(range(len(att.heads)))
    out: list[list[Fraction]] = []
    for r in rows:
        row: list[Fraction] = []
        for hh in heads:
            v = att.heads[hh].v
            w = printed_row(hh, r)
            if v is None or w is None:
                return None
            for c in range(v.cols):
                total = Fraction(0)
                for j, wj in enumerate(w):
                    vj = v[j, c]
                    if not vj.is_Rational:
                        return None
                    total += wj * Fraction(int(vj.p), int(vj.q))
                row.append(total)
        out.append(row)
    if name == "output" and att.output is not None:
        from ..exact.engine import exact_matrix

        given = ex.engine_inputs()[claim.batch - 1]
        wo = exact_matrix(given["w_o"], "w_o")
        bo = exact_matrix(given["b_o"], "b_o") if given.get("b_o") is not None else None
        if not all(e.is_Rational for e in wo) or (bo is not None and not all(
                e.is_Rational for e in bo)):
            return None

        def q(e: Any) -> Fraction:
            return Fraction(int(e.p), int(e.q))

        out = [[sum((row[i] * q(wo[i, c]) for i in range(wo.rows)), Fraction(0))
                + (q(bo[c]) if bo is not None else 0) for c in range(wo.cols)] for row in out]
    return out


def _wrong_printings(ex: WorkedExample, att: Any,
                     used: dict[tuple[int, int, int], tuple[int, Any]]) -> list[int]:
    """The claims whose printed weights (among ``used``) are not roundings of the exact
    weights."""
    bad = []
    for (hh, r, j), (k, w) in used.items():
        text = w.text if isinstance(w, _Printed) else decimal_text(w)
        try:
            ok = holds(att.heads[hh].weights[r, j], parse_printed(text), Fraction(1, 10**6))
        except MhaSymbolicError:
            ok = False
        if not ok:
            bad.append(k)
    return bad


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

    found: list[str] = []
    for text, changes in variants:
        if name == "score" and "_transposed" not in changes:
            continue
        if not may_hold(ex, claim, p, changes):  # Arb proves the variant cannot give it
            continue
        try:
            alt = ex.attention(claim.batch - 1, **changes)
            value = quantity_value(ex, claim, alt)
            if holds(value, p, claim.rtol, exactly=coarse):
                found.append(text)  # every variant that gives it: they are said together
        except MhaSymbolicError:
            continue
    return "; or ".join(found) if found else None


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


#: The loosest relative error an approximation formula is diagnosed as "a looser
#: approximation" at (farther off, it is not an approximation of this value).
LOOSE_RTOL = Fraction(1, 100)


def approximation_diagnosis(value: Any, p: PrintedAnswer, rtol: Fraction) -> str | None:
    """A formula claimed ``≈`` whose certified relative error exceeds the claim's rtol
    but is below :data:`LOOSE_RTOL`: the text's approximation is looser than the
    tolerance it is judged at (the rtol it would hold at is named: the power of ten above
    the error, certified)."""
    if p.kind != "expression" or not p.approx or p.expr is None or special_value(value):
        return None
    import sympy as sp

    from ..exact.certified import certify

    v = certify(value)
    if v.sign() == 0:
        return None
    # |value − claim| / |value|, the signs decided first (as verdicts._approximation does)
    d = certify(value - p.expr).sign()
    if d == 0:
        return None
    num = sp.Mul(sp.Integer(d * v.sign()), sp.Add(value, -p.expr, evaluate=False),
                 evaluate=False)
    rel = certify(sp.Mul(num, sp.Pow(value, -1, evaluate=False), evaluate=False))
    if rel.compare(rtol) <= 0 or rel.compare(LOOSE_RTOL) >= 0:
        return None
    bound = Fraction(1, 10)
    while rel.compare(bound / 10) < 0:
        bound /= 10
    size = rel.round_significant(2)
    return (f"a looser approximation than the claim's tolerance: the formula is within a "
            f"relative {float(size):.2g} of the value, past rtol = {float(rtol):.2g} (it holds "
            f"as an approximation with rtol = {float(bound):.0e})")


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
