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
from typing import Any

from .._text import expr_text, int_text
from ..errors import InputValueError, ShapeError, SpecError
from .budget import charge
from .entries import (  # noqa: F401  (re-exported: the engine's documented names)
    MAX_ABS_MASK,
    MAX_MPF_EXPONENT,
    _entry_text,
    _finite_mask,
    _mask_entry,
    _shape,
    exact_matrix,
    exact_number,
)
from .spec import AttentionSpec
from .variants import alibi_bias, validate_variants, window_keep
from .variants import softcap as _softcap
from .work import (  # noqa: F401  (re-exported: the engine's documented names)
    IRRATIONAL_COST,
    MAGNITUDE_UNIT,
    MAX_ABS_SCORE,
    MAX_SCORE_ENTRIES,
    MAX_WORK,
    SHIFT_THRESHOLD,
    W_O_COST,
    _check_work,
    _score_bound,
    _terms,
    attention_work,
    magnitude_factor,
    work_total,
)

__all__ = ["ExactAttention", "HeadResult", "exact_attention", "exact_matrix", "exact_number"]


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
