"""Certified reference attention: rigorous enclosures and correctly rounded results.

:func:`reference_attention` computes scaled dot-product attention of the exact
numbers its inputs hold (every float is a dyadic rational; the default scale is
the real number ``1/sqrt(E)``); :func:`reference_mha` does the same for a whole
``torch.nn.MultiheadAttention``-style block, with exact (unrounded)
intermediate projections. Both return an :class:`Enclosure`: ``lower <= true
<= upper`` elementwise (float64, outward rounded) and ``rounded(dtype)``, the
correctly rounded (nearest, ties to even) value in float64/32/16 or bfloat16.

Method (the proofs are in docs/oracle.md and in the comments below):

1. A fast path in numpy float64 computes every output with a *proved* error
   bound (``_fast_attention``): Higham's dot-product bounds, Cauchy–Schwarz
   norm bounds, an exp with range reduction and a Taylor polynomial whose
   error is bounded analytically (``_exp_nonpos``), and an error propagation
   through the normalised weighted sum.
2. An element whose enclosure does not round to a single value in the target
   format is recomputed with Arb balls (python-flint ``arb_mat``), raising the
   precision until the ball rounds to one value (Ziv's strategy, capped).
3. A true value exactly on a rounding boundary must be a dyadic rational; by
   the Lindemann–Weierstrass theorem an attention output is rational only when
   every group of keys with equal scores has the same mean value, so that case
   is detected and decided in exact rational arithmetic (``_rational_row``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ._arrays import as_exact_array, to_float64, validate_finite
from ._fpformats import (
    FloatFormat,
    get_format,
    half_gaps,
    round_dyadic,
    round_float64_to,
    round_fraction,
)
from .errors import InputValueError, PrecisionError, ShapeError, SpecError

__all__ = ["Enclosure", "reference_attention", "reference_mha"]

# ---------------------------------------------------------------------------
# Constants of the error analysis (binary64, round to nearest, gradual underflow)
# ---------------------------------------------------------------------------
_U = 2.0**-53  # unit roundoff: |fl(x) - x| <= u|x| for a normal result
_ETA = 2.0**-1074  # smallest subnormal; an underflowing product errs by <= _ETA/2
_UP = 1.0 + 2.0**-40  # inflates a bound computed in floats: each of its <= 2**12
#                       nonnegative round-to-nearest operations can lose a
#                       factor (1-u), and (1-u)**-4096 < 1 + 2**-40
_FLOOR = 2.0**-1000  # absolute slack for underflow inside the bound formulas
#                      (each loses <= _ETA per operation; far fewer than 2**70 ops)
_EXP_CUT = -700.0  # exp(t) for t < _EXP_CUT is taken as 0, with weight <= _TINY_W
_TINY_W = 2.0**-1008  # >= exp(-699) (exp(-699) ~ 2**-1008.4); used as a bound
_RHO_EXP = 2.0**-46  # proved relative error bound of _exp_nonpos (about 60u needed)
_MAX_SCORE_ERR = 2.0**-10  # beyond this the fast path hands the row to Arb

# ln 2 = LN2_HI + LN2_LO + d with |d| <= 2**-86 (LN2_LO = RN(ln 2 - LN2_HI) and
# |ln 2 - LN2_HI| < 2**-32); LN2_HI has 32 significant bits so k·LN2_HI is exact
# for |k| < 2**21.  Checked against Arb in tests/test_oracle.py.
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
_EXP_DEGREE = 14
# c_i = RN(1/i!) (Python's int/int division is correctly rounded)
_EXP_COEFFS = [1.0 / math.factorial(i) if i < 2 else float(Fraction(1, math.factorial(i)))
               for i in range(_EXP_DEGREE + 1)]

_START_PREC = {53: 128}  # first Arb precision per target precision (default 96)
_MAX_PREC = 1 << 14
_RATIONAL_AT_PREC = 256  # try the exact rational decision from this precision on

_CHUNK_ELEMS = 1 << 21  # fast path: scores processed at most ~2M at a time


def _gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability, §3.1), rounded up."""
    nu = n * _U
    return nu / (1.0 - nu) * _UP


def _exp_nonpos(t: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """exp(t) for t <= 0 (float64 array; -inf allowed), with
    |result - exp(t)| <= _RHO_EXP · exp(t) for t >= _EXP_CUT; 0 below _EXP_CUT.

    Proof (u = 2**-53, all operations round to nearest):
    * k = rint(fl(t/ln2)): |t| <= 700 so |k| <= 1010 and |t/ln2 - k| <= 1/2 + 1011·3u,
      hence r* = t - k ln2 satisfies |r*| <= 0.3466 + 2**-40 < 0.3467.
    * r = fl(fl(t - k·LN2_HI) - fl(k·LN2_LO)), k·LN2_HI exact (<= 43 bits).  Each of
      the three roundings errs by <= u times a quantity <= 0.3467 + 2**-22, and
      |k|·|ln2 - LN2_HI - LN2_LO| <= 1010·2**-86, so |r - r*| <= 1.05u.  Thus
      exp(r)/exp(r*) is within a factor exp(±1.05u).
    * P(r) = sum_{i<=14} c_i r^i by Horner, c_i = RN(1/i!).  Horner's bound
      (Higham Eq. 5.3): |fl(P(r)) - P(r)| <= gamma_28 sum c_i|r|^i <= 28.01u·1.4144;
      coefficient rounding adds <= u·1.4144; the Taylor remainder is
      <= |r|^15/15!·e^|r| <= 1.4e-19 < 0.0013u.  Total <= 41.06u absolute, and
      exp(r) >= e^-0.3467 = 0.707, so <= 58.1u relative.
    * ldexp(P, k) is exact: P in [0.70, 1.42] and k >= -1010 keep it normal.
    Total relative error <= 58.1u + 1.05u·(1 + tiny) < 60u < 2**-46 = _RHO_EXP.
    exp(0) is exactly 1 (k = 0, r = 0, Horner returns c_0 = 1).
    """
    ok = t >= _EXP_CUT  # False for -inf and NaN
    tt = np.where(ok, t, 0.0)
    k = np.rint(tt * _INV_LN2)
    r = tt - k * _LN2_HI
    r -= k * _LN2_LO
    p = np.full_like(r, _EXP_COEFFS[_EXP_DEGREE])
    for c in reversed(_EXP_COEFFS[:_EXP_DEGREE]):
        p *= r
        p += c
    out = np.ldexp(p, k.astype(np.int32))
    out[~ok] = 0.0
    return out


def _row_norm_up(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Upper bound on the 2-norms of the last axis: true sum x² <= fl(sum x²)·(1+gamma_{n+1})
    + n·_ETA (each square errs by <= u relatively or _ETA/2 absolutely; the sum of n
    nonnegative terms by gamma_{n-1}); sqrt rounds by <= u."""
    n = x.shape[-1]
    s = np.einsum("...i,...i->...", x, x)
    return np.sqrt(s * (1.0 + 2.0 * _gamma(n + 1)) + n * _ETA) * _UP * (1.0 + 2 * _U)


class _FastResult:
    """Fast-path output for a stack of C problems (arrays indexed [c, i, ...])."""

    def __init__(self, y: Any, err_y: Any, ok: Any, p: Any, err_p: Any) -> None:
        self.y = y
        self.err_y = err_y
        self.ok = ok
        self.p = p
        self.err_p = err_p


def _fast_attention(
    q: np.ndarray[Any, Any], qr: np.ndarray[Any, Any] | None,
    k: np.ndarray[Any, Any], kr: np.ndarray[Any, Any] | None,
    v: np.ndarray[Any, Any], vr: np.ndarray[Any, Any] | None,
    allowed: np.ndarray[Any, Any], madd: np.ndarray[Any, Any] | None,
    c_f: float, rho_c: float, want_weights: bool,
) -> _FastResult:
    """Attention of (q ± qr, k ± kr, v ± vr) for C stacked problems, in float64,
    with a rigorous elementwise error bound on the output (and weights).

    q (C,L,E), k (C,S,E), v (C,S,Ev); allowed (C,L,S) bool; madd (C,L,S) float64
    (finite where allowed) or None; the true scale c satisfies |c - c_f| <= rho_c.
    Rows with no allowed key are not handled here (ok=False is not set for them;
    callers overwrite them by policy).  The bound's derivation is in docs/oracle.md
    §3; the numbered steps below follow it.
    """
    C, L, E = q.shape
    S = k.shape[1]
    Ev = v.shape[2]
    gE, gS = _gamma(max(E, 1)), _gamma(max(S, 1))
    inf = np.inf

    # Only the per-row maximum of the score errors is needed (tau below is monotone
    # in it), so every bound is reduced over keys first: max of a sum <= sum of maxima.
    # (1) G = fl(q kᵀ): |G - q kᵀ| <= gamma_E |q||k|ᵀ + E·_ETA  (any summation
    # order, with or without FMA), and |q||k|ᵀ_ij <= ||q_i|| ||k_j|| (Cauchy–Schwarz).
    # Uncertain inputs add ||qr_i||(||k_j|| + ||kr_j||) + ||q_i|| ||kr_j||.
    G = np.matmul(q, np.swapaxes(k, -1, -2))
    nq, nk = _row_norm_up(q), _row_norm_up(k)
    eg = gE * nq * np.max(nk, axis=-1)[:, None] + E * _ETA  # (C, L): >= max_j err_g
    if qr is not None or kr is not None:
        rq = _row_norm_up(qr) if qr is not None else np.zeros_like(nq)
        rk = _row_norm_up(kr) if kr is not None else np.zeros_like(nk)
        eg = eg + rq * np.max(nk + rk, axis=-1)[:, None] + nq * np.max(rk, axis=-1)[:, None]
    gmax = np.maximum(np.max(G, axis=-1), -np.min(G, axis=-1))  # max_j |G_ij|

    # (2) s = c·g + M, computed as fl(fl(c_f·G) + M):
    # |s - s~| <= rho_c|G| + (|c_f| + rho_c) err_g + u|a| + _ETA + u|s~|,  a = fl(c_f G),
    # with |a| <= |c_f||G|(1 + u) + _ETA.
    s = G
    s *= c_f
    if madd is not None:
        s += madd
    all_allowed = bool(allowed.all())
    if not all_allowed:
        s[~allowed] = -inf
    has_key: np.ndarray[Any, Any] = np.asarray(allowed.any(axis=-1)) if S else \
        np.zeros((C, L), dtype=bool)
    m = np.max(s, axis=-1) if S else np.zeros((C, L))
    m = np.where(has_key, m, 0.0)
    smin = np.min(s, axis=-1, where=allowed, initial=inf) if S else np.zeros((C, L))
    smin = np.where(has_key, smin, 0.0)
    smax_abs = np.maximum(np.abs(m), np.abs(smin))
    e_s = (rho_c * gmax + (abs(c_f) + rho_c) * eg + _U * (abs(c_f) * gmax * (1 + _U) + _ETA)
           + _ETA + _U * smax_abs)

    # (3) shift by the row maximum m (a double, so the shift itself is exact in the
    # mathematics: softmax(s) = softmax(s - m) for every real m); t~ = fl(s~ - m) <= 0,
    # |t~ - (s~ - m)| <= u|t~| <= u(m - min s~)(1 + u): the error of t~ against
    # t = s - m is at most e_t below, for every key of the row.
    with np.errstate(invalid="ignore"):
        t = s
        t -= m[..., None]
    e_t = (e_s + _U * (m - smin)) * _UP

    # (4) w~ = exp~(t~), relative error <= _RHO_EXP for t~ >= _EXP_CUT (proof in
    # _exp_nonpos).  The true weight w = exp(t) = w~(1 + theta) with
    # |theta| <= (e^err - 1 + rho)/(1 - rho) <= (err(1 + err) + rho)(1 + 2 rho)
    # for err <= 1.  Keys with t~ < _EXP_CUT get w~ = 0 and true w <= e^(-700 + err)
    # <= _TINY_W (err <= 1); they are counted in T0.
    w = _exp_nonpos(t)
    n_cut = np.count_nonzero(t < _EXP_CUT, axis=-1)  # masked keys have t = -inf
    n_masked = S - np.count_nonzero(allowed, axis=-1) if not all_allowed else 0
    t0 = (n_cut - n_masked) * _TINY_W
    tiny = (allowed & (t < _EXP_CUT)) if want_weights else None
    del t, s, G
    with np.errstate(over="ignore"):  # an infinite tau only sends the row to Arb
        tau = (e_t * (1.0 + e_t) + _RHO_EXP) * (1.0 + 2.0 * _RHO_EXP) * _UP
    max_err_t = e_t
    tau_d = tau + t0  # |D/D~ - 1| <= tau + T0/D~ and D~ >= w~(argmax) = exp~(0) = 1

    # (5)+(6) D~ = sum w~, N~ = w~ v, A = w~|v|, y^ = N~/D~, a = A/D~, computed by BLAS:
    # |fl(N~) - N~| <= gamma_S A + S·_ETA, fl(D~) = D~(1 ± gamma_S), fl(A) >= A(1 - gamma_S) - S·_ETA.
    # Since Σ_j w~_j (v_j - y^) = 0 exactly, y - y^ = [Σ w~θ(v - y^) + Σ w~(1+θ)δv
    # + N_tiny - y^ D_tiny] / D and D >= D~(1 - tau) with D~ >= 1, so
    #   |y - y^| <= [tau (a + |y^|) + (1 + tau) Vr + T0 (Vmax + |y^|)] / (1 - tau)
    # and the float evaluation adds
    #   |y~ - y^| <= (gamma_S (a + |y^|) + S·_ETA)/(1 - gamma_S) + u|y~|(1 + 2u) + _ETA,
    # where |y^| <= |y~| + (2 gamma_S a + S·_ETA)/(1 - gamma_S) + u|y~|(1 + 2u) + _ETA.
    d_f = np.sum(w, axis=-1)
    abs_v = np.abs(v)
    n_f = np.matmul(w, v)
    a_f = np.matmul(w, abs_v)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = n_f / d_f[..., None]
        a_up = (a_f + S * _ETA) * (1.0 + gS) / ((1.0 - gS) * d_f[..., None])
    vmax = np.max(abs_v, axis=1) if S else np.zeros((C, Ev))
    if vr is not None:
        vr_col = np.max(vr, axis=1) if S else np.zeros((C, Ev))
        vmax = (vmax + vr_col) * _UP
    else:
        vr_col = np.zeros_like(vmax)
    tau3, t03 = tau[..., None], t0[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        abs_y = np.abs(y)
        rnd = _U * abs_y * (1.0 + 2 * _U) + _ETA
        yhat = (abs_y + (2.0 * gS * a_up + S * _ETA) / (1.0 - gS) + rnd) * _UP
        err1 = (tau3 * (a_up + yhat) + (1.0 + tau3) * vr_col[:, None, :]
                + t03 * (vmax[:, None, :] + yhat)) / (1.0 - tau3)
        err2 = (gS * (a_up + yhat) + S * _ETA) / (1.0 - gS)
        err_y = (err1 + err2 + rnd) * _UP + _FLOOR
    tau_d3 = tau_d[..., None]
    ok = has_key & (max_err_t <= _MAX_SCORE_ERR) & (tau_d < 2.0**-10)
    ok &= np.all(np.isfinite(y) & np.isfinite(err_y), axis=-1)
    p = err_p = None
    if want_weights:
        # p_j = w_j/D.  |p_j - w~_j/D~| <= (w~_j/D~)(tau + tau_d)/(1 - tau_d) (big keys),
        # p_j <= _TINY_W/(1 - tau_d) (tiny keys), exactly 0 (masked keys);
        # |fl(w~/fl(D~)) - w~/D~| <= u p~(1+2u) + _ETA + (w~/D~) gamma_S/(1 - gamma_S),
        # and w~/D~ <= (p~(1 + u) + _ETA)(1 + gamma_S).
        with np.errstate(divide="ignore", invalid="ignore"):
            p = w / d_f[..., None]
            pb = (p * (1.0 + _U) + _ETA) * (1.0 + gS)
            rel = (tau3 + tau_d3) / (1.0 - tau_d3) + gS / (1.0 - gS)
            err_p = (pb * rel + _U * p * (1.0 + 2 * _U) + _ETA) * _UP + _FLOOR
            err_p = err_p + np.where(tiny, 2.0 * _TINY_W, 0.0)  # type: ignore[arg-type]
        err_p = np.where(allowed, err_p, 0.0)
        p = np.where(allowed, p, 0.0)
        ok &= np.all(np.isfinite(p) & np.isfinite(err_p), axis=-1)
    return _FastResult(y, err_y, ok, p, err_p)


# ---------------------------------------------------------------------------
# Arb (ball arithmetic) path
# ---------------------------------------------------------------------------


def _arb_mat(rows: np.ndarray[Any, Any]) -> Any:
    """An exact arb_mat of a 2-D float64 array (doubles are exact in Arb)."""
    from flint import arb_mat

    r, c = rows.shape
    if r == 0 or c == 0:
        return arb_mat(r, c)
    return arb_mat(rows.tolist())


_SPLIT = 134217729.0  # 2**27 + 1, Veltkamp's splitting constant for binary64


def _two_prod_err(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any],
                  ph: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """pl with a·b = ph + pl exactly, ph = fl(a·b) (Dekker's TwoProduct, Veltkamp split)."""
    ta = a * _SPLIT
    ah = ta - (ta - a)
    al = a - ah
    tb = b * _SPLIT
    bh = tb - (tb - b)
    bl = b - bh
    return ((ah * bh - ph) + ah * bl + al * bh) + al * bl


def _dd_dot_balls(qr: np.ndarray[Any, Any], k: np.ndarray[Any, Any],
                  exact_products: bool = False) -> list[list[Any]] | None:
    """Arb balls for every q_i·k_j, from error-free transformations in numpy.

    Each product a·b = ph + pl exactly (Dekker's TwoProduct with Veltkamp's split;
    exact when no product or partial product under/overflows, guaranteed here by
    requiring every nonzero |x| in [2**-450, 2**450]).  (With fp32/fp16/bf16 inputs,
    significands of <= 24 bits, a·b is already exact: pl = 0 is skipped.)  The n
    terms are added by a pairwise tree of TwoSum (Knuth), each exact: Σ x = s + Σ e_i
    over fewer than n error terms, which are summed in floats:
    |fl(Σ e_i) - Σ e_i| <= gamma_n Σ|e_i| (Higham (H1)/(H2)).  So
    q_i·k_j lies in s + fl(Σ e_i) ± gamma_{n+1}·fl(Σ|e_i|)(1 + 2gamma_{n+1}), a ball of
    relative width ~n²u², enough for the first Arb precisions; returns None when
    the range guard fails (callers then convert the whole matrix to Arb)."""
    from flint import arb

    for x in (qr, k):
        ax = np.abs(x[x != 0])
        if ax.size and (ax.min() < 2.0**-450 or ax.max() > 2.0**450):
            return None
    r, E = qr.shape
    S = k.shape[0]
    a = np.broadcast_to(qr[:, None, :], (r, S, E))
    b = np.broadcast_to(k[None, :, :], (r, S, E))
    ph = a * b
    # significands of <= 26 bits (fp32/fp16/bf16): a·b is a double already
    terms = ph if exact_products else np.concatenate([ph, _two_prod_err(a, b, ph)], axis=-1)
    n = terms.shape[-1]

    # pairwise TwoSum tree: every level is exact, x_a + x_b = s + e
    x = terms
    errs = []
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = np.concatenate([x, np.zeros((*x.shape[:-1], 1))], axis=-1)
        xa, xb = x[..., 0::2], x[..., 1::2]
        sm = xa + xb
        bb = sm - xa
        errs.append((xa - (sm - bb)) + (xb - bb))
        x = sm
    s = x[..., 0]
    if errs:
        e_all = np.concatenate(errs, axis=-1)  # fewer than n terms
        err = np.sum(e_all, axis=-1)
        rad = _gamma(n + 1) * np.sum(np.abs(e_all), axis=-1) * (1.0 + 2.0 * _gamma(n + 1)) * _UP
    else:
        err = rad = np.zeros((r, S))
    out = []
    for si, ei, ri in zip(s.tolist(), err.tolist(), rad.tolist(), strict=True):
        out.append([arb(x_, z_) + y_ for x_, y_, z_ in zip(si, ei, ri, strict=True)])
    return out


def _arb_attention_rows(
    qm: Any, km: Any, vm: Any, c: Any,
    allowed: np.ndarray[Any, Any], madd: np.ndarray[Any, Any] | None,
    want: str, shift_idx: list[int] | None = None, g_rows: list[list[Any]] | None = None,
) -> list[list[Any]]:
    """Rows of attention in ball arithmetic at the current precision.

    qm (r×E), km (S×E), vm (S×Ev) arb_mat; c an arb; allowed (r×S) bool; madd (r×S)
    or None.  want = "output" -> r lists of Ev balls; "weights" -> r lists of S balls.
    Every row must have an allowed key.  Softmax is shifted by the exact midpoint of
    one score per row: ``shift_idx[i]`` (an allowed key with an approximately largest
    score, found in floats by the caller) or else the key with the largest midpoint.
    Any real shift gives the same softmax; a near-maximal one keeps exps <= ~1."""
    from flint import arb, arb_mat

    r, S = allowed.shape
    Ev = vm.ncols()
    zero = arb(0)
    if g_rows is not None:  # balls for q_i·k_j given by the caller: scale them
        g_rows = [[g * c for g in row] for row in g_rows]
    elif qm.ncols() == 0 or r == 0 or S == 0:
        g_rows = [[zero] * S for _ in range(r)]
    else:
        sc = (qm * km.transpose()) * c
        ents = sc.entries()
        g_rows = [ents[i * S:(i + 1) * S] for i in range(r)]
    w_rows: list[list[Any]] = []
    for i in range(r):
        row = g_rows[i]
        al = allowed[i]
        full = bool(al.all())
        if madd is not None:
            row = [x + arb(float(mj)) for x, mj in zip(row, madd[i].tolist(), strict=True)]
        if shift_idx is not None:
            shift = row[shift_idx[i]].mid()
        else:
            idx = np.flatnonzero(al).tolist()
            shift = row[max(idx, key=lambda j: float(row[j].mid()))].mid()
        if full:
            w_rows.append([(x - shift).exp() for x in row])
        else:
            w_rows.append([(x - shift).exp() if a_ else zero
                           for x, a_ in zip(row, al.tolist(), strict=True)])
    # one product gives the weighted sums and (last column) the normaliser D
    ones = arb_mat(S, 1)
    for j in range(S):
        ones[j, 0] = 1
    if want == "weights" or Ev == 0:
        dm = arb_mat(w_rows) * ones
        d_list = [dm[i, 0] for i in range(r)]
        if want == "weights":
            return [[wj / d for wj in wrow] for wrow, d in zip(w_rows, d_list, strict=True)]
        return [[] for _ in range(r)]
    vext = arb_mat(S, Ev + 1)
    for j in range(S):
        for l in range(Ev):
            vext[j, l] = vm[j, l]
        vext[j, Ev] = 1
    nm = arb_mat(w_rows) * vext
    ents = nm.entries()
    w1 = Ev + 1
    out = []
    for i in range(r):
        base = i * w1
        inv = 1 / ents[base + Ev]
        out.append([ents[base + l] * inv for l in range(Ev)])
    return out


class _Prec:
    """Context manager setting python-flint's working precision (restored on exit).
    Arb endpoints (``x.lower()``) and differences are rounded to the *current*
    precision, so every inspection of a ball happens inside one of these."""

    def __init__(self, prec: int) -> None:
        self.prec = prec
        self.old = 0

    def __enter__(self) -> None:
        from flint import ctx

        self.old = ctx.prec
        ctx.prec = self.prec

    def __exit__(self, *exc: object) -> None:
        from flint import ctx

        ctx.prec = self.old


def _ball_bounds(x: Any) -> tuple[float, float]:
    """Outward float64 bounds of an arb ball (call inside _Prec)."""
    from flint import arb

    if not x.is_finite():
        return -math.inf, math.inf
    lo_x, hi_x = x.lower(), x.upper()
    lo, hi = float(lo_x), float(hi_x)
    if math.isfinite(lo) and arb(lo) > lo_x:
        lo = math.nextafter(lo, -math.inf)
    if math.isfinite(hi) and arb(hi) < hi_x:
        hi = math.nextafter(hi, math.inf)
    return lo, hi


def _round_ends(x: Any, fmt: FloatFormat) -> tuple[float, float] | None:
    """Both exact endpoints of the ball rounded to ``fmt`` (call inside _Prec)."""
    if not x.is_finite():
        return None
    lo_m, lo_e = x.lower().man_exp()
    hi_m, hi_e = x.upper().man_exp()
    return (round_dyadic(int(lo_m), int(lo_e), fmt), round_dyadic(int(hi_m), int(hi_e), fmt))


def _decide_ball_exact(x: Any, fmt: FloatFormat) -> float | None:
    """Round both exact endpoints of the ball to ``fmt``; the common value, or None."""
    ends = _round_ends(x, fmt)
    return ends[0] if ends is not None and ends[0] == ends[1] else None


def _boundary_between(a: float, b: float, fmt: FloatFormat) -> Fraction | None:
    """The rounding boundary between adjacent format values a < b (the overflow
    threshold when b is inf), or None when they are not adjacent."""
    half_top = Fraction(2) ** (fmt.emax - fmt.p)  # half a quantum at the top binade
    if math.isinf(b) and b > 0:
        return Fraction(fmt.max_finite) + half_top if a == fmt.max_finite else None
    if math.isinf(a) and a < 0:
        return -(Fraction(fmt.max_finite) + half_top) if b == -fmt.max_finite else None
    if not (math.isfinite(a) and math.isfinite(b)) or not a < b:
        return None
    mid = (Fraction(a) + Fraction(b)) / 2
    return mid if round_fraction(mid, fmt) in (a, b) else None


def _decide_balls(balls: Sequence[Any], fmt: FloatFormat) -> tuple[np.ndarray[Any, Any],
                                                                     np.ndarray[Any, Any]]:
    """Correct rounding of many arb balls to ``fmt``; returns (decided, value).

    Vectorised test: with m the ball midpoint, m_f = float(m) (nearest),
    res = m - m_f (exact in Arb: both have <= prec bits and are within one ulp),
    r_f = float(res) and R >= rad + |res - r_f| (|res - r_f| <= 2**-52|r_f| + _ETA),
    the true value lies in m_f + [r_f - R, r_f + R].  With z = RN_fmt(m_f) and
    d = m_f - z (exact, Sterbenz), it rounds to z if d + r_f - R > -below and
    d + r_f + R < above (half gaps of z).  The float sums d + r_f ± R err by
    <= 2u(|d|+|r_f|+R)(1+u); requiring a margin of 2**-20·gap and
    |d|+|r_f|+R <= 2**20·gap makes that error harmless.  Elements failing
    the test (or with |m_f| < 2**-960, or non-finite) go to the exact endpoint test.
    """
    from flint import arb

    n = len(balls)
    mf = np.empty(n)
    rf = np.empty(n)
    rad = np.empty(n)
    fin = np.ones(n, dtype=bool)
    for idx, x in enumerate(balls):
        if not x.is_finite():
            fin[idx] = False
            mf[idx] = rf[idx] = rad[idx] = 0.0
            continue
        mid = x.mid()
        f = float(mid)
        mf[idx] = f
        if math.isfinite(f):
            rf[idx] = float(mid - arb(f))
        else:
            rf[idx] = 0.0
            fin[idx] = False
        rad[idx] = float(x.rad())
    with np.errstate(invalid="ignore", over="ignore"):
        big_r = (rad * (1.0 + 2.0**-51) + np.abs(rf) * 2.0**-52 + 2 * _ETA) * _UP
        z = round_float64_to(mf, fmt)
        ok = fin & np.isfinite(z) & (np.abs(mf) >= 2.0**-960) & np.isfinite(big_r)
        d = mf - z
        below, above = half_gaps(np.where(ok, z, 1.0), fmt)
        base = d + rf
        lo_off = base - big_r
        hi_off = base + big_r
        gap = np.minimum(below, above)
        ok &= (lo_off > -below * (1 - 2.0**-20)) & (hi_off < above * (1 - 2.0**-20))
        ok &= (np.abs(d) + np.abs(rf) + big_r) <= gap * 2.0**20
    value = np.where(ok, z, np.nan)
    for idx in np.flatnonzero(~ok).tolist():
        got = _decide_ball_exact(balls[idx], fmt)
        if got is not None:
            ok[idx] = True
            value[idx] = got
    return ok, value


# ---------------------------------------------------------------------------
# Problems: what an Enclosure needs to refine itself
# ---------------------------------------------------------------------------


class _Problem:
    """Interface: a stack of row-structured results (flat shape (B, L, ncols))."""

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        """Ball enclosures of rows ``rows`` of stack element ``b`` at ``prec`` bits;
        with ``cols`` (outputs only) just those columns, in that order."""
        raise NotImplementedError

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        return None

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction) -> int | None:
        """sign(true value - boundary) by a method that does not need the value's own
        precision, or None when not available (the default)."""
        return None


class _AttentionProblem(_Problem):
    def __init__(self, q: Any, k: Any, v: Any, allowed: Any, madd: Any,
                 scale: Fraction | None, E: int) -> None:
        self.q, self.k, self.v = q, k, v
        self.allowed, self.madd = allowed, madd
        self.scale = scale  # exact rational scale, or None for 1/sqrt(E)
        self.E = E
        self._kv_key = -1
        self._km: Any = None
        self.exact_products = False  # set when q and k have <= 26-bit significands

    def scale_arb(self) -> Any:
        from flint import arb

        if self.scale is not None:
            # a float scale is dyadic: numerator / 2**k is exact in Arb
            return arb(self.scale.numerator) / arb(self.scale.denominator)
        if self.E == 0:
            return arb(0)
        return arb(self.E).rsqrt()

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import ctx

        old = ctx.prec
        ctx.prec = prec
        try:
            vb = self.v[b] if cols is None or kind != "output" else self.v[b][:, cols]
            vm = _arb_mat(vb)
            madd = self.madd[b][rows] if self.madd is not None else None
            allowed = np.asarray(self.allowed[b][rows])
            shift = self._shift_idx(b, rows, allowed, madd)
            qrows = self.q[b][rows]
            g_rows = None
            # few rows at a low precision: error-free dot products in numpy are
            # cheaper than converting all of K to Arb (ball radius ~ (2E)²u²)
            if prec <= 128 and self.E and len(rows) * self.k.shape[1] <= 1 << 14:
                g_rows = _dd_dot_balls(qrows, self.k[b], self.exact_products)
            if g_rows is not None:
                return _arb_attention_rows(_arb_mat(np.zeros((len(rows), 0))), None, vm,
                                           self.scale_arb(), allowed, madd, kind, shift,
                                           g_rows)
            if self._kv_key != b:
                self._km = _arb_mat(self.k[b])
                self._kv_key = b
            return _arb_attention_rows(_arb_mat(qrows), self._km, vm, self.scale_arb(),
                                       allowed, madd, kind, shift)
        finally:
            ctx.prec = old

    def _shift_idx(self, b: int, rows: list[int], allowed: Any, madd: Any) -> list[int] | None:
        """Per row, an allowed key whose float score is largest (None if floats fail)."""
        c_f = float(self.scale) if self.scale is not None else (
            1.0 / math.sqrt(self.E) if self.E else 0.0)
        with np.errstate(all="ignore"):
            sa = (self.q[b][rows] @ self.k[b].T) * c_f
            if madd is not None:
                sa = sa + madd
            sa = np.where(allowed, sa, -np.inf)
            if not np.all(np.isfinite(sa[allowed])):
                return None
        return [int(j) for j in np.argmax(sa, axis=-1)]

    def _c_rat(self) -> Fraction | None:
        """The scale as an exact rational, or None when it is 1/sqrt(E) irrational."""
        if self.scale is not None:
            return self.scale
        if self.E == 0:
            return Fraction(0)
        rt = math.isqrt(self.E)
        return Fraction(1, rt) if rt * rt == self.E else None

    def _groups(self, b: int, i: int) -> dict[Any, list[int]]:
        """Unmasked keys of row (b, i) grouped by exact score.  Key: the score as a
        Fraction when the scale is rational, else (q·k_j, M_j) — with c irrational,
        c·g + M = c·g' + M' iff g = g' and M = M'."""
        cache = self.__dict__.setdefault("_group_cache", {})
        if (b, i) in cache:
            return cache[(b, i)]
        allowed = np.asarray(self.allowed[b][i])
        qrow = [Fraction(float(x)) for x in self.q[b][i]]
        c_rat = self._c_rat()
        groups: dict[Any, list[int]] = {}
        for j in np.flatnonzero(allowed).tolist():
            g = sum((a * Fraction(float(x)) for a, x in zip(qrow, self.k[b][j], strict=True)),
                    Fraction(0))
            mj = Fraction(float(self.madd[b][i][j])) if self.madd is not None else Fraction(0)
            key: Any = c_rat * g + mj if c_rat is not None else (g, mj)
            groups.setdefault(key, []).append(j)
        if len(cache) > 4096:
            cache.clear()
        cache[(b, i)] = groups
        return groups

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction) -> int | None:
        """sign(y - boundary) for one element, decided without computing y to the
        precision of its distance from the boundary.

        With groups g of equal exact score a_g, n_g keys and value sums V_g,
        y - T = Σ_g e^{a_g} (V_g - n_g T) / Σ_g n_g e^{a_g}, so the sign is that of
        Σ_g e^{a_g - A} c_g with exact rationals c_g = V_g - n_g T (weights: c_g =
        [j in g] - n_g T).  Terms with c_g = 0 are exactly 0; the others are balls of
        full relative accuracy however small e^{a_g - A} is, so a score gap of 1e4
        (a factor e^-10000 that no fixed precision resolves in y itself) costs nothing.
        Returns 0 when every c_g is 0 (y = T exactly), None if undecided at 2**16 bits."""
        from flint import arb, fmpq

        groups = self._groups(b, i)
        coef = []
        for key, js in groups.items():
            if kind == "weights":
                val = Fraction(1 if col in js else 0)
            else:
                val = sum((Fraction(float(self.v[b][j][col])) for j in js), Fraction(0))
            coef.append((key, val - len(js) * boundary))
        if all(cg == 0 for _, cg in coef):
            return 0
        c_rat = self._c_rat()
        prec = 256
        while prec <= 1 << 16:
            with _Prec(prec):
                c = self.scale_arb()
                terms = []
                for key, cg in coef:
                    if c_rat is not None:
                        a_g = arb(fmpq(key.numerator, key.denominator))
                    else:
                        g, mj = key
                        a_g = c * arb(fmpq(g.numerator, g.denominator)) + arb(
                            fmpq(mj.numerator, mj.denominator))
                    terms.append((a_g, cg))
                top = max(terms, key=lambda t: float(t[0].mid()))[0].mid()
                total = arb(0)
                for a_g, cg in terms:
                    if cg != 0:
                        total += (a_g - top).exp() * arb(fmpq(cg.numerator, cg.denominator))
                if total > 0:
                    return 1
                if total < 0:
                    return -1
            prec *= 4
        return None

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        """The exact row when it is rational, else None (see module docstring, 3.).

        Scores c·g_j + M_j with g_j = q_i·k_j exact rationals.  If c is rational,
        group keys by the exact score; if c = 1/sqrt(E) is irrational, two scores
        are equal iff their g and M agree.  Output column l is rational iff every
        group has the same mean of v[:, l] (Lindemann–Weierstrass: the e^{a_g} of
        distinct algebraic a_g are linearly independent over the algebraic numbers),
        and then equals that mean.  Weights are rational iff there is one group
        (then p_j = 1/n)."""
        allowed = np.asarray(self.allowed[b][i])
        idx = np.flatnonzero(allowed).tolist()
        if not idx:
            return None
        groups = self._groups(b, i)
        if kind == "weights":
            if len(groups) != 1:
                return None
            n = len(idx)
            return [Fraction(1, n) if a else Fraction(0) for a in allowed.tolist()]
        out: list[Fraction | None] = []
        for col in range(self.v.shape[-1]):
            means = {sum((Fraction(float(self.v[b][j][col])) for j in js), Fraction(0)) / len(js)
                     for js in groups.values()}
            out.append(next(iter(means)) if len(means) == 1 else None)
        return out


# ---------------------------------------------------------------------------
# The result object
# ---------------------------------------------------------------------------


class Enclosure:
    """Rigorous elementwise enclosure of an exact attention result.

    Attributes: ``lower``, ``upper`` (float64, outward rounded: lower <= true <=
    upper), ``midpoint`` (float64, an approximation inside the enclosure),
    ``shape``; ``weights`` (an Enclosure of the softmax probabilities, or None).
    Rows under ``masked_rows="nan"`` hold NaN in every array.
    """

    def __init__(self, problem: _Problem, kind: str, shape: tuple[int, ...],
                 mid: np.ndarray[Any, Any], err: np.ndarray[Any, Any],
                 ok: np.ndarray[Any, Any], zero_rows: np.ndarray[Any, Any],
                 nan_rows: np.ndarray[Any, Any],
                 perm: tuple[int, ...] | None = None) -> None:
        # flat arrays (B, L, ncols); ok/zero_rows/nan_rows (B, L).  The user's array
        # is flat.reshape(pre_shape).transpose(perm) (perm None: no transpose).
        self._problem = problem
        self._kind = kind
        self._perm = perm
        self._pre_shape = shape if perm is None else tuple(shape[perm.index(a)]
                                                           for a in range(len(shape)))
        self.shape = shape
        self.weights: Enclosure | None = None
        self._zero_rows = zero_rows
        self._nan_rows = nan_rows
        self._exact_rows: dict[tuple[int, int], list[Fraction | None] | None] = {}
        self._rounded_cache: dict[str, np.ndarray[Any, Any]] = {}
        mid = np.array(mid, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            lo = np.nextafter(mid - err, -np.inf)
            hi = np.nextafter(mid + err, np.inf)
        bad = ~ok & ~zero_rows & ~nan_rows
        for b, i in np.argwhere(bad).tolist():
            balls = problem.arb_rows(b, [i], 128, kind)[0]
            with _Prec(4 * 128):
                for col, x in enumerate(balls):
                    lo[b, i, col], hi[b, i, col] = _ball_bounds(x)
                    mid[b, i, col] = float(x.mid()) if x.is_finite() else np.nan
        exact_zero = ok[..., None] & (err == 0)
        lo = np.where(exact_zero, mid, lo)
        hi = np.where(exact_zero, mid, hi)
        for arr, val in ((lo, 0.0), (hi, 0.0), (mid, 0.0)):
            arr[zero_rows] = val
        for arr in (lo, hi, mid):
            arr[nan_rows] = np.nan
        self._lo, self._hi, self._mid = lo, hi, mid

    def _user(self, flat: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        arr = flat.reshape(self._pre_shape)
        return arr if self._perm is None else np.ascontiguousarray(arr.transpose(self._perm))

    @property
    def lower(self) -> np.ndarray[Any, Any]:
        return self._user(self._lo)

    @property
    def upper(self) -> np.ndarray[Any, Any]:
        return self._user(self._hi)

    @property
    def midpoint(self) -> np.ndarray[Any, Any]:
        return self._user(self._mid)

    def __repr__(self) -> str:
        width = float(np.nanmax(self._hi - self._lo)) if self._lo.size else 0.0
        return f"Enclosure(shape={self.shape}, max width={width:.3g})"

    def _flat_index(self, index: Any) -> tuple[int, int, int]:
        if isinstance(index, (int, np.integer)):
            index = (int(index),)
        index = tuple(int(i) for i in index)
        if len(index) != len(self.shape):
            raise SpecError(f"index={index} must have {len(self.shape)} entries "
                            f"for shape={self.shape}")
        for i, n in zip(index, self.shape, strict=False):
            if not -n <= i < n:
                raise SpecError(f"index={index} is out of range for shape={self.shape}")
        index = tuple(i % n for i, n in zip(index, self.shape, strict=False))
        if self._perm is not None:
            index = tuple(index[self._perm.index(a)] for a in range(len(index)))
        flat = int(np.ravel_multi_index(index, self._pre_shape))
        b, i, col = np.unravel_index(flat, self._mid.shape)
        return int(b), int(i), int(col)

    def _rational(self, b: int, i: int) -> list[Fraction | None] | None:
        key = (b, i)
        if key not in self._exact_rows:
            self._exact_rows[key] = self._problem.rational_row(b, i, self._kind)
        return self._exact_rows[key]

    def exact(self, index: Any, *, prec: int = 256) -> Any:
        """One element at high precision: a Fraction when the value is rational
        and known exactly (masked rows, uniform weights, one-hot rows), else a
        python-flint arb ball computed at ``prec`` bits (NaN rows: float nan)."""
        b, i, col = self._flat_index(index)
        if self._nan_rows[b, i]:
            return math.nan
        if self._zero_rows[b, i]:
            return Fraction(0)
        row = self._rational(b, i)
        if row is not None and row[col] is not None:
            return row[col]
        return self._problem.arb_rows(b, [i], prec, self._kind)[0][col]

    def rounded(self, dtype: Any = "float64") -> np.ndarray[Any, Any]:
        """The correctly rounded (nearest, ties to even) value of every element in
        ``dtype`` (float64/float32/float16/bfloat16, as a numpy dtype, ml_dtypes
        type, torch dtype or name).  Raises PrecisionError if an element cannot be
        decided within the precision cap (never observed; it would need a value
        within ~2**-16000 of a rounding boundary)."""
        fmt = get_format(dtype)
        if fmt.name not in self._rounded_cache:
            self._rounded_cache[fmt.name] = self._round(fmt)
        return self._user(self._rounded_cache[fmt.name]).astype(fmt.numpy_dtype())

    def _round(self, fmt: FloatFormat) -> np.ndarray[Any, Any]:
        lo = round_float64_to(self._lo, fmt)
        hi = round_float64_to(self._hi, fmt)
        decided = lo == hi  # rounding is monotone: lo <= y <= hi => same rounding
        value = np.where(decided, lo, np.nan)
        decided |= self._nan_rows[..., None]
        todo = np.argwhere(~decided)
        if todo.size == 0:
            return value
        # group the undecided elements by row
        rows: dict[tuple[int, int], list[int]] = {}
        for b, i, col in todo.tolist():
            rows.setdefault((b, i), []).append(col)
        prec = _START_PREC.get(fmt.p, 96)
        while rows:
            if prec > _MAX_PREC:
                (b, i), cols = next(iter(rows.items()))
                raise PrecisionError(
                    f"could not decide the {fmt.name} rounding of element "
                    f"{self._user_index(b, i, cols[0])} within {_MAX_PREC} bits"
                )
            if prec >= _RATIONAL_AT_PREC:
                for (b, i), cols in list(rows.items()):
                    exact_row = self._rational(b, i)
                    if exact_row is None:
                        continue
                    left = []
                    for col in cols:
                        fr = exact_row[col]
                        if fr is None:
                            left.append(col)
                        else:
                            value[b, i, col] = round_fraction(fr, fmt)
                    if left:
                        rows[(b, i)] = left
                    else:
                        del rows[(b, i)]
            by_b: dict[int, list[int]] = {}
            for b, i in rows:
                by_b.setdefault(b, []).append(i)
            balls: list[Any] = []
            where: list[tuple[int, int, int]] = []
            for b, ilist in by_b.items():
                need = sorted({col for i in ilist for col in rows[(b, i)]})
                pos = {col: n for n, col in enumerate(need)}
                got = self._problem.arb_rows(b, ilist, prec, self._kind, need)
                for i, row_balls in zip(ilist, got, strict=False):
                    for col in rows[(b, i)]:
                        balls.append(row_balls[pos[col]] if self._kind == "output"
                                     else row_balls[col])
                        where.append((b, i, col))
            with _Prec(2 * prec):  # endpoints and mid - float(mid) stay exact
                ok, vals = _decide_balls(balls, fmt)
            new_rows: dict[tuple[int, int], list[int]] = {}
            for n, ((b, i, col), good, val) in enumerate(
                    zip(where, ok.tolist(), vals.tolist(), strict=True)):
                if good:
                    value[b, i, col] = val
                    continue
                if prec >= _RATIONAL_AT_PREC:
                    # one boundary inside the ball: decide the side exactly (a tie
                    # sits on it; a huge score gap can put y within e^-10000 of it)
                    with _Prec(2 * prec):
                        ends = _round_ends(balls[n], fmt)
                    if ends is not None:
                        t_b = _boundary_between(ends[0], ends[1], fmt)
                        if t_b is not None:
                            sign = self._problem.boundary_sign(b, i, col, self._kind, t_b)
                            if sign is not None:
                                value[b, i, col] = (ends[1] if sign > 0 else ends[0]
                                                    if sign < 0 else round_fraction(t_b, fmt))
                                continue
                new_rows.setdefault((b, i), []).append(col)
            rows = new_rows
            prec *= 2
        return value

    def _user_index(self, b: int, i: int, col: int) -> tuple[int, ...]:
        """The user's index of flat element (b, i, col)."""
        flat = int(np.ravel_multi_index((b, i, col), self._mid.shape))
        pre = tuple(int(x) for x in np.unravel_index(flat, self._pre_shape))
        return pre if self._perm is None else tuple(pre[a] for a in self._perm)


# ---------------------------------------------------------------------------
# Input handling
# ---------------------------------------------------------------------------

_POLICIES = ("zero", "nan", "error")
_ALIGNMENTS = ("top_left", "bottom_right")


def _exact_scale(scale: Any, E: int) -> tuple[Fraction | None, float, float]:
    """(exact rational scale or None for 1/sqrt(E), c_f, rho_c) with |c - c_f| <= rho_c."""
    if scale is None:
        if E == 0:
            return None, 0.0, 0.0
        rt = math.isqrt(E)
        if rt * rt == E:
            c = Fraction(1, rt)
            c_f = float(c)  # correctly rounded
            return None, c_f, abs(float(c - Fraction(c_f))) * _UP + (0.0 if c == c_f else _ETA)
        c_f = 1.0 / math.sqrt(E)  # sqrt and division each round: |c - c_f| <= 2.01u c_f
        return None, c_f, 2.01 * _U * c_f * _UP + _ETA
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise SpecError(f"scale={scale!r}: expected None or a real number")
    if isinstance(scale, (int, np.integer)) and abs(int(scale)) > 2**53:
        raise SpecError(f"scale={scale!r} is too large to be held exactly as a float")
    sf = float(scale)
    if not math.isfinite(sf):
        raise InputValueError(f"scale={scale!r}: expected a finite number")
    return Fraction(sf), sf, 0.0


def _broadcast(shapes: dict[str, tuple[int, ...]], what: str) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError:
        desc = ", ".join(f"{k}={v}" for k, v in shapes.items())
        raise ShapeError(f"{what} do not broadcast: {desc}") from None


def _prepare_mask(attn_mask: Any, is_causal: bool, causal_alignment: str,
                  batch: tuple[int, ...], L: int, S: int) -> tuple[Any, Any]:
    """(allowed bool array broadcastable to batch+(L,S), additive float64 or None)."""
    allowed: np.ndarray[Any, Any] = np.ones((1,) * len(batch) + (L, S), dtype=bool)
    madd = None
    if attn_mask is not None:
        m = as_exact_array(attn_mask, "attn_mask")
        target = (*batch, L, S)
        try:
            np.broadcast_shapes(m.shape, target)
            if np.broadcast_shapes(m.shape, target) != target:
                raise ValueError
        except ValueError:
            raise ShapeError(
                f"attn_mask.shape={m.shape} does not broadcast to the scores' shape "
                f"{target} (batch..., L, S)"
            ) from None
        if m.dtype == bool:
            allowed = allowed & m
        else:
            validate_finite(m, "attn_mask", allow_neg_inf=True)
            m64 = to_float64(m)
            allowed = allowed & (m64 != -np.inf)
            madd = np.where(m64 == -np.inf, 0.0, m64)
    if is_causal:
        i = np.arange(L)[:, None]
        j = np.arange(S)[None, :]
        causal = j <= i if causal_alignment == "top_left" else j <= i + (S - L)
        allowed = allowed & causal
    return allowed, madd


def reference_attention(
    query: Any, key: Any, value: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left",
    masked_rows: str = "zero", return_weights: bool = False,
) -> Enclosure:
    """Certified scaled dot-product attention of the exact input values.

    Named and shaped like ``torch.nn.functional.scaled_dot_product_attention``:
    query (..., H_q, L, E), key (..., H_kv, S, E), value (..., H_kv, S, E_v);
    leading dimensions broadcast.  ``attn_mask``: bool (True = takes part) or float
    (added to the scores; -inf = weight exactly 0), broadcastable to
    (..., H_q, L, S); combined with ``is_causal`` (top_left: key j <= i,
    bottom_right: j <= i + S - L).  ``scale=None`` is exactly 1/sqrt(E); a float
    scale is its exact value (0 means zero).  ``enable_gqa``: query head g uses
    key/value head g // (H_q/H_kv).  ``masked_rows``: "zero" | "nan" | "error" for
    rows where every key is masked.

    >>> import numpy as np
    >>> r = reference_attention(np.ones((1, 2, 4)), np.ones((1, 3, 4)),
    ...                         np.arange(6.0).reshape(1, 3, 2), scale=0.0)
    >>> r.rounded("float32").tolist()
    [[[2.0, 3.0], [2.0, 3.0]]]
    """
    if masked_rows not in _POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {_POLICIES}")
    if causal_alignment not in _ALIGNMENTS:
        raise SpecError(f"causal_alignment={causal_alignment!r}: expected one of {_ALIGNMENTS}")
    q = as_exact_array(query, "query")
    k = as_exact_array(key, "key")
    v = as_exact_array(value, "value")
    for name, arr in (("query", q), ("key", k), ("value", v)):
        if arr.dtype == bool:
            raise SpecError(f"{name}.dtype=bool: expected a float array")
        if arr.ndim < 2:
            raise ShapeError(f"{name}.shape={arr.shape}: expected at least 2 dimensions (..., L, E)")
        validate_finite(arr, name)
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(
            f"key.shape={k.shape} does not match query.shape={q.shape}: "
            f"E must agree ({q.shape[-1]} vs {k.shape[-1]})"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(
            f"value.shape={v.shape} does not match key.shape={k.shape}: "
            f"S must agree ({k.shape[-2]} vs {v.shape[-2]})"
        )
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk != hv:
            raise ShapeError(f"value.shape={v.shape} does not match key.shape={k.shape}: "
                             f"H_kv must agree ({hk} vs {hv})")
        if hk == 0 or hq % hk:
            raise ShapeError(
                f"query.shape={q.shape}, key.shape={k.shape}: with enable_gqa=True H_q must "
                f"be a multiple of H_kv ({hq} vs {hk})"
            )
        rep = hq // hk
        k = np.repeat(k, rep, axis=-3)
        v = np.repeat(v, rep, axis=-3)
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    try:
        batch = tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    except ValueError:
        hint = ""
        if q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3] and not enable_gqa:
            hint = f" (H_q={q.shape[-3]} != H_kv={k.shape[-3]}: pass enable_gqa=True for GQA)"
        raise ShapeError(
            f"query.shape={q.shape}, key.shape={k.shape}, value.shape={v.shape}: the "
            f"leading (batch, head) dimensions do not broadcast{hint}"
        ) from None
    scale_exact, c_f, rho_c = _exact_scale(scale, E)
    allowed_b, madd_b = _prepare_mask(attn_mask, is_causal, causal_alignment, batch, L, S)
    B = math.prod(batch)
    qf = np.broadcast_to(to_float64(q), (*batch, L, E)).reshape(B, L, E)
    kf = np.broadcast_to(to_float64(k), (*batch, S, E)).reshape(B, S, E)
    vf = np.broadcast_to(to_float64(v), (*batch, S, Ev)).reshape(B, S, Ev)
    allowed = np.broadcast_to(allowed_b, (*batch, L, S)).reshape(B, L, S)
    madd = None if madd_b is None else np.broadcast_to(madd_b, (*batch, L, S)).reshape(B, L, S)

    empty_rows: np.ndarray[Any, Any] = (np.asarray(~allowed.any(axis=-1)) if S
                                        else np.ones((B, L), dtype=bool))
    if masked_rows == "error" and empty_rows.any():
        b, i = np.argwhere(empty_rows)[0].tolist()
        where = (*tuple(int(x) for x in np.unravel_index(b, batch)), i) if batch else (i,)
        raise InputValueError(
            f"query row {where} has every key masked out (attn_mask/is_causal) and "
            "masked_rows='error'"
        )
    zero_rows = empty_rows if masked_rows == "zero" else np.zeros_like(empty_rows)
    nan_rows = empty_rows if masked_rows == "nan" else np.zeros_like(empty_rows)

    y = np.zeros((B, L, Ev))
    err_y = np.zeros((B, L, Ev))
    ok = np.zeros((B, L), dtype=bool)
    p = np.zeros((B, L, S)) if return_weights else None
    err_p = np.zeros((B, L, S)) if return_weights else None
    if B and L and S:
        c_step = max(1, _CHUNK_ELEMS // max(1, L * S))
        for start in range(0, B, c_step):
            sl = slice(start, min(B, start + c_step))
            fr = _fast_attention(qf[sl], None, kf[sl], None, vf[sl], None,
                                 np.ascontiguousarray(allowed[sl]),
                                 None if madd is None else madd[sl],
                                 c_f, rho_c, return_weights)
            y[sl], err_y[sl], ok[sl] = fr.y, fr.err_y, fr.ok
            if return_weights:
                p[sl], err_p[sl] = fr.p, fr.err_p  # type: ignore[index]
    ok &= ~empty_rows
    problem = _AttentionProblem(qf, kf, vf, allowed, madd, scale_exact, E)
    problem.exact_products = q.dtype.name != "float64" and k.dtype.name != "float64"
    out = Enclosure(problem, "output", (*batch, L, Ev), y, err_y, ok, zero_rows, nan_rows)
    if return_weights:
        assert p is not None and err_p is not None
        out.weights = Enclosure(problem, "weights", (*batch, L, S), p, err_p, ok,
                                zero_rows, nan_rows)
    return out




# ---------------------------------------------------------------------------
# Multi-head attention block
# ---------------------------------------------------------------------------


def _proj_fast(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any],
               b: np.ndarray[Any, Any] | None) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """y = x wᵀ + b in float64 with |y - y~| <= err (x, w, b exact doubles):
    gamma_n ||x_i|| ||w_r|| + n·_ETA (dot product, Cauchy–Schwarz) + u|y~| + _ETA (bias)."""
    n = x.shape[-1]
    y = x @ w.T
    if b is not None:
        y = y + b
    err = _gamma(max(n, 1)) * _row_norm_up(x)[..., None] * _row_norm_up(w)[None, :] + n * _ETA
    if b is not None:
        err = err + _U * np.abs(y) + _ETA
    return y, err * _UP


class _MhaProblem(_Problem):
    """Exact composition: projections, per-head attention, output projection."""

    def __init__(self, xq: Any, xk: Any, xv: Any, w: dict[str, Any], H: int, Hkv: int,
                 hd: int, allowed: Any, madd: Any, masked_rows: str) -> None:
        self.xq, self.xk, self.xv = xq, xk, xv
        self.w = w
        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.allowed, self.madd = allowed, madd  # (N, H, L, S)
        self.masked_rows = masked_rows
        self._cache_key: tuple[int, int] | None = None
        self._cache: Any = None

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import arb, ctx

        old = ctx.prec
        ctx.prec = prec
        try:
            w, hd, H, Hkv = self.w, self.hd, self.H, self.Hkv
            S = self.xk.shape[1]
            if self._cache_key != (b, prec):
                ks, vs = [], []
                xk, xv = _arb_mat(self.xk[b]), _arb_mat(self.xv[b])
                for h in range(Hkv):
                    sl = slice(h * hd, (h + 1) * hd)
                    kh = xk * _arb_mat(w["wk"][sl]).transpose()
                    vh = xv * _arb_mat(w["wv"][sl]).transpose()
                    if w["bk"] is not None:
                        kh = kh + _arb_mat(np.broadcast_to(w["bk"][sl], (S, hd)))
                    if w["bv"] is not None:
                        vh = vh + _arb_mat(np.broadcast_to(w["bv"][sl], (S, hd)))
                    ks.append(kh)
                    vs.append(vh)
                self._cache = (ks, vs)
                self._cache_key = (b, prec)
            ks, vs = self._cache
            r = len(rows)
            xq = _arb_mat(self.xq[b][rows])
            c = arb(hd).rsqrt() if hd else arb(0)
            zero = arb(0)
            a_rows: list[list[Any]] = [[] for _ in range(r)]
            rep = H // Hkv
            for h in range(H):
                sl = slice(h * hd, (h + 1) * hd)
                qh = xq * _arb_mat(w["wq"][sl]).transpose()
                if w["bq"] is not None:
                    qh = qh + _arb_mat(np.broadcast_to(w["bq"][sl], (r, hd)))
                al = np.asarray(self.allowed[b, h][rows])
                has = al.any(axis=-1) if S else np.zeros(r, dtype=bool)
                out_h: list[list[Any]] = [[zero] * hd for _ in range(r)]
                live = np.flatnonzero(has).tolist()
                if live:
                    from flint import arb_mat

                    qlive = arb_mat([[qh[i, j] for j in range(hd)] for i in live]) if hd \
                        else arb_mat(len(live), 0)
                    madd = None if self.madd is None else self.madd[b, h][rows][live]
                    got = _arb_attention_rows(qlive, ks[h // rep], vs[h // rep], c,
                                              al[live], madd, "output")
                    for n_, i in enumerate(live):
                        out_h[i] = got[n_]
                for i in range(r):
                    a_rows[i].extend(out_h[i])
            from flint import arb_mat

            E_out = w["wo"].shape[0]
            cols = list(range(E_out)) if cols is None else cols
            am = arb_mat(a_rows) if a_rows and a_rows[0] else arb_mat(r, 0)
            wo = _arb_mat(w["wo"][cols])
            om = am * wo.transpose() if am.ncols() else arb_mat(r, len(cols))
            if w["bo"] is not None:
                om = om + _arb_mat(np.broadcast_to(w["bo"][cols], (r, len(cols))))
            n_c = len(cols)
            ents = om.entries()
            return [ents[i * n_c:(i + 1) * n_c] for i in range(r)]
        finally:
            ctx.prec = old


def _get(module: Any, name: str) -> Any:
    val = getattr(module, name, None)
    if val is None:
        return None
    return as_exact_array(val, f"module.{name}")


def reference_mha(
    query: Any, key: Any, value: Any, *,
    num_heads: int | None = None,
    in_proj_weight: Any = None, in_proj_bias: Any = None,
    q_proj_weight: Any = None, k_proj_weight: Any = None, v_proj_weight: Any = None,
    out_proj_weight: Any = None, out_proj_bias: Any = None,
    num_kv_heads: int | None = None,
    key_padding_mask: Any = None, attn_mask: Any = None, is_causal: bool = False,
    batch_first: bool = False, masked_rows: str = "zero", module: Any = None,
) -> Enclosure:
    """Certified output of a multi-head attention block, ``torch.nn.MultiheadAttention``
    conventions throughout.

    Inputs: ``batch_first=False`` (torch's default): query (L, N, E_q), key (S, N, kdim),
    value (S, N, vdim); ``batch_first=True``: (N, L, E_q) ...; unbatched (L, E_q) too.
    Weights in torch's layout, y = x Wᵀ + b: ``in_proj_weight`` (3E, E) (rows: W_q,
    W_k, W_v) or ``q_proj_weight`` (E, E_q), ``k_proj_weight`` (E_kv, kdim),
    ``v_proj_weight`` (E_kv, vdim); ``in_proj_bias`` (E + 2 E_kv); ``out_proj_weight``
    (E_out, E); ``out_proj_bias``.  E_kv = num_kv_heads · E/num_heads (GQA;
    default num_kv_heads = num_heads); query head g uses key/value head
    g // (num_heads/num_kv_heads).  Or pass ``module=`` a torch
    ``nn.MultiheadAttention`` to read all of these (and batch_first) from it.

    Masks, as torch.nn.MultiheadAttention.forward: ``key_padding_mask`` (N, S) and
    ``attn_mask`` (L, S) or (N·num_heads, L, S), bool **True = masked out** (ignored),
    or float (added to the scores; -inf = masked out).  ``is_causal=True`` applies
    the top-left causal mask (key j <= query i) in addition.  Scale 1/sqrt(E/num_heads),
    exactly.  Every intermediate (projections, attention) is an exact real number:
    the result encloses the exact composition of the exact inputs.
    """
    if masked_rows not in _POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {_POLICIES}")
    if module is not None:
        if getattr(module, "bias_k", None) is not None or getattr(module, "add_zero_attn", False):
            raise SpecError("module uses add_bias_kv or add_zero_attn, which reference_mha "
                            "does not model")
        num_heads = int(module.num_heads)
        batch_first = bool(getattr(module, "batch_first", False))
        in_proj_weight = _get(module, "in_proj_weight")
        q_proj_weight = _get(module, "q_proj_weight")
        k_proj_weight = _get(module, "k_proj_weight")
        v_proj_weight = _get(module, "v_proj_weight")
        in_proj_bias = _get(module, "in_proj_bias")
        out_proj_weight = as_exact_array(module.out_proj.weight, "module.out_proj.weight")
        ob = getattr(module.out_proj, "bias", None)
        out_proj_bias = None if ob is None else as_exact_array(ob, "module.out_proj.bias")
    if num_heads is None or isinstance(num_heads, bool) or int(num_heads) < 1:
        raise SpecError(f"num_heads={num_heads!r}: expected a positive integer")
    H = int(num_heads)
    Hkv = H if num_kv_heads is None else int(num_kv_heads)
    if Hkv < 1 or H % Hkv:
        raise SpecError(f"num_kv_heads={num_kv_heads!r}: expected a positive divisor of "
                        f"num_heads={H}")
    if out_proj_weight is None:
        raise SpecError("out_proj_weight is required (or pass module=)")

    def arr(x: Any, name: str) -> np.ndarray[Any, Any]:
        a = as_exact_array(x, name)
        if a.dtype == bool:
            raise SpecError(f"{name}.dtype=bool: expected a float array")
        validate_finite(a, name)
        return to_float64(a)

    xq, xk, xv = arr(query, "query"), arr(key, "key"), arr(value, "value")
    unbatched = xq.ndim == 2
    for name, x in (("query", xq), ("key", xk), ("value", xv)):
        if x.ndim != (2 if unbatched else 3):
            raise ShapeError(f"{name}.shape={x.shape}: expected "
                             f"{'(L, E)' if unbatched else '3 dimensions'} like query.shape="
                             f"{xq.shape}")
    if unbatched:
        xq, xk, xv = xq[None], xk[None], xv[None]
    elif not batch_first:
        xq, xk, xv = (np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (xq, xk, xv))
    N, L, Eq = xq.shape
    if xk.shape[:2] != xv.shape[:2] or xk.shape[0] != N:
        raise ShapeError(f"key.shape={np.shape(key)} and value.shape={np.shape(value)} must "
                         f"share batch and length, with query.shape={np.shape(query)}")
    S = xk.shape[1]
    if in_proj_weight is not None:
        wi = arr(in_proj_weight, "in_proj_weight")
        if wi.ndim != 2 or wi.shape[0] % 3 or Hkv != H:
            raise ShapeError(f"in_proj_weight.shape={wi.shape}: expected (3E, E) "
                             "(GQA needs separate q/k/v_proj_weight)")
        E = wi.shape[0] // 3
        wq, wk, wv = wi[:E], wi[E:2 * E], wi[2 * E:]
    else:
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise SpecError("pass in_proj_weight or all of q_proj_weight, k_proj_weight, "
                            "v_proj_weight")
        wq = arr(q_proj_weight, "q_proj_weight")
        wk = arr(k_proj_weight, "k_proj_weight")
        wv = arr(v_proj_weight, "v_proj_weight")
        E = wq.shape[0]
    if E % H:
        raise ShapeError(f"embed_dim={E} is not divisible by num_heads={H}")
    hd = E // H
    Ekv = Hkv * hd
    for name, wmat, rows_, cols_ in (("q_proj_weight", wq, E, Eq),
                                     ("k_proj_weight", wk, Ekv, xk.shape[2]),
                                     ("v_proj_weight", wv, Ekv, xv.shape[2])):
        if wmat.shape != (rows_, cols_):
            raise ShapeError(f"{name}.shape={wmat.shape} does not match the inputs: expected "
                             f"({rows_}, {cols_}) (E={E}, num_heads={H}, num_kv_heads={Hkv})")
    bq = bk = bv = None
    if in_proj_bias is not None:
        bi = arr(in_proj_bias, "in_proj_bias")
        if bi.shape != (E + 2 * Ekv,):
            raise ShapeError(f"in_proj_bias.shape={bi.shape}: expected ({E + 2 * Ekv},)")
        bq, bk, bv = bi[:E], bi[E:E + Ekv], bi[E + Ekv:]
    wo = arr(out_proj_weight, "out_proj_weight")
    if wo.ndim != 2 or wo.shape[1] != E:
        raise ShapeError(f"out_proj_weight.shape={wo.shape}: expected (E_out, {E})")
    E_out = wo.shape[0]
    bo = None
    if out_proj_bias is not None:
        bo = arr(out_proj_bias, "out_proj_bias")
        if bo.shape != (E_out,):
            raise ShapeError(f"out_proj_bias.shape={bo.shape}: expected ({E_out},)")

    # masks -> allowed (N, H, L, S) and additive (N, H, L, S) or None
    allowed = np.ones((N, H, L, S), dtype=bool)
    madd: np.ndarray[Any, Any] | None = None

    def add_mask(m: Any, name: str, shape4: Callable[[np.ndarray[Any, Any]],
                                                        np.ndarray[Any, Any]]) -> None:
        nonlocal allowed, madd
        a = as_exact_array(m, name)
        if a.dtype == bool:
            allowed = allowed & ~shape4(a)
            return
        validate_finite(a, name, allow_neg_inf=True)
        a4 = shape4(to_float64(a))
        allowed = allowed & (a4 != -np.inf)
        fin = np.where(a4 == -np.inf, 0.0, a4)
        madd = fin if madd is None else madd + fin  # exact? see below
        if madd is not fin:
            # two float masks: their sum must be exact for the truth to be the sum of
            # the exact masks; refuse when it is not (rare; pass one combined mask).
            raise SpecError("key_padding_mask and attn_mask are both float masks; pass one "
                            "combined float mask (or bool masks) so the sum stays exact")

    if key_padding_mask is not None:
        kp_shape = (S,) if unbatched else (N, S)

        def kp4(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            if a.shape != kp_shape:
                raise ShapeError(f"key_padding_mask.shape={a.shape}: expected {kp_shape} "
                                 "(batch, S)")
            return np.broadcast_to(a.reshape(N, 1, 1, S), (N, H, L, S))

        add_mask(key_padding_mask, "key_padding_mask", kp4)
    if attn_mask is not None:

        def am4(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            if a.shape == (L, S):
                return np.broadcast_to(a, (N, H, L, S))
            if a.shape == (N * H, L, S):
                return a.reshape(N, H, L, S)  # torch layout: index n*num_heads + h
            raise ShapeError(f"attn_mask.shape={a.shape}: expected ({L}, {S}) or "
                             f"({N * H}, {L}, {S}) (batch*num_heads, L, S)")

        add_mask(attn_mask, "attn_mask", am4)
    if is_causal:
        allowed = allowed & (np.arange(S)[None, :] <= np.arange(L)[:, None])
    allowed = np.ascontiguousarray(allowed)
    empty: np.ndarray[Any, Any] = (np.asarray(~allowed.any(axis=-1)) if S
                                   else np.ones((N, H, L), dtype=bool))
    if masked_rows == "error" and empty.any():
        n, h, i = np.argwhere(empty)[0].tolist()
        raise InputValueError(f"query row {i} of batch {n}, head {h} has every key masked out "
                              "(key_padding_mask/attn_mask/is_causal) and masked_rows='error'")

    # ---- fast path
    q_t, q_e = _proj_fast(xq, wq, bq)
    k_t, k_e = _proj_fast(xk, wk, bk)
    v_t, v_e = _proj_fast(xv, wv, bv)

    def heads(x: np.ndarray[Any, Any], n_h: int) -> np.ndarray[Any, Any]:
        n, ln, _ = x.shape
        x = x.reshape(n, ln, n_h, hd).transpose(0, 2, 1, 3)
        if n_h != H:
            x = np.repeat(x, H // n_h, axis=1)
        return np.ascontiguousarray(x.reshape(n * H, ln, hd))

    c_f = 1.0 / math.sqrt(hd) if hd else 0.0
    rho_c = 2.01 * _U * c_f * _UP + (_ETA if hd else 0.0)
    y = np.zeros((N * H, L, hd))
    err = np.zeros((N * H, L, hd))
    ok = np.ones((N * H, L), dtype=bool)
    if L and S:
        fr = _fast_attention(heads(q_t, H), heads(q_e, H), heads(k_t, Hkv), heads(k_e, Hkv),
                             heads(v_t, Hkv), heads(v_e, Hkv), allowed.reshape(N * H, L, S),
                             None if madd is None else madd.reshape(N * H, L, S),
                             c_f, rho_c, False)
        y, err, ok = fr.y, fr.err_y, fr.ok
    em = empty.reshape(N * H, L)
    y[em] = 0.0
    err[em] = 0.0
    ok = ok | em
    a_t = y.reshape(N, H, L, hd).transpose(0, 2, 1, 3).reshape(N, L, E)
    a_e = err.reshape(N, H, L, hd).transpose(0, 2, 1, 3).reshape(N, L, E)
    ok_rows = ok.reshape(N, H, L).all(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        o_t = a_t @ wo.T
        abs_wo = np.abs(wo)
        o_e = a_e @ abs_wo.T + _gamma(max(E, 1)) * (np.abs(a_t) @ abs_wo.T) + E * _ETA
        if bo is not None:
            o_t = o_t + bo
            o_e = o_e + _U * np.abs(o_t) + _ETA
        o_e = o_e * _UP + _FLOOR
    ok_rows &= np.all(np.isfinite(o_t) & np.isfinite(o_e), axis=-1)
    nan_rows: np.ndarray[Any, Any] = (np.asarray(empty.any(axis=1)) if masked_rows == "nan"
                                      else np.zeros((N, L), dtype=bool))
    zero_rows = np.zeros((N, L), dtype=bool)
    w = {"wq": wq, "wk": wk, "wv": wv, "bq": bq, "bk": bk, "bv": bv, "wo": wo, "bo": bo}
    problem = _MhaProblem(xq, xk, xv, w, H, Hkv, hd, allowed, madd, masked_rows)
    if unbatched:
        return Enclosure(problem, "output", (L, E_out), o_t, o_e, ok_rows, zero_rows, nan_rows)
    if batch_first:
        return Enclosure(problem, "output", (N, L, E_out), o_t, o_e, ok_rows, zero_rows,
                         nan_rows)
    return Enclosure(problem, "output", (L, N, E_out), o_t, o_e, ok_rows, zero_rows, nan_rows,
                     perm=(1, 0, 2))
