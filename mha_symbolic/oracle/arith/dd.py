"""Error-free transformations and double-double arithmetic on numpy arrays.

Every function here works elementwise on float64 arrays in round-to-nearest
(IEEE 754 default; numpy never changes the rounding mode) and states the exact
identity or the error bound it guarantees.  ``u = 2**-53``.  The sources are
Knuth (TwoSum), Dekker (FastTwoSum, TwoProduct with Veltkamp's split) and
Muller et al., *Handbook of Floating-Point Arithmetic* (2nd ed.), §4.3 and §14.

A double-double (dd) is a pair ``(hi, lo)`` whose value is the exact real
``hi + lo``; the functions below keep ``|lo| <= u|hi|`` ("normalised") where they
say so.  The bounds assume no overflow and, where stated, no underflow; the
callers (:mod:`.dd_attention`) guarantee the ranges or add an absolute term.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

SPLIT = 134217729.0  # 2**27 + 1, Veltkamp's constant for binary64


def two_sum(a: Array, b: Array) -> tuple[Array, Array]:
    """(s, e) with ``s = fl(a + b)`` and ``a + b = s + e`` exactly (Knuth's TwoSum:
    six operations, any magnitudes, barring overflow).  |e| <= u|s|."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def fast_two_sum(a: Array, b: Array) -> tuple[Array, Array]:
    """(s, e) with ``a + b = s + e`` exactly, provided ``a == 0`` or the exponent of
    ``a`` is at least that of ``b`` (e.g. ``|a| >= |b|``) — Dekker's FastTwoSum."""
    s = a + b
    e = b - (s - a)
    return s, e


def split(a: Array) -> tuple[Array, Array]:
    """Veltkamp's split: ``a = hi + lo`` exactly with ``hi`` holding the top 26 and
    ``lo`` the low 26 significant bits (|a| < 2**995 so ``SPLIT·a`` cannot overflow)."""
    c = SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a: Array, b: Array) -> tuple[Array, Array]:
    """(p, e) with ``p = fl(a·b)`` and ``a·b = p + e`` exactly (Dekker's TwoProduct),
    provided no overflow and ``e`` does not underflow: |a·b| >= 2**-969 or a·b = 0
    (then the exact error is a multiple of 2**-1074·... representable).  |e| <= u|p|."""
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def dd_mul(ah: Array, al: Array, bh: Array, bl: Array) -> tuple[Array, Array]:
    """Normalised dd product of normalised dd numbers (no underflow):
    ``|(ah+al)(bh+bl) - (ph+pl)| <= 8.02·u²·|(ah+al)(bh+bl)|``.

    Proof: ``ah·bh = p + e`` exactly (TwoProduct).  With |al| <= u|ah|, |bl| <= u|bh|:
    t1 = fl(ah·bl), t2 = fl(al·bh) each err by <= u²|ah bh|; t3 = fl(t1 + t2) by
    <= 2u²(1+u)|ah bh|; fl(e + t3) by <= u(u + 2u(1+u))(1+u)|ah bh| <= 3.01u²|ah bh|;
    the dropped al·bl is <= u²|ah bh|.  Total <= 8.01u²|ah bh| and |ah bh| <=
    |ab|(1+u)²/(1-u)² ... <= 1.001|ab|; the final FastTwoSum (|p| >= |e'|) is exact."""
    p, e = two_prod(ah, bh)
    e += ah * bl + al * bh
    return fast_two_sum(p, e)


def dd_mul_d(ah: Array, al: Array, b: Array) -> tuple[Array, Array]:
    """Normalised dd times a double (no underflow):
    ``|(ah+al)·b - (ph+pl)| <= 4.02·u²·|(ah+al)·b|`` (as :func:`dd_mul` with bl = 0:
    fl(al·b) errs by <= u²|ah b|, fl(e + t) by <= 2.01u²|ah b|, no dropped term)."""
    p, e = two_prod(ah, b)
    e += al * b
    return fast_two_sum(p, e)


def dd_add_d(ah: Array, al: Array, b: Array) -> tuple[Array, Array]:
    """dd plus a double: ``s + e = ah + b`` exactly (TwoSum), then ``fl(e + al)`` errs
    by <= u|e + al| <= u(u|s| + |al|), and the result is renormalised by TwoSum
    (exact).  So ``|result - (ah + al + b)| <= u·(u|s| + |al|)`` with s = fl(ah + b):
    relative to the inputs, not to the (possibly cancelled) result."""
    s, e = two_sum(ah, b)
    e += al
    return two_sum(s, e)


def dd_add(ah: Array, al: Array, bh: Array, bl: Array) -> tuple[Array, Array]:
    """dd plus dd: ``s + e = ah + bh`` exactly (TwoSum), ``t = fl(al + bl)`` errs by
    <= u|al + bl|, ``fl(e + t)`` by <= u(|e| + |t|) <= u(u|s| + (1 + u)(|al| + |bl|)),
    and the result is renormalised by TwoSum (exact).  So
    ``|result - (ah + al + bh + bl)| <= u·(u|s| + 2.01(|al| + |bl|))`` with
    |s| <= (1 + u)(|ah| + |bh|): relative to the inputs, not to the (possibly
    cancelled) sum."""
    s, e = two_sum(ah, bh)
    e += al + bl
    return two_sum(s, e)


def dd_div(nh: Array, nl: Array, dh: Array, dl: Array) -> tuple[Array, Array]:
    """dd quotient (no underflow, ``dh > 0`` normalised):
    ``|N/D - (qh + ql)| <= 2**-100 · |qh|`` plus nothing else.

    Proof: q1 = fl(nh/dh) = (nh/dh)(1+δ), |δ| <= u.  With ``q1·dh = p + e`` exactly,
    ``nh - p`` is exact (Sterbenz: p = q1·dh (1+δ') is within a factor 2 of nh), so
    the exact remainder ``r = N - q1 D = (nh - p) - e + nl - q1·dl``; computing it
    with three roundings and one product errs by <= 4u·|r|(1+u)³ + u|q1 dl|, and
    |r| <= (2u + 2u)|q1 dh|(1+u)² (|nl| <= u|nh|, |dl| <= u|dh|), so the error on r is
    <= 17u²|q1 dh|.  q2 = fl(r~/dh) errs by <= u|q2| + |r~||dl|/(dh D) and adds the
    r error divided by dh: in all <= (17u² + 4.1u² + 4.1u²)|q1| <= 26u²|q1|, and
    26u² < 2**-100.  The FastTwoSum renormalisation is exact (|q2| <= 4.1u|q1|)."""
    q1 = nh / dh
    p, e = two_prod(q1, dh)
    r = (nh - p) - e
    r += nl
    r -= q1 * dl
    q2 = r / dh
    return fast_two_sum(q1, q2)


def renorm(hi: Array, lo: Array) -> tuple[Array, Array]:
    """The same exact value ``hi + lo`` as a normalised dd (TwoSum: exact)."""
    return two_sum(hi, lo)


def pow2(e: Array) -> Array:
    """2.0**e for an integer array e in [-1022, 1023], built from the bits (exact)."""
    return ((np.asarray(e, dtype=np.int64) + 1023) << 52).view(np.float64)
