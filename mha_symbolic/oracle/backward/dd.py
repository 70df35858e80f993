"""Tier 2 of the backward pass: gradients in double-double with a proved bound of
about 2**-80 relative, only for the query rows and key columns that tier 1 leaves
undecided.  The proof is docs/gradients.md §4; the steps are numbered the same
way here.

It is built from the forward's second tier (docs/oracle.md §3.3-3.5), not a copy
of it:

1. **Row statistics** of a problem, once per row and cached (O(L) memory):
   :func:`..dd_attention.tier2_block` (``kind="stats"``: no output) gives each row's
   shift m, the double-double weights w~ and their normaliser D~ with bounds;
   ``D_i = Σ_j P_ij dP_ij`` is formed in double-double with the normaliser as a
   common factor (:meth:`HeadTier2._row_d`; FlashAttention-2's dO_i·O_i, whose
   product :func:`_row_dot` stays tested, was wider: docs/gradients.md §4).
2. **The weights of the rows or key columns asked for**: from the same pass, or
   recomputed for a set of keys J with the cached shift
   (:func:`..dd_attention.dd_scores`, ``m=``) — P = w~/D~ with
   :func:`..dd_attention.weights_dd`.
3. **dP = f·keep∘(dO Vᵀ)** from exact slice products (:func:`..mha.proj_dd`),
   ``Y = dP − D`` (:func:`..dd.dd_add`: its error is relative to |dP| + |D|, so
   the cancellation in dP − D costs nothing), ``dS = P∘Y``, ``W = f·keep∘P``
   (:func:`..dd.dd_mul`), each with an elementwise bound (:func:`_chain`).
4. **dQ = c·dS K, dK = c·dSᵀ Q, dV = Wᵀ dO** again from exact slice products of the
   double-double operands (:func:`..mha.proj_dd`: the high words sliced, the low
   words through a plain product, the operands' bounds through |·| products), the
   row blocks of dK and dV accumulated by TwoSum (:class:`DDSum`), the scale
   multiplied in double-double (:func:`scale_dd`).

Rows that the forward's tier 2 cannot take (scores beyond 2**40, inexact
scalings) come back with ok = False and go to Arb (:mod:`.arb`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arith.constants import ETA, FLOOR, RHO_EXP2, UP, U, gamma
from ..arith.dd import dd_add, dd_mul, dd_mul_d, two_sum
from ..arith.jit import t2_weights
from ..conventions import Block, DDScale
from ..forward.dd import KVdd, dd_scores, tier2_block, tier2_from_scores, weights_dd
from ..forward.mha import proj_dd
from .fast import BWD_CHUNK, _compiled

__all__ = ["DDSum", "HeadTier2", "scale_dd"]

Arr = np.ndarray[Any, Any]
U2 = U * U


class DDSum:
    """Σ_k (h_k + l_k) of double-double terms with bounds e_k: both words go into one
    TwoSum chain (hi, c).  The chain is exact with errors |x_k| <= u|hi_k|, their
    float sum c errs by <= γ_K Σ|x_k| <= K u γ_K (1 + γ_K) Σ|t| (K words t), and the
    final TwoSum renormalisation is exact; Σ|t| and Σ e_k are float sums of
    nonnegative terms, bounded by (H2)."""

    def __init__(self) -> None:
        self.parts: list[tuple[Arr, Arr, Arr]] = []

    def add(self, h: Arr, lo: Arr, e: Arr) -> None:
        self.parts.append((h, lo, e))

    def result(self, shape: tuple[int, ...]) -> tuple[Arr, Arr, Arr]:
        if not self.parts:
            return np.zeros(shape), np.zeros(shape), np.zeros(shape)
        if len(self.parts) == 1:
            return self.parts[0]
        hi: Arr | None = None
        c = np.zeros(shape)
        mag = np.zeros(shape)
        err = np.zeros(shape)
        K = 0
        for h, lo, e in self.parts:
            err += e
            for t in (h, lo):
                K += 1
                mag += np.abs(t)
                if hi is None:
                    hi = t.copy()
                else:
                    hi, x = two_sum(hi, t)
                    c += x
        assert hi is not None
        hi, lo = two_sum(hi, c)
        gK = gamma(K)
        return hi, lo, (err + K * U * gK * (1 + gK) * mag) / (1 - gK) * UP


def row_sums_dd(h: Arr, lo: Arr, e: Arr) -> tuple[Arr, Arr, Arr]:
    """Σ_j over the columns of (h, lo, e) (r × n) row by row, as :class:`DDSum` with the
    columns added in order (the compiled twin where active: bit-identical)."""
    r, n = h.shape
    kern = _compiled()
    if kern is None or n < 2:
        acc = DDSum()
        for j in range(n):
            acc.add(h[:, j], lo[:, j], e[:, j])
        return acc.result((r,))
    hi_o, lo_o, err, mag = (np.empty(r) for _ in range(4))
    kern.row_ddsum(*(np.ascontiguousarray(a, dtype=np.float64) for a in (h, lo, e)),
                   hi_o, lo_o, err, mag)
    gK = gamma(2 * n)
    return hi_o, lo_o, (err + 2 * n * U * gK * (1 + gK) * mag) / (1 - gK) * UP


def scale_dd(h: Arr, lo: Arr, e: Arr, cs: DDScale) -> tuple[Arr, Arr, Arr]:
    """c·(h + lo) for the scale c = 2**cs.e (hi + lo + δ), |δ| <= cs.rho, with the bound
    |c·V − result| <= |c|e + 2**cs.e·rho·|h + lo| + (product rounding) + 4η:
    ±1 multiplies exactly, a double by :func:`..dd.dd_mul_d` (4.02u²), a double-double
    by :func:`..dd.dd_mul` (8.02u²); the power of two is exact unless a word
    underflows (<= η each)."""
    if cs.hi == 0.0 and cs.lo == 0.0 and cs.rho == 0.0:
        z = np.zeros_like(h)
        return z, z.copy(), z.copy()
    p2 = 2.0 ** cs.e
    e_mul: Any
    if cs.lo == 0.0 and cs.hi in (1.0, -1.0):
        mh, ml, e_mul = h * cs.hi, lo * cs.hi, 0.0
    elif cs.lo == 0.0:
        mh, ml = dd_mul_d(h, lo, np.float64(cs.hi))
        e_mul = 4.02 * U2 * np.abs(mh) * 1.01
    else:
        mh, ml = dd_mul(h, lo, np.full_like(h, cs.hi), np.full_like(h, cs.lo))
        e_mul = 8.02 * U2 * np.abs(mh) * 1.01
    abs_c = (abs(cs.hi) + abs(cs.lo) + cs.rho) * p2
    err = (abs_c * e + cs.rho * p2 * (np.abs(h) + np.abs(lo)) + e_mul * p2 + 4 * ETA) * UP
    return mh * p2, ml * p2, err


def _row_dot(oh: Arr, ol: Arr, oe: Arr, b: Arr) -> tuple[Arr, Arr, Arr]:
    """Σ_l b_il (oh + ol)_il ± Σ_l |b| oe (rows): products by :func:`..dd.dd_mul_d`
    (4.02u² each, + 4η for underflow), the 2n words accumulated by TwoSum
    (n u γ_2n (1 + γ_2n)·2 Σ|words|, as :class:`DDSum`)."""
    r, n = oh.shape
    if n == 0:
        z = np.zeros(r)
        return z, z.copy(), z.copy()
    ph, pl = dd_mul_d(oh, ol, b)
    hi = ph[:, 0].copy()
    c = np.zeros(r)
    for col in range(1, n):
        hi, x = two_sum(hi, ph[:, col])
        c += x
    for col in range(n):
        hi, x = two_sum(hi, pl[:, col])
        c += x
    hi, lo = two_sum(hi, c)
    K = 2 * n
    gK = gamma(K)
    mag = np.sum(np.abs(ph) + np.abs(pl), axis=-1)
    err = (np.sum(np.abs(b) * oe, axis=-1) + 4.02 * U2 * 1.01 * np.sum(np.abs(ph), axis=-1)
           + K * U * gK * (1 + gK) * mag + 4 * n * ETA) / (1 - gK) * UP
    return hi, lo, err


def normaliser_factor(eD: Arr, d_low: Arr, tau_d: Arr) -> Arr:
    """γ >= |D~/Σw − 1| per row from the statistics pass: Σ w = (Σ w~)(1 + θ) with
    |θ| <= tau_d and Σ w~ = D~ + ε with |ε| <= eD, d_low <= D~, so
    |Σw/D~ − 1| <= β = (1 + eD/d_low)(1 + tau_d) − 1 and |D~/Σw − 1| <= β/(1 − β)
    (NaN or inf where the statistics are not usable: the caller checks)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        beta = (eD / d_low + tau_d + (eD / d_low) * tau_d) * UP
        return np.asarray(np.where(beta < 0.5, beta / (1.0 - beta) * UP, np.inf))


@dataclass
class _Chain:
    """One block's dS = P∘(dP − D) and W = f·keep∘P with their bounds (hi, lo, err);
    ``s0`` the gradient of the scores before a transform (Φ∘dS; dS itself without)."""

    sh: Arr
    sl: Arr
    se: Arr
    wh: Arr
    wl: Arr
    we: Arr
    ok: bool
    s0: tuple[Arr, Arr, Arr] | None = None

    @property
    def ds0(self) -> tuple[Arr, Arr, Arr]:
        return (self.sh, self.sl, self.se) if self.s0 is None else self.s0


def _times_factor(ch: _Chain, f: tuple[Arr, Arr, Arr]) -> tuple[Arr, Arr, Arr]:
    """Φ∘dS by dd_mul: |Φ dS − p~| <= e_Φ(|dS~| + e_dS) + |Φ~| e_dS + 8.02u²·1.01|p~| + 4η
    (|x~| <= |x_h|(1 + 2u) for a normalised pair)."""
    fh, fl, fe = f
    ph, pl = dd_mul(ch.sh, ch.sl, fh, fl)
    a_s = np.abs(ch.sh) * (1 + 2 * U)
    a_f = np.abs(fh) * (1 + 2 * U)
    pe = (fe * (a_s + ch.se) + a_f * ch.se + 8.02 * U2 * np.abs(ph) * 1.01 + 4 * ETA) * UP
    return ph, pl, pe


def _chain(p: tuple[Arr, Arr, Arr], x: tuple[Arr, Arr, Arr], d: tuple[Arr, Arr, Arr],
           live: Arr, keep: Arr | None, fac: tuple[float, float, float] | None) -> _Chain:
    """Steps 3 of the module docstring for a block (rows × keys), all elementwise:

    dP = f·keep·X: dd_mul by f, |f X − dP~| <= |f~| e_X + ρ_f(|X~| + e_X) + 8.02u²|dP~|·1.01
    + 4η (exactly X without dropout, 0 on dropped keys);
    Y = dP − D: dd_add, e_Y = e_dP + e_D + u(1.01u(|dP_h| + |D_h|) + 2.01(|dP_l| + |D_l|));
    dS = P·Y (live keys; 0 elsewhere, exactly): e_P(|Y~| + e_Y) + |P~| e_Y + 8.02u²|P~Y~|·1.01
    + 4η;  W = f·keep·P like dP.  Everything times UP (fewer than 2**12 roundings)."""
    ph, pl, pe = p
    xh, xl, xe = x
    dh, dl, de = d
    kern = _compiled()
    if fac is None and kern is not None and ph.ndim == 2 and ph.size:
        sh, sl, se = np.empty_like(ph), np.empty_like(ph), np.empty_like(ph)
        arrs = [np.ascontiguousarray(a, dtype=np.float64) for a in (ph, pl, pe, xh, xl, xe)]
        fin = kern.chain_plain(*arrs, np.ascontiguousarray(dh, dtype=np.float64),
                               np.ascontiguousarray(dl, dtype=np.float64),
                               np.ascontiguousarray(de, dtype=np.float64),
                               np.ascontiguousarray(live, dtype=np.bool_), U, 1.01 * U,
                               1 + 2 * U, 8.02 * U2, 4 * ETA, FLOOR, UP, sh, sl, se)
        ok = bool(fin and np.all(np.isfinite(ph)) and np.all(np.isfinite(pe)))
        return _Chain(sh, sl, se, ph, pl, pe, ok)
    if fac is not None:
        fh, flo, rho_f = fac
        fa = abs(fh) + abs(flo)
        dph, dpl = dd_mul(xh, xl, np.full_like(xh, fh), np.full_like(xh, flo))
        dpe = (fa * xe + rho_f * (np.abs(xh) * 1.01 + xe) + 8.02 * U2 * np.abs(dph) * 1.01
               + 4 * ETA) * UP
        w_h, w_l = dd_mul(ph, pl, np.full_like(ph, fh), np.full_like(ph, flo))
        w_e = (fa * pe + rho_f * (np.abs(ph) * 1.01 + pe) + 8.02 * U2 * np.abs(w_h) * 1.01
               + 4 * ETA) * UP
        if keep is not None:
            dph, dpl, dpe = (np.where(keep, a, 0.0) for a in (dph, dpl, dpe))
            w_h, w_l, w_e = (np.where(keep, a, 0.0) for a in (w_h, w_l, w_e))
    else:
        dph, dpl, dpe = xh, xl, xe
        w_h, w_l, w_e = ph, pl, pe
    yh, yl = dd_add(dph, dpl, np.broadcast_to(-dh[:, None], dph.shape),
                    np.broadcast_to(-dl[:, None], dph.shape))
    ye = (dpe + de[:, None] + U * (1.01 * U * (np.abs(dph) + np.abs(dh)[:, None])
                                   + 2.01 * (np.abs(dpl) + np.abs(dl)[:, None]))) * UP
    sh, sl = dd_mul(ph, pl, yh, yl)
    abs_y = np.abs(yh) * (1 + 2 * U)
    abs_p = np.abs(ph) * (1 + 2 * U)
    se = (pe * (abs_y + ye) + abs_p * ye + 8.02 * U2 * abs_p * abs_y * 1.01 + 4 * ETA) * UP
    sh = np.where(live, sh, 0.0)
    sl = np.where(live, sl, 0.0)
    se = np.where(live, se + FLOOR, 0.0)
    ok = bool(np.all(np.isfinite(sh) & np.isfinite(se) & np.isfinite(w_h) & np.isfinite(w_e)))
    return _Chain(sh, sl, se, w_h, w_l, w_e, ok)


def _rows(blk: Block, sel: Arr) -> Block:
    """The score model of a block restricted to the rows ``sel`` (a mask)."""
    def sub(a: Arr | None) -> Arr | None:
        return None if a is None else a[sel]

    return Block(sub(blk.allowed), sub(blk.madd), sub(blk.keep), sub(blk.uniform))


def _cols(blk: Block, cols: Arr) -> Block:
    """The score model of a block restricted to the keys ``cols``."""
    def sub(a: Arr | None) -> Arr | None:
        return None if a is None else np.ascontiguousarray(a[:, cols])

    allowed = blk.allowed
    if allowed is not None:
        allowed = np.ascontiguousarray(allowed[:, cols])
    return Block(allowed, sub(blk.madd), sub(blk.keep), blk.uniform)


@dataclass
class _Stats:
    """Cached per-row quantities of one problem (arrays of length L)."""

    m: Arr
    Dh: Arr
    Dl: Arr
    eD: Arr
    d_low: Arr
    tau_d: Arr
    Ddh: Arr     # D_i = dO_i·O_i, double-double
    Ddl: Arr
    Dde: Arr
    ok: Arr      # the row's tier-2 values hold (rows without a key: True, they add 0)
    done: Arr


class _Chunk:
    """One chunk of rows of the statistics pass: its rows, score model and the
    forward's row statistics (weights of every key), from which :meth:`weights` gives
    P of any rows and keys."""

    def __init__(self, rr: Arr, blk: Block, rs: Any, ok: Arr) -> None:
        self.rr, self.blk, self.rs, self.ok = rr, blk, rs, ok
        #: X = dO Vᵀ of every row and key of the chunk (hi, lo, err) and whether its
        #: scalings were exact (formed once, for D and for the chain)
        self.x: tuple[tuple[Arr, Arr, Arr], bool] | None = None

    def weights_hat(self) -> tuple[Block, tuple[Arr, Arr, Arr]]:
        """P̂ = w/D~ (every row and key) bounded by the exponentials' and the division's
        errors alone (weights_dd with eD = tau_d = 0): the row's normaliser D~/Σw is a
        common factor the caller accounts for (:func:`normaliser_factor`)."""
        rs = self.rs
        z = np.zeros(rs.Dh.shape)
        p = weights_dd(rs.wh, rs.wl, rs.Dh, rs.Dl, z, rs.d_low, rs.tau, z, rs.notallowed,
                       None, None, np.ones(rs.Dh.shape[0], dtype=bool))
        return self.blk, (p.hi, p.lo, p.err)

    def weights(self, sel: Arr | None, keys: Arr | None) -> tuple[Block, tuple[Arr, Arr, Arr]]:
        """(score model, P = w~/D~ with its bound) of the rows ``sel`` (a mask; all when
        None) at ``keys`` (all when None): :func:`..dd_attention.weights_dd`."""
        rs, blk = self.rs, self.blk
        wh, wl, na = rs.wh, rs.wl, rs.notallowed
        Dh, Dl, eD, d_low, tau, tau_d = rs.Dh, rs.Dl, rs.eD, rs.d_low, rs.tau, rs.tau_d
        if sel is not None:
            wh, wl, na = wh[sel], wl[sel], None if na is None else na[sel]
            Dh, Dl, eD, d_low, tau, tau_d = (a[sel] for a in (Dh, Dl, eD, d_low, tau, tau_d))
            blk = _rows(blk, sel)
        if keys is not None:
            wh, wl = wh[:, keys], wl[:, keys]
            na = None if na is None else na[:, keys]
            blk = _cols(blk, keys)
        p = weights_dd(wh, wl, Dh, Dl, eD, d_low, tau, tau_d, na, None, None,
                       np.ones(wh.shape[0], dtype=bool))
        return blk, (p.hi, p.lo, p.err)


#: tier-2 hooks of a transformed score: ``scores(rows, keys, m)`` gives the
#: double-double scores of ``rows`` at ``keys`` (all when None) as
#: :class:`..dd_attention.Scores` (shift ``m`` when given, else the row maximum), in
#: place of :func:`..dd_attention.dd_scores` on q·k; ``factor(rows, keys)`` the factor
#: Φ = ∂s/∂(c q·k) as (hi, lo, err).
DDScoresHook = Callable[[Arr, "Arr | None", "Arr | None"], Any]
DDFactorHook = Callable[[Arr, "Arr | None"], "tuple[Arr, Arr, Arr]"]


class HeadTier2:
    """Tier 2 of one attention problem: q (L, E), k (S, E), v (S, Ev), grad_output do
    (L, Ev) (exact doubles), the score model ``block(rows)`` (rows an index array),
    the scale ``cs`` and the dropout factor ``fac`` = (hi, lo, rho) or None; the hooks
    ``scores`` and ``factor`` of a transformed score (above).

    Results kept (O(L + output rows)): the row statistics; dK and dV of the key
    columns formed in a statistics pass (every key when most rows were asked for,
    else the columns named by ``rows(..., columns=)``)."""

    def __init__(self, q: Arr, k: Arr, v: Arr, do: Arr, block: Callable[[Arr], Block],
                 cs: DDScale, fac: tuple[float, float, float] | None,
                 chunk: int = BWD_CHUNK, scores: DDScoresHook | None = None,
                 factor: DDFactorHook | None = None) -> None:
        self.q, self.k, self.v, self.do = q, k, v, do
        self.block, self.cs, self.fac = block, cs, fac
        self.scores, self.factor = scores, factor
        self.L, self.E = q.shape
        self.S, self.Ev = v.shape
        self.chunk = chunk
        self._kv: KVdd | None = None
        # kind -> key -> (hi, lo, err, ok) of one key row of dK or dV
        self._cols: dict[str, dict[int, tuple[Arr, Arr, Arr, bool]]] = {"dk": {}, "dv": {}}
        L = self.L
        z = np.zeros(L)
        self.st = _Stats(z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy(),
                         z.copy(), z.copy(), np.zeros(L, dtype=bool), np.zeros(L, dtype=bool))

    @property
    def kv(self) -> KVdd:
        if self._kv is None:
            self._kv = KVdd(self.k, self.v)
        return self._kv

    def _step(self, width: int) -> int:
        return max(1, self.chunk // max(width, 1))

    # ---- 1. row statistics, and in the same pass whatever the caller forms of them
    def _stats_pass(self, rows: Arr, use: Callable[[_Chunk], None]) -> None:
        """Run the forward's tier 2 on ``rows`` (chunks; its statistics only, no output),
        form X = dO Vᵀ and D_i = Σ_j P_ij dP_ij (:meth:`_row_d`), cache the statistics and
        hand each chunk to ``use``."""
        st = self.st
        for s0 in range(0, rows.size, self._step(self.S)):
            rr = rows[s0:s0 + self._step(self.S)]
            blk = self.block(rr)
            if self.scores is None:
                res = tier2_block(np.ascontiguousarray(self.q[rr]), None, None, self.kv, blk,
                                  self.cs, self.fac, "stats", want_stats=True)
            else:
                sc = self.scores(rr, None, None)
                with np.errstate(over="ignore", invalid="ignore", divide="ignore",
                                 under="ignore"):
                    res = tier2_from_scores(sc.sh, sc.sl, sc.m, sc.e_t, self.kv, sc.notallowed,
                                            blk.keep, sc.has_key, self.fac, "stats", sc.bad,
                                            want_stats=True)
            rs = res.stats
            assert rs is not None
            has_key = np.ones(rr.size, dtype=bool) if blk.allowed is None else blk.allowed.any(-1)
            ok = res.ok | ~has_key
            ck = _Chunk(rr, blk, rs, ok)
            ck.x = self._x(rr, None)
            dd_h, dd_l, dd_e = self._row_d(ck)
            st.m[rr], st.Dh[rr], st.Dl[rr], st.eD[rr] = rs.m, rs.Dh, rs.Dl, rs.eD
            st.d_low[rr], st.tau_d[rr] = rs.d_low, rs.tau_d
            st.Ddh[rr] = np.where(has_key, dd_h, 0.0)
            st.Ddl[rr] = np.where(has_key, dd_l, 0.0)
            st.Dde[rr] = np.where(has_key, dd_e, 0.0)
            st.ok[rr] = ok & ((np.isfinite(dd_h) & np.isfinite(dd_l) & np.isfinite(dd_e))
                              | ~has_key)
            st.done[rr] = True
            ck.ok = st.ok[rr].copy()
            use(ck)

    def _row_d(self, ck: _Chunk) -> tuple[Arr, Arr, Arr]:
        """D_i = Σ_j P_ij dP_ij of the chunk's rows (docs/gradients.md §4, step 1): Σ_j P_ij
        = 1 over the allowed keys and P = c·P̂ with P̂ = w/D~ and c = D~/Σw,
        |c − 1| <= γ (:func:`normaliser_factor`), so D = c Σ_j P̂_ij dP_ij ∈
        c(Σ~ ± e_Σ) and D ∈ Σ~ ± (e_Σ + γ(|Σ~| + e_Σ)): the terms P̂∘dP by :func:`_chain`
        (D = 0 there; its bound is |P̂ dP − t~|), summed by :func:`row_sums_dd` (its
        bound adds the terms'); the normaliser's uncertainty is charged to the sum, not
        to every term.  Non-finite where the row's values do not hold (the caller
        checks); X's inexact scalings make every row non-finite."""
        blk, p = ck.weights_hat()
        assert ck.x is not None
        x, ex = ck.x
        r = ck.rr.size
        z = np.zeros(r)
        ch = _chain(p, x, (z, z, z), self._live(blk, r, self.S), blk.keep, self.fac)
        h, lo, err = row_sums_dd(ch.sh, ch.sl, ch.se)
        rs = ck.rs
        gam = normaliser_factor(rs.eD, rs.d_low, rs.tau_d)
        err = (err + gam * (np.abs(h) + np.abs(lo) + err)) * UP
        if not ex:
            err = np.full(r, np.nan)
        return h, lo, err

    def _weights_at(self, rr: Arr, keys: Arr, normaliser: bool = True
                    ) -> tuple[Block, tuple[Arr, Arr, Arr], Arr]:
        """P of rows ``rr`` (statistics cached) at the keys ``keys``: the scores of those
        keys with the cached shift (dd_scores, m=), exp~, and weights_dd with the row's
        D~ — |t~ − t| <= e_t for these keys, so |w/w~ − 1| <= tau =
        (e_t(1 + e_t) + RHO_EXP2)(1 + 2 RHO_EXP2) (docs/oracle.md §3.5).

        ``normaliser`` False: the bound is of w/D~ (the exact weights over the computed
        normaliser D~ = Dh + Dl, weights_dd with eD = tau_d = 0), not of P = w/Σw; the
        caller accounts for the row's common factor D~/Σw (:func:`normaliser_factor`)."""
        st = self.st
        blk = _cols(self.block(rr), keys)
        if self.scores is None:
            kv = KVdd(np.ascontiguousarray(self.k[keys]), np.zeros((keys.size, 0)))  # scores
            sc = dd_scores(np.ascontiguousarray(self.q[rr]), None, None, kv, blk, self.cs,
                           st.m[rr])
        else:
            sc = self.scores(rr, keys, st.m[rr])
        wh, wl = t2_weights(sc.sh, sc.sl, sc.m, sc.notallowed)
        e_t = sc.e_t
        with np.errstate(over="ignore", invalid="ignore"):
            tau = (e_t * (1.0 + e_t) + RHO_EXP2) * (1.0 + 2.0 * RHO_EXP2) * UP
        e_d, t_d = (st.eD[rr], st.tau_d[rr]) if normaliser else (np.zeros(rr.size),) * 2
        p = weights_dd(wh, wl, st.Dh[rr], st.Dl[rr], e_d, st.d_low[rr], tau,
                       t_d, sc.notallowed, None, None, np.ones(rr.size, dtype=bool))
        has_key = np.ones(rr.size, dtype=bool) if blk.allowed is None else blk.allowed.any(-1)
        # exp_dd's domain is t <= 2**-40: with the shift of the statistics pass a key's
        # recomputed t~ = s~ - m can exceed 0 by about e_t; rows where it could exceed
        # 2**-40 (t~_hi > 2**-41) go to Arb
        with np.errstate(invalid="ignore"):
            hot = np.any(sc.sh - sc.m[:, None] > 2.0**-41, axis=-1)
        ok = (st.ok[rr] & (~sc.bad | ~has_key) & ~hot
              & np.all(np.isfinite(p.hi) & np.isfinite(p.err), -1))
        return blk, (p.hi, p.lo, p.err), ok

    def _x(self, rr: Arr, keys: Arr | None) -> tuple[tuple[Arr, Arr, Arr], bool]:
        """X = dO Vᵀ on rows rr and keys (exact slice products, proj_dd)."""
        vk = self.v if keys is None else self.v[keys]
        xh, xl, xe, ex = proj_dd(np.ascontiguousarray(self.do[rr]), np.ascontiguousarray(vk), None)
        return (xh, xl, xe), ex

    def _live(self, blk: Block, r: int, n: int) -> Arr:
        live = np.ones((r, n), dtype=bool) if blk.allowed is None else blk.allowed.copy()
        if blk.uniform is not None:
            live[blk.uniform] = False
        return live

    def _chain_at(self, rr: Arr, blk: Block, p: tuple[Arr, Arr, Arr], keys: Arr | None,
                  x_at: tuple[tuple[Arr, Arr, Arr], bool] | None = None
                  ) -> tuple[_Chain, bool]:
        """dS and W (with bounds) of rows rr at keys (all when None), and whether X's
        scalings were exact; ``x_at`` X of these rows and keys when formed already."""
        x, ex = self._x(rr, keys) if x_at is None else x_at
        d = (self.st.Ddh[rr], self.st.Ddl[rr], self.st.Dde[rr])
        n = self.S if keys is None else keys.size
        ch = _chain(p, x, d, self._live(blk, rr.size, n), blk.keep, self.fac)
        if self.factor is not None:
            ch.s0 = _times_factor(ch, self.factor(rr, keys))
            ch.ok = ch.ok and bool(np.all(np.isfinite(ch.s0[0]) & np.isfinite(ch.s0[2])))
        return ch, ex

    def _col_product(self, ch: _Chain, rr: Arr, want: str, acc: DDSum) -> bool:
        """Add the rows ``rr`` of dSᵀ Q (want "dk") or Wᵀ dO ("dv") to ``acc`` (exact slice
        products of the double-double operands, proj_dd); False when a scaling was not
        exact."""
        bt = (self.q if want == "dk" else self.do)[rr].T
        h, lo, e = ch.ds0 if want == "dk" else (ch.wh, ch.wl, ch.we)
        # transposed views: proj_dd forms its scaled operands in C order, no copies here
        th, tl, te, ex = proj_dd(h.T, bt, None, x_lo=lo.T, x_err=e.T)
        acc.add(th, tl, te)
        return bool(ex)

    def _keep_cols(self, accs: dict[str, tuple[Arr, DDSum]], good: dict[str, bool]) -> None:
        """Finish column sums (the scale for dK) and keep them key by key."""
        for kind, (keys, acc) in accs.items():
            n_out = self.E if kind == "dk" else self.Ev
            h, lo, e = acc.result((keys.size, n_out))
            if kind == "dk":
                h, lo, e = scale_dd(h, lo, e, self.cs)
            fin = np.all(np.isfinite(h) & np.isfinite(e), axis=-1)
            for n, j in enumerate(keys.tolist()):
                self._cols[kind][j] = (h[n], lo[n], e[n], bool(good[kind] and fin[n]))

    # ---- the rows of dQ and dS
    def rows(self, rows: Arr, want: str, columns: dict[str, Arr] | None = None
             ) -> tuple[Arr, Arr, Arr, Arr]:
        """(hi, lo, err, ok) of dQ (want "dq": (rows, E)) or dS (want "ds": (rows, S)).

        The first call on a problem runs the statistics pass over every row (dK and dV
        need them all) and forms in the same pass the key columns of dK and dV named in
        ``columns`` (kind -> keys: those the caller expects to be asked for), or every
        key when at least half the rows are asked for (float64 rounding: nearly all)."""
        n_out = self.E if want == "dq" else self.S
        out_h = np.zeros((rows.size, n_out))
        out_l = np.zeros_like(out_h)
        out_e = np.zeros_like(out_h)
        ok_out = np.zeros(rows.size, dtype=bool)
        pos = {int(i): n for n, i in enumerate(rows.tolist())}
        kt = np.ascontiguousarray(self.k.T)
        first = not self.st.done.any()
        accs: dict[str, tuple[Arr, DDSum]] = {}
        if first:
            if 2 * rows.size >= self.L:
                accs = {kind: (np.arange(self.S), DDSum()) for kind in ("dk", "dv")}
            elif columns:
                accs = {kind: (keys, DDSum()) for kind, keys in columns.items() if keys.size}
        good = {kind: True for kind in accs}

        def use(ck: _Chunk) -> None:
            rr = ck.rr
            sel = np.fromiter((int(i) in pos for i in rr.tolist()), dtype=bool, count=rr.size)
            full_rows = bool(sel.all())
            for kind, (keys, acc) in accs.items():
                full_keys = keys.size == self.S
                if full_keys and full_rows and want == "dq":
                    continue   # formed with the rows below
                blk, p = ck.weights(None, None if full_keys else keys)
                ch, ex = self._chain_at(rr, blk, p, None if full_keys else keys,
                                        ck.x if full_keys else None)
                good[kind] = (good[kind] and bool(ck.ok.all()) and ex and ch.ok
                              and self._col_product(ch, rr, kind, acc))
            if not sel.any():
                return
            blk, p = ck.weights(None if full_rows else sel, None)
            rs_ = rr[sel]
            assert ck.x is not None
            x_sel = ck.x if full_rows else (tuple(a[sel] for a in ck.x[0]), ck.x[1])
            ch, ex = self._chain_at(rs_, blk, p, None, x_sel)
            for kind, (keys, acc) in accs.items():
                if keys.size == self.S and full_rows and want == "dq":
                    good[kind] = (good[kind] and bool(ck.ok.all()) and ex and ch.ok
                                  and self._col_product(ch, rs_, kind, acc))
            idx = np.array([pos[int(i)] for i in rs_.tolist()])
            good_r = ck.ok[sel] & ex & ch.ok
            if want == "ds":
                out_h[idx], out_l[idx], out_e[idx] = ch.sh, ch.sl, ch.se
            else:
                s0h, s0l, s0e = ch.ds0
                gh, gl, ge, exq = proj_dd(s0h, kt, None, x_lo=s0l, x_err=s0e)
                out_h[idx], out_l[idx], out_e[idx] = scale_dd(gh, gl, ge, self.cs)
                good_r = good_r & exq
            ok_out[idx] = good_r & np.all(np.isfinite(out_h[idx]) & np.isfinite(out_e[idx]), -1)

        if first:
            todo = np.arange(self.L)
        else:
            todo = rows if self.st.done.all() else np.union1d(rows, np.flatnonzero(~self.st.done))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            self._stats_pass(todo, use)
            self._keep_cols(accs, good)
        return out_h, out_l, out_e, ok_out

    # ---- the key columns of dK and dV
    def columns(self, keys: Arr, want: str) -> tuple[Arr, Arr, Arr, bool]:
        """(hi, lo, err, ok) of dK (want "dk": (keys, E)) or dV ("dv": (keys, Ev)): every
        row contributes, so the row statistics of all rows are needed (computed once);
        columns formed earlier are taken as they were."""
        if all(j in self._cols[want] for j in keys.tolist()):
            return self._kept(keys, want)
        accs = {want: (keys, DDSum())}
        good = {want: True}
        acc = accs[want][1]

        def use(ck: _Chunk) -> None:
            blk, p = ck.weights(None, keys)
            assert ck.x is not None
            ch, ex = self._chain_at(ck.rr, blk, p, keys,
                                    (tuple(a[:, keys] for a in ck.x[0]), ck.x[1]))  # type: ignore[arg-type]
            good[want] = (good[want] and bool(ck.ok.all()) and ex and ch.ok
                          and self._col_product(ch, ck.rr, want, acc))

        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            todo = np.flatnonzero(~self.st.done)
            if todo.size:
                self._stats_pass(todo, use)
            rest = np.flatnonzero(self.st.done & ~np.isin(np.arange(self.L), todo))
            step = self._step(max(keys.size, self.E))
            for s0 in range(0, rest.size, step):
                rr = rest[s0:s0 + step]
                blk, p, ok_r = self._weights_at(rr, keys)
                ch, ex = self._chain_at(rr, blk, p, keys)
                good[want] = (good[want] and bool(ok_r.all()) and ex and ch.ok
                              and self._col_product(ch, rr, want, acc))
            self._keep_cols(accs, good)
        return self._kept(keys, want)

    def _kept(self, keys: Arr, want: str) -> tuple[Arr, Arr, Arr, bool]:
        """The kept key rows ``keys`` of dK or dV stacked."""
        got = [self._cols[want][j] for j in keys.tolist()]
        if not got:
            z = np.zeros((0, self.E if want == "dk" else self.Ev))
            return z, z.copy(), z.copy(), True
        return (np.stack([g[0] for g in got]), np.stack([g[1] for g in got]),
                np.stack([g[2] for g in got]), all(g[3] for g in got))
