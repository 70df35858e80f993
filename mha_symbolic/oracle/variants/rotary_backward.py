"""Certified gradients of attention with rotary embeddings (:mod:`.rotary`): the
``backward`` hook of the rotary variant.

With q' = R q and k' = R k (R the rotation of each row at its position: per pair
(a, b) of angle θ, x'_a = x_a cos θ - x_b sin θ, x'_b = x_b cos θ + x_a sin θ, the
other dimensions unchanged), the scores are s = c·q'·k' + masks, so by the chain rule

    dQ' = c·dS K',   dK' = c·dSᵀ Q',   dV = Pᵀ dO     (plain attention of q', k')
    dQ = Rᵀ dQ',     dK = Rᵀ dK'                       (R orthogonal per pair)

with Rᵀ per pair: y_a = x_a cos θ + x_b sin θ, y_b = x_b cos θ - x_a sin θ.  Rᵀ is
applied per flat problem, before the sums over the query heads of a GQA group and
over broadcast copies (each copy's keys sit at the same positions, so the order does
not change the value, only the bounds).

Tiers (no double-double tier, as the rotary forward):

1. q̃', k̃' rotated in float64 with proved elementwise bounds
   (:meth:`.rotary.Rotation.float_rotate`), the plain tier 1 on them with those bounds
   as input radii (:class:`..backward.fast.Radii`), then Rᵀ in float64 (:func:`_rotate_t`:
   the rounding of the rotation, the angles' own bounds, and the propagation of the
   input bound);
2. Arb: q', k' as balls rotated with Arb's angles (:meth:`.rotary.RotarySpec.arb_angles`),
   :func:`..backward.arb.arb_backward` on them, then Rᵀ with the same balls.

Structural zeros are returned exactly (never as a ball around 0, whose rounding
could not be decided): rows without an allowed key, rows with one allowed key, uniform
rows, rows whose dP is constant over the allowed keys (dO_i = 0, or equal value rows:
dS_i = 0 exactly), keys only such rows see, and a zero scale.

A float attn_mask is an additive part of the scores (exact doubles, as in the
lowering); its gradient (``d_attn_mask``) is the functional of dS of
:mod:`..backward.functionals`, in both tiers.  Variants that change the scores or add
sinks (softcap — Gemma-2 —, ALiBi, score_mod biases and tables, gpt-oss's sinks) take
:class:`_Pipeline`: s = T(c·q'·k'), the transformed backward's hooks
(:mod:`.transformed_backward`: dS⁰ = Φ∘dS) on the rotated q', k', then Rᵀ; the
gradients of the sinks, slopes and tables are functionals of dS as without rotary.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ..arith.balls import to_arb_mat
from ..arith.constants import UP
from ..backward.arb import arb_backward
from ..backward.attention import _Flat, _setup
from ..backward.fast import Radii, tier1_backward
from ..backward.functionals import arb_part, tier1_part
from ..conventions import exact_scale, masked_rows_of
from ..enclosure import Enclosure, Problem
from .transformed import TransformedProblem
from .transformed_backward import TransformHooks

__all__ = ["rotary_backward"]

Arr = np.ndarray[Any, Any]


class _Pipeline:
    """A rotated call whose scores pass through a pipeline (softcaps, biases that are
    not doubles, ALiBi, score_mod tables) or carry sinks: s_ij = T(c·q'_i·k'_j), the
    gradients those of :mod:`.transformed_backward` at q', k' (dS⁰ = Φ∘dS, dQ' =
    c·dS⁰ K', dK' = c·dS⁰ᵀ Q'), then Rᵀ.  Tier 1 runs the transformed hooks on the
    float64-rotated q̃', k̃' with their dot products' bound as ``extra``
    (:meth:`.rotary.Rotation.float_chunk`); Arb takes the weights and factors of the
    :class:`.rotary.RotaryProblem` (scores from rotated balls).  A sink is one more key
    with k' = 0 and v = 0 (never rotated: its score is σ), as without rotary."""

    def __init__(self, prep: Any, rot: Any, scale: Any, masked_rows: str) -> None:
        geo, lead = prep.geo, prep.lead
        L, S, B = geo.L, geo.S, geo.B
        qf, kf, vf, allowed, madd = prep.flat()
        q64, k64, v64, keep = prep.q64, prep.k64, prep.v64, prep.keep
        E, Ev = q64.shape[-1], v64.shape[-1]
        empty = (np.asarray(~allowed.any(axis=-1)) if prep.sinks is None
                 else np.zeros(allowed.shape[:-1], dtype=bool))
        rows = masked_rows_of(masked_rows, empty, S, lead, what="", check=False)
        uniform = None
        if rows.uniform.any():
            uniform = rows.uniform
            allowed = allowed.copy()
            allowed[uniform] = True
        scale_exact, c_f, rho_c = exact_scale(scale, E)
        args = (vf, allowed, madd, prep.ops, prep.sinks, scale_exact, E, geo, uniform)
        self.arb_problem = rot.problem(qf, kf, *args)
        qt, kt, extra = rot.float_chunk(qf, kf, range(B), allowed)
        self.hooks = TransformHooks(TransformedProblem(qt, kt, *args), c_f, rho_c, extra)
        self.S = S
        mask = keep if keep is not None else np.ones((L, S), dtype=bool)
        if prep.sinks is not None:
            k64 = np.concatenate([k64, np.zeros((*k64.shape[:-2], 1, E))], axis=-2)
            v64 = np.concatenate([v64, np.zeros((*v64.shape[:-2], 1, Ev))], axis=-2)
            mask = np.concatenate([mask, np.ones((*mask.shape[:-1], 1), dtype=bool)], axis=-1)
        self.k64, self.v64, self.mask = k64, v64, mask


def _rotate_t(rot: Any, x: Arr, ex: Arr, pos: Arr, tables: tuple[Arr, ...]
              ) -> tuple[Arr, Arr]:
    """(Rᵀx̃, bound) with |Rᵀx - Rᵀx̃| <= bound for |x - x̃| <= ex, x (n, E), pos (n,).
    Rᵀ is the rotation by -θ: float_rotate with the tables (ĉ, -ŝ) bounds the rounding
    of fl(fl(x_a ĉ) + fl(x_b ŝ)) and the angles' errors |x̃|e_c + |x̃|e_s; the input's
    bound adds |X_a c - x̃_a ĉ| <= ex_a(|ĉ| + e_c) + |x̃_a|e_c per term."""
    c, s, ec, es = tables
    y, e_round = rot.float_rotate(x, pos, (c, -s, ec, es))
    cp, sp, ecp, esp = np.abs(c[pos]), np.abs(s[pos]), ec[pos], es[pos]
    ea, eb = ex[..., rot.ia], ex[..., rot.ib]
    prop = np.array(ex, dtype=np.float64, copy=True)
    with np.errstate(over="ignore", invalid="ignore"):
        prop[..., rot.ia] = ea * (cp + ecp) + eb * (sp + esp)
        prop[..., rot.ib] = eb * (cp + ecp) + ea * (sp + esp)
        return y, (e_round + prop) * UP


def _flat_rows(allowed: Arr, v: Arr, do: Arr) -> Arr:
    """(L,) rows whose dS is exactly 0 whatever the scores: dP_ij = dO_i·v_j takes one
    value over the allowed keys (dO_i = 0, or the allowed keys' value rows equal), so
    dS_ij = P_ij(dP_ij - Σ_j' P_ij' dP_ij') = 0."""
    zero_do = ~np.any(do != 0, axis=-1)
    if v.shape[0] == 0:
        return zero_do
    _, ids = np.unique(v, axis=0, return_inverse=True)
    ids = np.asarray(ids).reshape(-1)
    big = np.iinfo(np.int64).max
    lo = np.where(allowed, ids[None, :], big).min(axis=-1)
    hi = np.where(allowed, ids[None, :], -1).max(axis=-1)
    return np.asarray(zero_do | (lo == hi) | ~allowed.any(axis=-1))


def _mask(prep: Any) -> Any:
    """The score model's mask: the kept keys, with a float attn_mask's additive part
    (-inf off the kept keys), as the lowering builds it."""
    if prep.user_madd is None:
        return prep.keep
    return prep.user_madd if prep.keep is None else np.where(prep.keep, prep.user_madd,
                                                             -np.inf)


def rotary_backward(rot: Any, opts: Any, prep: Any, grad_output: Any, *, scale: Any,
                    enable_gqa: bool, masked_rows: str, progress: bool | None = None,
                    functionals: tuple[Any, ...] = ()) -> dict[str, Enclosure]:
    """The gradients' Enclosures "dq", "dk", "dv" (and "fn<n>" for ``functionals[n]``,
    a float attn_mask's gradient) of a rotary call (``rot`` its
    :class:`.rotary.Rotation`, ``prep`` the call's :class:`.forward.Prepared`): the
    ``backward`` hook's work (module docstring)."""
    del progress
    pipe = (_Pipeline(prep, rot, scale, masked_rows) if prep.ops or prep.sinks is not None
            else None)
    k_in, v_in, mask = ((prep.k64, prep.v64, _mask(prep)) if pipe is None
                        else (pipe.k64, pipe.v64, pipe.mask))
    st = _setup(prep.q64, k_in, v_in, grad_output, mask, False, scale,
                enable_gqa, "top_left", masked_rows, 0.0, None, functionals=functionals,
                mask_grad=False)
    outs = {kind: _Flat(*st.flat[kind], single=bool(
        np.array_equal(np.sort(st.maps[kind]), np.arange(st.flat[kind][0]))))
        for kind in st.maps}
    flat_rows = {}
    for e in range(st.B):
        flat_rows[e] = _problem(st, rot, e, outs, pipe)
    problem = _RotaryBackwardProblem(st, rot, flat_rows, pipe)
    return {kind: outs[kind].enclosure(problem, kind, st.shapes[kind]) for kind in outs}


def _rotate_keys(rot: Any, x: Arr, ex: Arr, pos: Arr, tables: tuple[Arr, ...], S: int,
                 sign: int) -> tuple[Arr, Arr]:
    """Rows 0 … S-1 of x (keys) rotated by sign·θ (R, or Rᵀ with the input bound ex);
    a sink's row S (when there) passes unchanged."""
    if sign > 0:
        y, e = rot.float_rotate(x[:S], pos, tables)
    else:
        y, e = _rotate_t(rot, x[:S], ex[:S], pos, tables)
    if x.shape[0] == S:
        return y, e
    return np.concatenate([y, x[S:]]), np.concatenate([e, ex[S:]])


def _problem(st: Any, rot: Any, e: int, outs: dict[str, _Flat], pipe: _Pipeline | None
             ) -> Arr:
    """Tier 1 of problem e added to ``outs`` (module docstring, 1.; with a score
    pipeline or sinks, :class:`_Pipeline`); returns its rows whose dS is exactly 0
    (:func:`_flat_rows`)."""
    L, S, E, Ev = st.L, st.S, st.E, st.Ev
    empty = st.empty[e]
    nan_row = empty & (st.policy == "nan")
    nan_all = np.full(S, bool(nan_row.any()))
    if not (L and S):
        for kind, n, w in (("dq", L, E), ("dk", S, E), ("dv", S, Ev)):
            z = np.zeros((n, w))
            outs[kind].add(int(st.maps[kind][e]), z, z, np.ones(n, bool),
                           np.zeros(n, bool), nan_row if kind == "dq" else nan_all)
        for kind, fn in st.functionals.items():
            z = np.zeros((fn.R, fn.C))
            outs[kind].add(int(st.maps[kind][e]), z, z, np.ones(fn.R, bool),
                           np.zeros(fn.R, bool),
                           nan_row if fn.rowwise else np.asarray([bool(nan_row.any())]))
        return np.ones(L, dtype=bool)
    tables = rot.spec.float_tables(rot.npos, rot.r)
    kpos = rot.k_positions()
    q, k, v, do = st.inputs(e)
    qpos = rot.q_positions(np.array([e]))[0]
    S0 = kpos.shape[0]
    qr, eq = rot.float_rotate(q, qpos, tables)
    kr, ek = _rotate_keys(rot, k, np.zeros_like(k), kpos, tables, S0, 1)
    w_hook, f_hook = (None, None) if pipe is None else pipe.hooks.tier1(e)
    hg = tier1_backward(qr, kr, v, do, partial(st.block, e), st.c_f, st.rho_c,
                        radii=Radii(q=eq, k=ek), want_ds=bool(st.functionals),
                        weights=w_hook, factor=f_hook)
    allowed = st.dense(e)[0]
    flat = _flat_rows(allowed, v, do) | st.uniform[e]
    scale_zero = st.c_f == 0.0 and st.rho_c == 0.0
    live_q = ~empty & (not scale_zero) & ~flat
    if hg.live_rows is not None:
        live_q = live_q & hg.live_rows
    live_k = hg.live_k & (not scale_zero) & (allowed & live_q[:, None]).any(axis=0)
    dq, e_dq = _rotate_t(rot, hg.dq, hg.e_dq, qpos, tables)
    dk, e_dk = _rotate_keys(rot, hg.dk, hg.e_dk, kpos, tables, S0, -1)
    ok_q = hg.row_ok & np.all(np.isfinite(dq) & np.isfinite(e_dq), axis=-1)
    ok_k = hg.all_ok and bool(np.all(np.isfinite(dk) & np.isfinite(e_dk)))
    parts = {"dq": (dq, e_dq, ok_q, live_q, nan_row),
             "dk": (dk, e_dk, np.full(S, ok_k), live_k, nan_all),
             "dv": (hg.dv, hg.e_dv, np.full(S, hg.all_ok), hg.live_v, nan_all)}
    for kind, (val, err, ok, live, nan) in parts.items():
        outs[kind].add(int(st.maps[kind][e]), val, err, ok, live, nan)
    for kind, fn in st.functionals.items():
        # dS, as _gradients takes it; the rows whose dS is exactly 0 contribute exactly 0
        assert hg.ds is not None and hg.e_ds is not None
        ds = np.where(flat[:, None], 0.0, hg.ds)
        e_ds = np.where(flat[:, None], 0.0, hg.e_ds)
        val, err, live = tier1_part(fn, e, ds, e_ds, ~empty & ~flat)
        if fn.rowwise:
            ok_f, live_f, nan_f = hg.row_ok, np.asarray(live.any(axis=-1)), nan_row
        else:
            ok_f = np.asarray([bool(hg.row_ok.all())])
            live_f = np.asarray([bool(live.any())])
            nan_f = np.asarray([bool(nan_row.any())])
        outs[kind].add(int(st.maps[kind][e]), val, err, ok_f, live_f, nan_f)
    return flat


class _RotaryBackwardProblem(Problem):
    """The Arb tier of the rotary gradients (module docstring, 2.): ``b`` indexes the
    flat input of the gradient, ``rows`` its rows (query positions for dq, key
    positions for dk and dv), summed over the problems that share the input."""

    def __init__(self, st: Any, rot: Any, flat_rows: dict[int, Arr],
                 pipe: _Pipeline | None = None) -> None:
        self.st, self.rot, self.flat_rows, self.pipe = st, rot, flat_rows, pipe
        self.S0 = st.S if pipe is None else pipe.S   # the keys (without a sink)
        self.groups: dict[str, list[list[int]]] = {}
        for kind in st.maps:
            g: list[list[int]] = [[] for _ in range(st.flat[kind][0])]
            for e, t in enumerate(st.maps[kind].tolist()):
                g[t].append(e)
            self.groups[kind] = g
        self._balls: dict[tuple[int, int], tuple[Any, Any]] = {}

    def _rot(self, rows: list[list[Any]], pos: list[int], prec: int, sign: int
             ) -> list[list[Any]]:
        """Rows of balls rotated by sign·θ at positions ``pos`` (call inside Prec)."""
        ang = self.rot.spec.arb_angles(sorted(set(pos)), self.rot.r, prec)
        ia, ib = self.rot.ia.tolist(), self.rot.ib.tolist()
        out = []
        for row, p in zip(rows, pos, strict=True):
            row = list(row)
            cs, sn = ang[p]
            for m, (a, b) in enumerate(zip(ia, ib, strict=True)):
                xa, xb = row[a], row[b]
                if sign > 0:
                    row[a], row[b] = xa * cs[m] - xb * sn[m], xb * cs[m] + xa * sn[m]
                else:
                    row[a], row[b] = xa * cs[m] + xb * sn[m], xb * cs[m] - xa * sn[m]
            out.append(row)
        return out

    def _rotated(self, e: int, prec: int) -> tuple[Any, Any]:
        """q' (L×E) and k' (S×E) of problem e as arb_mats of rotated balls."""
        from flint import arb, arb_mat

        key = (e, prec)
        got = self._balls.get(key)
        if got is None:
            q, k, _, _ = self.st.inputs(e)
            L, S, E = q.shape[0], k.shape[0], q.shape[1]
            qpos = [int(x) for x in self.rot.q_positions(np.array([e]))[0]]
            qb = self._rot([[arb(float(x)) for x in r] for r in q], qpos, prec, 1)
            S0 = self.S0
            kb = self._rot([[arb(float(x)) for x in r] for r in k[:S0]], list(range(S0)),
                           prec, 1)
            kb += [[arb(float(x)) for x in r] for r in k[S0:]]   # a sink's 0 row
            got = (arb_mat(qb) if L and E else arb_mat(L, E),
                   arb_mat(kb) if S and E else arb_mat(S, E))
            if len(self._balls) >= 16:
                self._balls.pop(next(iter(self._balls)))
            self._balls[key] = got
        return got

    def _arb(self, e: int, rows: list[int], keys: list[int] | None, prec: int) -> Any:
        from flint import arb, arb_mat

        st = self.st
        _, _, v, do = st.inputs(e)
        qm, km = self._rotated(e, prec)
        E, S = qm.ncols(), km.nrows()
        tr = None
        if self.pipe is not None:   # weights and factors of the rotated pipeline
            g: list[list[Any]] = [[] for _ in rows]
            tr = partial(self.pipe.arb_problem.arb_weights_factor, e, rows)
        elif E and S and rows:
            sub = arb_mat([[qm[i, c] for c in range(E)] for i in rows])
            ents = (sub * km.transpose()).entries()
            g = [ents[n * S:(n + 1) * S] for n in range(len(rows))]
        else:
            g = [[arb(0)] * S for _ in rows]
        res = arb_backward(g, prec, qm, km, to_arb_mat(v), to_arb_mat(do),
                           st.block(e, np.asarray(rows, dtype=np.int64)), rows, st.scale,
                           st.E, st.f, prec, keys, transformed=tr)
        flat = self.flat_rows[e]
        res.ds = [[arb(0)] * S if flat[i] else row for i, row in zip(rows, res.ds, strict=True)]
        return res

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
                    got = self._arb(e, rows, None, prec).dq
                    pos = [int(x) for x in self.rot.q_positions(np.array([e]))[0][rows]]
                    ctx.prec = prec
                    got = self._rot(got, pos, prec, -1)
                elif kind in st.functionals:
                    fn = st.functionals[kind]
                    src = rows if fn.rowwise else list(range(st.L))
                    got = arb_part(fn, e, self._arb(e, src, None, prec).ds, rows)
                    if not fn.rowwise:
                        got = got * len(rows)
                else:
                    res = self._arb(e, list(range(st.L)), rows, prec)
                    got = res.dv
                    if kind == "dk":
                        ctx.prec = prec
                        rk = [n for n, j in enumerate(rows) if j < self.S0]
                        rot_k = self._rot([res.dk[n] for n in rk], [rows[n] for n in rk],
                                          prec, -1)
                        got = list(res.dk)
                        for n, row in zip(rk, rot_k, strict=True):
                            got[n] = row
                ctx.prec = prec
                for n in range(len(rows)):
                    out[n] = [a + x for a, x in zip(out[n], got[n], strict=True)]
            return out
        finally:
            ctx.prec = old
