"""More diagnoses of wrong claims (issue 25), each stated only once it is proved:

* **a scale by another constant**: the claim is what scale 1/√m gives for a nearby
  size m (d_model for d_k, 2·d_k, d_k/2, d_v, n_k), the constant named;
* **weights masked after the softmax** without renormalising (the masked keys' weights
  set to 0, the others left as the unmasked softmax gave them), and their blend;
* **heads concatenated out of order** (a permutation of the heads' blocks, through W^O);
* **a bias counted once** instead of once per projection (``params.total``);
* **float32 round-off**: the printed last digit is what a float32 computation gives
  (numpy float32, max-subtracted softmax as torch computes it), where the exact value
  lies within float32's error of a rounding boundary.  The float32 value is exact (a
  binary number), so the statement "a float32 computation gives this digit" is proved;
  it is only made when the claim is one unit of the last digit from the correct answer.

Each diagnosis judges the slip's value with :func:`verdicts.holds` (certified)."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..errors import MhaSymbolicError
from .claims import PrintedAnswer
from .quantities import parse_quantity, quantity_value
from .verdicts import describe, holds, special_value

if TYPE_CHECKING:
    from .examples import Claim, WorkedExample

__all__ = [
    "bias_once_diagnosis",
    "float32_diagnosis",
    "heads_order_diagnosis",
    "mask_after_softmax_diagnosis",
    "scale_constant_diagnosis",
    "together",
]

#: Most head permutations tried (4 heads: 23 orders besides the right one).
MAX_PERMUTATIONS = 24


def _pick(matrix: Any, idx: tuple[int, ...]) -> Any:
    """A claim's value from a matrix: one entry, a row (tuple) or the whole (tuple of rows)."""
    if len(idx) == 2:
        return matrix[idx[0] - 1, idx[1] - 1]
    if len(idx) == 1:
        return tuple(matrix[idx[0] - 1, c] for c in range(matrix.cols))
    return tuple(tuple(matrix[r, c] for c in range(matrix.cols)) for r in range(matrix.rows))


def _coarse(p: PrintedAnswer) -> bool:
    return all(part.kind == "decimal" and part.significant_digits < 2 for part in p.entries)


def scale_constant_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    """The claim is what 1/√m gives, m another size of the example (named)."""
    name, _, _ = parse_quantity(claim.quantity)
    if name not in ("scaled_score", "weight", "head_output", "concat", "output", "weight_sum"):
        return None
    if ex.options.get("scale") is not None or not 0 < claim.batch <= ex.batch_size:
        return None
    att = ex.attention(claim.batch - 1)
    d_k = att.spec.d_k if att is not None else None
    if not isinstance(d_k, int) or _coarse(p):
        return None
    import sympy as sp

    from .screening import may_hold

    spec = ex.spec
    named: dict[int, str] = {}
    for m, why in ((spec.d_model, "d_model"), (2 * d_k, "2·d_k"), (d_k // 2 if d_k % 2 == 0
                   else None, "d_k/2"), (spec.d_v, "d_v"), (att.spec.n_k, "n_k"),
                   (d_k * d_k, "d_k²")):
        if isinstance(m, int) and m > 0 and m not in (d_k, 1) and m not in named:
            named[m] = why
    if named.get(d_k * d_k) not in (None, "d_model"):
        # 1/√(d_k²) = 1/d_k: "scaled by 1/d_k" says it; only d_model (the other common
        # slip) is named beside it, as indistinguishable
        del named[d_k * d_k]
    found = []
    for m, why in named.items():
        changes = {"scale": 1 / sp.sqrt(m)}
        if not may_hold(ex, claim, p, changes):
            continue
        try:
            value = quantity_value(ex, claim, ex.attention(claim.batch - 1, **changes))
        except MhaSymbolicError:
            continue
        if holds(value, p, claim.rtol):
            found.append(f"scaled by 1/√{m} (√{why}) instead of 1/√{d_k} (√d_k)")
    return together(found)


def together(found: list[str]) -> str | None:
    """One slip, or several that give the same printed answer, said together."""
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    return "indistinguishable here, each gives the printed answer: " + "; or ".join(found)


def mask_after_softmax_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer
                                 ) -> str | None:
    """The weights of the unmasked softmax with the masked keys' weights set to 0 (not
    renormalised), and head outputs blended from them."""
    name, _, idx = parse_quantity(claim.quantity)
    if name not in ("weight", "head_output", "weight_sum") or not 0 < claim.batch <= ex.batch_size:
        return None
    att = ex.attention(claim.batch - 1)
    if att is None:
        return None
    import sympy as sp

    from .intermediates import keep_matrix, masked_after_softmax

    head = att.heads[claim.head - 1]
    keep = keep_matrix(head)
    if all(all(row) for row in keep):
        return None
    try:
        w = masked_after_softmax(ex, claim.batch - 1, claim.head - 1, keep)
    except MhaSymbolicError:
        return None
    if name == "weight_sum":
        value: Any = sp.Add(*[w[idx[0] - 1, c] for c in range(w.cols)])
    elif name == "weight":
        value = _pick(w, idx)
    else:
        v = head.v
        if v is None:
            return None
        value = _pick(w * v, idx)
    if holds(value, p, claim.rtol, exactly=_coarse(p)):
        return ("mask applied after the softmax: the masked keys' weights were set to 0 "
                "without renormalising the row")
    return None


def heads_order_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    """The heads' outputs concatenated in another order (then W^O, b_o as given)."""
    name, _, idx = parse_quantity(claim.quantity)
    if name not in ("concat", "output") or not 0 < claim.batch <= ex.batch_size:
        return None
    att = ex.attention(claim.batch - 1)
    if att is None or len(att.heads) < 2 or any(h.output is None for h in att.heads):
        return None
    if att.spec.kv_heads != att.spec.heads and att.spec.kv_heads is not None:
        return None
    import sympy as sp

    wo = bo = None
    if name == "output" and att.output is not None:
        from ..exact.engine import exact_matrix

        given = ex.engine_inputs()[claim.batch - 1]
        wo = exact_matrix(given["w_o"], "w_o")
        if given.get("b_o") is not None:
            bo = exact_matrix(given["b_o"], "b_o")
    n = len(att.heads)
    for k, order in enumerate(itertools.permutations(range(n))):
        if k > MAX_PERMUTATIONS:
            break
        if list(order) == list(range(n)):
            continue
        concat = sp.Matrix.hstack(*(att.heads[i].output for i in order))
        out = concat
        if wo is not None:
            out = concat * wo
            if bo is not None:
                out = out + sp.Matrix.vstack(*([bo.reshape(1, wo.cols)] * out.rows))
        if holds(_pick(out, idx), p, claim.rtol, exactly=_coarse(p)):
            said = ", ".join(f"head {i + 1}" for i in order)
            return f"heads concatenated out of order: the printed answer is what ({said}) gives"
    return None


def bias_once_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    """``params.total`` with one bias vector of d_model entries in place of one per
    biased projection."""
    name, sub, _ = parse_quantity(claim.quantity)
    if name != "params" or sub != "total" or p.kind != "decimal" or p.value is None:
        return None
    from ..exact.params import parameter_count

    spec = ex.spec
    if not isinstance(spec.d_model, int):
        return None
    pc = parameter_count(spec)
    biased = [k for k, v in spec.bias_parts.items() if v]
    if len(biased) < 2:
        return None
    if p.value == pc.weights + spec.d_model:
        return (f"a bias counted once ({spec.d_model} entries) instead of once per projection "
                f"({', '.join(biased)})")
    return None


def float32_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer, value: Any) -> str | None:
    """The claim's wrong last digit is what a float32 computation gives."""
    name, _, idx = parse_quantity(claim.quantity)
    if name not in ("q", "k", "v", "score", "scaled_score", "weight", "head_output", "concat",
                    "output") or len(idx) != 2 or p.kind != "decimal" or p.unit is None:
        return None
    if p.value is None or not 0 < claim.batch <= ex.batch_size or special_value(value):
        return None
    from ..exact.certified import certify
    from .claims import _places

    places = _places(p.unit)
    cv = certify(value)
    correct = cv.round_places(places)
    if abs(correct - p.value) != p.unit:
        return None
    got = _float32_entry(ex, claim, name, idx)
    if got is None:
        return None
    f32 = Fraction(got)
    import sympy as sp

    if certify(sp.Rational(f32.numerator, f32.denominator)).round_places(places) != p.value:
        return None
    return (f"float32 round-off: a float32 computation gives {got!r}, which prints as "
            f"{p.text.strip()}; the exact value {describe(value, places + 4)[0]} is within float32's "
            "error of the rounding boundary")


_SIMPLE = {"layout", "qkv_layout", "inputs", "heads", "d_k", "mask", "masked", "valid_lens",
           "causal_alignment", "masked_rows"}


def _float32_entry(ex: WorkedExample, claim: Claim, name: str, idx: tuple[int, ...]) -> float | None:
    """The entry computed in float32 (numpy), or None for options it does not emulate."""
    import numpy as np

    if set(ex.options) - _SIMPLE:
        return None
    att = ex.attention(claim.batch - 1)
    if att is None or att.spec.kv_heads not in (None, att.spec.heads):
        return None
    h = claim.head - 1
    head = att.heads[h]

    def f32(m: Any) -> Any:
        try:
            return np.array([[float(m[r, c]) for c in range(m.cols)] for r in range(m.rows)],
                            dtype=np.float32)
        except (TypeError, ValueError):
            return None

    given = ex.engine_inputs()[claim.batch - 1]
    from ..exact.engine import exact_matrix

    def proj(xname: str, wname: str, bname: str) -> Any:
        x = f32(exact_matrix(given[xname], xname))
        w = f32(exact_matrix(given[wname], wname))
        if x is None or w is None:
            return None
        y = np.matmul(x, w)
        if given.get(bname) is not None:
            b = f32(exact_matrix(given[bname], bname).reshape(1, w.shape[1]))
            y = (y + b).astype(np.float32)
        return y

    d_k = head.q.cols if head.q is not None else None
    if "x" in given and given.get("w_q") is not None:
        xkv = "x_kv" if given.get("x_kv") is not None else "x"
        q_all, k_all = proj("x", "w_q", "b_q"), proj(xkv, "w_k", "b_k")
        v_all = proj(xkv, "w_v", "b_v") if given.get("w_v") is not None else None
    elif given.get("query") is not None:
        q_all, k_all = f32(exact_matrix(given["query"], "query")), f32(exact_matrix(given["key"], "key"))
        v_all = f32(exact_matrix(given["value"], "value")) if given.get("value") is not None else None
    else:
        return None
    if q_all is None or k_all is None or d_k is None:
        return None
    sl = slice(h * d_k, (h + 1) * d_k)
    q, k = q_all[:, sl], k_all[:, sl]
    if name in ("q", "k", "v"):
        mat = {"q": q, "k": k, "v": v_all[:, h * head.v.cols:(h + 1) * head.v.cols]
               if v_all is not None and head.v is not None else None}[name]
    else:
        s = np.matmul(q, k.T).astype(np.float32)
        if name == "score":
            mat = s
        else:
            scale = np.float32(float(att.scale))
            t = (s * scale).astype(np.float32)
            import sympy as sp

            keep = np.array([[head.scaled[r, c] != -sp.oo for c in range(head.scaled.cols)]
                             for r in range(head.scaled.rows)])
            t = np.where(keep, t, np.float32(-np.inf)).astype(np.float32)
            if name == "scaled_score":
                mat = t
            else:
                with np.errstate(invalid="ignore"):
                    e = np.exp((t - t.max(axis=1, keepdims=True)).astype(np.float32))
                    w = (e / e.sum(axis=1, keepdims=True, dtype=np.float32)).astype(np.float32)
                if name == "weight":
                    mat = w
                elif name == "head_output" and v_all is not None and head.v is not None:
                    dv = head.v.cols
                    mat = np.matmul(w, v_all[:, h * dv:(h + 1) * dv]).astype(np.float32)
                else:
                    return None
    if mat is None:
        return None
    r, c = idx[0] - 1, idx[1] - 1
    if not (0 <= r < mat.shape[0] and 0 <= c < mat.shape[1]):
        return None
    got = float(mat[r, c])
    return got if np.isfinite(got) else None


def row_sum_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    """Weights printed so that each row sums to 1: every wrong entry is within one unit
    of its last digit from the exact weight, every printed row sums to exactly 1, and the
    correct roundings of some row do not (the text nudged an entry to make the row add
    up)."""
    name, _, idx = parse_quantity(claim.quantity)
    if name != "weight" or len(idx) == 2 or p.kind not in ("tuple", "array"):
        return None
    if not 0 < claim.batch <= ex.batch_size:
        return None
    att = ex.attention(claim.batch - 1)
    if att is None:
        return None
    w = att.heads[claim.head - 1].weights
    rows = [idx[0] - 1] if idx else list(range(w.rows))
    parts = p.entries
    if len(parts) != len(rows) * w.cols or any(
            q.kind != "decimal" or q.value is None or q.unit is None for q in parts):
        return None
    from ..exact.certified import certify
    from .claims import _places

    nudged = False
    for k, r in enumerate(rows):
        row = parts[k * w.cols:(k + 1) * w.cols]
        if sum((q.value for q in row if q.value is not None), Fraction(0)) != 1:
            return None
        rounded = Fraction(0)
        for c, q in enumerate(row):
            assert q.unit is not None and q.value is not None
            cv = certify(w[r, c])
            rounded += cv.round_places(_places(q.unit))
            lo, hi = q.value - q.unit, q.value + q.unit
            if not (cv.compare(lo) > 0 and cv.compare(hi) < 0):
                return None  # an entry further than one unit: not a nudge
        nudged = nudged or rounded != 1
    if not nudged:
        return None
    return ("rounded so that each row sums to 1: every printed weight is within one unit of "
            "its last digit, and the correct roundings of the row do not sum to 1")

