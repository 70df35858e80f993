"""Tier 1: attention in float64 with a *proved* elementwise error bound, one block
of query rows at a time.

Higham's dot-product bound with Cauchy–Schwarz norms for the scores, the shift by
the row maximum, :func:`.expo.exp_double` (relative error <= 2**-48), and the
normalised weighted sum computed by BLAS in key blocks of at most
``KEY_BLOCK`` keys, accumulated across blocks by TwoSum, so that the bound
depends on the block size, not on S.  The derivation is docs/oracle.md §3.1–3.3;
the numbered steps below follow it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arith.constants import (
    ETA,
    FLOOR,
    KEY_BLOCK,
    MAX_SCORE_ERR,
    RHO_EXP1,
    TINY1,
    TINY_N,
    UP,
    U,
    gamma,
)
from ..arith.dd import two_sum
from ..arith.jit import Workspace, t1_finish, t1_weights, vscale
from ..arith.products import norm_up
from ..conventions import Block

Array = np.ndarray[Any, Any]


@dataclass
class KV:
    """Keys and values of one stack element (exact doubles, the values possibly float32;
    or approximations with radii: ``kr[j] >= ||k_j - k~_j||`` and ``vr[l] >= max_j
    |v_jl - v~_jl|``), with the per-head quantities every block reuses."""

    k: Array
    v: Array
    kr: Array | None = None
    vr: Array | None = None
    #: an (S, 2·Ev) float64 buffer to build [v', |v'|] in (a head's set-up reuses the
    #: memory of a head no longer in use: no fresh pages per head), or None
    buf: Array | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        S = self.k.shape[0]
        self.S = S
        with np.errstate(over="ignore"):
            self.knorm = norm_up(self.k) if S else np.zeros(0)
        self.kmax = float(np.max(self.knorm)) if S else 0.0
        self.krmax = float(np.max(self.kr)) if self.kr is not None and S else 0.0
        # values scaled per column by a power of two 2**-F_l (max |v'| in [1/2, 1)), so
        # the bounds below never underflow for tiny values; exact unless a value
        # would become subnormal (checked: then the scaling is 1)
        Ev = self.v.shape[1]
        # the values' hull per column (plain attention's output lies in it: value_hull)
        # (``v`` may be float32: tier 1 of plain attention passes a float32 head as is,
        # and everything below is exact in float64)
        self.vlo = np.min(self.v, axis=0).astype(np.float64) if S else np.zeros(Ev)
        self.vhi = np.max(self.v, axis=0).astype(np.float64) if S else np.zeros(Ev)
        vm = np.maximum(self.vhi, -self.vlo) if S else np.zeros(Ev)
        _, F = np.frexp(vm)
        F = np.where((vm > 0) & (F >= -1021) & (F <= 1023), F, 0).astype(np.int64)
        sc = np.ldexp(1.0, -F)
        # [v', |v'|] written in place (one buffer: decode builds one per key head)
        vcat = (self.buf if self.buf is not None and self.buf.shape == (S, 2 * Ev)
                else np.empty((S, 2 * Ev)))
        self.buf = None
        v2, absv = vcat[:, :Ev], vcat[:, Ev:]
        # the scaling is exact unless a value becomes subnormal: none of |v'| below
        # 2**-1022 but the zeros (else the exact check, and scale 1 where it fails)
        tiny = vscale(self.v, sc, vcat, bool(S and np.any(F > 0)))
        if tiny and not np.array_equal(v2 / sc, self.v):
            F = np.zeros(Ev, dtype=np.int64)
            sc = np.ones(Ev)
            v2[...] = self.v
            np.abs(v2, out=absv)
        self.vexp = F
        self.vscale = np.ldexp(1.0, F)  # 2**F_l: multiplying by it is exact (normal range)
        # max_j |v'_jl| = max_j |v_jl|·2**-F_l exactly (the scaling is exact, or 1)
        self.vmax = np.abs(vm) * sc if S else np.zeros(Ev)
        self.vr2 = None if self.vr is None else self.vr * sc * UP
        if self.vr2 is not None:
            self.vmax = (self.vmax + self.vr2) * UP
        self.vcat = vcat

    def keys(self, j0: int, j1: int) -> KV:
        """The keys ``j0:j1`` only (views, no copy), for a block whose other keys are
        all masked (:meth:`ScoreModel.block_keys`).  The per-head maxima (``kmax``,
        ``krmax``, ``vmax``) and the values' scale stay those of the whole head: upper
        bounds of the range's, so every bound of :func:`tier1_block` still holds (and
        the counts of keys in it become the range's: a masked key has w~ = 0 exactly
        and adds nothing, not even an underflow)."""
        if j0 == 0 and j1 == self.S:
            return self
        sub = copy.copy(self)
        sub.k, sub.v, sub.vcat = self.k[j0:j1], self.v[j0:j1], self.vcat[j0:j1]
        sub.kr = None if self.kr is None else self.kr[j0:j1]
        sub.knorm = self.knorm[j0:j1]
        sub.S = j1 - j0
        return sub


@dataclass
class Tier1:
    """Block result: y~ (r, Ev), err (r, Ev), ok (r,), weights p~/err_p (r, S) or None,
    ``a_up`` (r, Ev) >= Σ_j P_j |v_j| (the exact weights; with ``want_abs``) or None."""

    y: Array
    err: Array
    ok: Array
    p: Array | None = None
    err_p: Array | None = None
    a_up: Array | None = None


def _sum_blocks(w: Array, kv: KV, keep: Array | None) -> tuple[Array, Array, Array, int]:
    """(N, A, D, nb): N = Σ_j keep_j w_j v_j (r, Ev), A = Σ_j keep_j w_j |v_j| (r, Ev) and
    D = Σ_j w_j (r,), by BLAS (and np.sum) over key blocks of <= KEY_BLOCK keys, the
    blocks' N and D accumulated by TwoSum and rounded once at the end; nb blocks."""
    S = kv.S
    Ev = kv.v.shape[1]
    wk = w if keep is None else w * keep
    if S <= KEY_BLOCK:
        x = wk @ kv.vcat
        return x[:, :Ev], x[:, Ev:], np.sum(w, axis=-1), 1
    n_hi = a_sum = d_hi = n_lo = d_lo = None
    nb = 0
    for j0 in range(0, S, KEY_BLOCK):
        j1 = min(S, j0 + KEY_BLOCK)
        x = wk[:, j0:j1] @ kv.vcat[j0:j1]
        d = np.sum(w[:, j0:j1], axis=-1)
        nb += 1
        if n_hi is None:
            n_hi, a_sum, d_hi = x[:, :Ev].copy(), x[:, Ev:].copy(), d
            n_lo, d_lo = np.zeros_like(n_hi), np.zeros_like(d)
        else:
            n_hi, e = two_sum(n_hi, x[:, :Ev])
            n_lo += e
            d_hi, e2 = two_sum(d_hi, d)  # type: ignore[arg-type]
            d_lo += e2
            a_sum += x[:, Ev:]
    assert n_hi is not None and n_lo is not None and a_sum is not None
    assert d_hi is not None and d_lo is not None
    return n_hi + n_lo, a_sum, d_hi + d_lo, nb


def tier1_block(q: Array, qr: Array | None, kv: KV, blk: Block, c_f: float, rho_c: float,
                r_f: float = 1.0, rho_r: float = 0.0, want_weights: bool = False,
                ws: Workspace | None = None, want_abs: bool = False) -> Tier1:
    """Attention of query rows q (r, E) (``qr[i] >= ||q_i - q~_i||`` or None) against
    ``kv``, with the scores, masks and dropout of ``blk``, the true scale within
    ``rho_c`` of ``c_f`` and the dropout factor within ``rho_r`` of ``r_f``.
    Rows without an allowed key get ok = False (callers apply the policy).
    ``want_abs`` (no dropout, exact values): also an upper bound of the exact
    Σ_j P_j |v_j| (the perturbation lemma of :mod:`.transformed` needs it)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _tier1(q, qr, kv, blk, c_f, rho_c, r_f, rho_r, want_weights, ws, want_abs)


def _scores(q: Array, qr: Array | None, kv: KV, blk: Block, c_f: float, rho_c: float,
            ws: Workspace | None) -> tuple[Array, Array]:
    """Steps (1)-(2) of tier 1: G = fl(q kᵀ) (into the workspace when one is given) and
    the row constant alpha of the scores' error."""
    r, E = q.shape
    S = kv.S
    gE = gamma(max(E, 1))
    # (1) G = fl(q kᵀ): |G_ij - q_i·k_j| <= gamma_E ||q_i|| ||k_j|| + E·ETA =: eg (row bound
    # with K = max_j ||k_j||), plus the input radii ||qr_i||(K + Kr) + ||q_i|| Kr.
    G = q @ kv.k.T if ws is None else np.matmul(q, kv.k.T, out=ws.get("t1_G", (r, S)))
    qn = norm_up(q)
    eg = gE * qn * kv.kmax + E * ETA
    if qr is not None or kv.kr is not None:
        qrv = qr if qr is not None else np.zeros(r)
        eg = eg + qrv * (kv.kmax + kv.krmax) + qn * kv.krmax
    # (2) s~ = fl(fl(c_f G) + M): |s~_j - s_j| <= alpha + u|s~_j| with the row constant
    # alpha = (u|c_f| + rho_c)(||q|| K + eg) + (|c_f| + rho_c) eg + ETA/2.
    ac = abs(c_f)
    alpha = (U * ac + rho_c) * (qn * (kv.kmax + kv.krmax) + eg) + (ac + rho_c) * eg + ETA
    if blk.uniform is not None:
        alpha[blk.uniform] = 0.0
    return G, alpha


def _abs_weighted(a_f: Array, d_low: Array, tau0: Array, twt0: Array, tau_d: Array, kv: KV,
                  S: int, ascale: float) -> Array:
    """An upper bound of Σ_j P_j|v_j| per row and value column (``want_abs``)."""
    # Σ_j P_j|v_j| = Σ_j w_j|v_j|/D with w_j = w~_j(1 + theta_j), |theta_j| <= tau0 +
    # tau1|t~_j| (cut keys: |w_j - w~_j| <= TINY1) and D >= D~(1 - tau_d):
    # <= [A(1 + tau0) + (tau1 Tw + S·TINY1·D~)Vmax]/(D~(1 - tau_d)) with the exact
    # A = Σ w~|v| <= (fl(A) + S ETA)·ascale, D~ >= d_low >= 1 (the argmax key has
    # w~ = 1): <= [(fl(A) + S ETA)·ascale/d_low·(1 + tau0) + twt0·Vmax]/(1 - tau_d),
    # in the values' scaled units; times 2**F_l (exact).
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (((a_f + S * ETA) * ascale / d_low[:, None] * (1.0 + tau0[:, None])
                 + twt0[:, None] * kv.vmax[None, :]) / (1.0 - tau_d[:, None])
                * UP * kv.vscale[None, :])


def _weights(w: Array, t: Array, d_f: Array, tau0: Array, tau1: Array, tau_d: Array, g: float,
             keep: Array | None, notallowed: Array | None, r_f: float,
             rho_r: float) -> tuple[Array, Array]:
    """The weights p and their bounds (``want_weights``)."""
    # p_j = k_j r w_j / D.  |p_j - w~_j/D~| <= (w~_j/D~)(tau_j + tau_d)/(1 - tau_d) for
    # uncut keys (tau_d bounds |D/D~ - 1|), <= 2 TINY1/(1 - tau_d) for cut
    # keys; fl(w~/fl(D~)) adds u p~(1+2u) + ETA + (w~/D~) g/(1 - g).
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        p = w / d_f[:, None]
        if keep is not None:
            p *= keep
        # per key |theta_j| <= tau_j = tau0 + tau1 |t~_j| (step 4: the key's own score
        # error, not the row's largest, which counts 2u·708 for every key); D's
        # relative error <= tau_d
        tau_k = tau0[:, None] + tau1[:, None] * np.abs(t)
        tdd = tau_d[:, None]
        pb = (p * (1.0 + U) + ETA) * (1.0 + g)
        rel = (tau_k + tdd) / (1.0 - tdd) + 2 * g / (1.0 - g)
        err_p = (pb * rel + U * p * (1.0 + 2 * U) + ETA + 2.0 * TINY1) * UP + FLOOR
        if r_f != 1.0 or rho_r:
            p2 = p * r_f
            err_p = (abs(r_f) * err_p * (1 + U) + rho_r * (np.abs(p) + err_p)
                     + U * np.abs(p2) + ETA) * UP
            p = p2
        if notallowed is not None:
            np.putmask(err_p, notallowed, 0.0)
            np.putmask(p, notallowed, 0.0)  # exactly 0 (also in rows without a key)
    return p, err_p


def _tier1(q: Array, qr: Array | None, kv: KV, blk: Block, c_f: float, rho_c: float,
           r_f: float, rho_r: float, want_weights: bool, ws: Workspace | None,
           want_abs: bool = False) -> Tier1:
    r = q.shape[0]
    S = kv.S
    G, alpha = _scores(q, qr, kv, blk, c_f, rho_c, None if want_weights else ws)
    notallowed = None if blk.allowed is None else ~blk.allowed
    has_key = np.ones(r, dtype=bool) if blk.allowed is None else np.asarray(blk.allowed.any(axis=-1))
    # (3) t~ = fl(s~ - m) <= 0 with m the row maximum of s~ (masked keys -inf); for keys
    # with t~ >= EXP1_CUT: |t~ - t| <= alpha + u|m| + 2u|t~| =: eps0 + 2u|t~|.  Keys below
    # the cut: true t <= -707 (eps0 + u|m| <= 1); t~ is clamped there.
    # (4) w~ = exp~(t~) (masked keys 0): one fused pass (jit.t1_weights; numpy twin).
    w, t, m = t1_weights(G, c_f, blk.madd, blk.uniform, notallowed, has_key,
                         None if want_weights else ws)
    eps0 = (alpha + U * np.abs(m)) * UP
    e_t = (eps0 + 1416.0 * U) * UP  # the largest per-key error
    # |w~ - e^{t~}| <= RHO_EXP1 e^{t~} (uncut keys).
    # w = e^t = w~(1 + theta_j), |theta_j| <= (eps_j(1 + e_t) + rho)(1 + 2 rho)
    #   <= tau0 + tau1 |t~_j|,  tau0 = (eps0(1 + e_t) + rho)(1 + 2 rho), tau1 = 2u(1 + e_t)(1 + 2 rho).
    # Keys below the cut: |w - w~| <= TINY1, at most S of them, and D~ >= 1 (the
    # argmax key has t~ = 0, w~ = 1): T0 = S·TINY1 bounds their share relative to D~.
    # Tw = Σ_j w~_j |t~_j| (<= D~ log S: an entropy), rounded up: fl errs by gamma_{S+1}
    tw = -np.einsum("ij,ij->i", w, t) / (1.0 - gamma(S + 1)) * UP
    del G
    if not want_weights:
        del t
    with np.errstate(over="ignore"):
        tau0 = (eps0 * (1.0 + e_t) + RHO_EXP1) * (1.0 + 2.0 * RHO_EXP1) * UP
        tau1 = 2.0 * U * (1.0 + e_t) * (1.0 + 2.0 * RHO_EXP1) * UP
    t0 = S * TINY1
    # (5)+(6) N~ = Σ w~ k v, A = Σ w~ k |v|, D~ = Σ w~ by BLAS in key blocks of <= Sb keys,
    # accumulated by TwoSum: |fl(N~) - N~| <= gamma_Sb A + S·ETA + acc, fl(D~) = D~(1 ± g).
    n_f, a_f, d_f, nb = _sum_blocks(w, kv, blk.keep)
    # Per block: |fl(W_b V_b) - W_b V_b| <= gS W_b|V_b| + Sb·ETA (gS = gamma_Sb); across
    # nb blocks the TwoSum accumulation and the final rounding add <= (nb u gamma_nb
    # (1.01) + u) of the sum of magnitudes: g bounds both relative errors of N and D.
    Sb = min(S, KEY_BLOCK) if S else 1
    gS = gamma(max(Sb, 1))
    gn = gamma(nb) if nb > 1 else 0.0
    g = gS + ((nb * U * gn * 1.01 + U) * (1 + gS) if nb > 1 else 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d_low = d_f * (1.0 - g) - S * ETA  # <= D~
        twt0 = tau1 * tw / d_low + t0  # tau1 Tw/D~ + T0
        tau_d = tau0 + twt0  # bounds |D/D~ - 1|
    # the per-element bound (jit.t1_finish; the formula is jit._t1_elem):
    # A~ <= (fl(A) + S ETA)/((1 - gS)(1 - gn)), a = A~/D~;
    # |y~ - fl(N)/fl(D)| <= u|y~|(1 + 2u) + ETA =: rnd;
    # |fl(N)/fl(D) - N~/D~| <= g(a + 2.01|y_c|) + S ETA/D~ =: e_fl, |y^| <= |y~| + e_fl + rnd;
    # Σ_j w~|theta||x_j| <= tau0 Σ w~|x| + tau1 Tw max|x|, |x_j| = |k_j v_j - y^| <=
    # Vmax + |y^|, relative to D >= D~(1 - tau_d):
    # |y - N~/D~| <= [tau0(a + |y^|) + (tau1 Tw/D~ + T0)(Vmax + |y^|) + (1 + tau_d)Vr]/(1 - tau_d);
    # dropout y_out = r·y: fl(r_f y~) errs by <= |r_f| err + rho_r |y| + u|fl| + ETA;
    # the values' scale 2**F_l is put back exactly (+ 2 ETA for underflow).
    ascale = UP / ((1.0 - gS) * (1.0 - gn))
    vr = kv.vr2 if kv.vr2 is not None else np.zeros(kv.vmax.shape)
    y, err, fin = t1_finish(n_f, a_f, d_f, d_low, tau0, twt0, tau_d, kv.vmax, vr, g, ascale,
                            S * TINY_N, r_f, rho_r, bool(r_f != 1.0 or rho_r), kv.vscale)
    ok = has_key & (e_t <= MAX_SCORE_ERR) & (tau_d < 2.0**-10) & fin & (d_low > 0)
    a_up = _abs_weighted(a_f, d_low, tau0, twt0, tau_d, kv, S, ascale) if want_abs else None
    p = err_p = None
    if want_weights:
        p, err_p = _weights(w, t, d_f, tau0, tau1, tau_d, g, blk.keep, notallowed, r_f, rho_r)
        ok &= np.all(np.isfinite(p) & np.isfinite(err_p), axis=-1)
    return Tier1(y, err, ok, p, err_p, a_up)


def proj_fast(x: Array, w: Array, b: Array | None) -> tuple[Array, Array]:
    """y = x wᵀ + b in float64 with |y - y~| <= err (x, w, b exact doubles):
    gamma_n ||x_i|| ||w_r|| + n·ETA (dot product, Cauchy–Schwarz) + u|y~| + ETA (bias)."""
    n = x.shape[-1]
    y = x @ w.T
    if b is not None:
        y = y + b
    err = gamma(max(n, 1)) * norm_up(x)[..., None] * norm_up(w)[None, :] + n * ETA
    if b is not None:
        err = err + U * np.abs(y) + ETA
    return y, err * UP
