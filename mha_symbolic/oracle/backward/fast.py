"""Tier 1 of the backward pass: gradients in float64 with a *proved* elementwise
error bound, one stack element (batch × head) at a time, in blocks of query rows
(memory O(block)).  The proof is docs/gradients.md §3; the steps are numbered the
same way here.

Notation: u = 2**-53, η = 2**-1074, γ_n = nu/(1 − nu); every float64 operation
rounds to nearest, fl(a op b) = (a op b)(1 + δ) + ε with |δ| <= u, |ε| <= η/2
(ε = 0 for + and −).  Facts used (Higham, *Accuracy and Stability*, 2nd ed.):

(H1) |fl(xᵀy) − xᵀy| <= γ_n |x|ᵀ|y| + nη, any summation order, FMA or not;
(H2) for nonnegative a_i, fl(Σ a_i) >= (1 − γ_{n−1}) Σ a_i, so a true sum of
     nonnegative terms is at most (fl(Σ) + nη)/(1 − γ_n).

Every bound is itself evaluated in floats from nonnegative terms: an elementwise
formula of fewer than 2**12 operations loses at most a factor (1 − u)**4096 > 1/UP,
so it is multiplied by UP; matrix products of nonnegative matrices go through
:func:`mm_up`, which applies (H2).  Underflow inside the bound formulas loses at
most η per operation, covered by FLOOR added to every bound that is not zero.

The weights come from the forward's tier 1 (:func:`..fast.tier1_block`, with its
per-key bound); sums over keys and over query rows are computed by BLAS in blocks
and the blocks accumulated by TwoSum (:class:`BlockSum`), so no bound grows with
S or L beyond its block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..arith.constants import ETA, FLOOR, KEY_BLOCK, UP, U, gamma
from ..arith.dd import two_sum
from ..arith.jit import numba_active
from ..arith.products import norm_up
from ..conventions import Block
from ..forward.fast import KV, tier1_block
from .elements import _elem_dp, _elem_ds, _elem_t, _elem_w

__all__ = ["BlockSum", "HeadGrads", "Radii", "blocked_matmul", "blocked_rowdot", "mm_up",
           "tier1_backward", "tier1_structure"]

Arr = np.ndarray[Any, Any]

# scores per block of query rows in the backward's tiers: four times the forward's
# CHUNK_ELEMS — its products (dS K, dSᵀ Q, Wᵀ dO, per-key bounds) are BLAS calls whose
# efficiency falls with skinny blocks (at S = 2048 the forward's block is 32 rows);
# about 30 such arrays per block: ~60 MB
BWD_CHUNK = 1 << 18


def mm_up(a: Arr, b: Arr) -> Arr:
    """An upper bound on the exact product a @ b of nonnegative float arrays (H2):
    the n-term sums lie below (fl(a @ b) + nη)/(1 − γ_n), times UP for the few
    roundings of this formula."""
    n = a.shape[-1]
    return (np.matmul(a, b) + n * ETA) / (1.0 - gamma(max(n, 1))) * UP


class BlockSum:
    """Σ_k T_k of float arrays, accumulated by TwoSum (hi, lo) with Σ|T_k| and the
    blocks' own bounds Σ e_k.  :meth:`result` gives v and a bound of |v − Σ B_k| for
    exact block values B_k with |T_k − B_k| <= e_k:

    the chain hi_k = fl(hi_{k−1} + T_k) is exact with its errors e'_k (|e'_k| <=
    u|hi_k| <= u(1 + γ_n)Σ|T|), their float sum lo errs by <= γ_n Σ|e'_k|, and the
    final v = fl(hi + lo) by <= u|v|: in all <= n u γ_n (1 + γ_n)/(1 − γ_n)·fl(Σ|T|)
    + u|v| (fl(Σ|T|) is a float sum of n nonnegative terms, (H2))."""

    def __init__(self) -> None:
        self.hi: Arr | None = None
        self.lo: Arr | None = None
        self.mag: Arr | None = None
        self.err: Arr | None = None
        self.n = 0

    def add(self, t: Arr, e: Arr) -> None:
        self.n += 1
        if self.hi is None:
            self.hi, self.lo, self.mag, self.err = t.copy(), np.zeros_like(t), np.abs(t), e.copy()
            return
        assert self.lo is not None and self.mag is not None and self.err is not None
        self.hi, lo = two_sum(self.hi, t)
        self.lo += lo
        self.mag += np.abs(t)
        self.err += e

    def result(self, shape: tuple[int, ...]) -> tuple[Arr, Arr]:
        if self.hi is None:
            return np.zeros(shape), np.zeros(shape)
        assert self.lo is not None and self.mag is not None and self.err is not None
        if self.n == 1:
            return self.hi, self.err
        n = self.n
        gn = gamma(n)
        v = self.hi + self.lo
        acc = n * U * gn * (1 + gn) / (1 - gn) * self.mag + U * np.abs(v)
        # the blocks' bounds are a float sum of n nonnegative terms too (H2)
        return v, (self.err / (1 - gn) + acc) * UP


def _acc_g(block: int, K: int) -> float:
    gb, gK = gamma(max(block, 1)), gamma(K)
    return gb + (K * U * gK * (1 + gK) / (1 - gK) + 1.01 * U) * (1 + gb)


def matmul_g(n: int, block: int = KEY_BLOCK) -> float:
    """The g of :func:`blocked_matmul` for an inner dimension n."""
    return gamma(max(n, 1)) if n <= block else _acc_g(block, -(-n // block))


rowdot_g = matmul_g  # the same blocks and accumulation (:func:`blocked_rowdot`)


def blocked_rowdot(a: Arr, b: Arr, block: int = KEY_BLOCK) -> tuple[Arr, float]:
    """(v, g): v_i = Σ_j a_ij b_ij by blocks of <= ``block`` columns accumulated by
    TwoSum, |v − Σ a b| <= g Σ|a||b| + nη (the argument of :func:`blocked_matmul`)."""
    n = a.shape[-1]
    if n <= block:
        return np.einsum("ij,ij->i", a, b), gamma(max(n, 1))
    hi = np.einsum("ij,ij->i", a[:, :block], b[:, :block])
    lo = np.zeros_like(hi)
    K = 1
    for j0 in range(block, n, block):
        hi, e = two_sum(hi, np.einsum("ij,ij->i", a[:, j0:j0 + block], b[:, j0:j0 + block]))
        lo += e
        K += 1
    return hi + lo, _acc_g(block, K)


def blocked_matmul(a: Arr, b: Arr, block: int = KEY_BLOCK) -> tuple[Arr, float]:
    """(v, g): v = a @ b computed by BLAS in blocks of <= ``block`` along the inner
    dimension n and accumulated by TwoSum, with |v − ab| <= g·(|a||b|) + nη.

    Per block (H1) gives γ_nb; the accumulation (:class:`BlockSum`) adds
    K u γ_K (1 + γ_K)/(1 − γ_K)·Σ|T_k| + u|v| with Σ|T_k| <= (1 + γ_nb)|a||b| + nη and
    |v| <= (1 + g)|a||b|: g = γ_nb + (K u γ_K (1 + γ_K)/(1 − γ_K) + 1.01u)(1 + γ_nb),
    which depends on the block size and the number of blocks K, not on n alone."""
    n = a.shape[-1]
    if n <= block:
        return a @ b, gamma(max(n, 1))
    terms = [a[..., j0:j0 + block] @ b[..., j0:j0 + block, :] for j0 in range(0, n, block)]
    hi = terms[0].copy()
    lo = np.zeros_like(hi)
    for t in terms[1:]:
        hi, e = two_sum(hi, t)
        lo += e
    return hi + lo, _acc_g(block, len(terms))


@lru_cache(maxsize=1)
def _compiled() -> Any:
    """The compiled twins (backward/_kernels.py) when the forward's kernels are active."""

    if not numba_active():
        return None
    try:
        from . import _kernels
    except ImportError:  # pragma: no cover - numba_active() already imported numba
        return None
    return _kernels


def step_dp(p: Arr, ep: Arr, x: Arr, ex: Arr, keep: Arr | None, live: Arr, f_f: float,
            rho_f: float, g_d: float) -> tuple[Arr, Arr, Arr, Arr]:
    """(dP, e_dP, t, P on live keys): steps (1)-(4) before D's row sums."""
    k = _compiled()
    if k is not None and p.size:
        dp, edp, t, pl = (np.empty_like(p) for _ in range(4))
        k.step_dp(p, ep, x, ex, keep, live, f_f, rho_f, g_d, dp, edp, t, pl)
        return dp, edp, t, pl
    if keep is None:
        dp, edp = x, ex
        t = _elem_t(p, ep, dp, edp, g_d)
    else:
        dp, edp = _elem_dp(x, ex, f_f, rho_f)
        dp, edp = np.where(keep, dp, 0.0), np.where(keep, edp, 0.0)
        t = _elem_t(p, ep, dp, edp, g_d)
    return dp, edp, np.where(live, t, 0.0), np.where(live, p, 0.0)


def step_ds(p: Arr, ep: Arr, dp: Arr, edp: Arr, d: Arr, ed: Arr, keep: Arr | None, live: Arr,
            f_f: float, rho_f: float, g_q: float, g_r: float) -> tuple[Arr, ...]:
    """(dS, e_dS, e_dS + g_q|dS|, e_dS + g_r|dS|, W, e_W, e_W + g_r W): steps (1), (5), (6)."""
    k = _compiled()
    if k is not None and p.size:
        out = tuple(np.empty_like(p) for _ in range(7))
        k.step_ds(p, ep, dp, edp, d, ed, keep, live, f_f, rho_f, g_q, g_r, *out)
        return out
    ds, eds, aq, ak = _elem_ds(p, ep, dp, edp, d[:, None], ed[:, None], g_q, g_r)
    ds, eds, aq, ak = (np.where(live, a, 0.0) for a in (ds, eds, aq, ak))
    if keep is None:
        w, ew = p, ep
        aw = ew + g_r * w
    else:
        w, ew, aw = _elem_w(p, ep, f_f, rho_f, g_r)
        w, ew, aw = (np.where(keep, a, 0.0) for a in (w, ew, aw))
    return ds, eds, aq, ak, w, ew, aw


@dataclass
class Radii:
    """Elementwise radii of uncertain inputs (reference_mha_backward feeds the exact
    projections as floats with bounds): |q − q~| <= q, |k − k~| <= k, |v − v~| <= v,
    |dO − dO~| <= do (arrays shaped like the inputs; None: exact)."""

    q: Arr | None = None
    k: Arr | None = None
    v: Arr | None = None
    do: Arr | None = None


@dataclass
class HeadGrads:
    """Tier-1 gradients of one stack element with their bounds: dq, e_dq (L, E);
    dk, e_dk (S, E); dv, e_dv (S, Ev); ds, e_ds (L, S) when asked for (the mask
    gradient); o, e_o (L, Ev) the forward output without dropout (MHA's dW_o).
    row_ok (L,): the row's forward bound held (its dq and ds are valid; rows with
    no allowed key count as valid, their gradients are 0); all_ok: every row held
    (dk, dv are valid).  live_k (S,): keys whose dS can be nonzero in some row;
    live_v (S,): keys with a nonzero weight in some row; live_rows (L,): rows whose dS
    can be nonzero (not empty, not uniform, more than one allowed key)."""

    dq: Arr
    e_dq: Arr
    dk: Arr
    e_dk: Arr
    dv: Arr
    e_dv: Arr
    ds: Arr | None
    e_ds: Arr | None
    o: Arr
    e_o: Arr
    row_ok: Arr
    all_ok: bool
    has_key: Arr
    live_k: Arr
    live_v: Arr
    live_rows: Arr | None = None


def _scale_err(g: Arr, e_g: Arr, out: Arr, c_f: float, rho_c: float) -> Arr:
    """|c·G − fl(c_f G~)| <= ρ_c(|G~| + e_G) + |c_f| e_G + u|out|(1 + 2u) + η."""
    return (rho_c * (np.abs(g) + e_g) + abs(c_f) * e_g + U * np.abs(out) * (1 + 2 * U)
            + ETA) * UP


#: tier-1 hooks of a transformed score (softcap, inexact biases): ``weights(i0, i1,
#: block)`` gives the forward's tier-1 result of rows i0:i1 (weights with a proved
#: bound, output) in place of :func:`..fast.tier1_block` on q·k; ``factor(i0, i1)``
#: the elementwise factor Φ = ∂s/∂(c q·k) with its bound (r, S) or None for 1.
WeightsHook = Callable[[int, int, Block], Any]
FactorHook = Callable[[int, int], "tuple[Arr, Arr] | None"]


def tier1_backward(q: Arr, k: Arr, v: Arr, do: Arr, block: Callable[[slice], Block],
                   c_f: float, rho_c: float, f_f: float = 1.0, rho_f: float = 0.0,
                   radii: Radii | None = None, want_ds: bool = False,
                   chunk: int = BWD_CHUNK, key_block: int = KEY_BLOCK,
                   weights: WeightsHook | None = None,
                   factor: FactorHook | None = None) -> HeadGrads:
    """Gradients of one attention problem (q (L, E), k (S, E), v (S, Ev), grad_output
    do (L, Ev), exact doubles or approximations within ``radii``) with the score
    model ``block(rows)`` (masks, dropout keep-mask, uniform rows), the true scale
    within ``rho_c`` of ``c_f`` and the dropout factor 1/(1 − p) within ``rho_f`` of
    ``f_f``.  Rows without an allowed key (other than uniform ones) give zero
    gradients; the caller applies the nan/zero policies.  ``chunk`` (scores per row
    block) and ``key_block`` (keys per BLAS sum) size the blocks.  ``weights`` and
    ``factor``: the hooks of a transformed score (above); ``ds`` (``want_ds``) is then
    the gradient of the transformed scores, dQ and dK use Φ∘dS (step 6b)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return _tier1_backward(q, k, v, do, block, c_f, rho_c, f_f, rho_f,
                               radii or Radii(), want_ds, chunk, key_block, weights, factor)


def _apply_factor(ds: Arr, e_ds: Arr, phi: Arr, e_phi: Arr, g_q: float, g_r: float
                  ) -> tuple[Arr, Arr, Arr, Arr]:
    """Step (6b): dS⁰ = Φ∘dS with |Φ dS − fl(Φ~ dS~)| <= e_Φ(|dS~| + e_dS) + Φ~ e_dS +
    u|dS⁰~| + η (Φ >= 0), and the terms e + g|dS⁰| of the dQ and dK bounds."""
    ds0 = phi * ds
    e0 = (e_phi * (np.abs(ds) + e_ds) + phi * e_ds + U * np.abs(ds0) + ETA) * UP
    return ds0, e0, e0 + g_q * np.abs(ds0), e0 + g_r * np.abs(ds0)


def _live_keys(blk: Block, r: int, S: int) -> tuple[Arr, Arr]:
    """The block's keys whose dS can be nonzero (allowed, not on a uniform row, whose
    output does not depend on the scores, nor on a row with one allowed key, whose P = 1
    exactly whatever its score, so D = dP and dS = 0 exactly: a causal mask's first row,
    a narrow window), and the keys whose V receives a weight."""
    allowed = blk.allowed
    uni = np.zeros(r, dtype=bool) if blk.uniform is None else blk.uniform
    live = (np.ones((r, S), dtype=bool) if allowed is None else allowed) & ~uni[:, None]
    single = live.sum(axis=-1) == 1
    if single.any():
        live &= ~single[:, None]
    wk = (np.ones((r, S), dtype=bool) if allowed is None else allowed)
    return live, np.asarray((wk if blk.keep is None else wk & blk.keep).any(axis=0))


def tier1_structure(block: Callable[[slice], Block], L: int, S: int, chunk: int = BWD_CHUNK
                    ) -> tuple[Arr, Arr, Arr]:
    """(live_rows, live_k, live_v) of :class:`HeadGrads` without the arithmetic: the same
    blocks' :func:`_live_keys` (the structure of the score model only)."""
    live_rows = np.zeros(L, dtype=bool)
    live_k = np.zeros(S, dtype=bool)
    live_v = np.zeros(S, dtype=bool)
    step = max(1, chunk // max(S, 1))
    for i0 in range(0, L, step):
        i1 = min(L, i0 + step)
        live, kept_v = _live_keys(block(slice(i0, i1)), i1 - i0, S)
        live_rows[i0:i1] = live.any(axis=-1)
        live_k |= live.any(axis=0)
        live_v |= kept_v
    return live_rows, live_k, live_v


def _x_block(dob: Arr, abs_do: Arr, vt: Arr, abs_vt: Arr, vr_t: Arr | None,
             do_r: Arr | None, Ev: int) -> tuple[Arr, Arr]:
    """(2) X = dO Vᵀ: (H1) elementwise, γ_Ev (|dO||V|ᵀ) + Ev η; radii add
    |dO~| vrᵀ + dor (|V~| + vr)ᵀ."""
    x = dob @ vt
    e_x = gamma(max(Ev, 1)) * mm_up(abs_do, abs_vt) + Ev * ETA
    if vr_t is not None:
        e_x = e_x + mm_up(abs_do, vr_t)
    if do_r is not None:
        e_x = e_x + mm_up(do_r, abs_vt + (0.0 if vr_t is None else vr_t))
    return x, e_x * UP


def _d_block(p: Arr, e_p: Arr, x: Arr, e_x: Arr, keep: Arr | None, live: Arr, f_f: float,
             rho_f: float, S: int, key_block: int) -> tuple[Arr, Arr, Arr, Arr]:
    """(1), (3): W = f·keep∘P, |W − W~| <= ρ_f(P~ + e_P) + f~ e_P + u W~ + η;
    dP = f·keep∘X, |dP − dP~| <= ρ_f(|X~| + e_X) + f~ e_X + u|dP~| + η (both exact
    without dropout); (4) D_i = Σ_j P_ij dP_ij (live keys), in key blocks
    (blocked_rowdot, g_d): |D − D~| <= Σ_j [e_P(|dP~| + e_dP) + P~ e_dP] + g_d Σ_j P~|dP~|
    + Sη.  Returns dP, its bound, D, its bound."""
    g_d = rowdot_g(S, key_block)
    dp, e_dp, t, pl = step_dp(p, e_p, x, e_x, keep, live, f_f, rho_f, g_d)
    d, _ = blocked_rowdot(pl, dp, key_block)
    e_d = (np.sum(t, axis=-1) + 2 * S * ETA) / (1.0 - gamma(max(S, 1) + 1)) * UP
    return dp, e_dp, d, e_d


def _dv_term(w: Arr, e_w: Arr, a_w: Arr, dob: Arr, abs_do: Arr, do_r: Arr | None,
             r: int) -> tuple[Arr, Arr]:
    """(7) the block's term of dV = Wᵀ dO: (e_W + γ_r W~)ᵀ(|dO~| + dor) + W~ᵀ dor + rη."""
    tv = w.T @ dob
    etv = mm_up(a_w.T, abs_do) + r * ETA
    if do_r is not None:
        etv = etv + mm_up((e_w + w).T, do_r)
    return tv, etv * UP


def _dk_term(ds: Arr, e_ds: Arr, a_k: Arr, qb: Arr, q_r: Arr | None,
             r: int) -> tuple[Arr, Arr]:
    """(9) the block's term of dSᵀ Q: (e_dS + γ_r|dS~|)ᵀ|Q~| + (e_dS + |dS~|)ᵀ qr + rη."""
    tk = ds.T @ qb
    etk = mm_up(a_k.T, np.abs(qb)) + r * ETA
    if q_r is not None:
        etk = etk + mm_up((e_ds + np.abs(ds)).T, q_r)
    return tk, etk * UP


def _dq_block(ds: Arr, e_ds: Arr, a_q: Arr, k: Arr, abs_k: Arr, k_r: Arr | None,
              key_block: int, c_f: float, rho_c: float) -> tuple[Arr, Arr]:
    """(8) dQ = c·dS K: G = dS~ K~ in key blocks, |dS K − G| <= (e_dS + g|dS~|)|K~| + Sη
    (+ (e_dS + |dS~|) kr); then the scale (_scale_err)."""
    gq, _ = blocked_matmul(ds, k, key_block)
    e_gq = mm_up(a_q, abs_k) + k.shape[0] * ETA
    if k_r is not None:
        e_gq = e_gq + mm_up(e_ds + np.abs(ds), k_r)
    dq_b = c_f * gq
    return dq_b, _scale_err(gq, e_gq, dq_b, c_f, rho_c)


def _tier1_backward(q: Arr, k: Arr, v: Arr, do: Arr, block: Callable[[slice], Block],
                    c_f: float, rho_c: float, f_f: float, rho_f: float, rad: Radii,
                    want_ds: bool, chunk: int, key_block: int,
                    weights: WeightsHook | None = None,
                    factor: FactorHook | None = None) -> HeadGrads:
    L, E = q.shape
    S, Ev = v.shape
    # (0) the forward's tier 1 per block: radii as row norms and column maxima
    kv = KV(k, v, None if rad.k is None else norm_up(rad.k),
            None if rad.v is None else np.max(rad.v, axis=0) * UP if S else np.zeros(Ev))
    qr_n = None if rad.q is None else norm_up(rad.q)
    abs_k, abs_vt = np.abs(k), np.abs(v).T
    vt = np.ascontiguousarray(v.T)
    vr_t = None if rad.v is None else np.ascontiguousarray(rad.v.T)
    dq = np.zeros((L, E))
    e_dq = np.zeros((L, E))
    ds_all = np.zeros((L, S)) if want_ds else None
    e_ds_all = np.zeros((L, S)) if want_ds else None
    o = np.zeros((L, Ev))
    e_o = np.zeros((L, Ev))
    row_ok = np.ones(L, dtype=bool)
    has_key_all = np.zeros(L, dtype=bool)
    live_k = np.zeros(S, dtype=bool)
    live_rows = np.zeros(L, dtype=bool)
    live_v = np.zeros(S, dtype=bool)
    acc_k, acc_v = BlockSum(), BlockSum()
    step = max(1, chunk // max(S, 1))
    for i0 in range(0, L, step):
        i1 = min(L, i0 + step)
        r = i1 - i0
        blk = block(slice(i0, i1))
        allowed = blk.allowed
        has_key = np.ones(r, dtype=bool) if allowed is None else np.asarray(allowed.any(axis=-1))
        has_key_all[i0:i1] = has_key
        nodrop = Block(allowed, blk.madd, None, blk.uniform)
        qb = np.ascontiguousarray(q[i0:i1])
        if weights is not None:
            res = weights(i0, i1, nodrop)
        else:
            res = tier1_block(qb, None if qr_n is None else qr_n[i0:i1], kv, nodrop, c_f,
                              rho_c, want_weights=True)
        assert res.p is not None and res.err_p is not None
        ok = res.ok | ~has_key
        row_ok[i0:i1] = ok
        p = np.where(ok[:, None], res.p, 0.0)
        e_p = np.where(ok[:, None], res.err_p, 0.0)
        o[i0:i1], e_o[i0:i1] = res.y, res.err
        live, kept_v = _live_keys(blk, r, S)
        live_rows[i0:i1] = live.any(axis=-1)
        live_k |= live.any(axis=0)
        live_v |= kept_v
        dob = np.ascontiguousarray(do[i0:i1])
        abs_do = np.abs(dob)
        do_r = None if rad.do is None else rad.do[i0:i1]
        x, e_x = _x_block(dob, abs_do, vt, abs_vt, vr_t, do_r, Ev)
        dp, e_dp, d, e_d = _d_block(p, e_p, x, e_x, blk.keep, live, f_f, rho_f, S, key_block)
        del x, e_x
        # (5) Y = dP − D: |Y − Y~| <= e_dP + e_D + u|Y~|(1 + 2u)
        # (6) dS = P∘Y: |dS − dS~| <= e_P(|Y~| + e_Y) + P~ e_Y + u|dS~| + η; exactly 0 off
        # the live keys
        gr = gamma(max(r, 1))
        g_q = matmul_g(S, key_block)
        ds, e_ds, a_q, a_k, w, e_w, a_w = step_ds(p, e_p, dp, e_dp, d, e_d, blk.keep, live,
                                                  f_f, rho_f, g_q, gr)
        del dp, e_dp
        if want_ds:
            assert ds_all is not None and e_ds_all is not None
            ds_all[i0:i1] = ds
            e_ds_all[i0:i1] = np.where(live, e_ds + FLOOR, 0.0)
        fac = None if factor is None else factor(i0, i1)
        if fac is not None:
            ds, e_ds, a_q, a_k = _apply_factor(ds, e_ds, fac[0], fac[1], g_q, gr)
        acc_v.add(*_dv_term(w, e_w, a_w, dob, abs_do, do_r, r))
        dq[i0:i1], e_dq[i0:i1] = _dq_block(ds, e_ds, a_q, k, abs_k, rad.k, key_block, c_f,
                                           rho_c)
        acc_k.add(*_dk_term(ds, e_ds, a_k, qb, None if rad.q is None else rad.q[i0:i1], r))
    return _head_grads(acc_k, acc_v, dq, e_dq, ds_all, e_ds_all, o, e_o, row_ok, c_f, rho_c,
                       (S, E), (S, Ev), has_key_all, live_k, live_v, live_rows)


def _head_grads(acc_k: BlockSum, acc_v: BlockSum, dq: Arr, e_dq: Arr, ds_all: Arr | None,
                e_ds_all: Arr | None, o: Arr, e_o: Arr, row_ok: Arr, c_f: float,
                rho_c: float, k_shape: tuple[int, int], v_shape: tuple[int, int],
                has_key: Arr, live_k: Arr, live_v: Arr, live_rows: Arr) -> HeadGrads:
    """(7), (9): the row blocks' sums (BlockSum), the scale for dK, and which rows and
    gradients tier 1 decided (finite values and bounds)."""
    gk, e_gk = acc_k.result(k_shape)
    dk = c_f * gk
    e_dk = _scale_err(gk, e_gk, dk, c_f, rho_c)
    dv, e_dv = acc_v.result(v_shape)
    all_ok = bool(row_ok.all())
    row_ok &= np.all(np.isfinite(dq) & np.isfinite(e_dq), axis=-1)
    if ds_all is not None:
        assert e_ds_all is not None
        row_ok &= np.all(np.isfinite(ds_all) & np.isfinite(e_ds_all), axis=-1)
    all_ok = all_ok and bool(row_ok.all()) and bool(
        np.all(np.isfinite(dk) & np.isfinite(e_dk)) and np.all(np.isfinite(dv) & np.isfinite(e_dv)))
    # FLOOR covers underflow inside the bound formulas (see the module docstring)
    return HeadGrads(dq, e_dq + FLOOR, dk, e_dk + FLOOR, dv, e_dv + FLOOR,
                     ds_all, e_ds_all, o, e_o, row_ok, all_ok, has_key, live_k, live_v,
                     live_rows)
