"""The exact engine: every intermediate of multi-head attention as a SymPy expression.

Inputs can be given at any of three levels:

1. raw ``scores`` (one ``n_q x n_k`` matrix per head) and, optionally, ``value``;
2. ``query``, ``key``, ``value`` (heads side by side: ``n x h·d_k``, ``n x h·d_v``);
3. ``x`` (and ``x_kv`` for cross-attention) with ``w_q``, ``w_k``, ``w_v``, optional
   ``w_o`` and biases (``y = x W + b``: W is ``in x out``).

Entries may be ints, Fractions, SymPy numbers or symbols, strings in the
restricted grammar (``"sqrt(2)"``, ``"0.707"``, ``"e^3"``), Python floats,
which are read as the decimal they print as (``0.1`` is 1/10), or mpmath ``mpf``
numbers, read exactly as the binary value they hold (``mpf(1)/3`` at 53 bits is
6004799503160661/2^54); a matrix may be an ``mpmath.matrix``.  mpmath ``mpc`` and
``mpi`` are refused.  Exact inputs give
exact outputs: nothing is rounded, and masked keys get weight exactly 0.

The identities used (per head ``i``, query row ``r``, key ``j``)::

    S_i = Q_i K_i^T                          raw scores
    T_i = scale · S_i + M                    scaled scores (M: additive mask, 0 if none)
    A_i[r, j] = exp(T_i[r, j]) / Σ_{j' kept} exp(T_i[r, j'])      (0 for masked j)
    head_i = A_i V_i,   Concat = [head_1 | … | head_h],   Output = Concat W^O + b^O

>>> import sympy as sp
>>> att = exact_attention(query=[[1, 0], [0, 1]], key=[[1, 0], [0, 1]],
...                       value=[[2, 0], [0, 4]])
>>> att.weights()[0, 0]
exp(sqrt(2)/2)/(1 + exp(sqrt(2)/2))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .._text import echo, expr_text, int_text
from ..errors import InputValueError, ShapeError, SpecError
from .budget import charge
from .spec import AttentionSpec

if TYPE_CHECKING:
    import sympy

__all__ = ["ExactAttention", "HeadResult", "exact_attention", "exact_matrix", "exact_number"]

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
#: Largest |entry| of an additive mask or a ``mask_fill`` value. Tutorials mask with
#: −1e4, −1e6, −1e9 or −9e15; such a key's contribution e^(−10^9) is never evaluated
#: at that many bits: it is bounded by magnitude analysis (exact/magnitude.py).
MAX_ABS_MASK = 10**30
#: A row whose scaled scores reach this magnitude is exponentiated after subtracting its
#: largest score (softmax is invariant under the shift), so that masked keys become
#: e^(−huge) next to e^0 rather than e^(−huge) over e^(−huge).
SHIFT_THRESHOLD = 1000


def exact_number(x: Any, name: str = "value") -> sympy.Expr:
    """One input entry as an exact SymPy number (or symbol)."""
    import sympy as sp

    if isinstance(x, bool):
        raise SpecError(f"{name}={x!r} is a boolean, expected a number")
    if isinstance(x, sp.Basic):
        if x.has(sp.nan, sp.zoo) or (x.is_number and x.is_real is False):
            raise InputValueError(f"{name}={x} is not a real number")
        if x.has(sp.Float):
            raise InputValueError(
                f"{name}={x} holds a floating-point Float, which SymPy evaluates to 15 digits: "
                "pass a string such as '0.1' or a Rational so that the exact number is explicit"
            )
        return x
    if isinstance(x, int):
        return sp.Integer(x)
    if isinstance(x, Fraction):
        return sp.Rational(x.numerator, x.denominator)
    if (type(x).__module__ or "").startswith("mpmath"):
        return _mpmath_number(x, name)
    if isinstance(x, str):
        from ..errors import ParseError
        from .grammar import parse_number

        try:
            return parse_number(x)
        except ParseError as exc:
            raise ParseError(f"{name}: {exc}") from None
    try:  # numpy scalars and Python floats
        import numbers

        if isinstance(x, numbers.Integral):
            return sp.Integer(int(x))
        if isinstance(x, numbers.Real):
            f = float(x)
            if f != f or f in (float("inf"), float("-inf")):
                raise InputValueError(f"{name}={expr_text(x)} is not a finite number")
            # A float typed by a person stands for the decimal it prints as.
            return sp.Rational(repr(f))
    except (TypeError, ValueError):
        pass
    raise SpecError(f"{name}={_entry_text(x)} ({type(x).__name__}) is not a number")


#: Largest binary exponent of an mpf entry read exactly (2^±100000 has ~30103 digits).
MAX_MPF_EXPONENT = 100_000


def _mpmath_number(x: Any, name: str) -> sympy.Expr:
    """An mpmath ``mpf`` as the exact dyadic rational it holds (sign · man · 2^exp);
    ``mpc`` and intervals refused, NaN/±inf refused."""
    import mpmath
    import sympy as sp

    kind = type(x).__name__
    if isinstance(x, mpmath.mpc) or kind in ("mpc", "ivmpc"):
        raise InputValueError(f"{name} is an mpmath {kind} (complex): expected a real number")
    if not isinstance(x, mpmath.mpf):
        raise SpecError(f"{name} is an mpmath {kind}: expected one exact number (an mpf), "
                        "not an interval or a matrix")
    if not mpmath.isfinite(x):
        raise InputValueError(f"{name}={x} is not a finite number")
    sign, man, exp, bc = x._mpf_
    if man and abs(int(exp) + int(bc)) > MAX_MPF_EXPONENT:
        raise InputValueError(f"{name} = {mpmath.nstr(x, 8)} is beyond 2^±{MAX_MPF_EXPONENT}")
    value = sp.Integer(int(man)) * sp.Integer(2) ** int(exp)
    return -value if sign else value


def _entry_text(x: Any) -> str:
    """An entry for a message: a string quoted and cut (:func:`echo`), a number short."""
    return echo(x) if isinstance(x, str) else expr_text(x)


def exact_matrix(rows: Any, name: str) -> sympy.Matrix:
    """A 2-D input as an exact SymPy Matrix (a vector is one row)."""
    import sympy as sp

    if isinstance(rows, sp.MatrixBase):
        return sp.Matrix(rows).applyfunc(lambda e: exact_number(e, name))
    if hasattr(rows, "dtype") and getattr(rows.dtype, "kind", "") == "f":
        # A floating array holds numbers typed by a person: each element stands for the
        # shortest decimal that prints as it *in its own dtype* (float32 0.1 is 1/10).
        import numpy as np

        def text(v: Any) -> str:
            return np.format_float_positional(v, unique=True, trim="0")

        rows = [[text(v) for v in row] for row in np.atleast_2d(rows)]
    if hasattr(rows, "tolist"):
        rows = rows.tolist()
    if not isinstance(rows, (list, tuple)) or not rows:
        raise SpecError(f"{name} must be a non-empty matrix (a list of rows)")
    if not isinstance(rows[0], (list, tuple)):
        rows = [rows]
    width = len(rows[0])
    if width == 0:
        raise SpecError(f"{name} has an empty row")
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)):
            raise SpecError(f"{name} row {i} is not a list")
        if len(row) != width:
            raise ShapeError(f"{name} row {i} has {len(row)} entries but row 0 has {width}")
    return sp.Matrix([[exact_number(e, f"{name}[{i}][{j}]") for j, e in enumerate(row)]
                      for i, row in enumerate(rows)])


def _shape(m: Any) -> str:
    return f"{m.rows} × {m.cols}"


@dataclass(frozen=True)
class HeadResult:
    """Every intermediate of one head, exactly."""

    index: int
    q: Any  # n_q x d_k or None
    k: Any  # n_k x d_k or None
    v: Any  # n_k x d_v or None
    scores: Any  # n_q x n_k, Q_i K_i^T
    scaled: Any  # n_q x n_k, scale·S + M (masked entries: -oo); the variants' logit
    weights: Any  # n_q x n_k
    output: Any  # n_q x d_v or None
    bias: Any = None  # n_q x n_k ALiBi bias (alibi_slopes), else None
    sink: Any = None  # the head's sink logit σ (sinks), else None
    sink_weight: Any = None  # n_q x 1: e^σ / (Σ_kept e^t + e^σ), the sink's share


@dataclass(frozen=True)
class ExactAttention:
    """The exact value of every intermediate of one attention computation."""

    spec: AttentionSpec
    scale: Any
    heads: tuple[HeadResult, ...]
    concat: Any = None
    output: Any = None
    inputs: dict[str, Any] = field(default_factory=dict, repr=False)
    # the validated variant options (window, softcap, alibi_slopes, sinks): see .variants
    variants: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- access -----------------------------------------------------------------
    def head(self, i: int = 0) -> HeadResult:
        if not 0 <= i < len(self.heads):
            raise SpecError(f"head={i} is out of range: there are {len(self.heads)} heads")
        return self.heads[i]

    def scores(self, head: int = 0) -> Any:
        return self.head(head).scores

    def scaled_scores(self, head: int = 0) -> Any:
        return self.head(head).scaled

    def weights(self, head: int = 0) -> Any:
        return self.head(head).weights

    def head_output(self, head: int = 0) -> Any:
        out = self.head(head).output
        if out is None:
            raise SpecError("no values were given, so there is no head output")
        return out

    def final(self) -> Any:
        """The block's output: Concat·W^O + b^O when W^O was given, else the concat."""
        if self.output is not None:
            return self.output
        if self.concat is None:
            raise SpecError("no values were given, so there is no output")
        return self.concat

    def latex(self) -> str:
        import sympy as sp

        parts = []
        for h in self.heads:
            parts.append(rf"A_{{{h.index + 1}}} = {sp.latex(h.weights)}")
            if h.output is not None:
                parts.append(rf"\mathrm{{head}}_{{{h.index + 1}}} = {sp.latex(h.output)}")
        if self.output is not None:
            parts.append(rf"\mathrm{{Output}} = {sp.latex(self.output)}")
        return ",\\quad ".join(parts)

    def _repr_latex_(self) -> str:
        return f"$${self.latex()}$$"


def _scale_value(scale: Any, d_k: Any, default_unscaled: bool) -> Any:
    import sympy as sp

    if scale is None:
        if d_k is None:
            if default_unscaled:
                return sp.Integer(1)
            raise SpecError("scale=None needs d_k to form 1/sqrt(d_k)")
        return 1 / sp.sqrt(d_k)
    return exact_number(scale, "scale")


def _check_magnitude(t: Any, head: int, what: str = "scaled score") -> None:
    """Refuse scaled scores beyond ±MAX_ABS_SCORE before SymPy exponentiates them.

    ``t`` holds scale · score only: additive masks and ``mask_fill`` values are checked
    by :func:`_mask_entry` against MAX_ABS_MASK.  A softcap's tanh argument s/cap is
    held to the same bound (``what``): SymPy rewrites functions of c·log(n) into powers
    n^c, so a tiny cap (sqrt(1e-400)) made 3^(10^200) out of tanh(10^200·log(3)/2),
    a computation without end (issue 30, seed 41 #8684)."""
    import sympy as sp

    from .certified import to_arb

    for (r, j), e in zip(((r, j) for r in range(t.rows) for j in range(t.cols)), t, strict=True):
        if e == -sp.oo or e.free_symbols:
            continue
        if e.is_Rational:
            if abs(e) > MAX_ABS_SCORE:
                raise InputValueError(
                    f"{what} [{r + 1},{j + 1}] of head {head + 1} is beyond ±{MAX_ABS_SCORE} "
                    f"(it is {expr_text(e, 40)}): too large to exponentiate exactly; use "
                    "reference_attention for such inputs")
            continue
        ball = to_arb(e, 64)
        if not ball.is_finite() or abs(ball) > MAX_ABS_SCORE:
            raise InputValueError(
                f"{what} [{r + 1},{j + 1}] of head {head + 1} is beyond ±{MAX_ABS_SCORE} "
                f"(it is {expr_text(e, 40)}): too large to exponentiate exactly; use "
                "reference_attention for such inputs"
            )


def _check_radicals(mats: list[Any]) -> None:
    """Bound SymPy's radical arithmetic over every input entry (see
    :func:`mha_symbolic.exact.grammar.check_radicals`): products of entries combine
    their fractional powers."""
    import sympy as sp

    from ..errors import ParseError
    from .grammar import check_radicals

    radicals = []
    for m in mats:
        if isinstance(m, sp.Basic):
            radicals += [(p.base, p.exp) for p in m.atoms(sp.Pow)
                         if p.base.is_Rational and p.exp.is_Rational and not p.exp.is_Integer]
    try:
        check_radicals(radicals)
    except ParseError as exc:
        raise InputValueError(f"the inputs' {exc}") from None


def _softmax_rows(t: Any, keep: list[list[bool]], masked_rows: str, head: int,
                  parts: list[Any] | None = None, sink: Any = None,
                  sink_shares: list[Any] | None = None) -> Any:
    """Row-wise softmax of the scaled scores over the kept keys.

    softmax(t)_j = e^(t_j − m) / Σ_k e^(t_k − m) for any m; a row holding a score of
    magnitude ≥ SHIFT_THRESHOLD (a huge finite mask) is shifted by its largest score m
    (found with certified comparisons), so each masked key is e^(−huge) beside e^0.
    With an attention sink σ, e^(σ − m) joins every row's denominator only (gpt-oss),
    and a row whose keys are all masked gives its whole weight to the sink (its
    weights are 0, no masked-row policy).  ``sink_shares`` receives each row's
    e^(σ − m) / D, over the same denominator as the row's weights (so that the row
    visibly sums to 1, without evaluating anything)."""
    import sympy as sp

    n_q, n_k = t.shape
    w = sp.zeros(n_q, n_k)
    for r in range(n_q):
        cols = [j for j in range(n_k) if keep[r][j] and t[r, j] != -sp.oo]
        if parts is not None:
            parts.append(None)
        if sink is not None:
            shift = _row_shift([t[r, j] for j in cols] + [sink])
            exps = {j: sp.exp(t[r, j] - shift) for j in cols}
            sink_exp = sp.exp(sink - shift)
            denom = sp.Add(*exps.values(), sink_exp)
            for j in cols:
                w[r, j] = exps[j] / denom
            if sink_shares is not None:
                sink_shares.append(sink_exp / denom)
            if parts is not None:
                parts[-1] = (exps, denom)
            continue
        if not cols:
            if masked_rows == "error":
                raise InputValueError(
                    f"query row {r + 1} of head {head + 1} has every key masked (masked_rows='error')"
                )
            if masked_rows == "nan":
                for j in range(n_k):
                    w[r, j] = sp.nan
            continue  # "zero": the row stays 0, as PyTorch SDPA and FlashAttention return
        shift = _row_shift([t[r, j] for j in cols])
        exps = {j: sp.exp(t[r, j] - shift) for j in cols}
        denom = sp.Add(*exps.values())
        inverse = 1 / denom
        for j in cols:
            w[r, j] = exps[j] * inverse
        if parts is not None:
            parts[-1] = (exps, denom)
    return w


def _weighted_sum(w: Any, vh: Any, rows: list[Any] | None) -> Any:
    """A_i V_i.  With the softmax's rows (numerators e^(t_j), denominator D) each entry
    is written over the common denominator, Σ_j (e^(t_j)/D) v_j = (Σ_j e^(t_j) v_j)/D:
    one division per entry instead of one per term."""
    import sympy as sp

    n_q, n_k = w.shape
    if rows is None:
        return sp.Matrix(n_q, vh.cols, lambda r, c: sp.Add(*[w[r, j] * vh[j, c] for j in range(n_k)]))
    out = sp.zeros(n_q, vh.cols)
    for r in range(n_q):
        row = rows[r]
        for c in range(vh.cols):
            if row is None:  # a fully masked row: zero (or NaN) weights as they stand
                out[r, c] = sp.Add(*[w[r, j] * vh[j, c] for j in range(n_k)])
            else:
                numer, denom = row
                out[r, c] = sp.Add(*[e * vh[j, c] for j, e in numer.items()]) / denom
    return out


def _row_shift(row: list[Any]) -> Any:
    """0, or the row's largest entry when some entry is huge (see SHIFT_THRESHOLD)."""
    import sympy as sp

    from .certified import certify, to_arb

    huge = False
    for e in row:
        if e.is_Rational:
            huge = huge or abs(e) >= SHIFT_THRESHOLD
            continue
        if e.free_symbols:
            return sp.Integer(0)
        ball = to_arb(e, 64)
        if not ball.is_finite() or abs(ball) >= SHIFT_THRESHOLD:
            huge = True
    if not huge:
        return sp.Integer(0)
    best = row[0]
    for e in row[1:]:
        if e != best and certify(e - best).sign() > 0:
            best = e
    return best


def _keep_matrix(spec: AttentionSpec, n_q: int, n_k: int, head: int = 0) -> list[list[bool]]:
    return [[spec.takes_part(i, j, head) for j in range(n_k)] for i in range(n_q)]


def _split(m: Any, parts: int, width: int, name: str) -> list[Any]:
    if m.cols != parts * width:
        raise ShapeError(f"{name} has {m.cols} columns; expected {parts} heads × {width} = "
                         f"{parts * width}")
    return [m[:, p * width:(p + 1) * width] for p in range(parts)]


def _bias(b: Any, width: int, rows: int, name: str) -> Any:
    import sympy as sp

    if b is None:
        return sp.zeros(rows, width)
    vec = exact_matrix(b, name)
    if vec.shape != (1, width):
        raise ShapeError(f"{name} has shape {_shape(vec)}; expected a vector of {width}")
    return sp.ones(rows, 1) * vec


def _project(x: Any, w: Any, b: Any, xname: str, wname: str, bname: str) -> Any:
    wm = exact_matrix(w, wname)
    if x.cols != wm.rows:
        raise ShapeError(
            f"cannot multiply {xname} ({_shape(x)}) by {wname} ({_shape(wm)}): "
            f"inner sizes {x.cols} and {wm.rows} differ"
        )
    return x * wm + _bias(b, wm.cols, x.rows, bname)


def _guarded(build: Any) -> Any:
    """SymPy's own arithmetic errors on extreme inputs (an OverflowError in its
    perfect-power test, a RecursionError) become one-line InputValueErrors."""
    import functools

    from .._validate import door
    from ..errors import MhaSymbolicError

    # misspelt keywords, strict booleans, counts and options by their size
    checked = door(build, sized=("heads", "kv_heads", "d_k", "window", "masked_rows",
                                 "causal_alignment", "softmax_over", "mask_fill_stage"),
                   max_chars=None)  # its own messages cut long strings (window: left='ww…')

    @functools.wraps(build)
    def run(**kwargs: Any) -> ExactAttention:
        try:
            result: ExactAttention = checked(**kwargs)
        except MhaSymbolicError:
            raise
        except (ArithmeticError, RecursionError, ValueError, TypeError) as exc:
            raise InputValueError(f"exact arithmetic on these inputs failed inside SymPy "
                                  f"({type(exc).__name__}): the numbers are too large or "
                                  "too deeply nested to handle exactly") from None
        return result

    return run


@_guarded
def exact_attention(
    *,
    scores: Any = None,
    query: Any = None,
    key: Any = None,
    value: Any = None,
    x: Any = None,
    x_kv: Any = None,
    w_q: Any = None,
    w_k: Any = None,
    w_v: Any = None,
    w_o: Any = None,
    b_q: Any = None,
    b_k: Any = None,
    b_v: Any = None,
    b_o: Any = None,
    heads: int = 1,
    kv_heads: int | None = None,
    d_k: Any = None,
    scale: Any = None,
    mask: Any = None,
    causal_alignment: str = "top_left",
    masked_rows: str = "zero",
    softmax_over: str = "keys",
    mask_fill: Any = None,
    mask_fill_stage: str = "scaled",
    window: Any = None,
    softcap: Any = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
) -> ExactAttention:
    """Build every intermediate of (multi-head, masked, cross-, GQA) attention exactly.

    ``scale=None`` is ``1/sqrt(d_k)``, with ``d_k`` the per-head query width
    (given, or read off ``query``); for raw ``scores`` without ``d_k`` the
    scores are taken as already scaled (scale 1).  ``scale=0`` means zero.
    ``mask``: None, ``"causal"``, a boolean matrix (True = takes part) or an
    additive matrix added to the scaled scores, whose entries may be
    ``float("-inf")``, ``"-inf"`` or SymPy's ``-oo`` to remove a key exactly.
    A mask may also be a list of ``heads`` such matrices (one per head: ALiBi-like
    biases, per-head masks).  ``mask_fill``: with a boolean (or causal) mask, the
    masked entries are *replaced* by this number instead of removed, as
    ``scores.masked_fill(~mask, mask_fill)`` does (``-inf`` removes them exactly);
    ``mask_fill_stage="scaled"`` replaces the scaled score, ``"raw"`` the raw score
    before scaling.
    ``softmax_over="queries"`` normalizes each *column* instead of each row: it is
    wrong attention, built only so that the textbook checker can recognise a text
    that took the softmax over the wrong axis.

    Variants (:mod:`.variants`): ``window=(left, right)`` (FlashAttention's
    window_size, -1 unbounded, aligned by ``causal_alignment``), ``softcap`` (the
    scaled score s -> cap·tanh(s/cap), before the mask), ``alibi_slopes`` (one per
    head: -slope·|j - (i + off)| added), ``sinks`` (one logit per head, in every
    row's denominator only).
    """
    import numbers

    import sympy as sp

    def whole(v: Any) -> bool:
        return isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 1

    if not whole(heads):
        raise SpecError(f"heads={expr_text(heads, 40)} must be a positive integer")
    heads = int(heads)
    kv = heads if kv_heads is None else kv_heads
    if not whole(kv) or heads % int(kv):
        raise SpecError(f"kv_heads={expr_text(kv_heads, 40)} must be a positive divisor of "
                        f"heads={int_text(heads)}")
    kv = int(kv)
    if d_k is not None:
        if not whole(d_k):
            raise SpecError(f"d_k={expr_text(d_k, 40)} must be a positive integer")
        d_k = int(d_k)
    if x_kv is not None and x is None:
        raise SpecError("x_kv needs x (and w_q, w_k, w_v): it is the key/value input of the "
                        "projections")
    group = heads // kv
    # Count the work and bound the radicals before any arithmetic is done: first from the
    # shapes alone (before reading a single entry), then with the entries' terms.
    sizes = dict(scores=scores, query=query, key=key, value=value, x=x, x_kv=x_kv, w_q=w_q,
                 w_k=w_k, w_v=w_v, w_o=w_o, heads=heads, kv_heads=kv, softmax_over=softmax_over,
                 sinks=sinks)
    _check_work(sizes)
    score_list = (scores if heads > 1 and isinstance(scores, (list, tuple)) else [scores]
                  ) if scores is not None else []
    parsed = {name: exact_matrix(m, name) for name, m in (
        ("query", query), ("key", key), ("value", value), ("x", x), ("x_kv", x_kv),
        ("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("w_o", w_o), ("b_q", b_q), ("b_k", b_k),
        ("b_v", b_v), ("b_o", b_o)) if m is not None}
    score_mats_parsed = [exact_matrix(m, "scores") for m in score_list]
    _check_radicals(list(parsed.values()) + score_mats_parsed
                    + ([exact_number(scale, "scale")] if scale is not None else []))
    terms = {name: _terms(m) for name, m in parsed.items()}
    if score_mats_parsed:
        terms["scores"] = max(_terms(m) for m in score_mats_parsed)
    extras = (mask_fill is not None or alibi_slopes is not None or sinks is not None
              or _finite_mask(mask))
    charge(_check_work(sizes, terms, _score_bound(parsed, score_mats_parsed, scale, heads, extras,
                                                  kv)))  # the file's budget, when one is held
    inputs: dict[str, Any] = {}

    q_heads: list[Any] | None = None
    k_heads: list[Any] | None = None
    v_heads: list[Any] | None = None
    score_mats: list[Any]

    if x is not None:
        if scores is not None or query is not None or key is not None:
            raise SpecError("give either x (with weights) or query/key/value or scores, not several")
        if w_q is None or w_k is None or w_v is None:
            raise SpecError("x needs w_q, w_k and w_v")
        xm = exact_matrix(x, "x")
        xkv = exact_matrix(x_kv, "x_kv") if x_kv is not None else xm
        inputs.update(x=xm, x_kv=xkv)
        query = _project(xm, w_q, b_q, "x", "w_q", "b_q")
        key = _project(xkv, w_k, b_k, "x_kv", "w_k", "b_k")
        value = _project(xkv, w_v, b_v, "x_kv", "w_v", "b_v")
        inputs.update(q=query, k=key, v=value)

    if query is not None or key is not None:
        if scores is not None:
            raise SpecError("give either scores or query/key, not both")
        if query is None or key is None:
            raise SpecError("query and key must be given together")
        qm = exact_matrix(query, "query")
        km = exact_matrix(key, "key")
        if qm.cols % heads:
            raise ShapeError(f"query has {qm.cols} columns, not divisible by heads={int_text(heads)}")
        width = qm.cols // heads
        if d_k is not None and d_k != width:
            raise ShapeError(f"d_k={d_k} but query has {qm.cols} columns for heads={int_text(heads)}")
        d_k = width
        if km.cols != kv * width:
            raise ShapeError(
                f"key has {km.cols} columns; expected kv_heads={kv} × d_k={width} = {kv * width}"
            )
        q_heads = _split(qm, heads, width, "query")
        k_heads = _split(km, kv, width, "key")
        inputs.update(q=qm, k=km)
        n_q, n_k = qm.rows, km.rows
    elif scores is not None:
        mats = scores if heads > 1 else [scores]
        if heads > 1 and (not isinstance(scores, (list, tuple)) or len(scores) != heads):
            raise ShapeError(f"scores must be a list of heads={int_text(heads)} matrices")
        score_mats = [exact_matrix(s, f"scores[{i}]" if heads > 1 else "scores")
                      for i, s in enumerate(mats)]
        n_q, n_k = score_mats[0].shape
        for i, s in enumerate(score_mats):
            if s.shape != (n_q, n_k):
                raise ShapeError(f"scores[{i}] is {_shape(s)} but scores[0] is {n_q} × {n_k}")
    else:
        raise SpecError("give scores, or query and key (and value), or x with w_q, w_k, w_v")

    if n_q * n_k * heads > MAX_SCORE_ENTRIES:
        raise SpecError(
            f"heads·n_q·n_k = {int_text(heads)}·{n_q}·{n_k} exceeds {MAX_SCORE_ENTRIES} entries: "
            "too large to build symbolically; use reference_attention for numeric inputs"
        )

    if value is not None:
        vm = exact_matrix(value, "value")
        if vm.rows != n_k:
            raise ShapeError(f"value has n_k={vm.rows} rows but key has n_k={n_k}")
        if vm.cols % kv:
            raise ShapeError(f"value has {vm.cols} columns, not divisible by kv_heads={kv}")
        v_heads = _split(vm, kv, vm.cols // kv, "value")
        inputs["v"] = vm

    d_v = v_heads[0].cols if v_heads else None
    spec = AttentionSpec(
        n_q=n_q, n_k=n_k, d_model=(heads * d_k) if isinstance(d_k, int) else None,
        heads=heads, kv_heads=kv, d_k=d_k if isinstance(d_k, int) else None,
        d_v=d_v, scale=scale, mask=mask, causal_alignment=causal_alignment,  # type: ignore[arg-type]
        masked_rows=masked_rows,  # type: ignore[arg-type]
    )
    scale_value = _scale_value(scale, d_k, default_unscaled=q_heads is None)
    if mask_fill_stage not in ("scaled", "raw"):
        raise SpecError(f"mask_fill_stage={_entry_text(mask_fill_stage)} must be 'scaled' or 'raw'")
    fill = None if mask_fill is None else _mask_entry(mask_fill, "mask_fill")
    if fill is not None and fill != -sp.oo and mask_fill_stage == "raw":
        fill = fill * scale_value
    from .variants import alibi_bias, validate_variants, window_keep
    from .variants import softcap as _softcap

    var = validate_variants(window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                            sinks=sinks, heads=heads)
    win = (window_keep(n_q, n_k, var["window"], causal_alignment)
           if var["window"] is not None else None)

    results = []
    for i in range(heads):
        g = i // group
        s = q_heads[i] * k_heads[g].T if q_heads is not None and k_heads is not None else score_mats[i]
        keep = _keep_matrix(spec, n_q, n_k, i)
        if win is not None:
            keep = [[a and b for a, b in zip(ka, kb, strict=True)]
                    for ka, kb in zip(keep, win, strict=True)]
        additive = spec.head_additive_mask(i)
        scaled = s * scale_value
        _check_magnitude(scaled, i)
        if var["softcap"] is not None:  # cap·tanh(s/cap): after the scale, before masks
            _check_magnitude(scaled / var["softcap"], i, what="scaled score / softcap")
            scaled = _softcap(scaled, var["softcap"])
        bias = None
        if var["alibi_slopes"] is not None:  # added after the softcap (FlashAttention)
            bias = alibi_bias(var["alibi_slopes"][i], n_q, n_k, causal_alignment)
            _check_magnitude(bias, i)
            scaled = scaled + bias
        t = (scaled + sp.Matrix([[_mask_entry(e) for e in row] for row in additive])
             if additive is not None else scaled)
        if fill is None or fill == -sp.oo:
            t = sp.Matrix(n_q, n_k, lambda r, j, t=t, keep=keep: t[r, j] if keep[r][j] else -sp.oo)
        else:  # masked_fill: the masked entries take the fill value and stay in the softmax
            t = sp.Matrix(n_q, n_k, lambda r, j, t=t, keep=keep: t[r, j] if keep[r][j] else fill)
            keep = [[True] * n_k for _ in range(n_q)]
        sink = var["sinks"][i] if var["sinks"] is not None else None
        sink_weight = None
        row_parts: list[Any] | None = None
        if softmax_over == "queries":
            w = _softmax_rows(t.T, [list(c) for c in zip(*keep, strict=True)], masked_rows, i).T
        elif softmax_over == "keys":
            row_parts = []
            shares: list[Any] = []
            w = _softmax_rows(t, keep, masked_rows, i, row_parts, sink, shares)
            if sink is not None:
                sink_weight = sp.Matrix(n_q, 1, shares)
        else:
            raise SpecError(f"softmax_over={_entry_text(softmax_over)} must be 'keys' or 'queries'")
        out = None
        if v_heads is not None:
            out = _weighted_sum(w, v_heads[g], row_parts)
        results.append(HeadResult(
            i,
            q_heads[i] if q_heads else None,
            k_heads[g] if k_heads else None,
            v_heads[g] if v_heads else None,
            s, t, w, out, bias, sink, sink_weight,
        ))

    concat = None
    output = None
    if v_heads is not None:
        concat = sp.Matrix.hstack(*[h.output for h in results])
        if w_o is not None:
            output = _project(concat, w_o, b_o, "concat", "w_o", "b_o")
        elif b_o is not None:
            raise SpecError("b_o given without w_o")
    return ExactAttention(spec, scale_value, tuple(results), concat, output, inputs,
                          {k: v for k, v in var.items() if v is not None})


def _finite_mask(mask: Any) -> bool:
    """Whether a mask (nested lists or an array) holds a finite non-zero additive entry;
    booleans, 0 and −inf (a key removed exactly) cost nothing more."""
    import sympy as sp

    if mask is None or isinstance(mask, str):
        return False
    if hasattr(mask, "tolist"):
        mask = mask.tolist()
    if isinstance(mask, sp.MatrixBase):
        mask = list(mask)
    stack = [mask]
    while stack:
        e = stack.pop()
        if isinstance(e, (list, tuple)):
            stack.extend(e)
        elif isinstance(e, bool) or e is None:
            continue
        elif isinstance(e, (int, float, Fraction)):
            if e != 0 and e != float("-inf"):
                return True
        elif isinstance(e, str):
            if e.strip().replace("\u2212", "-") not in ("-inf", "-oo", "-∞", "0"):
                return True
        elif isinstance(e, sp.Basic):
            if e != 0 and e != -sp.oo:
                return True
        else:
            return True  # numpy scalars and anything else: counted
    return False


def _mask_entry(e: Any, name: str = "mask") -> Any:
    """An additive-mask entry: a number, or -inf (float, string or -oo) to remove a key.

    Finite entries may be as large as MAX_ABS_MASK (−1e9 and −9e15 are common)."""
    import sympy as sp

    if isinstance(e, float) and e == float("-inf"):
        return -sp.oo
    if isinstance(e, str) and e.strip().replace("\u2212", "-") in ("-inf", "-oo", "-∞"):
        return -sp.oo
    if isinstance(e, sp.Basic) and e == -sp.oo:
        return e
    value = exact_number(e, name)
    if value.is_Rational and abs(value) > MAX_ABS_MASK:
        raise InputValueError(f"{name} entry {_entry_text(e)} is beyond ±{MAX_ABS_MASK:.0e}")
    if not value.is_Rational and not value.free_symbols:
        from .certified import to_arb

        ball = to_arb(value, 64)
        if not ball.is_finite() or abs(ball) > MAX_ABS_MASK:
            raise InputValueError(f"{name} entry {_entry_text(e)} is beyond ±{MAX_ABS_MASK:.0e}")
    return value
