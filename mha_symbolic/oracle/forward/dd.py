"""Tier 2: attention in double-double with a proved bound of about 2**-80 relative,
one block of query rows at a time — enough to decide float64 rounding of almost
every element.

1. Scores exactly from BLAS (:mod:`.exact_scores`): q rows and k rows are scaled by
   powers of two and cut into row-aligned slices, every slice product is exact,
   the products are accumulated by TwoSum; the scale multiplies in double-double
   (a power of two, e.g. 1/8 for E = 64, multiplies exactly), the float mask is
   added by TwoSum, the row maximum is subtracted by TwoSum.
2. Weights by :func:`.expo.exp_dd` (relative error <= 2**-84).
3. ``N = W·V`` and ``D = Σ W`` per key block: the high words of the weights are cut
   into three fixed-point slices (aligned at 2, 22 bits each) and the values into
   column-aligned slices, so every slice product is exact; the low words and the
   truncation remainders go through one plain BLAS product each, with a bound.
4. ``y = N/D`` by double-double division, times the dropout factor.

The error propagation is that of tier 1 (docs/oracle.md §3.3) with smaller
numbers; §3.4 spells out each term.  Rows this tier cannot take (scores above
``MAX_SCORE_DD``, scalings that are not exact, a score error above
``DD_ERR_CAP``) come back with ok = False and go to the Arb tier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arith.constants import (
    DD_ERR_CAP,
    ETA,
    FLOOR,
    KEY_BLOCK,
    MAX_SCORE_DD,
    RHO_EXP2,
    TINY2,
    UP,
    U,
    gamma,
)
from ..arith.dd import dd_div, dd_mul, pow2, two_sum
from ..arith.jit import t2_scores, t2_weights, weights_plain
from ..arith.products import (
    Slices,
    beta_for,
    exact_product,
    norm_up,
    row_exponents,
    slice_rows,
    w_slices,
)
from ..conventions import Block, DDScale

Array = np.ndarray[Any, Any]

BETA_W = 22  # weight slices: 9 (KEY_BLOCK = 2**9) + 22 + 22 <= 53 - 0
BETA_V = 22
W_SLICES = 3  # 66 bits below 2**1: every weight >= 2**-12 is exact in the slices
V_SLICES = 4
QK_SLICES = 5
PRUNE_QK = 112  # pairs (s, t) with (s + t)·beta >= this are bounded, not computed
PRUNE_WV = 100


def _pow2_any(e: Array) -> tuple[Array, Array]:
    """2.0**e where e is in the normal range, and a mask of the entries that are not."""
    ok = (e >= -1022) & (e <= 1023)
    return pow2(np.where(ok, e, 0)), ok


@dataclass
class KVdd:
    """Keys and values of one stack element for tier 2: exact doubles ``kh`` (S, E),
    ``vh`` (S, Ev), optional low words ``kl``, ``vl`` (the held value is hi + lo,
    exactly) and radii ``kr`` (S,) >= ||k_j - k~_j||, ``vr`` (Ev,) >= max_j |v_jl - v~_jl|."""

    kh: Array
    vh: Array
    kl: Array | None = None
    vl: Array | None = None
    kr: Array | None = None
    vr: Array | None = None

    def __post_init__(self) -> None:
        S, E = self.kh.shape
        Ev = self.vh.shape[1]
        self.S, self.E, self.Ev = S, E, Ev
        self.ok = True
        self.beta = beta_for(E)
        # keys scaled by one power of two 2**-F (exact, checked), so |k'| < 1
        F = int(np.max(row_exponents(np.abs(self.kh).max(axis=0, keepdims=True)))) if S and E else 0
        self.F = F
        sc = 2.0 ** -F
        kh2 = self.kh * sc
        if S and E and not np.array_equal(kh2 / sc, self.kh):
            self.ok = False
        self.kl2 = None if self.kl is None else self.kl * sc
        if self.kl2 is not None and self.kl is not None and not np.array_equal(
                self.kl2 / sc, self.kl):
            self.ok = False
        self.ks: Slices | None = slice_rows(kh2, self.beta, QK_SLICES) if S and E else None
        self.kh2 = kh2
        self.kn = norm_up(kh2) if S else np.zeros(0)
        self.kln = norm_up(self.kl2) if self.kl2 is not None and S else None
        self.krs = None if self.kr is None else self.kr * sc * UP
        # values scaled per column by 2**-F_l (exact, checked): |v'| < 1
        if S and Ev:
            self.Fv = row_exponents(np.ascontiguousarray(self.vh.T))
            self.Fv = np.where(np.max(np.abs(self.vh), axis=0) == 0, 0, self.Fv)
        else:
            self.Fv = np.zeros(Ev, dtype=np.int64)
        pv, okv = _pow2_any(-self.Fv)
        if not okv.all():
            self.ok = False
        vh2 = self.vh * pv
        if S and Ev and not np.array_equal(vh2 / pv, self.vh):
            self.ok = False
        self.vh2 = vh2
        self.vl2 = None if self.vl is None else self.vl * pv
        self.vr2 = None if self.vr is None else self.vr * pv * UP
        self.vt = np.ascontiguousarray(vh2.T)  # (Ev, S): rows are the columns of V
        align = np.zeros(Ev, dtype=np.int64)
        self.vs = slice_rows(self.vt, BETA_V, V_SLICES, align) if S and Ev else None
        # per column: max |v'| (+ low word + radius), max |remainder|, max |low word|
        absmax = np.max(np.abs(vh2), axis=0) if S else np.zeros(Ev)
        self.vl_max = np.max(np.abs(self.vl2), axis=0) if self.vl2 is not None and S else np.zeros(Ev)
        self.colmax = (absmax + self.vl_max + (self.vr2 if self.vr2 is not None else 0.0)) * UP
        if self.vs is not None and not self.vs.zero_rem:
            rem = self.vt - sum(self.vs.parts)
            self.rv_max = np.max(np.abs(rem), axis=1) * UP
        else:
            self.rv_max = np.zeros(Ev)


@dataclass
class Tier2:
    """Block result: value hi + lo (r, Ev) with |true - hi - lo| <= err, ok (r,)."""

    hi: Array
    lo: Array
    err: Array
    ok: Array
    p_hi: Array | None = None
    p_lo: Array | None = None
    p_err: Array | None = None
    stats: RowStats | None = None


@dataclass
class Scores:
    """Double-double scores of a block (step 1-2 of :func:`tier2_block`): s~ = sh + sl
    (r, S) with masked keys sh = -inf, the shift m (r,) (the row maximum of sh unless
    given), the per-key bound ``e_t`` (r,) of |t~ - t| for t~ = s~ - m (keys with
    t~ >= -600), rows this tier cannot take (``bad``), rows with an allowed key."""

    sh: Array
    sl: Array
    m: Array
    e_t: Array
    bad: Array
    has_key: Array
    notallowed: Array | None


@dataclass
class RowStats:
    """The row quantities of a block that the gradients reuse (:func:`tier2_block`
    with ``want_stats``): shift m, weights w~ = wh + wl (r, S; exp~(s~ - m), masked
    keys 0), their relative bound tau (r,), D~ = Dh + Dl = Σ w~ within eD, d_low <= D~,
    tau_d >= |Σ w / Σ w~ - 1| (docs/oracle.md §3.5), ok (r,) as the block's."""

    m: Array
    wh: Array
    wl: Array
    tau: Array
    Dh: Array
    Dl: Array
    eD: Array
    d_low: Array
    tau_d: Array
    notallowed: Array | None
    ok: Array


def tier2_block(qh: Array, ql: Array | None, qr: Array | None, kv: KVdd, blk: Block,
                cs: DDScale, dropout: tuple[float, float, float] | None = None,
                kind: str = "output", want_stats: bool = False) -> Tier2:
    """Rows qh (+ ql) (r, E) (radius ``qr[i] >= ||q_i - q~_i||`` or None) against ``kv``;
    ``dropout`` = (r_hi, r_lo, rho_r) of the factor 1/(1 - p) or None; ``kind`` is
    "output" (r × Ev) or "weights" (r × S); ``want_stats`` (output only) also returns
    the block's :class:`RowStats` (the gradients' second tier reuses them); ``kind``
    "stats": those alone (no output: ``hi``, ``lo``, ``err`` empty, ``ok`` the rows'
    statistics hold)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return _tier2(qh, ql, qr, kv, blk, cs, dropout, kind, want_stats)


def dd_scores(qh: Array, ql: Array | None, qr: Array | None, kv: KVdd, blk: Block,
              cs: DDScale, m: Array | None = None) -> Scores:
    """Steps 1-2 of :func:`tier2_block` (exact scores, scale, mask) for the keys of
    ``kv``; with ``m`` given, the shift is that (the row maximum over *all* keys, of
    an earlier block) instead of the maximum over these keys."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return _scores(qh, ql, qr, kv, blk, cs, m)


def _scores(qh: Array, ql: Array | None, qr: Array | None, kv: KVdd, blk: Block,
            cs: DDScale, m_given: Array | None) -> Scores:
    r, E = qh.shape
    S = kv.S
    bad = np.zeros(r, dtype=bool)
    if not kv.ok:
        bad[:] = True
    # ---- 1. exact scores in scaled units: g = 2**(e_i + F)·G'
    if E and S:
        e_q = row_exponents(qh)
        pq, okq = _pow2_any(-e_q)
        bad |= ~okq
        qh2 = qh * pq[:, None]
        bad |= ~np.all(qh2 / pq[:, None] == qh, axis=-1)
        ql2 = None if ql is None else ql * pq[:, None]
        if ql2 is not None and ql is not None:
            bad |= ~np.all(ql2 / pq[:, None] == ql, axis=-1)
        qs = slice_rows(qh2, kv.beta, QK_SLICES, np.zeros(r, dtype=np.int64))
        qn = norm_up(qh2)
        plain: list[tuple[Array, Array]] = []
        pb: list[tuple[Array, Array]] = []
        if kv.kl2 is not None:
            assert kv.kln is not None
            plain.append((qh2, kv.kl2))
            pb.append((qn, kv.kln))
        qln = None
        if ql2 is not None:
            qln = norm_up(ql2)
            plain.append((ql2, kv.kh2))
            pb.append((qln, kv.kn))
        assert kv.ks is not None
        prod = exact_product(qs, kv.ks, PRUNE_QK, plain or None, pb or None)
        g_err = prod.row_max_err()  # in G' units
        kmax = float(np.max(kv.ks.norm)) if S else 0.0
        if qln is not None and kv.kln is not None:
            g_err = g_err + qln * float(np.max(kv.kln))  # ql·kl, not computed
        gmax = qn * kmax + g_err  # >= max_j |G'_ij| (Cauchy–Schwarz)
        if qln is not None:
            gmax = gmax + qln * kmax
        if kv.kln is not None:
            gmax = gmax + qn * float(np.max(kv.kln))
        gh, gl = prod.hi, prod.lo
        P = e_q + kv.F + cs.e
    else:
        gh = np.zeros((r, S))
        gl = np.zeros((r, S))
        g_err = np.zeros(r)
        gmax = np.zeros(r)
        qn = np.zeros(r)
        P = np.zeros(r, dtype=np.int64)
    return scale_and_mask(gh, gl, g_err, gmax, P, _radius(qh, ql, qr, kv), bad, blk, cs,
                          m_given)


def _radius(qh: Array, ql: Array | None, qr: Array | None, kv: KVdd) -> Array:
    """Per row, the scores' error from the inputs' radii, in true units:
    ||qr|| (||k|| + ||kr||) + ||q|| ||kr|| (0 without radii)."""
    r, E = qh.shape
    S = kv.S
    rad = np.zeros(r)
    if qr is not None or kv.krs is not None:
        kmax_true = float(np.max(kv.kn)) * 2.0**kv.F * UP if S else 0.0
        qn_true = norm_up(qh) if E else np.zeros(r)
        if ql is not None:
            qn_true = qn_true + norm_up(ql)
        krmax = float(np.max(kv.krs)) * 2.0**kv.F if kv.krs is not None and S else 0.0
        if qr is not None:
            rad += qr * (kmax_true + krmax)
        rad += qn_true * krmax
        rad *= UP
    return rad


def scale_and_mask(gh: Array, gl: Array, g_err: Array, gmax: Array, P: Array, rad: Array,
                   bad: Array, blk: Block, cs: DDScale, m_given: Array | None) -> Scores:
    """Step 2 of :func:`tier2_block` from the products: ``(gh + gl)·2**P`` (r, S) is q·kᵀ
    within ``g_err·2**P`` per row (``gmax·2**P`` >= max_j |q·k_j|), ``rad`` the radii's
    share in true units, ``bad`` rows already refused; the scale, the mask, the row
    maxima and the per-key bound ``e_t``.  Shared by the sliced products
    (:func:`_scores`) and the compensated dot products of :mod:`.dd_rows`."""
    r = gh.shape[0]
    # ---- 2. s = c·g + M in double-double; scaling by 2**P is exact in the normal range
    ps, okp = _pow2_any(P)
    # rows whose scale would leave the normal range: scores of magnitude < 2**-1000 are
    # replaced by 0 with that bound; scores too large go to Arb
    tiny_rows = P < -1022
    bad |= (P > 1023)
    gh0, gl0 = gh, gl
    abs_c = abs(cs.hi) + abs(cs.lo) + cs.rho
    with np.errstate(over="ignore"):
        scale_abs = np.where(okp, ps, 0.0) * abs_c  # |c|·2**(e_i + F) (cs.e folded into P)
        cg_max = scale_abs * gmax  # >= max_j |c g_ij|
    if cs.lo == 0.0 and cs.hi in (1.0, -1.0):
        mode = 0  # c = ±2**e: the scaling by 2**P already multiplied by it, exactly
        e_mul = np.zeros(r)
    elif cs.lo == 0.0:
        mode = 1
        e_mul = 4.02 * U * U * cg_max
    else:
        mode = 2
        e_mul = 8.02 * U * U * cg_max
    # |c g - s~| <= |c_m| 2**P (err G') + rho_c 2**P |G'| + mul error + scaling underflow
    with np.errstate(over="ignore", invalid="ignore"):
        alpha = (scale_abs * g_err + cs.rho * np.where(okp, ps, 0.0) * gmax + e_mul + 4 * ETA
                 + abs_c * 2.0 ** float(cs.e) * rad)
    if tiny_rows.any():
        with np.errstate(over="ignore", under="ignore"):
            tb = np.ldexp(abs_c * (gmax + 1.0), P) + ETA
        alpha = np.where(tiny_rows, tb, alpha)
        cg_max = np.where(tiny_rows, tb, cg_max)
    if blk.uniform is not None:
        alpha[blk.uniform] = 0.0
        cg_max[blk.uniform] = 0.0
    notallowed = None if blk.allowed is None else ~blk.allowed
    has_key = np.ones(r, dtype=bool) if blk.allowed is None else np.asarray(blk.allowed.any(axis=-1))
    # s~ = c·(2**P G') + M in double-double, the row maxima m (one fused pass)
    sh, sl, m = t2_scores(gh0, gl0, ps, tiny_rows, mode, cs.hi, cs.lo, blk.madd, blk.uniform,
                          notallowed, has_key)
    if m_given is not None:
        m = m_given
    # per key: |t~ - t| <= alpha + u²(3|m| + 3000 + 2|c g|max) for keys with t~ >= -600
    # (mask addition and shift each err by <= u(u|result| + |low word|)); cut keys have
    # true t <= -599 as long as e_t <= 2**-30.
    abs_m = np.abs(m)
    e_t = (alpha + U * U * (3 * abs_m + 3000.0 + 2 * cg_max)) * UP
    bad |= ~(e_t <= DD_ERR_CAP) | ~(abs_m <= MAX_SCORE_DD) | ~np.isfinite(cg_max)
    return Scores(sh, sl, m, e_t, bad, has_key, notallowed)


def _tier2(qh: Array, ql: Array | None, qr: Array | None, kv: KVdd, blk: Block,
           cs: DDScale, dropout: tuple[float, float, float] | None, kind: str,
           want_stats: bool) -> Tier2:
    sc = _scores(qh, ql, qr, kv, blk, cs, None)
    return tier2_from_scores(sc.sh, sc.sl, sc.m, sc.e_t, kv, sc.notallowed, blk.keep,
                             sc.has_key, dropout, kind, sc.bad, want_stats)


def tier2_from_scores(sh: Array, sl: Array, m: Array, e_t: Array, kv: KVdd,
                      notallowed: Array | None, keep: Array | None, has_key: Array,
                      dropout: tuple[float, float, float] | None, kind: str,
                      bad: Array, want_stats: bool = False) -> Tier2:
    """Steps 3-5 of tier 2 from double-double scores: ``sh + sl`` (r, S) within ``e_t``
    (r,) of the exact shifted-or-not scores on every allowed key (the u² rounding of
    the shift inside the weights' pass included), ``m`` (r,) a double near each row's
    largest allowed score.  The hook for score transforms (softcapped scores, biases:
    mha_symbolic.oracle.variants.transformed); the plain tier 2 ends here too (its
    :func:`_scores` has already flagged the rows checked again here, so the flags are
    unchanged).  ``want_stats`` as in :func:`tier2_block`."""
    S = kv.S
    abs_m = np.abs(m)
    bad = bad | ~(e_t <= DD_ERR_CAP) | ~(abs_m <= MAX_SCORE_DD)
    # ---- 3. weights: w~ = exp~(s~ - m) in double-double, masked keys 0 (one fused pass)
    wh, wl = t2_weights(sh, sl, m, notallowed)
    del sh, sl
    tau = (e_t * (1.0 + e_t) + RHO_EXP2) * (1.0 + 2.0 * RHO_EXP2) * UP
    # ---- 4. N = W·V (keep applied) and D = Σ W, exact slice products per key block
    # the sliced BLAS sums, or the compensated row sums of .dd_rows (its KVrows)
    sums = getattr(kv, "weighted_sums", None) or (
        lambda wh, wl, keep, want_n: _weighted_sums(wh, wl, kv, keep, want_n))
    Dh, Dl, eD, Nh, Nl, eN = sums(wh, wl, keep, kind == "output")
    d_low = (Dh + Dl) * (1 - 2.0**-50) - eD - ETA  # <= D~
    bad |= ~(d_low > 0.25)
    with np.errstate(divide="ignore", invalid="ignore"):
        t0 = S * TINY2 / d_low  # cut keys: |w - w~| <= TINY2 each, relative to D~
    tau_d = tau + t0
    bad |= ~(tau_d < 2.0**-20)
    if kind == "stats":   # the gradients' statistics pass: no output
        z = np.zeros((wh.shape[0], 0))
        ok = ~bad & has_key
        return Tier2(z, z, z, ok, stats=RowStats(m, wh, wl, tau, Dh, Dl, eD, d_low, tau_d,
                                                 notallowed, ok))
    fac = None
    if dropout is not None:
        fac = dropout
    if kind == "weights":
        return weights_dd(wh, wl, Dh, Dl, eD, d_low, tau, tau_d, notallowed, keep, fac,
                          ~bad & has_key)
    assert Nh is not None and Nl is not None and eN is not None
    # ---- 5. y = N/D, error assembly (in the scaled units of V's columns)
    yh, yl = dd_div(Nh, Nl, np.broadcast_to(Dh[:, None], Nh.shape).copy(),
                    np.broadcast_to(Dl[:, None], Nh.shape).copy())
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        e_div = 2.0**-100 * np.abs(yh) + 4 * ETA
        dl = d_low[:, None]
        e_nd = (eN + (np.abs(yh) * (1 + 2.0**-50) + e_div) * eD[:, None]) / dl  # N_c/D_c vs N~/D~
        yhat = (np.abs(yh) * (1 + 2.0**-50) + e_div + e_nd) * UP  # >= |N~/D~|
        tau3 = tau[:, None]
        # a = Σ w|v|/D is an average of |v|: <= max |v| (per row when the rows read
        # different heads: dd_rows.RowsBatch)
        a_up = kv.colmax if kv.colmax.ndim == 2 else kv.colmax[None, :]
        vr = kv.vr2[None, :] if kv.vr2 is not None else 0.0
        e_w = (tau3 * (a_up + yhat) + (1.0 + tau3) * vr + t0[:, None] * (a_up + yhat)) / (
            1.0 - tau_d[:, None])
        err = (e_w + e_nd + e_div) * UP + FLOOR  # FLOOR: underflow inside these formulas
    # back to true units: times 2**F_l (exact unless it underflows: + ETA)
    pv, okv = _pow2_any(kv.Fv)
    if not okv.all():
        bad[:] = True
    yh = yh * pv
    yl = yl * pv
    err = err * pv + 2 * ETA
    if fac is not None:
        rh, rlo, rho_r = fac
        y2h, y2l = dd_mul(yh, yl, np.full_like(yh, rh), np.full_like(yh, rlo))
        with np.errstate(over="ignore"):
            err = ((abs(rh) + abs(rlo)) * err + rho_r * (np.abs(yh) * 1.01 + err)
                   + 8.02 * U * U * np.abs(y2h) * 1.01 + 4 * ETA) * UP
        yh, yl = y2h, y2l
    err = err * UP
    ok = ~bad & has_key & np.all(np.isfinite(yh) & np.isfinite(yl) & np.isfinite(err), axis=-1)
    stats = (RowStats(m, wh, wl, tau, Dh, Dl, eD, d_low, tau_d, notallowed, ok) if want_stats
             else None)
    return Tier2(yh, yl, err, ok, stats=stats)


def _weighted_sums(wh: Array, wl: Array, kv: KVdd, keep: Array | None, want_n: bool
                   ) -> tuple[Array, Array, Array, Array | None, Array | None, Array | None]:
    """(Dh, Dl, eD, Nh, Nl, eN): D = Σ_j w~_j and N = Σ_j keep_j w~_j v'_j (scaled values)
    in double-double with bounds eD (r,), eN (r, Ev).

    Per key block of Sb <= KEY_BLOCK keys: wh = W_1 + W_2 + W_3 + Rw (fixed-point
    slices aligned at 2**1, exact), V'ᵀ = Σ_t V_t + RV (column-aligned slices); every
    ``W_s V_tᵀ`` and every ``Σ_j W_s`` is exact (Sb·2**(22+22) <= 2**53).  Plain BLAS
    products: P = fl(wl + Rw) with V', and wh with the values' low words.  Errors:
    missing ``W·RV`` (<= Dsum·max|RV|), missing ``wl·vl`` (<= u Dsum max|vl|), pruned
    pairs (<= Sb·2**(1 - (s-1)22)·2**(-(t-1)22) per block), plain products (gamma_Sb
    Σ|P||v| + Sb ETA), P's rounding (u Σ|P| max|v|), TwoSum accumulation of K terms
    (K u gamma_K Σ|terms|)."""
    r, S = wh.shape
    Ev = kv.Ev
    nb = max(1, -(-S // KEY_BLOCK))
    Sb = min(S, KEY_BLOCK) if S else 1
    gS = gamma(max(Sb, 1))
    d_terms: list[Array] = []
    n_terms: list[Array] = []
    psum = np.zeros(r)  # >= Σ_j |P_j|
    pruned = np.zeros(Ev)
    vs = kv.vs
    for j0 in range(0, S, KEY_BLOCK):
        j1 = min(S, j0 + KEY_BLOCK)
        parts, nonzero, p = w_slices(wh[:, j0:j1], wl[:, j0:j1])
        psum += np.sum(np.abs(p), axis=-1) * (1 + 2 * gS)
        for part, nz in zip(parts, nonzero, strict=True):
            if nz:
                d_terms.append(np.sum(part, axis=-1))
        d_terms.append(np.sum(p, axis=-1))
        if not want_n or vs is None:
            continue
        kb = keep[:, j0:j1] if keep is not None else None
        for s_, (part, nz) in enumerate(zip(parts, nonzero, strict=True)):
            if not nz:
                continue
            wpart = part if kb is None else part * kb
            for t_, (vpart, vnz) in enumerate(zip(vs.parts, vs.nonzero, strict=True)):
                if not vnz:
                    continue
                if s_ * BETA_W + t_ * BETA_V >= PRUNE_WV:
                    # Σ_j |W_s,j||V_t,jl| <= Sb·2**(1 - s·22)·(bound of V_t in column l)
                    pruned += (j1 - j0) * 2.0 ** (1 - s_ * BETA_W) * vs.bounds[t_]
                    continue
                n_terms.append(wpart @ vpart[:, j0:j1].T)
        pk = p if kb is None else p * kb
        n_terms.append(pk @ kv.vh2[j0:j1])
        if kv.vl2 is not None:
            whk = wh[:, j0:j1] if kb is None else wh[:, j0:j1] * kb
            n_terms.append(whk @ kv.vl2[j0:j1])
    Dh, Dl, Kd = _accumulate(d_terms, (r,))
    dsum = (np.abs(Dh) + np.abs(Dl)) * (1 + 2.0**-40) + psum * 2 + S * 2.0 ** (2 - BETA_W) + S * ETA
    gK = gamma(Kd)
    eD = (gS * psum + U * psum + nb * Sb * ETA
          + Kd * U * gK * (1 + gK) * (dsum + psum + S * 2.0 ** (2 - BETA_W))) * UP
    if not want_n:
        return Dh, Dl, eD, None, None, None
    if vs is None:
        z = np.zeros((r, Ev))
        return Dh, Dl, eD, z, z.copy(), z.copy()
    Nh, Nl, Kn = _accumulate(n_terms, (r, Ev))
    gKn = gamma(Kn)
    colx = kv.colmax + 2.0 ** (1 - BETA_V)
    eN = (dsum[:, None] * (kv.rv_max + U * kv.vl_max)[None, :]
          + pruned[None, :]
          + gS * (psum[:, None] * (kv.colmax[None, :] + U) + dsum[:, None] * kv.vl_max[None, :])
          + 2 * nb * Sb * ETA
          + U * psum[:, None] * kv.colmax[None, :]
          + Kn * U * gKn * (1 + gKn) * (dsum + psum + S * 2.0 ** (2 - BETA_W))[:, None] * colx[None, :])
    return Dh, Dl, eD, Nh, Nl, eN * UP


def _accumulate(terms: list[Array], shape: tuple[int, ...]) -> tuple[Array, Array, int]:
    """TwoSum accumulation of exact or approximate doubles: (hi, lo, K), hi + lo
    normalised; the caller bounds the accumulation error K u gamma_K Σ|terms|."""
    if not terms:
        return np.zeros(shape), np.zeros(shape), 1
    hi = terms[0].copy()
    lo = np.zeros_like(hi)
    for x in terms[1:]:
        hi, e = two_sum(hi, x)
        lo += e
    hi, lo = two_sum(hi, lo)
    return hi, lo, len(terms)


def weights_dd(wh: Array, wl: Array, Dh: Array, Dl: Array, eD: Array, d_low: Array,
             tau: Array, tau_d: Array, notallowed: Array | None, keep: Array | None,
             fac: tuple[float, float, float] | None, ok: Array) -> Tier2:
    """p_j = keep_j r w_j/D in double-double: relative (tau + tau_d)/(1 - tau_d) for the
    weights, eD/D for the normaliser, 2**-100 for the division; cut keys add
    2·TINY2/D~."""
    if keep is None and fac is None and wh.ndim == 2 and wh.size:
        got = weights_plain(wh, wl, Dh, Dl, eD, d_low, tau, tau_d, notallowed)
        if got is not None:  # compiled: the formulas below in one pass, bit-identical
            ph, pl, err, fin = got
            return Tier2(ph, pl, err, ok & fin)
    # p = w / D row by row
    ph, pl = dd_div(wh, wl, np.broadcast_to(Dh[:, None], wh.shape).copy(),
                    np.broadcast_to(Dl[:, None], wh.shape).copy())
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = ((tau + tau_d) / (1.0 - tau_d) + eD / d_low + 2.0**-99)[:, None]
        err = np.abs(ph) * rel * 1.01 + (2 * TINY2 / d_low)[:, None] + 4 * ETA
    if keep is not None:
        ph = ph * keep
        pl = pl * keep
        err = err * keep
    if fac is not None:
        rh, rlo, rho_r = fac
        p2h, p2l = dd_mul(ph, pl, np.full_like(ph, rh), np.full_like(ph, rlo))
        err = ((abs(rh) + abs(rlo)) * err + rho_r * (np.abs(ph) * 1.01 + err)
               + 8.02 * U * U * np.abs(p2h) * 1.01 + 4 * ETA)
        ph, pl = p2h, p2l
    err = err * UP + FLOOR
    if notallowed is not None:
        np.putmask(err, notallowed, 0.0)
        np.putmask(ph, notallowed, 0.0)
        np.putmask(pl, notallowed, 0.0)
    ok = ok & np.all(np.isfinite(ph) & np.isfinite(err), axis=-1)
    return Tier2(ph, pl, err, ok)
