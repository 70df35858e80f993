"""Certified gradients of scaled dot-product attention:
:func:`reference_attention_backward`.

The gradients are those of the scalar Σ grad_output ∘ output with respect to
query, key, value (and a float ``attn_mask``), for the exact inputs; the method
mirrors the forward's three tiers (docs/gradients.md §2):

1. :mod:`.fast` computes every gradient in float64 with a proved elementwise
   bound, one problem (batch × head) and one block of query rows at a time.
2. An element whose enclosure does not round to one value is refined in
   double-double (:mod:`.dd`, about 2**-80): a dQ or mask element needs its own
   row, a dK or dV element its key column (and the row statistics of its problem,
   computed once).
3. What is still undecided goes to Arb at rising precision (:mod:`.arb`, Ziv's
   loop in :class:`..enclosure.Enclosure`), again by rows and key columns, and
   from 256 bits to the exact decisions of :mod:`.exact` (Lindemann–Weierstrass).

Broadcasting and GQA follow autograd: a gradient is summed over every copy of its
input, i.e. over broadcast leading dimensions and over the query heads of a
key/value head's group (``enable_gqa``: query head g uses kv head g // (H_q/H_kv)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np

from ...errors import ShapeError, SpecError
from ..arith.balls import exact_prec, scale_arb, to_arb_mat
from ..arith.formats import FloatFormat
from ..conventions import (
    POLICIES,
    Block,
    DDScale,
    ScoreModel,
    check_dropout,
    check_options,
    check_sdpa_inputs,
    dd_scale,
    exact_scale,
    masked_rows_of,
    rational_scale,
    read_mask,
)
from ..enclosure import Enclosure, Problem
from ..forward.attention import Stack, dropout_dd, dropout_f
from ..inputs import as_exact_array, to_float64, validate_finite
from ..progress import Progress, expected_seconds
from .arb import arb_backward, exact_scores
from .arb_columns import ColumnProblem, ColumnTier3
from .dd import DDSum, HeadTier2
from .enclosures import _Deferred, _Flat, _GradEnclosure, _mask_part
from .exact import Accumulator, Decomposition, ExactDecisions, ExactProblem, IntMatrix, QField
from .fast import tier1_backward, tier1_structure
from .functionals import ScoreFunctional, arb_part, dd_part, exact_part, tier1_part

__all__ = ["POLICIES", "AttentionGradients", "plain_attention_backward"]

KINDS = ("dq", "dk", "dv", "dmask")
KV_BUDGET = 1 << 26  # bytes of tier-2 key/value slices kept across the gradients' roundings

Arr = np.ndarray[Any, Any]


class AttentionGradients:
    """The certified gradients: ``dq``, ``dk``, ``dv`` (each an
    :class:`~mha_symbolic.oracle.enclosure.Enclosure` shaped like its input:
    ``lower``, ``upper``, ``midpoint``, ``rounded(dtype)``, ``exact(index)``) and
    ``d_attn_mask`` (an Enclosure shaped like a float ``attn_mask``, else None);
    with variants also ``d_sinks``, ``d_alibi_slopes`` and ``d_score_mod`` (else
    None).  Unpacks as ``dq, dk, dv = grads``."""

    def __init__(self, dq: Enclosure, dk: Enclosure, dv: Enclosure,
                 d_attn_mask: Enclosure | None, *, d_sinks: Any = None,
                 d_alibi_slopes: Any = None, d_score_mod: tuple[Any, ...] | None = None
                 ) -> None:
        self.dq, self.dk, self.dv, self.d_attn_mask = dq, dk, dv, d_attn_mask
        #: variants (docs/variants.md, "Gradients"): the sink logits (H,), the ALiBi
        #: slopes' shape, one entry per score_mod item (a bias table's or ALiBi slopes'
        #: gradient, None for a softcap)
        self.d_sinks, self.d_alibi_slopes, self.d_score_mod = d_sinks, d_alibi_slopes, d_score_mod

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
    """The problems (flat over the batch shape, GQA heads mapped without copies), the
    score model, the scale and dropout factor, and the maps from a problem to the
    flat index of each input it came from."""

    stack: Stack
    do: Arr                  # (*batch, L, Ev) float64
    model: ScoreModel
    batch: tuple[int, ...]
    L: int
    S: int
    E: int
    Ev: int
    scale: Fraction | None   # exact rational scale, None for 1/sqrt(E)
    c_f: float
    rho_c: float
    cs: DDScale
    f: Fraction              # exact dropout factor 1/(1 - p) (1 without dropout)
    policy: str
    empty: Arr               # (B, L) rows with no allowed key
    uniform: Arr             # (B, L) empty rows under "uniform"
    maps: dict[str, Arr]     # kind -> (B,) flat input index
    flat: dict[str, tuple[int, int, int]]   # flat (n, rows, cols) of each gradient
    shapes: dict[str, tuple[int, ...]]      # user shape of each gradient
    mask_bcast: tuple[bool, bool]           # the float mask broadcasts along (L, S)
    hooks: Any = None        # a transformed score's hooks (transformed_backward.py)
    functionals: dict[str, ScoreFunctional] = field(default_factory=dict)

    @property
    def B(self) -> int:
        return math.prod(self.batch)

    def inputs(self, e: int) -> tuple[Arr, Arr, Arr, Arr]:
        """q (L, E), k (S, E), v (S, Ev), do (L, Ev) of problem e (contiguous float64)."""
        q, k, v, _ = self.stack.qkv(e)
        idx = tuple(int(x) for x in np.unravel_index(e, self.batch)) if self.batch else ()
        return (np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                np.ascontiguousarray(self.do[idx]))

    def block(self, e: int, rows: Any) -> Block:
        return self.model.block(e, rows)

    def dense(self, e: int) -> tuple[Arr, Arr | None, Arr | None, Arr]:
        """allowed (L, S), madd, keep (L, S) or None, uniform (L,) of problem e,
        materialised (for the exact decisions of one problem)."""
        blk = self.block(e, slice(0, self.L))
        allowed = np.ones((self.L, self.S), dtype=bool) if blk.allowed is None else blk.allowed
        return allowed, blk.madd, blk.keep, self.uniform[e]

    @property
    def fac(self) -> tuple[float, float, float] | None:
        return dropout_dd(self.model.dropout_factor)


def _index_map(lead: tuple[int, ...], batch: tuple[int, ...], gqa_rep: int = 1) -> Arr:
    """For every problem (flat over ``batch``), the flat index of the input whose
    leading shape is ``lead`` (heads repeated ``gqa_rep`` times, repeat_interleave)."""
    idx = np.arange(math.prod(lead), dtype=np.int64).reshape(lead)
    if gqa_rep > 1:
        idx = np.repeat(idx, gqa_rep, axis=-1)
    return np.broadcast_to(idx, batch).reshape(-1).copy()


def _setup(query: Any, key: Any, value: Any, grad_output: Any, attn_mask: Any,
           is_causal: bool, scale: Any, enable_gqa: bool, causal_alignment: str,
           masked_rows: str, dropout_p: Any, dropout_mask: Any, hooks: Any = None,
           functionals: tuple[ScoreFunctional, ...] = (), mask_grad: bool = True) -> _Setup:
    # the forward's checks (conventions.check_*): the same messages, the same rules
    check_options(masked_rows, causal_alignment)
    p_drop = check_dropout(dropout_p, dropout_mask)
    q, k, v, batch, rep = check_sdpa_inputs(query, key, value, enable_gqa)
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    do = as_exact_array(grad_output, "grad_output")
    if do.dtype == bool:
        raise SpecError("grad_output.dtype=bool: expected a float array")
    validate_finite(do, "grad_output")
    if do.shape != (*batch, L, Ev):
        raise ShapeError(f"grad_output.shape={do.shape} does not match the attention output's "
                         f"shape {(*batch, L, Ev)}")
    scale_exact, c_f, rho_c = exact_scale(scale, E)
    model = ScoreModel(batch, L, S, attn_mask=attn_mask, is_causal=is_causal,
                       causal_alignment=causal_alignment, policy=masked_rows,
                       dropout_mask=dropout_mask, dropout_p=p_drop)
    B = math.prod(batch)
    empty = model.empty_rows()
    uniform: Arr = masked_rows_of(masked_rows, empty, S, batch).uniform
    stack = Stack(to_float64(q), to_float64(k), to_float64(v), batch, rep)
    f = model.dropout_factor if model.dropout_factor is not None else Fraction(1)
    maps = {"dq": _index_map(q.shape[:-2], batch), "dk": _index_map(k.shape[:-2], batch, rep),
            "dv": _index_map(v.shape[:-2], batch, rep)}
    flat = {"dq": (math.prod(q.shape[:-2]), L, E), "dk": (math.prod(k.shape[:-2]), S, E),
            "dv": (math.prod(v.shape[:-2]), S, Ev)}
    shapes = {"dq": q.shape, "dk": k.shape, "dv": v.shape}
    bc = (False, False)
    if model._float is not None and mask_grad:
        m = read_mask(attn_mask, "attn_mask")
        m2 = (1,) * max(0, 2 - m.ndim) + tuple(m.shape)
        mlead = m2[:-2]
        maps["dmask"] = _index_map(mlead, batch)
        flat["dmask"] = (math.prod(mlead), m2[-2], m2[-1])
        shapes["dmask"] = tuple(m.shape)
        bc = (m2[-2] == 1 and L != 1, m2[-1] == 1 and S != 1)
        flat["dmask"] = (flat["dmask"][0], 1 if bc[0] else L, 1 if bc[1] else S)
    fns: dict[str, ScoreFunctional] = {}
    for n_fn, fn in enumerate(functionals):
        kind = f"fn{n_fn}"
        fns[kind] = fn
        maps[kind] = np.asarray(fn.target, dtype=np.int64)
        flat[kind] = (fn.n, fn.R, fn.C)
        shapes[kind] = fn.shape
    del B
    return _Setup(stack, to_float64(do), model, batch, L, S, E, Ev, scale_exact, c_f, rho_c,
                  dd_scale(scale_exact, E), f, masked_rows, empty, uniform, maps, flat, shapes, bc,
                  hooks, fns)


# --------------------------------------------------------------------------------------
# The problem behind the four Enclosures: tier 2, Arb rows and exact decisions


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
        self._t2: dict[int, HeadTier2] = {}
        self._t2_recent: list[int] = []
        self._exact_problems: dict[int, ExactProblem] = {}
        self.encs: dict[str, Enclosure] = {}   # the gradients' Enclosures (set by the API)
        self._fmt: str | None = None
        self._fmt_obj: FloatFormat | None = None
        self._cand: dict[str, Arr] = {}
        self._decomp: dict[tuple[str, int, int, int], Decomposition] = {}
        self.fld = QField(rational_scale(st.scale, st.E), st.E)
        if st.hooks is not None:
            self.fld = st.hooks.field(self.fld)
        self._columns = ColumnTier3(self._column_problem, self._t2.get)

    # -- tier 2
    def _head(self, e: int) -> HeadTier2:
        """The tier-2 state of problem e: its row statistics are kept (O(L)); the sliced
        keys and values (about 12·S·(E + Ev) doubles) for the most recent problems
        within KV_BUDGET bytes."""
        got = self._t2.get(e)
        if got is None:
            st = self.st
            q, k, v, do = st.inputs(e)
            sc_hook, f_hook = (None, None) if st.hooks is None else st.hooks.tier2(e)
            got = HeadTier2(q, k, v, do, partial(st.block, e), st.cs, st.fac,
                            scores=sc_hook, factor=f_hook)
            self._t2[e] = got
        if e in self._t2_recent:
            self._t2_recent.remove(e)
        self._t2_recent.append(e)
        st = self.st
        keep = max(2, KV_BUDGET // max(1, 96 * st.S * (st.E + st.Ev)))
        while len(self._t2_recent) > keep:
            self._t2[self._t2_recent.pop(0)]._kv = None
        return got

    def hint(self, fmt: FloatFormat) -> None:
        """The format being rounded: the key rows of dK and dV that tier 1 leaves
        undecided in it are the columns the second tier will be asked for, so the
        statistics pass of each problem (run for dQ first) forms them at once."""
        if self._fmt == fmt.name:
            return
        self._fmt = fmt.name
        self._fmt_obj = fmt
        self._cand = {}
        for kind in ("dk", "dv"):
            enc = self.encs.get(kind)
            if enc is None:
                continue
            decided, _ = enc._first_test(fmt)
            self._cand[kind] = (~decided.all(axis=-1) & (enc._tier == 1) & ~enc._zero_rows
                                & ~enc._nan_rows)

    def _columns_for(self, e: int) -> dict[str, Arr]:
        return {kind: np.flatnonzero(und[int(self.st.maps[kind][e])])
                for kind, und in self._cand.items()}

    def refine(self, b: int, rows: Arr, kind: str) -> tuple[Arr, Arr, Arr, Arr] | None:
        st = self.st
        n_cols = st.flat[kind][2]
        acc = DDSum()
        ok = np.ones(rows.size, dtype=bool)
        for e in self.groups[kind][b]:
            head = self._head(e)
            if kind == "dq":
                h, lo, err, okr = head.rows(rows, "dq", self._columns_for(e))
            elif kind in ("dk", "dv"):
                h, lo, err, ok_all = head.columns(rows, kind)
                okr = np.full(rows.size, ok_all)
            elif kind in st.functionals:
                fn = st.functionals[kind]
                src = rows if fn.rowwise else np.arange(st.L)
                h, lo, err, okr = dd_part(fn, e, head.rows(src, "ds"), rows)
                if not fn.rowwise:
                    h, lo, err, okr = (np.repeat(a, rows.size, axis=0) for a in (h, lo, err, okr))
            else:
                h, lo, err, okr = self._mask_rows_dd(head, rows)
            acc.add(h, lo, err)
            ok &= okr
        h, lo, err = acc.result((rows.size, n_cols))
        ok &= np.all(np.isfinite(h) & np.isfinite(err), axis=-1)
        return h, lo, err, ok

    def _mask_rows_dd(self, head: HeadTier2, rows: Arr) -> tuple[Arr, Arr, Arr, Arr]:
        """Rows of the mask gradient contributed by one problem: dS rows, summed over L
        and/or S where the mask broadcasts along them (DDSum over the copies)."""
        bl, bs = self.st.mask_bcast
        L = self.st.L
        src = np.arange(L) if bl else rows
        h, lo, err, ok = head.rows(src, "ds")
        if bl:
            acc = DDSum()
            for i in range(L):
                acc.add(h[i:i + 1], lo[i:i + 1], err[i:i + 1])
            h, lo, err = acc.result((1, h.shape[1]))
            ok = np.full(1, bool(ok.all()))
            h, lo, err, ok = (np.repeat(a, rows.size, axis=0) for a in (h, lo, err, ok))
        if bs:
            acc = DDSum()
            for j in range(h.shape[1]):
                acc.add(h[:, j:j + 1], lo[:, j:j + 1], err[:, j:j + 1])
            h, lo, err = acc.result((h.shape[0], 1))
        return h, lo, err, ok

    # -- tier 3
    def scale_arb(self) -> Any:
        return scale_arb(self.st.scale, self.st.E)

    def _arb(self, e: int, rows: list[int], keys: list[int] | None, prec: int) -> Any:
        st = self.st
        q, k, v, do = st.inputs(e)
        tr = None
        if st.hooks is not None:
            g: list[list[Any]] = [[] for _ in rows]
            g_prec = 0
            tr = partial(st.hooks.arb, e, rows)
        km = to_arb_mat(k)
        if tr is None:
            g, g_prec = exact_scores(q[rows], k, st.E, km)
        # rows only (dQ, dS): Q is not read and of dO only the rows (each exact
        # conversion of a whole (L, E) matrix costs ~15 ms at L = 1024)
        qm = to_arb_mat(q) if keys is not None else None
        dom = to_arb_mat(do) if keys is not None else to_arb_mat(np.ascontiguousarray(do[rows]))
        return arb_backward(g, g_prec, qm, km, to_arb_mat(v), dom,
                            st.block(e, np.asarray(rows, dtype=np.int64)), rows,
                            st.scale, st.E, st.f, prec, keys, transformed=tr,
                            dom_rows=keys is None)

    def _column_problem(self, e: int) -> ColumnProblem | None:
        """Problem e for the key-column path of dK and dV (:mod:`.arb_columns`); None
        with a transformed score (its hooks replace the scores)."""
        st = self.st
        if st.hooks is not None:
            return None
        q, k, v, do = st.inputs(e)
        return ColumnProblem(q, k, v, do, st.block(e, np.arange(st.L)), st.scale, st.E, st.f,
                             exact_prec(q, k, st.E))

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import arb, ctx

        st = self.st
        n_cols = st.flat[kind][2]
        old = ctx.prec
        ctx.prec = prec
        try:
            if kind in ("dk", "dv"):  # by key columns (None: transformed or huge scores)
                got_c = self._columns.summed(self.groups[kind][b], rows, prec, kind,
                                             self._fmt_obj, cols)
                if got_c is not None:
                    return got_c
            out = [[arb(0)] * n_cols for _ in rows]
            for e in self.groups[kind][b]:
                if kind == "dq":
                    got = self._arb(e, rows, None, prec).dq
                elif kind in ("dk", "dv"):
                    res = self._arb(e, list(range(st.L)), rows, prec)
                    got = res.dk if kind == "dk" else res.dv
                elif kind in st.functionals:
                    fn = st.functionals[kind]
                    src = rows if fn.rowwise else list(range(st.L))
                    got = arb_part(fn, e, self._arb(e, src, None, prec).ds, rows)
                    if not fn.rowwise:
                        got = got * len(rows)
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
        L = st.L
        src_rows = list(range(L)) if bl else rows
        ds = self._arb(e, src_rows, None, prec).ds
        if bl:
            tot = [sum((ds[i][j] for i in range(L)), arb(0)) for j in range(len(ds[0]) if ds else 0)]
            ds_rows = [tot for _ in rows]
        else:
            ds_rows = ds
        if bs:
            return [[sum(r, arb(0))] for r in ds_rows]
        return ds_rows

    # -- exact decisions
    def _exact(self, e: int) -> ExactProblem:
        got = self._exact_problems.get(e)
        if got is None:
            st = self.st
            q, k, v, do = st.inputs(e)
            allowed, madd, keep, uniform = st.dense(e)
            make = ExactProblem if st.hooks is None else partial(st.hooks.exact, e)
            got = make(self.fld, IntMatrix.of_doubles(q), IntMatrix.of_doubles(k),
                       IntMatrix.of_doubles(v), IntMatrix.of_doubles(do), allowed, madd,
                       keep, st.f, uniform)
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
        L, S = st.L, st.S
        for e in self.groups[kind][b]:
            ex = self._exact(e)
            if kind == "dq":
                ex.add_dq(acc, r, col, one)
            elif kind == "dk":
                ex.add_dk(acc, r, col, one)
            elif kind == "dv":
                ex.add_dv(acc, r, col, one)
            elif kind in st.functionals:
                exact_part(st.functionals[kind], e, ex, acc, r, col, L)
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
        name = self.st.functionals[kind].name if kind in self.st.functionals else _NAMES[kind]
        return f"{name} element (flat {b}, {i}, {col})"


_NAMES = {"dq": "grad_query", "dk": "grad_key", "dv": "grad_value", "dmask": "grad_attn_mask"}


# --------------------------------------------------------------------------------------
# Tier 1 over all problems, summed into the inputs' shapes


def plain_attention_backward(
    query: Any, key: Any, value: Any, grad_output: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left",
    masked_rows: str = "zero", dropout_p: float = 0.0, dropout_mask: Any = None,
    progress: bool | None = None,
) -> AttentionGradients:
    """Certified gradients of plain scaled dot-product attention (no variant): the
    tiers' driver behind :func:`mha_symbolic.reference_attention_backward`
    (:mod:`..api`), which routes calls with variants to :mod:`..variants.backward`."""
    st = _setup(query, key, value, grad_output, attn_mask, is_causal, scale, enable_gqa,
                causal_alignment, masked_rows, dropout_p, dropout_mask)
    res = _deferred_gradients(st, progress) or _gradients(st, progress)
    return AttentionGradients(res["dq"], res["dk"], res["dv"], res.get("dmask"))


def backward_enclosures(
    query: Any, key: Any, value: Any, grad_output: Any, *, attn_mask: Any = None,
    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
    causal_alignment: str = "top_left", masked_rows: str = "zero", progress: bool | None = None,
    hooks: Any = None, functionals: tuple[ScoreFunctional, ...] = (), mask_grad: bool = True,
) -> dict[str, Enclosure]:
    """The gradients' Enclosures of a problem given by its hooks (variants): "dq", "dk",
    "dv", "dmask" (a float ``attn_mask``, unless ``mask_grad`` is False) and "fn<n>"
    for ``functionals[n]``.  ``hooks`` (a transformed score,
    :mod:`..transformed_backward`) replace the scores q·k + mask in every tier; the
    mask then only says which keys are allowed."""
    st = _setup(query, key, value, grad_output, attn_mask, is_causal, scale, enable_gqa,
                causal_alignment, masked_rows, 0.0, None, hooks, functionals, mask_grad)
    return _gradients(st, progress)


def _flats(st: _Setup, kinds: Any) -> dict[str, _Flat]:
    return {kind: _Flat(*st.flat[kind], single=bool(
        np.array_equal(np.sort(st.maps[kind]), np.arange(st.flat[kind][0]))))
        for kind in kinds}


def _progress_of(st: _Setup, progress: bool | None) -> Progress:
    return Progress(progress, expected_seconds(
        3 * st.B * st.L * st.S * max(1, (st.E + st.Ev) // 64), "tier1"))


def _deferred_gradients(st: _Setup, progress: bool | None) -> dict[str, Enclosure] | None:
    """The Enclosures of a plain call (dq, dk, dv; no mask gradient, no hooks) with tier 1
    deferred (:class:`_Deferred`), or None where the call does not qualify."""
    if st.hooks is not None or st.functionals or "dmask" in st.maps or not (
            st.B and st.L and st.S):
        return None
    outs = _flats(st, ("dq", "dk", "dv"))
    scale_zero = st.c_f == 0.0 and st.rho_c == 0.0
    for e in range(st.B):
        # the zero and NaN rows exactly as _gradients forms them from tier 1's flags
        empty = st.empty[e]
        nan_row = empty & (st.policy == "nan")
        nan_all = np.full(st.S, bool(nan_row.any()))
        live_rows, live_k, live_v = tier1_structure(partial(st.block, e), st.L, st.S)
        live_q = ~empty & (not scale_zero) & live_rows
        for kind, live, nan in (("dq", live_q, nan_row), ("dk", live_k & (not scale_zero), nan_all),
                                ("dv", live_v, nan_all)):
            t = int(st.maps[kind][e])
            outs[kind].live[t] |= live
            outs[kind].nan[t] |= nan
    problem = _BackwardProblem(st)
    res = {kind: outs[kind].placeholder(problem, kind, st.shapes[kind]) for kind in outs}
    problem.encs = res
    later = _Deferred(st, progress, res, _tier1)
    prog = _progress_of(st, progress)
    for enc in res.values():
        assert isinstance(enc, _GradEnclosure)
        enc._deferred = later
        enc._progress = prog if prog.enabled else None
    return res


def _gradients(st: _Setup, progress: bool | None) -> dict[str, Enclosure]:
    """Tier 1 over every problem, summed into the gradients' shapes: the Enclosures."""
    outs, prog = _tier1(st, progress)
    problem = _BackwardProblem(st)
    res = {kind: outs[kind].enclosure(problem, kind, st.shapes[kind]) for kind in outs}
    problem.encs = res
    for enc in res.values():
        enc._progress = prog if prog.enabled else None
    return res


def _tier1(st: _Setup, progress: bool | None) -> tuple[dict[str, _Flat], Progress]:
    """Tier 1 over every problem, summed into the gradients' shapes (:class:`_Flat`)."""
    B, L, S, E, Ev = st.B, st.L, st.S, st.E, st.Ev
    want_mask = "dmask" in st.maps
    want_ds = want_mask or bool(st.functionals)
    outs = _flats(st, st.maps)
    f_f, rho_f = dropout_f(st.model.dropout_factor)
    scale_zero = st.c_f == 0.0 and st.rho_c == 0.0  # dQ = c·dS K = 0 and dK = 0 exactly
    prog = _progress_of(st, progress)
    bar = prog.bar(B, "certified gradients") if B and L and S else None
    bl, bs = st.mask_bcast
    for e in range(B):
        empty = st.empty[e]
        nan_row = empty & (st.policy == "nan")
        nan_all = np.full(S, bool(nan_row.any()))
        if L and S:
            q, k, v, do = st.inputs(e)
            w_hook, f_hook = (None, None) if st.hooks is None else st.hooks.tier1(e)
            hg = tier1_backward(q, k, v, do, partial(st.block, e), st.c_f,
                                st.rho_c, f_f, rho_f, want_ds=want_ds, weights=w_hook,
                                factor=f_hook)
            live_q = ~empty & (not scale_zero)
            if hg.live_rows is not None:
                live_q = live_q & hg.live_rows
            live_k = hg.live_k & (not scale_zero)
            parts = {"dq": (hg.dq, hg.e_dq, hg.row_ok, live_q, nan_row),
                     "dk": (hg.dk, hg.e_dk, np.full(S, hg.all_ok), live_k, nan_all),
                     "dv": (hg.dv, hg.e_dv, np.full(S, hg.all_ok), hg.live_v, nan_all)}
            for kind, (val, err, ok, live, nan) in parts.items():
                outs[kind].add(int(st.maps[kind][e]), val, err, ok, live, nan)
            if want_mask:
                assert hg.ds is not None and hg.e_ds is not None
                ds, e_ds = _mask_part(hg.ds, hg.e_ds, bl, bs)
                live_rows = (~empty & ~st.uniform[e]) if not bl else np.asarray(
                    [bool((~empty & ~st.uniform[e]).any())])
                ok_rows = hg.row_ok if not bl else np.asarray([bool(hg.row_ok.all())])
                nan_m = nan_row if not bl else np.asarray([bool(nan_row.any())])
                outs["dmask"].add(int(st.maps["dmask"][e]), ds, e_ds, ok_rows, live_rows, nan_m)
            for kind, fn in st.functionals.items():
                assert hg.ds is not None and hg.e_ds is not None
                live_r = ~empty & ~st.uniform[e]
                val, err, live = tier1_part(fn, e, hg.ds, hg.e_ds, live_r)
                if fn.rowwise:
                    ok_f, live_f, nan_f = hg.row_ok, np.asarray(live.any(axis=-1)), nan_row
                else:
                    ok_f = np.asarray([bool(hg.row_ok.all())])
                    live_f = np.asarray([bool(live.any())])
                    nan_f = np.asarray([bool(nan_row.any())])
                outs[kind].add(int(st.maps[kind][e]), val, err, ok_f, live_f, nan_f)
        else:
            zq, zk = np.zeros((L, E)), np.zeros((S, E))
            outs["dq"].add(int(st.maps["dq"][e]), zq, zq, np.ones(L, bool), np.zeros(L, bool),
                           nan_row)
            outs["dk"].add(int(st.maps["dk"][e]), zk, zk, np.ones(S, bool), np.zeros(S, bool),
                           nan_all)
            zv = np.zeros((S, Ev))
            outs["dv"].add(int(st.maps["dv"][e]), zv, zv, np.ones(S, bool), np.zeros(S, bool),
                           nan_all)
            for kind, fn in st.functionals.items():
                zf = np.zeros((fn.R, fn.C))
                outs[kind].add(int(st.maps[kind][e]), zf, zf, np.ones(fn.R, bool),
                               np.zeros(fn.R, bool),
                               nan_row if fn.rowwise else np.asarray([bool(nan_row.any())]))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return outs, prog
