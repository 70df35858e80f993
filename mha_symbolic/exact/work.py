"""The cost model of the exact engine: the work of a computation estimated from its
inputs' sizes, entries and magnitudes before SymPy is asked anything
(:func:`attention_work`, checked against :data:`MAX_WORK`).

The constants are calibrated in bench/RESULTS.md (issues 11 and 15).
"""

from __future__ import annotations

from typing import Any

from .._text import int_text
from ..errors import SpecError
from .entries import exact_number

__all__ = ["MAX_ABS_SCORE", "MAX_SCORE_ENTRIES", "MAX_WORK", "SHIFT_THRESHOLD",
           "attention_work", "magnitude_factor", "work_total"]

#: Largest number of score entries (heads · n_q · n_k) the symbolic engine builds.
MAX_SCORE_ENTRIES = 4096
#: Largest number of exact term operations (see :func:`attention_work`) for one
#: computation: about a few seconds of SymPy arithmetic.
MAX_WORK = 340_000
#: The work of an example with irrational entries (sqrt(2), e^x, ln 3) counts this many
#: times: calibrated in bench/RESULTS.md (issue 15) on the slowest derivations.
IRRATIONAL_COST = 4
#: The W^O stage counts this many times its terms: SymPy multiplies every A·V entry (a
#: quotient over its row's denominator) by an entry of W^O and flattens h·d_v such
#: products into each output entry, and a derivation prints Concat and Output both
#: (calibrated in bench/RESULTS.md, issue 11 item 7).
W_O_COST = 2
#: Scores of large magnitude cost more per term: SymPy's assumptions evaluate sums of
#: e^(t) whose terms span e^(±|t|) numerically, and certified digits of a weight as small
#: as e^(−2|t|) need integers of about 2.9·|t| bits.  The work is multiplied by
#: :func:`magnitude_factor` of B, the example's largest |scale · score| (computed in
#: float64 from its entries): 1 + B/MAGNITUDE_UNIT.  Calibrated in bench/RESULTS.md
#: (issue 11 item 7): at the same shape, `derive` costs 1.1–1.5× more with B ≈ 100,
#: 2.5–3× with B ≈ 900, 7–19× with B ≈ 10^4 and 19–24× with B ≈ 4·10^4 than with B ≈ 10;
#: the factor is above all of these, and the slowest examples the limit admits (entries
#: of ±10…±30, B of a few hundred) set the unit.
MAGNITUDE_UNIT = 150
#: Largest |scaled score| the symbolic engine exponentiates. SymPy rewrites
#: exp(k·log 2) as the integer 2^k, so an unbounded score could make it build an
#: integer of astronomically many digits; e^(10^5) ≈ 10^43429 is far beyond any
#: worked example (the numeric oracle, reference_attention, has no such limit).
MAX_ABS_SCORE = 10**5
#: A row whose scaled scores reach this magnitude is exponentiated after subtracting its
#: largest score (softmax is invariant under the shift), so that masked keys become
#: e^(−huge) next to e^0 rather than e^(−huge) over e^(−huge).
SHIFT_THRESHOLD = 1000


def _dims(m: Any) -> tuple[int, int] | None:
    """(rows, columns) of a matrix input as given (nested lists, arrays, SymPy), without
    reading its entries; a flat list is one row.  None when absent or not a matrix."""
    if m is None:
        return None
    shape = getattr(m, "shape", None)
    if shape is not None:
        shape = tuple(int(n) for n in shape)
        if len(shape) == 1:
            return (1, shape[0])
        return (shape[-2], shape[-1]) if len(shape) >= 2 else None
    if (type(m).__module__ or "").startswith("mpmath") and hasattr(m, "cols"):
        return (int(m.rows), int(m.cols))     # an mpmath.matrix
    if isinstance(m, (list, tuple)) and m:
        first = m[0]
        if isinstance(first, (list, tuple)):
            return (len(m), len(first))
        return (1, len(m))
    return None


def attention_work(*, scores: Any = None, query: Any = None, key: Any = None, value: Any = None,
                   x: Any = None, x_kv: Any = None, w_q: Any = None, w_k: Any = None,
                   w_v: Any = None, w_o: Any = None, heads: int = 1, kv_heads: int | None = None,
                   softmax_over: str = "keys", sinks: Any = None,
                   terms: dict[str, int] | None = None, **_: Any) -> dict[str, int]:
    """The size of the exact computation, stage by stage, counted from the input
    shapes (and ``terms``) before any arithmetic is done: the number of terms SymPy
    builds, or that a consumer walking each entry's tree on its own (printing, the
    derivation's certified digits of every weight, ``free_symbols``) visits, whichever
    is larger.  Certified evaluation of one entry is memoized; such walks are not.

    ``terms[name]`` is 0 for a matrix of rationals (a product of rationals is one
    rational: 1 term) and otherwise the largest number of terms of its entries.  A
    product of an m × k matrix whose entries have a terms by a k × n one with b-term
    entries builds m·n entries of k·a·b terms (1 if both are rational).

    The softmax over keys builds each row's denominator D = Σ_k e^(t_k) once (n_k
    score-sized terms, one more with a sink) and a weight is e^(t_j)·D^(−1): walked on
    its own it has n_k times a score's terms.  An entry of A·V is written over that
    common denominator, (Σ_j e^(t_j) v_j)/D: n_k·t_s·t_v terms above, n_k·t_s below —
    not n_k weights of n_k terms each.  W^O sums h·d_v entries of A·V (counted
    W_O_COST times).  The softmax
    over *queries* (a slip the checker recognises) shares nothing: a weight has its
    column's n_q terms, and an entry of A·V sums n_k such weights, each with its own
    denominator.  A fully masked row is zero (or NaN) and costs less than this count.
    Without ``terms`` every input counts as rational: a lower bound, cheap enough to
    check before parsing anything.

    >>> w = attention_work(query=[[1, 0]] * 8, key=[[1, 0]] * 8, value=[[1]] * 8)
    >>> w["softmax"], w["A·V"]  # 64 weights of 8 terms; 8 entries of 8 + 8 terms
    (512, 128)
    >>> attention_work(query=[[1, 0]] * 8, key=[[1, 0]] * 8, value=[[1]] * 8,
    ...                softmax_over="queries")["A·V"]  # 8 entries of 8 weights of 8 terms
    512
    """
    t = terms or {}
    h = heads if isinstance(heads, int) and heads > 0 else 1
    kv = kv_heads if isinstance(kv_heads, int) and kv_heads > 0 else h

    def product(k: int, a: int, b: int) -> int:
        """Terms of an entry of a product with inner size k (0: rational)."""
        return 0 if a == 0 and b == 0 else k * max(a, 1) * max(b, 1)

    work = {"projections": 0, "scores": 0, "softmax": 0, "A·V": 0, "W^O": 0}
    if x is not None:
        n_q, d_model = _dims(x) or (0, 0)
        n_k, kdim = _dims(x_kv) or (n_q, d_model)
        q_width = (_dims(w_q) or (0, 0))[1]
        k_width = (_dims(w_k) or (0, 0))[1]
        v_width = (_dims(w_v) or (0, 0))[1]
        t_x, t_kv = t.get("x", 0), t.get("x_kv", t.get("x", 0))
        t_q = product(d_model, t_x, t.get("w_q", 0))
        t_k = product(kdim, t_kv, t.get("w_k", 0))
        t_v = product(kdim, t_kv, t.get("w_v", 0))
        work["projections"] = (n_q * q_width * max(t_q, 1) + n_k * k_width * max(t_k, 1)
                               + n_k * v_width * max(t_v, 1))
    elif query is not None or key is not None:
        n_q, q_width = _dims(query) or (0, 0)
        n_k = (_dims(key) or (0, 0))[0]
        v_width = (_dims(value) or (0, 0))[1]
        t_q, t_k, t_v = t.get("query", 0), t.get("key", 0), t.get("value", 0)
    else:
        first = scores[0] if h > 1 and isinstance(scores, (list, tuple)) and scores else scores
        n_q, n_k = _dims(first) or (0, 0)
        q_width = t_q = t_k = 0
        v_width = (_dims(value) or (0, 0))[1]
        t_v = t.get("value", 0)
    work["entries"] = h * n_q * n_k  # not a stage: the score-entry limit checks it first
    d_k = q_width // h if h else 0
    t_s = max(product(d_k, t_q, t_k) if q_width else t.get("scores", 0), 1)
    t_v = max(t_v, 1)
    work["scores"] = h * n_q * n_k * t_s
    hd_v = v_width * h // kv  # every query head reads its key/value head's d_v columns
    if softmax_over == "queries":
        weight = n_q * t_s  # e^(t_rj) / Σ_r' e^(t_r'j): a column's denominator each
        entry = n_k * weight * t_v  # Σ_j w[r,j] v[j,c]: n_k weights, nothing shared
        work["softmax"] = h * n_q * n_k * weight
    else:
        denom = (n_k + (sinks is not None)) * t_s  # D = Σ_k e^(t_k) (+ e^σ)
        weight = denom  # e^(t_j) · D^(−1), walked with its denominator
        entry = n_k * t_s * t_v + denom  # (Σ_j e^(t_j) v_j) / D
        # with sinks, each row's sink weight e^σ / D is one more entry of D's size
        work["softmax"] = h * n_q * (n_k + (sinks is not None)) * weight
    work["A·V"] = n_q * hd_v * entry
    if w_o is not None:
        d_out = (_dims(w_o) or (0, 0))[1]
        work["W^O"] = W_O_COST * n_q * d_out * hd_v * entry * max(t.get("w_o", 0), 1)
    return work


def magnitude_factor(magnitude: float) -> float:
    """How much dearer a term is when the scaled scores reach ±``magnitude``.

    >>> magnitude_factor(0.0), magnitude_factor(900.0)
    (1.0, 7.0)
    """
    return 1.0 + magnitude / MAGNITUDE_UNIT


def work_total(work: dict[str, int], terms: dict[str, int] | None = None,
               magnitude: float = 0.0) -> int:
    """The number compared with MAX_WORK: the stages of :func:`attention_work` added up,
    times IRRATIONAL_COST when some input entry is irrational, times
    :func:`magnitude_factor` (``magnitude``: the largest |scale · score|, see
    :func:`_score_bound`).

    >>> work_total({"scores": 100, "softmax": 1000}, {"query": 1}, magnitude=900.0)
    30800
    """
    total = sum(v for k, v in work.items() if k != "entries")
    # a term of an irrational entry costs more than a rational product (which collapses
    # into one number): its exponentials are evaluated, printed and compared in Arb
    if terms and any(terms.values()):
        total *= IRRATIONAL_COST
    return int(total * magnitude_factor(magnitude))


def _check_work(kwargs: dict[str, Any], terms: dict[str, int] | None = None,
                magnitude: float = 0.0) -> int:
    """Refuse a computation beyond the limits (one line, SpecError); else its work."""
    work = attention_work(**kwargs, terms=terms)
    entries = work.pop("entries")
    if entries > MAX_SCORE_ENTRIES:
        raise SpecError(
            f"heads·n_q·n_k = {int_text(entries)} score entries exceeds {MAX_SCORE_ENTRIES} "
            "entries: "
            "too large to build symbolically; use reference_attention for numeric inputs"
        )
    total = work_total(work, terms, magnitude)
    if total > MAX_WORK:
        parts = ", ".join(f"{k} {v:,}" for k, v in work.items() if v)
        factor = f" × {IRRATIONAL_COST} for irrational entries" if terms and any(
            terms.values()) else ""
        if magnitude:
            factor += (f" × {magnitude_factor(magnitude):.3g} for scaled scores up to "
                       f"±{magnitude:.3g}")
        raise SpecError(
            f"this example's exact computation would build or walk about {total:,} terms "
            f"({parts}{factor}); the limit is {MAX_WORK:,}: too large to compute symbolically "
            "(fewer tokens, narrower matrices, smaller or rational entries; "
            "reference_attention for numbers)"
        )
    return total


def _floats(m: Any) -> Any:
    """A parsed matrix as a float64 array (entries rounded; symbols and entries beyond
    floats give NaN and inf): for cost estimates only, never for an answer."""
    import numpy as np

    from .certified import to_arb

    out = np.zeros((m.rows, m.cols))
    for i in range(m.rows):
        for j in range(m.cols):
            e = m[i, j]
            if e.free_symbols:
                out[i, j] = np.nan
            elif e.is_Rational:
                try:
                    out[i, j] = float(e)
                except OverflowError:
                    out[i, j] = np.inf
            else:
                ball = to_arb(e, 64)
                out[i, j] = float(ball.mid()) if ball.is_finite() else np.inf
    return out


def _score_bound(parsed: dict[str, Any], score_mats: list[Any], scale: Any, heads: int,
                 extras: bool, kv_heads: int | None = None) -> float:
    """B, the largest |scale · score| of the example, computed in float64 from its
    entries (projections included) — a cost estimate for :func:`work_total`, not a
    certified bound.  A finite additive mask, ``mask_fill``, ALiBi or sinks (``extras``)
    add SHIFT_THRESHOLD: beyond it a row is shifted and its tiny terms are bounded by
    magnitude analysis.  At most MAX_ABS_SCORE, the largest scaled score the engine
    exponentiates (a larger one is refused when the scores are formed); symbols count 0.

    >>> import sympy as sp
    >>> q, k = sp.Matrix([[1, -3], [2, 2]]), sp.Matrix([[2, 0], [1, 1]])
    >>> round(_score_bound({"query": q, "key": k}, [], None, 1, False), 6)  # |-2|·... /√2
    2.828427
    """
    import math

    import numpy as np

    def scale_float() -> float:
        import sympy as sp

        c = abs(float(_floats(sp.Matrix([[exact_number(scale, "scale")]]))[0, 0]))
        return c if not math.isnan(c) else 1.0  # a symbolic scale: no numeric cost

    def project(x: str, w: str, b: str) -> Any:
        xm, wm = parsed[x], parsed[w]
        if xm.cols != wm.rows:
            return None  # a shape error, reported by the engine itself
        y = _floats(xm) @ _floats(wm)
        if b in parsed:
            bm = _floats(parsed[b]).reshape(-1)
            if bm.size != y.shape[1]:
                return None
            y = y + bm
        return y

    with np.errstate(all="ignore"):
        if score_mats:
            bound = max(float(np.nanmax(np.abs(_floats(m)), initial=0.0)) for m in score_mats)
            if scale is not None:
                bound *= scale_float()
        else:
            if "x" in parsed:
                if "w_q" not in parsed or "w_k" not in parsed:
                    return 0.0
                kv_in = "x_kv" if "x_kv" in parsed else "x"
                q, k = project("x", "w_q", "b_q"), project(kv_in, "w_k", "b_k")
            elif "query" in parsed and "key" in parsed:
                q, k = _floats(parsed["query"]), _floats(parsed["key"])
            else:
                return 0.0
            h = max(heads, 1)
            if q is None or k is None or q.shape[1] % h or k.shape[1] != q.shape[1] * (
                    (kv_heads or h) / h):
                return 0.0  # shapes the engine refuses with its own message
            d_k = max(q.shape[1] // h, 1)
            kv = kv_heads if kv_heads and k.shape[1] == kv_heads * d_k else h
            c = scale_float() if scale is not None else 1 / math.sqrt(d_k)
            bound = 0.0
            for i in range(h):
                g = i // max(h // kv, 1)
                s = q[:, i * d_k:(i + 1) * d_k] @ k[:, g * d_k:(g + 1) * d_k].T
                bound = max(bound, float(np.nanmax(np.abs(s), initial=0.0)) * c)
    if extras:
        bound += SHIFT_THRESHOLD
    # a scaled score beyond MAX_ABS_SCORE is refused once the scores are formed
    return min(bound, MAX_ABS_SCORE) if math.isfinite(bound) else MAX_ABS_SCORE


def _terms(m: Any) -> int:
    """0 when every entry of the parsed matrix is rational, else its largest entry's
    number of terms (at least 1)."""
    from .certified import expansion_terms

    if all(getattr(e, "is_Rational", False) for e in m):
        return 0
    return max(max(expansion_terms(e, cap=10**6) for e in m), 1)
