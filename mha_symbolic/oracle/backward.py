"""Certified gradients of scaled dot-product attention:
:func:`reference_attention_backward`.

The gradients are those of the scalar Σ grad_output ∘ output with respect to
query, key, value (and a float ``attn_mask``), for the exact inputs; the method
mirrors the forward (:mod:`.forward`):

1. :mod:`.backward_fast` computes every gradient in float64 with a proved
   elementwise bound (docs/gradients.md §3), on the weights of the forward fast
   path (:func:`.fast.fast_attention`) and their bound.
2. An element whose enclosure does not round to one value is recomputed in Arb
   (:mod:`.backward_arb`) at rising precision (Ziv; :class:`.enclosure.Enclosure`):
   a dQ or mask element needs its own row only, a dK or dV element every row of
   the problems it sums over.
3. An element still undecided at 256 bits is decided exactly
   (:mod:`.backward_exact`: Lindemann–Weierstrass on exponential polynomials).

Broadcasting and GQA follow autograd: a gradient is summed over every copy of its
input, i.e. over broadcast leading dimensions and over the query heads of a
key/value head's group (``enable_gqa``: query head g uses kv head g // (H_q/H_kv)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import InputValueError, ShapeError, SpecError
from .backward_arb import ArbGradients, arb_backward
from .backward_exact import (
    Accumulator,
    Decomposition,
    ExactDecisions,
    ExactProblem,
    IntMatrix,
    QField,
)
from .backward_fast import fast_attention_backward
from .constants import CHUNK_ELEMS, UP, U, gamma
from .conventions import ALIGNMENTS, exact_scale, prepare_mask
from .enclosure import Enclosure, Problem
from .inputs import as_exact_array, to_float64, validate_finite

__all__ = ["POLICIES", "AttentionGradients", "reference_attention_backward"]

# masked_rows policies of the backward: the forward's, and "uniform" (JAX: every key
# of a fully masked row gets weight 1/S, the output is the mean of the values)
POLICIES = ("zero", "nan", "error", "uniform")
KINDS = ("dq", "dk", "dv", "dmask")

Arr = np.ndarray[Any, Any]


class AttentionGradients:
    """The certified gradients: ``dq``, ``dk``, ``dv`` (each an
    :class:`~mha_symbolic.oracle.enclosure.Enclosure` shaped like its input:
    ``lower``, ``upper``, ``midpoint``, ``rounded(dtype)``, ``exact(index)``) and
    ``d_attn_mask`` (an Enclosure shaped like a float ``attn_mask``, else None).
    Unpacks as ``dq, dk, dv = grads``."""

    def __init__(self, dq: Enclosure, dk: Enclosure, dv: Enclosure,
                 d_attn_mask: Enclosure | None) -> None:
        self.dq, self.dk, self.dv, self.d_attn_mask = dq, dk, dv, d_attn_mask

    def __iter__(self) -> Any:
        return iter((self.dq, self.dk, self.dv))

    def __repr__(self) -> str:
        m = "" if self.d_attn_mask is None else f", d_attn_mask={self.d_attn_mask.shape}"
        return (f"AttentionGradients(dq={self.dq.shape}, dk={self.dk.shape}, "
                f"dv={self.dv.shape}{m})")


# --------------------------------------------------------------------------------------
# Inputs


@dataclass
class _Setup:
    """Everything the backward needs, expanded to B = prod(batch) problems, with the
    maps from a problem to the flat index of each input it came from."""

    q: Arr                   # (B, L, E) float64, exact inputs
    k: Arr                   # (B, S, E)
    v: Arr                   # (B, S, Ev)
    do: Arr                  # (B, L, Ev)
    allowed: Arr             # (B, L, S) bool
    madd: Arr | None         # (B, L, S) finite additive mask
    keep: Arr | None         # (B, L, S) dropout keep-mask
    f: Fraction              # exact dropout factor 1/(1 - p)
    scale: Fraction | None   # exact rational scale, None for 1/sqrt(E)
    c_f: float
    rho_c: float
    E: int
    policy: str
    empty: Arr               # (B, L) rows with no allowed key
    uniform: Arr             # (B, L) empty rows under "uniform"
    maps: dict[str, Arr]     # "dq"/"dk"/"dv"/"dmask" -> (B,) flat input index
    flat: dict[str, tuple[int, int, int]]   # flat (n, rows, cols) of each gradient
    shapes: dict[str, tuple[int, ...]]      # user shape of each gradient
    mask_bcast: tuple[bool, bool]           # the float mask broadcasts along (L, S)


def _index_map(lead: tuple[int, ...], batch: tuple[int, ...], gqa_rep: int = 1) -> Arr:
    """For every problem (flat over ``batch``), the flat index of the input whose
    leading shape is ``lead`` (heads repeated ``gqa_rep`` times, repeat_interleave)."""
    idx = np.arange(math.prod(lead), dtype=np.int64).reshape(lead)
    if gqa_rep > 1:
        idx = np.repeat(idx, gqa_rep, axis=-1)
    return np.broadcast_to(idx, batch).reshape(-1).copy()


def _float_input(x: Any, name: str) -> Arr:
    a = as_exact_array(x, name)
    if a.dtype == bool:
        raise SpecError(f"{name}.dtype=bool: expected a float array")
    if a.ndim < 2:
        raise ShapeError(f"{name}.shape={a.shape}: expected at least 2 dimensions (..., L, E)")
    validate_finite(a, name)
    return a


def _setup(query: Any, key: Any, value: Any, grad_output: Any, attn_mask: Any,
           is_causal: bool, scale: Any, enable_gqa: bool, causal_alignment: str,
           masked_rows: str, dropout_p: Any, dropout_mask: Any) -> _Setup:
    if masked_rows not in POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {POLICIES}")
    if causal_alignment not in ALIGNMENTS:
        raise SpecError(f"causal_alignment={causal_alignment!r}: expected one of {ALIGNMENTS}")
    q, k, v = (_float_input(x, n) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(f"key.shape={k.shape} does not match query.shape={q.shape}: "
                         f"E must agree ({q.shape[-1]} vs {k.shape[-1]})")
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(f"value.shape={v.shape} does not match key.shape={k.shape}: "
                         f"S must agree ({k.shape[-2]} vs {v.shape[-2]})")
    rep = 1
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk != hv:
            raise ShapeError(f"value.shape={v.shape} does not match key.shape={k.shape}: "
                             f"H_kv must agree ({hk} vs {hv})")
        if hk == 0 or hq % hk:
            raise ShapeError(f"query.shape={q.shape}, key.shape={k.shape}: with enable_gqa=True "
                             f"H_q must be a multiple of H_kv ({hq} vs {hk})")
        rep = hq // hk
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]

    def lead(x: Arr, r: int = 1) -> tuple[int, ...]:
        s = x.shape[:-2]
        return (*s[:-1], s[-1] * r) if r > 1 else s

    try:
        batch = tuple(np.broadcast_shapes(q.shape[:-2], lead(k, rep), lead(v, rep)))
    except ValueError:
        hint = ""
        if q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3] and not enable_gqa:
            hint = f" (H_q={q.shape[-3]} != H_kv={k.shape[-3]}: pass enable_gqa=True for GQA)"
        raise ShapeError(f"query.shape={q.shape}, key.shape={k.shape}, value.shape={v.shape}: "
                         f"the leading (batch, head) dimensions do not broadcast{hint}") from None
    do = _float_input(grad_output, "grad_output")
    if do.shape != (*batch, L, Ev):
        raise ShapeError(f"grad_output.shape={do.shape} does not match the attention output's "
                         f"shape {(*batch, L, Ev)}")
    scale_exact, c_f, rho_c = exact_scale(scale, E)
    allowed_b, madd_b = prepare_mask(attn_mask, is_causal, causal_alignment, batch, L, S)
    B = math.prod(batch)

    def expand(x: Arr, r: int, rows: int, cols: int) -> Arr:
        x64 = to_float64(x)
        if r > 1:
            x64 = np.repeat(x64, r, axis=-3)
        return np.ascontiguousarray(np.broadcast_to(x64, (*batch, rows, cols)).reshape(B, rows, cols))

    qf, kf, vf = expand(q, 1, L, E), expand(k, rep, S, E), expand(v, rep, S, Ev)
    dof = to_float64(do).reshape(B, L, Ev)
    allowed = np.ascontiguousarray(np.broadcast_to(allowed_b, (*batch, L, S)).reshape(B, L, S))
    madd = None if madd_b is None else np.ascontiguousarray(
        np.broadcast_to(madd_b, (*batch, L, S)).reshape(B, L, S))

    # dropout: out = ((P ∘ keep)/(1 - p)) V with an explicit keep-mask
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.floating, np.integer)):
        raise SpecError(f"dropout_p={dropout_p!r}: expected a number in [0, 1)")
    p_drop = float(dropout_p)
    if not (0.0 <= p_drop < 1.0):
        raise SpecError(f"dropout_p={dropout_p!r}: expected a number in [0, 1)")
    keep = None
    if dropout_mask is not None:
        km = as_exact_array(dropout_mask, "dropout_mask")
        if km.dtype != bool:
            raise SpecError(f"dropout_mask.dtype={km.dtype}: expected a bool keep-mask "
                            "(True = kept)")
        try:
            keep = np.ascontiguousarray(np.broadcast_to(km, (*batch, L, S)).reshape(B, L, S))
        except ValueError:
            raise ShapeError(f"dropout_mask.shape={km.shape} does not broadcast to the scores' "
                             f"shape {(*batch, L, S)}") from None
    elif p_drop > 0:
        raise SpecError(f"dropout_p={dropout_p!r} without dropout_mask: random dropout cannot be "
                        "certified; pass the keep-mask the kernel used (dropout_mask=)")
    f = 1 / (1 - Fraction(p_drop))

    empty: Arr = np.asarray(~allowed.any(axis=-1)) if S else np.ones((B, L), dtype=bool)
    if masked_rows == "error" and empty.any():
        b, i = np.argwhere(empty)[0].tolist()
        where = (*tuple(int(x) for x in np.unravel_index(b, batch)), i) if batch else (i,)
        raise InputValueError(f"query row {where} has every key masked out (attn_mask/is_causal) "
                              "and masked_rows='error'")
    uniform: Arr = (np.asarray(empty & (S > 0)) if masked_rows == "uniform"
                    else np.zeros_like(empty))

    maps = {"dq": _index_map(q.shape[:-2], batch), "dk": _index_map(k.shape[:-2], batch, rep),
            "dv": _index_map(v.shape[:-2], batch, rep)}
    flat = {"dq": (math.prod(q.shape[:-2]), L, E), "dk": (math.prod(k.shape[:-2]), S, E),
            "dv": (math.prod(v.shape[:-2]), S, Ev)}
    shapes = {"dq": q.shape, "dk": k.shape, "dv": v.shape}
    bc = (False, False)
    if madd is not None:
        m = as_exact_array(attn_mask, "attn_mask")
        mshape = m.shape
        m2 = (1,) * max(0, 2 - m.ndim) + tuple(mshape)
        mlead = m2[:-2]
        maps["dmask"] = _index_map(mlead, batch)
        flat["dmask"] = (math.prod(mlead), m2[-2], m2[-1])
        shapes["dmask"] = tuple(mshape)
        bc = (m2[-2] == 1 and L != 1, m2[-1] == 1 and S != 1)
    return _Setup(qf, kf, vf, dof, allowed, madd, keep, f, scale_exact, c_f, rho_c, E,
                  masked_rows, empty, uniform, maps, flat, shapes, bc)


# --------------------------------------------------------------------------------------
# The problem behind the four Enclosures: Arb rows and exact decisions


class _BackwardProblem(ExactDecisions, Problem):
    """Gradient rows on demand.  ``b`` indexes the flat input of the gradient
    (kind), ``rows`` its rows: query positions (dq), key positions (dk, dv), mask
    rows (dmask)."""

    def __init__(self, st: _Setup) -> None:
        self.st = st
        self.groups: dict[str, list[list[int]]] = {}
        for kind, mp in st.maps.items():
            g: list[list[int]] = [[] for _ in range(st.flat[kind][0])]
            for e, t in enumerate(mp.tolist()):
                g[t].append(e)
            self.groups[kind] = g
        self._full: dict[tuple[int, int], ArbGradients] = {}
        self._exact_problems: dict[int, ExactProblem] = {}
        self._decomp: dict[tuple[str, int, int, int], Decomposition] = {}
        self.fld = QField(self._c_rat(), st.E)

    # -- Arb
    def scale_arb(self) -> Any:
        from flint import arb

        st = self.st
        if st.scale is not None:
            return arb(st.scale.numerator) / arb(st.scale.denominator)
        return arb(st.E).rsqrt() if st.E else arb(0)

    def _arb(self, e: int, rows: list[int] | None, prec: int) -> ArbGradients:
        st = self.st
        if rows is None:
            key = (e, prec)
            got = self._full.get(key)
            if got is None:
                if any(kk[1] != prec for kk in self._full):
                    self._full.clear()  # keep one precision only
                got = arb_backward(st.q[e], st.k[e], st.v[e], st.do[e], st.allowed[e],
                                   None if st.madd is None else st.madd[e],
                                   None if st.keep is None else st.keep[e], st.f,
                                   self.scale_arb, st.c_f, st.uniform[e], None, prec)
                self._full[key] = got
            return got
        return arb_backward(st.q[e], st.k[e], st.v[e], st.do[e], st.allowed[e],
                            None if st.madd is None else st.madd[e],
                            None if st.keep is None else st.keep[e], st.f,
                            self.scale_arb, st.c_f, st.uniform[e], rows, prec)

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import arb, ctx

        st = self.st
        n_cols = st.flat[kind][2]
        old = ctx.prec
        ctx.prec = prec
        try:
            out = [[arb(0)] * n_cols for _ in rows]
            for e in self.groups[kind][b]:
                if kind == "dq":
                    got = self._arb(e, rows, prec).dq
                elif kind in ("dk", "dv"):
                    full = self._arb(e, None, prec)
                    src = full.dk if kind == "dk" else full.dv
                    assert src is not None
                    got = [src[j] for j in rows]
                else:
                    got = self._mask_rows(e, rows, prec)
                for n in range(len(rows)):
                    out[n] = [a + x for a, x in zip(out[n], got[n], strict=True)]
            return out
        finally:
            ctx.prec = old

    def _mask_rows(self, e: int, rows: list[int], prec: int) -> list[list[Any]]:
        """Rows of the mask gradient contributed by problem e: dS rows, summed over L
        and/or S where the mask broadcasts along them."""
        from flint import arb

        st = self.st
        bl, bs = st.mask_bcast
        L = st.q.shape[1]
        src_rows = list(range(L)) if bl else rows
        ds = self._arb(e, src_rows, prec).ds
        if bl:
            tot = [sum((ds[i][j] for i in range(L)), arb(0)) for j in range(len(ds[0]) if ds else 0)]
            ds_rows = [tot for _ in rows]
        else:
            ds_rows = ds
        if bs:
            return [[sum(r, arb(0))] for r in ds_rows]
        return ds_rows

    # -- exact decisions
    def _c_rat(self) -> Fraction | None:
        st = self.st
        if st.scale is not None:
            return st.scale
        if st.E == 0:
            return Fraction(0)
        rt = math.isqrt(st.E)
        return Fraction(1, rt) if rt * rt == st.E else None

    def _exact(self, e: int) -> ExactProblem:
        got = self._exact_problems.get(e)
        if got is None:
            st = self.st
            got = ExactProblem(
                self.fld, IntMatrix.of_doubles(st.q[e]), IntMatrix.of_doubles(st.k[e]),
                IntMatrix.of_doubles(st.v[e]), IntMatrix.of_doubles(st.do[e]), st.allowed[e],
                None if st.madd is None else st.madd[e], None if st.keep is None else st.keep[e],
                st.f, st.uniform[e])
            if len(self._exact_problems) > 64:
                self._exact_problems.clear()
            self._exact_problems[e] = got
        return got

    def _decomposition(self, kind: str, b: int, r: int, col: int) -> Decomposition:
        """Element (b, r, col) of ``kind`` as a constant plus row terms: the sum over
        the problems (and broadcast rows/columns) it collects."""
        key = (kind, b, r, col)
        got = self._decomp.get(key)
        if got is not None:
            return got
        st = self.st
        one = (Fraction(1), Fraction(0))
        acc = Accumulator(self.fld)
        L, S = st.allowed.shape[1:]
        for e in self.groups[kind][b]:
            ex = self._exact(e)
            if kind == "dq":
                ex.add_dq(acc, r, col, one)
            elif kind == "dk":
                ex.add_dk(acc, r, col, one)
            elif kind == "dv":
                ex.add_dv(acc, r, col, one)
            else:  # dmask
                bl, bs = st.mask_bcast
                for i in (range(L) if bl else [r]):
                    for j in (range(S) if bs else [col]):
                        ex.add_ds(acc, i, j, one)
        dec = acc.decomposition()
        if len(self._decomp) > 1 << 14:
            self._decomp.clear()
        self._decomp[key] = dec
        return dec

    def _n_cols(self, kind: str) -> int:
        return self.st.flat[kind][2]

    def _describe(self, kind: str, b: int, i: int, col: int) -> str:
        return f"{_NAMES[kind]} element (flat {b}, {i}, {col})"


_NAMES = {"dq": "grad_query", "dk": "grad_key", "dv": "grad_value", "dmask": "grad_attn_mask"}


# --------------------------------------------------------------------------------------
# The fast path over all problems, reduced to the inputs' shapes


def _reduce(kind: str, st: _Setup, vals: Arr, errs: Arr) -> tuple[Arr, Arr]:
    """Sum problem-level gradients (B, rows, cols) into the flat input (n, rows, cols):
    the float sum of n terms errs by <= γ_{n-1} Σ|terms| (H1), added to Σ bounds."""
    n_in = st.flat[kind][0]
    mp = st.maps[kind]
    if n_in == len(mp) and np.array_equal(mp, np.arange(len(mp))):
        return vals, errs
    out = np.zeros((n_in, *vals.shape[1:]))
    err = np.zeros_like(out)
    mag = np.zeros_like(out)
    np.add.at(out, mp, vals)
    np.add.at(err, mp, errs)
    np.add.at(mag, mp, np.abs(vals))
    count = int(np.bincount(mp, minlength=n_in).max()) if len(mp) else 1
    return out, (err + gamma(max(count, 1)) * mag) * UP


def _mask_reduce(st: _Setup, ds: Arr, e_ds: Arr) -> tuple[Arr, Arr]:
    bl, bs = st.mask_bcast
    n_terms = 1
    mag = np.abs(ds)
    for axis, flag in ((1, bl), (2, bs)):
        if flag:
            n_terms *= ds.shape[axis]
            ds = ds.sum(axis=axis, keepdims=True)
            e_ds = e_ds.sum(axis=axis, keepdims=True)
            mag = mag.sum(axis=axis, keepdims=True)
    if n_terms > 1:
        # nested sums of n_terms terms: γ_{n-1} Σ|terms|; the bound sums themselves are
        # sums of nonnegative terms (H2)
        e_ds = (e_ds + gamma(n_terms) * mag) / (1.0 - gamma(n_terms)) * UP
    return _reduce("dmask", st, ds, e_ds)


def reference_attention_backward(
    query: Any, key: Any, value: Any, grad_output: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left",
    masked_rows: str = "zero", dropout_p: float = 0.0, dropout_mask: Any = None,
) -> AttentionGradients:
    """Certified gradients of scaled dot-product attention of the exact inputs.

    The gradients of Σ grad_output ∘ attention(query, key, value) — what
    ``torch.autograd.grad(out, (q, k, v), grad_output)`` computes — with the
    options of :func:`mha_symbolic.reference_attention` (``attn_mask``,
    ``is_causal``, ``scale``, ``enable_gqa``, ``causal_alignment``), and:

    * ``grad_output``: shaped like the output (..., H_q, L, E_v);
    * ``masked_rows``: rows with every key masked — "zero" (their output is 0 and
      its gradient 0), "nan" (NaN in dq for the row, and in dk, dv and the mask
      gradient of everything the row touches, as autograd propagates a NaN
      softmax), "error" (InputValueError), "uniform" (JAX: weights 1/S, output the
      mean of the values; dq 0, dv gets grad_output/S);
    * ``dropout_p``, ``dropout_mask``: output ((softmax ∘ keep)/(1 − p))·V with the
      bool keep-mask the kernel used (True = kept); the factor 1/(1 − p) is exact.

    Returns :class:`AttentionGradients` with ``dq``, ``dk``, ``dv`` shaped like
    query, key, value (summed over broadcast dimensions and, with GQA, over the
    query heads of each key/value head), and ``d_attn_mask`` for a float mask.

    >>> import numpy as np
    >>> q = np.array([[1.0, 0.0], [0.0, 1.0]]); k = q.copy()
    >>> v = np.array([[1.0, 2.0], [3.0, 4.0]]); do = np.ones((2, 2))
    >>> g = reference_attention_backward(q, k, v, do, scale=0.0)
    >>> g.dv.rounded("float32").tolist()   # each key gets 1/2 of every row's dO
    [[1.0, 1.0], [1.0, 1.0]]
    >>> g.dq.rounded("float32").tolist()   # scale 0: scores do not depend on q
    [[0.0, 0.0], [0.0, 0.0]]
    """
    st = _setup(query, key, value, grad_output, attn_mask, is_causal, scale, enable_gqa,
                causal_alignment, masked_rows, dropout_p, dropout_mask)
    B, L, E = st.q.shape
    S, Ev = st.k.shape[1], st.v.shape[2]
    dq = np.zeros((B, L, E))
    e_dq = np.zeros((B, L, E))
    dk = np.zeros((B, S, E))
    e_dk = np.zeros((B, S, E))
    dv = np.zeros((B, S, Ev))
    e_dv = np.zeros((B, S, Ev))
    want_mask = st.madd is not None
    ds = np.zeros((B, L, S)) if want_mask else None
    e_ds = np.zeros((B, L, S)) if want_mask else None
    row_ok = np.ones((B, L), dtype=bool)
    all_ok = np.ones(B, dtype=bool)
    f_f = float(st.f)
    rho_f = 0.0 if Fraction(f_f) == st.f else U * f_f * UP
    if B and L and S:
        step = max(1, CHUNK_ELEMS // max(1, L * S))
        for start in range(0, B, step):
            sl = slice(start, min(B, start + step))
            fg = fast_attention_backward(
                st.q[sl], None, st.k[sl], None, st.v[sl], None, st.do[sl], None,
                st.allowed[sl], None if st.madd is None else st.madd[sl], st.c_f, st.rho_c,
                None if st.keep is None else st.keep[sl], f_f, rho_f, st.uniform[sl])
            dq[sl], e_dq[sl], dk[sl], e_dk[sl] = fg.dq, fg.e_dq, fg.dk, fg.e_dk
            dv[sl], e_dv[sl] = fg.dv, fg.e_dv
            row_ok[sl], all_ok[sl] = fg.row_ok, fg.all_ok
            if want_mask:
                assert ds is not None and e_ds is not None
                ds[sl], e_ds[sl] = fg.ds, fg.e_ds
    # structural zeros: exactly 0, whatever the fast path's floor says
    has_key = ~st.empty
    live_k = np.any(st.allowed & ~st.uniform[..., None], axis=1)            # (B, S)
    w_any = st.allowed | st.uniform[..., None]
    if st.keep is not None:
        w_any = w_any & st.keep
    live_v = np.any(w_any, axis=1)
    if st.c_f == 0.0 and st.rho_c == 0.0:  # scale 0: dQ = c·dS K = 0 and dK = 0 exactly
        live_q, live_k = np.zeros_like(has_key), np.zeros_like(live_k)
    else:
        live_q = has_key
    for arr, err, live in ((dq, e_dq, live_q), (dk, e_dk, live_k),
                           (dv, e_dv, live_v)):
        arr[~live] = 0.0
        err[~live] = 0.0

    problem = _BackwardProblem(st)
    results: dict[str, Enclosure] = {}
    parts: list[tuple[str, Arr, Arr, Arr, Arr]] = [
        ("dq", dq, e_dq, row_ok, live_q),
        ("dk", dk, e_dk, np.broadcast_to(all_ok[:, None], (B, S)), live_k),
        ("dv", dv, e_dv, np.broadcast_to(all_ok[:, None], (B, S)), live_v),
    ]
    for kind, vals, errs, ok_e, live in parts:
        n_in, n_rows, _ = st.flat[kind]
        mp = st.maps[kind]
        mid, err = _reduce(kind, st, vals, errs)
        ok = np.ones((n_in, n_rows), dtype=bool)
        np.logical_and.at(ok, mp, ok_e)
        any_live = np.zeros((n_in, n_rows), dtype=bool)
        np.logical_or.at(any_live, mp, live)
        zero_rows = ~any_live
        nan_rows = np.zeros((n_in, n_rows), dtype=bool)
        if st.policy == "nan":
            if kind == "dq":
                np.logical_or.at(nan_rows, mp, st.empty)
            else:
                np.logical_or.at(nan_rows, mp, np.broadcast_to(np.asarray(st.empty.any(axis=1))[:, None],
                                                               (B, n_rows)))
        zero_rows &= ~nan_rows
        ok &= np.all(np.isfinite(mid) & np.isfinite(err), axis=-1)
        results[kind] = Enclosure(problem, kind, st.shapes[kind], mid, err, ok, zero_rows,
                                  nan_rows)
    d_mask = None
    if want_mask:
        assert ds is not None and e_ds is not None
        n_in, n_rows, n_cols = st.flat["dmask"]
        mp = st.maps["dmask"]
        bl, bs = st.mask_bcast
        mid, err = _mask_reduce(st, ds, e_ds)
        ok_src = np.all(row_ok, axis=1, keepdims=True) if bl else row_ok
        ok = np.ones((n_in, n_rows), dtype=bool)
        np.logical_and.at(ok, mp, ok_src)
        live_src = np.any(st.allowed & ~st.uniform[..., None], axis=(1, 2) if bl else 2)
        live_src = live_src[:, None] if bl else live_src
        any_live = np.zeros((n_in, n_rows), dtype=bool)
        np.logical_or.at(any_live, mp, live_src)
        nan_rows = np.zeros((n_in, n_rows), dtype=bool)
        if st.policy == "nan":
            np.logical_or.at(nan_rows, mp, st.empty.any(axis=1, keepdims=True) if bl
                             else st.empty)
        ok &= np.all(np.isfinite(mid) & np.isfinite(err), axis=-1)
        if not bs:
            live_el = np.zeros((n_in, n_rows, n_cols), dtype=bool)
            src: Arr = st.allowed & ~st.uniform[..., None]
            if bl:
                src = np.asarray(src.any(axis=1, keepdims=True))
            np.logical_or.at(live_el, mp, src)
            mid = np.where(live_el, mid, 0.0)
            err = np.where(live_el, err, 0.0)
        d_mask = Enclosure(problem, "dmask", st.shapes["dmask"], mid, err, ok,
                           ~any_live & ~nan_rows, nan_rows)
    return AttentionGradients(results["dq"], results["dk"], results["dv"], d_mask)
