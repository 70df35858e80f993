"""tanh and sech² with proved error bounds, in float64 and in double-double: the
arithmetic of a softcapped score (C·tanh(s/C)) and of its derivative, for the
transformed-score tiers (:mod:`..variants.transformed`) and their gradients.  Each
evaluation has a numpy twin and, with numba, a compiled kernel giving the same bits."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from .constants import ETA, RHO_EXP1, RHO_EXP2, TINY1, TINY2, UP, U
from .dd import dd_add_d, dd_div, dd_mul
from .expo import _table1, _table2, exp_dd, exp_double
from .jit import _POW2, _kernels

_R = U * (1.0 + 2.0 * U)  # |fl(x) - x| <= _R·|fl(x)| + ETA for one rounding (u/(1-u) < _R)

# tanh(x) = x·P(x²) for |x| <= TANH_SMALL, P(y) = Σ_{n=1..10} T_n y^{n-1}, T_n the Taylor
# coefficients of tanh (T_n = 2^{2n}(2^{2n} - 1) B_{2n}/(2n)!; tests check them against
# SymPy's series).  Proof of |fl(x·P̃) - tanh(x)| <= REL_TANH_SMALL·|tanh(x)|:
# * y = fl(x²) = x²(1 + δ), y <= 0.030016 (x² <= 0.17325² plus a rounding);
# * |T_n| = 2(2^{2n} - 1)ζ(2n)/π^{2n} <= 3.29·0.4053^n, so the omitted terms n >= 11 sum
#   to <= 3.29·0.4053·(0.4053·y)^10/(1 - 0.4053·y) < 10^-19 < 0.001u, and
#   Σ|T_n| y^{n-1} <= 1 + (y/3)/(1 - 0.0122) <= 1.0102, while P(y) >= 1 - y/3 >= 0.98999
#   (an alternating series with decreasing terms);
# * Horner (Higham, Eq. 5.3): <= gamma_18·1.0102 <= 18.2u; coefficient rounding
#   (d_n = RN(T_n)) <= u·1.0102; so fl(P(y)) = P(y)(1 + θ), |θ| <= 19.5u;
# * the rounding of y moves P by <= |P'(y)|·y·u <= 0.011u relative; the product by x
#   rounds once more: <= u.  Total relative <= 20.6u < 21u.
TANH_SERIES = [Fraction(1), Fraction(-1, 3), Fraction(2, 15), Fraction(-17, 315),
               Fraction(62, 2835), Fraction(-1382, 155925), Fraction(21844, 6081075),
               Fraction(-929569, 638512875), Fraction(6404582, 10854718875),
               Fraction(-443861162, 1856156927625)]
_TANH_COEFFS = [float(c) for c in TANH_SERIES]  # RN(T_n) (Fraction -> float rounds)
TANH_SMALL = 0.17325
# Relative error bounds of tanh_proved (proofs above and in its docstring).
REL_TANH_SMALL = 21.0 * U                         # |x| <= TANH_SMALL
REL_TANH_LARGE = 2.83 * RHO_EXP1 + 4.0 * U       # |x| > TANH_SMALL: <= 2^-46.4
ABS_TANH = 4.0 * TINY1                            # exp(-2|x|) held at exp~(-708) below the cut
# the largest of the above, as one absolute bound for |tanh| <= 1
E_TANH = REL_TANH_LARGE + ABS_TANH


# ---- tier 2: tanh in double-double (TransformedProblem.refine) -------------------------
# The series of _tanh_small to x^31 (16 terms), coefficients as double-doubles
# T_n = hi + lo with |T_n - hi - lo| <= 2^-106|T_n|.  For |x| <= TANH_SMALL (y = x² <=
# 0.030016): Horner in dd, 15 steps of dd_mul (8.02u²) and two dd_add_d (each <=
# u(u|s| + |low word|) <= 2.01u²·|partial sum|), partial sums <= 1.0102: <= 15·12.1u²·
# 1.0102 <= 184u²; coefficients <= u²·1.0102; the omitted terms n >= 17 <= 3.29·0.4053·
# (0.012166)^16/(1 - 0.012166) <= 25u² (u² = 2^-106); y's rounding (8.02u² relative)
# moves P by <= 0.011·8.02u²; the product by x: 8.02u².  With P >= 0.98999 the relative
# error is <= (184 + 1.02 + 25 + 0.1 + 8.02)u²/0.98999 < 221u² < 2^-98.
# For |x| > TANH_SMALL: e = exp_dd(-2|x|) (RHO_EXP2 = 2^-84; -2|x| >= -600, else
# the result is taken as 1 with an absolute error <= 2e^-600 <= 2·TINY2); (1 - e) and
# (1 + e) by dd_add_d (<= 2.01u² each, relative: 1 - e >= 0.29), the quotient by dd_div
# (2^-100): as for tanh_proved, relative <= 2.829·RHO_EXP2 + 2^-97.
def _tanh_taylor(n_terms: int) -> list[Fraction]:
    """The first Taylor coefficients of tanh, exactly: T_n = 2^{2n}(2^{2n} - 1)
    B_{2n}/(2n)! with the Bernoulli numbers from Σ_{k<=m} C(m+1, k) B_k = 0."""
    from math import comb, factorial

    bern = [Fraction(1)]
    for m in range(1, 2 * n_terms + 1):
        bern.append(-sum((comb(m + 1, k) * bern[k] for k in range(m)), Fraction(0)) / (m + 1))
    return [Fraction(4**n * (4**n - 1)) * bern[2 * n] / factorial(2 * n)
            for n in range(1, n_terms + 1)]


_TANH_DD = _tanh_taylor(16)
_TANH_DD_HI = [float(c) for c in _TANH_DD]
_TANH_DD_LO = [float(c - Fraction(h)) for c, h in zip(_TANH_DD, _TANH_DD_HI, strict=True)]
_TANH_DD_HI_A = np.array(_TANH_DD_HI)
_TANH_DD_LO_A = np.array(_TANH_DD_LO)
REL_TANH_DD_SMALL = 2.0**-98
REL_TANH_DD_LARGE = 2.83 * RHO_EXP2 + 2.0**-97
ABS_TANH_DD = 2.0 * TINY2


def _tanh_dd(xh: np.ndarray[Any, Any], xl: np.ndarray[Any, Any], want_sech2: bool = False
             ) -> tuple[np.ndarray[Any, Any], ...]:
    """(th, tl, rel_err_bound) for tanh(xh + xl) in double-double (proof above), and with
    ``want_sech2`` also (fh, fl) = sech²(xh + xl) within REL_SECH2_DD (proof below the
    sech² constants): one compiled pass when numba is available, bit-identical to
    :func:`_np_tanh_dd` (the same operations per element; tests/oracle/variants/test_variants.py)."""

    k = _kernels()
    if k is None or not hasattr(k, "tanh_dd") or xh.size == 0:
        return _np_tanh_dd(xh, xl, want_sech2)

    xh = np.ascontiguousarray(xh, dtype=np.float64)
    xl = np.ascontiguousarray(xl, dtype=np.float64)
    th = np.empty_like(xh)
    tl = np.empty_like(xh)
    fh = np.empty_like(xh) if want_sech2 else np.empty(0)
    fl = np.empty_like(xh) if want_sech2 else np.empty(0)
    tab_hi, tab_lo = _table2()
    k.tanh_dd(xh, xl, _TANH_DD_HI_A, _TANH_DD_LO_A, tab_hi, tab_lo, _POW2, th, tl,
              want_sech2, fh, fl)
    rel = np.where(np.abs(xh) <= TANH_SMALL, REL_TANH_DD_SMALL, REL_TANH_DD_LARGE)
    return (th, tl, rel, fh, fl) if want_sech2 else (th, tl, rel)


def _np_tanh_dd(xh: np.ndarray[Any, Any], xl: np.ndarray[Any, Any], want_sech2: bool = False
                ) -> tuple[np.ndarray[Any, Any], ...]:
    """The numpy twin of :func:`_tanh_dd`."""
    neg = xh < 0
    ah = np.where(neg, -xh, xh)
    al = np.where(neg, -xl, xl)
    small = ah <= TANH_SMALL
    th = np.zeros_like(ah)
    tl = np.zeros_like(ah)
    fh = np.zeros_like(ah)
    fl = np.zeros_like(ah)
    if np.any(small):
        sh, sl = ah[small], al[small]
        yh, yl = dd_mul(sh, sl, sh, sl)
        ph = np.full_like(sh, _TANH_DD_HI[-1])
        pl = np.full_like(sh, _TANH_DD_LO[-1])
        for chi, clo in zip(reversed(_TANH_DD_HI[:-1]), reversed(_TANH_DD_LO[:-1]),
                            strict=True):
            ph, pl = dd_mul(ph, pl, yh, yl)
            ph, pl = dd_add_d(ph, pl, np.full_like(ph, chi))
            ph, pl = dd_add_d(ph, pl, np.full_like(ph, clo))
        t_h, t_l = dd_mul(sh, sl, ph, pl)
        th[small], tl[small] = t_h, t_l
        if want_sech2:   # 1 - t² (t <= 0.1733: no cancellation)
            qh, ql = dd_mul(t_h, t_l, t_h, t_l)
            fh[small], fl[small] = dd_add_d(-qh, -ql, np.ones_like(qh))
    big = ~small
    if np.any(big):
        bh, bl = ah[big], al[big]
        far = bh > 300.0
        eh, el = exp_dd(np.where(far, -600.0, -2.0 * bh), np.where(far, 0.0, -2.0 * bl))
        eh = np.where(far, 0.0, eh)
        el = np.where(far, 0.0, el)
        nh, nl = dd_add_d(-eh, -el, np.ones_like(eh))
        dh, dl = dd_add_d(eh, el, np.ones_like(eh))
        th[big], tl[big] = dd_div(nh, nl, dh, dl)
        if want_sech2:   # 4e/(1 + e)²
            qh, ql = dd_mul(dh, dl, dh, dl)
            gh, gl = dd_div(4.0 * eh, 4.0 * el, qh, ql)
            fh[big], fl[big] = np.where(far, 0.0, gh), np.where(far, 0.0, gl)
    rel = np.where(small, REL_TANH_DD_SMALL, REL_TANH_DD_LARGE)
    t = (np.where(neg, -th, th), np.where(neg, -tl, tl), rel)
    return (*t, fh, fl) if want_sech2 else t


# ---- the softcap's derivative: sech²(x) = 1 - tanh²(x) = 4e/(1 + e)², e = exp(-2|x|) ----
# f(e) = 4e/(1 + e)² has d ln f/d ln e = (1 - e)/(1 + e) in [0, 1] for e in [0, 1], so a
# relative error θ of e moves f by a factor within e^{±|ln(1 + θ)|}: no cancellation
# anywhere (1 - tanh² would lose everything where tanh is near ±1).  The argument's
# own error |x - x~| <= e_x moves sech² by a factor within e^{±2 e_x} (|d ln sech²/dx| =
# 2|tanh x| <= 2), i.e. by <= sech²(x~)·2e_x(1 + 2e_x) for 2e_x <= 1.
#
# Double-double (tier 2): e~ = exp_dd(-2|x~|) (-2|x~| is an exact scaling; relative
# RHO_EXP2), 1 + e~ by dd_add_d (2.01u² relative: the result is in [1, 2]), its square by
# dd_mul (8.02u²), 4e~ exactly, the quotient by dd_div (2^-100): relative to f(e~) at
# most (1 + 2.01u²)²(1 + 8.02u²)(1 + 2^-100) - 1 < 12.1u² + 2^-100 < 2^-98, and
# e^{1.01 RHO_EXP2} - 1 < 1.02 RHO_EXP2 from e~: REL_SECH2_DD.  |x~| > 300: sech²(x~) <=
# 4e^-600 < 1.48 TINY2 (TINY2 >= e^-599), taken as 0, and sech²(x) <= e^{1/2}·1.48 TINY2
# < 2.5 TINY2 <= ABS_SECH2_DD for e_x <= 1/4.
# Float64 (tier 1): e~ = exp_double(-2|x~|) (RHO_EXP1 for -2|x~| >= -708; below, e~ and e
# are both <= TINY1(1 + RHO_EXP1)), then fl(1 + e~), its square, 4e~ (exact) and the
# quotient: four roundings, relative <= 1.01 RHO_EXP1 + 4.1u = REL_SECH2; below the cut
# the result and sech²(x~) are both <= 4.02 TINY1, and sech²(x) <= sech²(x~)e^{2e_x} <=
# 4.02·e^{1/2} TINY1 for e_x <= 1/4: |sech²(x) - result| <= 10.7 TINY1 <= ABS_SECH2.
# Both bounds need e_x <= 1/4 (checked: else the bound is infinite).
# With the tanh (:func:`_tanh_dd`, want_sech2) the series branch |x~| <= TANH_SMALL takes
# sech² = 1 - t² from its t (relative error <= 2^-98, |t| <= 0.1733): t² by dd_mul
# (8.02u²·t² <= 0.25u²), 1 - t² by dd_add_d (<= u(u + 0.031u) <= 1.04u², relative to
# 1 - t² >= 0.969: 1.08u²), t's error moves t² by <= 2.01·2^-98·t² <= 0.063·2^-98:
# relative < 1.4u² + 0.07·2^-98 < 2^-98 <= REL_SECH2_DD; beyond, 4e/(1 + e)² as above.
REL_SECH2_DD = 1.02 * RHO_EXP2 + 2.0**-98
ABS_SECH2_DD = 5.0 * TINY2
REL_SECH2 = 1.01 * RHO_EXP1 + 4.1 * U
ABS_SECH2 = 12.0 * TINY1


def sech2_proved(x: np.ndarray[Any, Any], e_x: np.ndarray[Any, Any] | float
                 ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(f, err): f = sech²(x~) in float64 and |sech²(x) - f| <= err for every x with
    |x - x~| <= e_x (e_x <= 1/4; proof above)."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        e = exp_double(-2.0 * np.abs(x))
        d = 1.0 + e
        f = 4.0 * e / (d * d)
        ex = np.asarray(e_x)
        rel = (2.0 * ex * (1.0 + 2.0 * ex) + REL_SECH2) * (1.0 + 2.0 * REL_SECH2)
        # the argument's bound must stay <= 1/4 (else: an infinite bound, the row is
        # handed on)
        return f, np.where(ex <= 0.25, (f * rel + ABS_SECH2) * UP, np.inf)


def _np_sech2_dd(xh: np.ndarray[Any, Any], xl: np.ndarray[Any, Any]
                 ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """sech²(xh + xl) in double-double (the numpy twin of the compiled ``sech2_dd``)."""
    neg = xh < 0
    ah = np.where(neg, -xh, xh)
    al = np.where(neg, -xl, xl)
    far = ah > 300.0
    eh, el = exp_dd(np.where(far, -600.0, -2.0 * ah), np.where(far, 0.0, -2.0 * al))
    dh, dl = dd_add_d(eh, el, np.ones_like(eh))
    sh, sl = dd_mul(dh, dl, dh, dl)
    fh, fl = dd_div(4.0 * eh, 4.0 * el, sh, sl)
    return np.where(far, 0.0, fh), np.where(far, 0.0, fl)


def _sech2_dd(xh: np.ndarray[Any, Any], xl: np.ndarray[Any, Any], e_x: np.ndarray[Any, Any]
              ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(fh, fl, err): sech²(x~) in double-double, |sech²(x) - fh - fl| <= err for every x
    with |x - x~| <= e_x (e_x <= 1/4; proof above); one compiled pass when numba is
    available (bit-identical to :func:`_np_sech2_dd`, tested)."""

    k = _kernels()
    if k is None or not hasattr(k, "sech2_dd") or xh.size == 0:
        fh, fl = _np_sech2_dd(xh, xl)
    else:

        xh = np.ascontiguousarray(xh, dtype=np.float64)
        xl = np.ascontiguousarray(xl, dtype=np.float64)
        fh, fl = np.empty_like(xh), np.empty_like(xh)
        tab_hi, tab_lo = _table2()
        k.sech2_dd(xh, xl, tab_hi, tab_lo, _POW2, fh, fl)
    return fh, fl, _sech2_dd_err(fh, e_x)


def _sech2_dd_err(fh: np.ndarray[Any, Any], e_x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The bound of a double-double sech² within REL_SECH2_DD of sech²(x~) (ABS_SECH2_DD
    beyond |x~| > 300) for every x within e_x <= 1/4 of x~ (infinite otherwise)."""
    rel = (2.0 * e_x * (1.0 + 2.0 * e_x) + REL_SECH2_DD) * (1.0 + 4.0 * U)
    err = (np.abs(fh) * rel * 1.01 + ABS_SECH2_DD + 4 * ETA) * UP
    return np.where(e_x <= 0.25, err, np.inf)


def _mul_factor(a: tuple[np.ndarray[Any, Any], ...] | None,
                b: tuple[np.ndarray[Any, Any], ...]) -> tuple[np.ndarray[Any, Any], ...]:
    """The product of two double-double factors with bounds (hi, lo, err):
    |AB - p~| <= e_a(|b~| + e_b) + |a~|e_b + 8.02u²|p~| (dd_mul) + 4η; None is 1."""
    if a is None:
        return b
    ah, al, ae = a
    bh, bl, be = b
    ph, pl = dd_mul(ah, al, bh, bl)
    aa = np.abs(ah) * (1.0 + 2.0 * U)
    ba = np.abs(bh) * (1.0 + 2.0 * U)
    err = (ae * (ba + be) + aa * be + 8.02 * U * U * np.abs(ph) * 1.01 + 4 * ETA) * UP
    return ph, pl, err


def _tanh_small(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """tanh(x) for |x| <= TANH_SMALL with relative error <= REL_TANH_SMALL (proof above)."""
    y = x * x
    p = np.full_like(x, _TANH_COEFFS[-1])
    for c in reversed(_TANH_COEFFS[:-1]):
        p *= y
        p += c
    return x * p


def tanh_proved(x: np.ndarray[Any, Any], need_err: bool = True
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
    """(t, err): t = tanh(x) in float64 with |t - tanh(x)| <= err elementwise,
    err = |t|·REL + ABS_TANH, REL = REL_TANH_SMALL for |x| <= TANH_SMALL (the odd
    Taylor series, proof above), else REL_TANH_LARGE (so err <= E_TANH everywhere).

    For a = |x| > TANH_SMALL: tanh(a) = g(e) = (1 - e)/(1 + e), e = exp(-2a) <
    e^-0.3465 <= 0.70715 (-2a is exact: a power-of-two scaling, -inf on overflow).
    ẽ = exp_double(-2a) (:mod:`.expo`) has |ẽ - e| <= RHO_EXP1·e for -2a >= -708; below,
    ẽ = exp~(-708) and e are both <= TINY1·(1 + RHO_EXP1), so |ẽ - e| <= 2·TINY1 and the
    result errs by <= 4·TINY1 = ABS_TANH.  |g'| = 2/(1 + e)², so |g(ẽ) - g(e)| <=
    2·RHO_EXP1·e/(1 + e)², relative to g(e): 2e/(1 - e²)·RHO_EXP1 <= 2.829·RHO_EXP1;
    1 - ẽ, 1 + ẽ and the division round once each (values in [0, 2]): <= 3.01u more.
    Total <= REL_TANH_LARGE.  The sign is restored exactly (tanh is odd).
    """
    a = np.abs(x)
    small = a <= TANH_SMALL
    th = np.empty_like(a)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.all(small):
            th = _tanh_small(a)
        else:
            if np.any(small):
                th[small] = _tanh_small(a[small])
            big = ~small
            e = exp_double(-2.0 * a[big])
            th[big] = (1.0 - e) / (1.0 + e)
    t = np.copysign(th, x)
    if not need_err:
        return t, None
    rel = np.where(small, REL_TANH_SMALL, REL_TANH_LARGE)
    return t, th * rel + ABS_TANH


def softcap_array(s: np.ndarray[Any, Any], cap: float) -> np.ndarray[Any, Any]:
    """cap·tanh(s/cap) by :func:`tanh_proved` (its bound applies), in one compiled pass
    when numba is available (bit-identical: the same operations in the same order,
    tests/oracle/variants/test_variants.py checks it)."""

    k = _kernels()
    if k is None or not hasattr(k, "softcap") or s.size == 0:
        t, _ = tanh_proved(s / cap, need_err=False)
        return cap * t

    out = np.empty_like(s)
    k.softcap(np.ascontiguousarray(s), cap, np.asarray(_TANH_COEFFS), _table1(), _POW2, out)
    return out


def _np_softcap_rows(g: np.ndarray[Any, Any], c_f: float, cap: float,
                     allowed: np.ndarray[Any, Any] | None
                     ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(s', max|g|, max|s'|): s' = cap·tanh_proved(fl(c_f g)/cap) and the row maxima over
    the allowed keys (g (r, S)); the numpy twin of the compiled ``softcap_rows``."""
    t, _ = tanh_proved((g * c_f) / cap, need_err=False)
    out = cap * t
    return out, _rowmax(g, allowed), _rowmax(out, allowed)


def softcap_rows(g: np.ndarray[Any, Any], c_f: float, cap: float,
                 allowed: np.ndarray[Any, Any] | None
                 ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """:func:`_np_softcap_rows` in one compiled pass when numba is available
    (bit-identical: the same operations per element; maxima are exact)."""

    k = _kernels()
    if k is None or not hasattr(k, "softcap_rows") or g.size == 0 or len(_TANH_COEFFS) != 10:
        return _np_softcap_rows(g, c_f, cap, allowed)

    g2 = np.ascontiguousarray(g).reshape(-1, g.shape[-1])
    al = (np.zeros((0, 0), dtype=bool) if allowed is None
          else np.ascontiguousarray(allowed, dtype=bool).reshape(g2.shape))
    out = np.empty_like(g2)
    gmax = np.empty(g2.shape[0])
    smax = np.empty(g2.shape[0])
    k.softcap_rows(g2, float(c_f), float(cap), al, np.asarray(_TANH_COEFFS), _table1(), _POW2,
                   out, gmax, smax)
    lead = g.shape[:-1]
    return out.reshape(g.shape), gmax.reshape(lead), smax.reshape(lead)


def _rowmax(a: np.ndarray[Any, Any], allowed: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    """max over the kept keys (all when ``allowed`` is None) of |a| per row (0 for none)."""
    if allowed is None:
        if a.shape[-1] == 0:
            return np.zeros(a.shape[:-1])
        return np.maximum(np.max(a, axis=-1), -np.min(a, axis=-1))
    return np.max(np.where(allowed, np.abs(a), 0.0), axis=-1, initial=0.0)
