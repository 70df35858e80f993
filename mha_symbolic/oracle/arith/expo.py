"""The exponentials of the fast paths, each with a proved relative error bound.

* :func:`exp_double` — float64, for the first tier (``RHO_EXP1 = 2**-48``):
  ``exp(t) = 2**k · 2**(j/128) · exp(r)``, a 128-entry table and a degree-4
  polynomial.
* :func:`exp_dd` — double-double, for the second tier (``RHO_EXP2 = 2**-84``):
  ``exp(t) = 2**k · 2**(j/1024) · exp(r)``, a 1024-entry double-double table and a
  degree-7 polynomial whose low-order part is evaluated in double.

The tables are computed once, on first use, in Arb (python-flint) and checked:
every entry is the correctly rounded double (``exp_double``) or a double-double
within ``2**-104`` relative (``exp_dd``) of ``2**(j/N)``.  The proofs are in the
docstrings and in docs/oracle.md §3; ``tests/oracle/arith/test_oracle_kernels.py`` checks both
functions against Arb on adversarial points (largest reduced arguments, the cut,
0, double-double inputs).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .constants import (
    EXP1_C3,
    EXP1_C4,
    EXP1_CUT,
    EXP2_C,
    EXP2_CUT,
    INV_LN2_128,
    INV_LN2_1024,
    LN2_128_HI,
    LN2_128_LO,
    LN2_1024_A,
    LN2_1024_B,
    LN2_1024_C,
)
from .dd import dd_mul, fast_two_sum, two_prod, two_sum

Array = np.ndarray[Any, Any]


@lru_cache(maxsize=1)
def _table1() -> Array:
    """RN(2**(j/128)), j = 0..127, correctly rounded (checked in Arb)."""
    from flint import arb, ctx

    old = ctx.prec
    ctx.prec = 256
    try:
        out = np.empty(128)
        for j in range(128):
            x = arb(2) ** (arb(j) / 128)
            f = float(x.mid())
            # correctly rounded: |x - f| < half an ulp, decided by the ball
            ulp = np.spacing(f)
            if not abs(x - arb(f)) < arb(ulp) / 2:  # pragma: no cover - a rounding tie is impossible
                raise ArithmeticError(f"table entry 2**({j}/128) not decided")
            out[j] = f
        return out
    finally:
        ctx.prec = old


@lru_cache(maxsize=1)
def _table2() -> tuple[Array, Array]:
    """(hi, lo) with |2**(j/1024) - hi - lo| <= 2**-104·2**(j/1024), j = 0..1023."""
    from flint import arb, ctx

    old = ctx.prec
    ctx.prec = 320
    try:
        hi = np.empty(1024)
        lo = np.empty(1024)
        for j in range(1024):
            x = arb(2) ** (arb(j) / 1024)
            h = float(x.mid())
            low = float((x - arb(h)).mid())
            if not abs(x - arb(h) - arb(low)) < x * arb(2) ** -104:  # pragma: no cover
                raise ArithmeticError(f"table entry 2**({j}/1024) not accurate enough")
            hi[j], lo[j] = h, low
        return hi, lo
    finally:
        ctx.prec = old


def exp_double(t: Array) -> Array:
    """exp(t) for t <= 0 (float64; -inf allowed), for ``t >= EXP1_CUT = -708`` with
    ``|result - exp(t)| <= RHO_EXP1·exp(t)``, ``RHO_EXP1 = 2**-48``; below the cut the
    result is ``exp~(-708)`` (the caller bounds those keys absolutely).

    Proof (u = 2**-53, round to nearest):
    * x = max(t, -708); N = rint(fl(x·RN(128/ln2))), |N| <= 130_800 < 2**17, and
      |x·128/ln2 - N| <= 1/2 + 2**-35, so r* = x - N·ln2/128 has |r*| <= 0.0027077.
    * LN2_128_HI has 36 significant bits, so N·LN2_128_HI is exact;
      |ln2/128 - HI - LO| <= 2**-100.  r = fl(fl(x - N·HI) - fl(N·LO)): three
      roundings of quantities <= 0.0028, so |r - r*| <= 3u·0.0028 + 2**17·2**-100
      < 0.01u: a relative factor exp(±0.01u) on the result.
    * P(r) = 1 + r(1 + r(1/2 + r(C3 + r·C4))), C3 = RN(1/6), C4 = RN(1/24).  Horner
      with |r| <= 0.0028: the last addition and multiplication dominate; summing
      the per-step relative errors weighted by |r|**i, the evaluation errs by
      <= 2.02u·P(r), the rounded coefficients by <= u·|r|**3/6, and the Taylor
      remainder is <= |r|**5/120·e**|r| <= 1.22e-15 < 11u·e**r.
    * j = N mod 128, k = (N - j)/128; T_j = RN(2**(j/128)) errs by <= u relatively;
      fl(T_j·P) adds u; multiplying by 2**k (k >= -1011; the result is >= e**-708 >
      2**-1022, normal) is exact.
    Total <= (0.01 + 2.02 + 11 + 1 + 1)u·(1 + 10u) < 15.1u < 2**-49.08, so
    RHO_EXP1 = 2**-48 holds with a margin of 2 (observed worst: 13.3u).  exp(0) = 1 exactly (N = 0, r = 0,
    P = 1, T_0 = 1, k = 0).
    """
    x = np.maximum(t, EXP1_CUT)
    n = x * INV_LN2_128
    np.rint(n, out=n)
    r = n * LN2_128_HI
    np.subtract(x, r, out=r)
    r -= n * LN2_128_LO
    ni = n.astype(np.int64)
    p = r * EXP1_C4
    p += EXP1_C3
    p *= r
    p += 0.5
    p *= r
    p += 1.0
    p *= r
    p += 1.0
    p *= np.take(_table1(), ni & 127, mode="clip")  # indices are in range
    return np.ldexp(p, (ni >> 7).astype(np.int32), out=p)  # exact: results are normal


def exp_dd(th: Array, tl: Array) -> tuple[Array, Array]:
    """exp(th + tl) as a double-double, for a normalised dd t (|tl| <= u|th|) with
    ``-600 <= t <= 2**-40``: ``|result - exp(t)| <= RHO_EXP2·exp(t)``,
    ``RHO_EXP2 = 2**-84``.  Below ``EXP2_CUT = -600`` the input is replaced by -600
    (callers bound such keys absolutely).

    Proof (docs/oracle.md §3.4 has the constants spelled out):
    * N = rint(fl(th·RN(1024/ln2))), |N| <= 886_500 < 2**20, |th·1024/ln2 - N| <=
      1/2 + 2**-32.  ln2/1024 = A + B + C + d with A, B of 33 significant bits (so
      N·A, N·B are exact), C = RN(ln2/1024 - A - B) and |d| <= 2**-130.
    * r1 = th - N·A is exact: A is a multiple of 2**-43; if |th| >= 2**-11 then th is
      a multiple of 2**-63 and |r1| < 2**-11.5, i.e. fewer than 2**52 units; if
      |th| < 2**-11 then N is 0 (r1 = th) or -1 with |th| >= 2**-11.53, a multiple
      of 2**-64 and |r1| < 2**-11.5.
    * (rh, e) = TwoSum(r1, -N·B) (exact); rl = fl(fl(e + tl) - fl(N·C)); the two
      roundings err by <= 2·u·(u·0.00034 + 600u + 2**-57) and fl(N·C) by <= 2**-110,
      so with r* = t - N·ln2/1024, |rh + rl - r*| <= 1201u² + 2**-109 < 2**-95.7;
      (rh, rl) is renormalised by TwoSum; |r*| <= R := 3.3847e-4.
    * exp(r) = 1 + r + r²/2 + r³·Q(r), Q(r) = 1/6 + r/24 + ... + r⁴/5040 + remainder
      (<= R**8/8!·e**R < 2**-107).  r² = p2h + p2l exactly (TwoProduct of rh; rh·rl
      and rl² are added/dropped: <= 2u·R² + u²R², < 2**-127), T = fl(fl(p2h·rh)·Q~(rh))
      errs by <= (2.01 + 3 + 2.02 + 1)u·R³·Q <= 1.35u·R³ (p2h·rh rounding,
      rl's share of r³, Horner on Q as in exp_double, the product); 1.35u·R³ < 2**-87.1.
    * Assembly: (a1, e1) = TwoSum(rh, p2h/2) and (1, a1) -> FastTwoSum are exact; the
      low part ((e1 + rl) + (rh·rl + p2l/2)) + T and its addition to the FastTwoSum
      error make two roundings of quantities <= 2**-37.1: <= 2**-89.1 together, the
      others < 2**-115.
    * So exp(r) is approximated within (2**-87.1 + 2**-89.1 + 2**-95.7 + 2**-106)/(1 - R)
      < 2**-86.7 relatively; the table entry adds 2**-104, the dd product
      8.02u² < 2**-103, the scaling by 2**k (results >= 2**-866, normal) is exact.
      Total < 2**-86.6 < RHO_EXP2 = 2**-84 (observed worst: 2**-87.9).
    """
    cut = th < EXP2_CUT
    th = np.maximum(th, EXP2_CUT)
    tl = np.where(cut, 0.0, tl)
    n = th * INV_LN2_1024
    np.rint(n, out=n)
    r1 = th - n * LN2_1024_A
    rh, e = two_sum(r1, -(n * LN2_1024_B))
    e += tl
    e -= n * LN2_1024_C
    rh, rl = two_sum(rh, e)
    p2h, p2l = two_prod(rh, rh)
    # Q(rh) = c3 + rh(c4 + rh(c5 + rh(c6 + rh c7)))
    c3, c4, c5, c6, c7 = EXP2_C
    q = rh * c7
    q += c6
    q *= rh
    q += c5
    q *= rh
    q += c4
    q *= rh
    q += c3
    t3 = p2h * rh
    t3 *= q
    half = 0.5 * p2h
    a1, e1 = two_sum(rh, half)
    low = e1 + rl
    low += rh * rl + 0.5 * p2l
    low += t3
    eh, el = fast_two_sum(np.ones_like(a1), a1)
    el += low
    eh, el = fast_two_sum(eh, el)
    ni = n.astype(np.int64)
    tab_hi, tab_lo = _table2()
    j = ni & 1023
    wh, wl = dd_mul(np.take(tab_hi, j, mode="clip"), np.take(tab_lo, j, mode="clip"), eh, el)
    k = (ni >> 10).astype(np.int32)
    np.ldexp(wh, k, out=wh)  # exact: both words stay normal (>= 2**-920)
    np.ldexp(wl, k, out=wl)
    return wh, wl
