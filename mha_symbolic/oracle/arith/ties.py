"""Exact ties: deciding values that sit exactly on (or absurdly near) a rounding
boundary, where no precision of Ziv's loop settles.

Both results are sums over *score groups*.  Write a row's distinct exact scores
``a_g`` (algebraic: rational, or c·rational + rational with c = 1/sqrt(E)) with
``n_g`` keys each.  Attention output column ``l`` is
``y = Σ_g e^{a_g} V_g / Σ_g n_g e^{a_g}`` with ``V_g = Σ_{j∈g} κ_j v_jl`` (κ_j the
dropout factor of a kept key, 0 for a dropped one, 1 without dropout).  By the
Lindemann–Weierstrass theorem the ``e^{a_g}`` of distinct algebraic ``a_g`` are
linearly independent over the algebraic numbers, so

* ``y`` is rational iff ``V_g = y·n_g`` for every g, i.e. every group has the same
  mean ``V_g/n_g`` (then y is that mean) — :func:`rational_value`;
* for a rational boundary T, ``sign(y - T) = sign(Σ_g e^{a_g - A}(V_g - n_g T))``
  with exact rational coefficients, each term a ball of full *relative* accuracy
  however small e^{a_g - A} is — :func:`sign_of_sum`.

Multi-head blocks add heads with different denominators; :func:`mha_rational`
and :func:`mha_sign` carry the argument through the projections by expanding
``Σ_h N_h / D_h`` over a common denominator in the group ring of the exponents.

Exact dot products come from integer matrices (:func:`int_matrix`): every double
is ``m·2**e`` with an integer m, so ``q·k`` is an integer times a power of two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

import numpy as np

from .balls import EXP_FLOOR, Prec

Array = np.ndarray[Any, Any]
MAX_TERMS = 200_000  # expansion size beyond which the MHA decision gives up


def int_matrix(x: Array) -> tuple[Array, int]:
    """(ints, e) with ``x == ints·2**e`` exactly: ints an object array of Python ints."""
    x = np.asarray(x, dtype=np.float64)
    m, e = np.frexp(x)  # x = m·2**e, 0.5 <= |m| < 1: m·2**53 is an integer
    mi = (m * 2.0**53).astype(np.int64)
    ex = e.astype(np.int64) - 53
    nz = mi != 0
    e0 = int(ex[nz].min()) if nz.any() else 0
    shift = np.where(nz, ex - e0, 0)
    flat = [int(a) << int(s) for a, s in zip(mi.ravel().tolist(), shift.ravel().tolist(), strict=True)]
    out = np.empty(x.shape, dtype=object)
    out.ravel()[:] = flat
    return out, e0


def to_fraction(n: int, e: int) -> Fraction:
    return Fraction(n) * (Fraction(2) ** e)


def exact_dots(q_row: Array, k_ints: tuple[Array, int]) -> list[Fraction]:
    """q_row · k_j for every key, exactly (k_ints from :func:`int_matrix` of K)."""
    qi, qe = int_matrix(q_row[None, :])
    ki, ke = k_ints
    if ki.shape[1] == 0:
        return [Fraction(0)] * ki.shape[0]
    g = ki.dot(qi[0])
    return [to_fraction(int(x), qe + ke) for x in g]


def score_key(g: Fraction, m: Fraction, c_rat: Fraction | None) -> Any:
    """The exact score c·g + M as a hashable key: the number itself when c is rational;
    the pair (g, M) when c = 1/sqrt(E) is irrational (c·g + M = c·g' + M' iff g = g'
    and M = M', since 1 and c are linearly independent over the rationals)."""
    return c_rat * g + m if c_rat is not None else (g, m)


def group(keys: Iterable[tuple[int, Any]]) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = {}
    for j, key in keys:
        out.setdefault(key, []).append(j)
    return out


def rational_value(groups: dict[Any, list[int]], vals: dict[int, Fraction]) -> Fraction | None:
    """The rational value of Σ_g e^{a_g} V_g / Σ_g n_g e^{a_g} (V_g = Σ_{j∈g} vals[j]) or
    None when it is irrational (groups with different means)."""
    means = {sum((vals[j] for j in js), Fraction(0)) / len(js) for js in groups.values()}
    return next(iter(means)) if len(means) == 1 else None


def key_arb(key: Any, c: Any) -> Any:
    """The exact score of a group key as an Arb ball (c the scale ball)."""
    from flint import arb, fmpq

    if isinstance(key, tuple):
        g, m = key
        return c * arb(fmpq(g.numerator, g.denominator)) + arb(fmpq(m.numerator, m.denominator))
    return arb(fmpq(key.numerator, key.denominator))


def _fraction_ball(cf: Any, c: Any) -> Any:
    from flint import arb, fmpq

    return arb(fmpq(cf.numerator, cf.denominator))


def sign_of_sum(terms: list[tuple[Any, Any]], scale_ball: Any,
                key_ball: Callable[[Any, Any], Any] = key_arb,
                coef_ball: Callable[[Any, Any], Any] = _fraction_ball,
                max_prec: int = 1 << 16) -> int | None:
    """sign(Σ_k e^{a_k} c_k) for distinct exponents a_k and exact coefficients c_k:
    0 when every c_k is 0, else computed in Arb with e^{a_k - A} of full relative
    accuracy, the precision raised (×4 from 256 bits up to ``max_prec``) while the
    terms cancel.  Terms with a_k - A < EXP_FLOOR count by their sign only (0 <
    e^{a_k - A} < e^EXP_FLOOR, whose sum is below e^EXP_FLOOR Σ|c_k|).

    The exponents are group keys (``key_ball(a, c)`` their ball, c the scale's
    ball: :func:`key_arb` by default) and the coefficients exact numbers
    (``coef_ball(c_k, c)``: Fractions by default; the gradients' a + b·c pairs);
    zero coefficients must be dropped by the caller except Fractions, which are
    filtered here."""
    from flint import arb


    live = [(a, cf) for a, cf in terms if not (isinstance(cf, Fraction) and cf == 0)]
    if not live:
        return 0
    prec = 256
    while prec <= max_prec:
        with Prec(prec):
            c = scale_ball()
            balls = [(key_ball(a, c), coef_ball(cf, c)) for a, cf in live]
            top = max(balls, key=lambda t: t[0].mid())[0].mid()  # exact arb midpoints
            big = arb(0)
            tiny_signs = set()
            ssum = arb(0)
            for a_g, cb in balls:
                ssum += abs(cb)
                d = a_g - top
                if d.upper() < EXP_FLOOR:  # 0 < e**d < e**EXP_FLOOR: only the sign counts
                    if cb > 0:
                        tiny_signs.add(1)
                    elif cb < 0:
                        tiny_signs.add(-1)
                    else:
                        tiny_signs.add(0)
                else:
                    big += d.exp() * cb
            if big.is_zero() and len(tiny_signs) == 1 and 0 not in tiny_signs:
                return tiny_signs.pop()  # a sum of positive exponentials of one sign
            rest = arb(EXP_FLOOR).exp() * ssum.upper()
            if big > rest * 2:
                return 1
            if big < -rest * 2:
                return -1
        prec *= 4
    return None


# ---- multi-head: Σ_h N_h/D_h over a common denominator ------------------------------

Poly = dict[Any, Fraction]  # exponent key -> coefficient (group ring of the scores)


def _add_keys(a: Any, b: Any) -> Any:
    if isinstance(a, tuple):
        return (a[0] + b[0], a[1] + b[1])
    return a + b


def _zero_key(like: Any) -> Any:
    return (Fraction(0), Fraction(0)) if isinstance(like, tuple) else Fraction(0)


def _mul(p: Poly, q: Poly) -> Poly:
    out: Poly = {}
    for ka, ca in p.items():
        for kb, cb in q.items():
            k = _add_keys(ka, kb)
            out[k] = out.get(k, Fraction(0)) + ca * cb
    return {k: v for k, v in out.items() if v != 0}


def mha_expand(heads: list[tuple[Poly, Poly]]) -> tuple[Poly, Poly] | None:
    """(P, Q) with Σ_h N_h/D_h = P/Q, Q = Π_h D_h, P = Σ_h N_h Π_{h'≠h} D_h', or None when
    the expansion would exceed MAX_TERMS terms."""
    size = 1
    for _, d in heads:
        size *= max(1, len(d))
        if size * len(heads) > MAX_TERMS:
            return None
    if not heads:
        return {}, {}
    like = next(iter(heads[0][1]))
    one: Poly = {_zero_key(like): Fraction(1)}
    Q = one
    for _, d in heads:
        Q = _mul(Q, d)
    P: Poly = {}
    for h, (n, _) in enumerate(heads):
        term = n
        for h2, (_, d2) in enumerate(heads):
            if h2 != h:
                term = _mul(term, d2)
        for k, v in term.items():
            P[k] = P.get(k, Fraction(0)) + v
    return {k: v for k, v in P.items() if v != 0}, Q


def _lead(p: Poly) -> Any:
    """The leading key of a polynomial in any fixed total order of the exponent group
    (lexicographic): if P = R·Q for a constant R, their leading terms correspond."""
    return max(p)


def mha_rational(P: Poly, Q: Poly) -> Fraction | None:
    """R if P = R·Q exactly (then Σ_h N_h/D_h = R is rational), else None (irrational:
    the group ring of a torsion-free group over the algebraic numbers is a domain
    embedded in C by e^a (Lindemann–Weierstrass), so P/Q constant iff P = R·Q)."""
    if not P:
        return Fraction(0)
    lk = _lead(Q)
    R = P.get(lk, Fraction(0)) / Q[lk]
    if R == 0:
        return None
    diff = dict(P)
    for k, v in Q.items():
        diff[k] = diff.get(k, Fraction(0)) - R * v
    return R if all(v == 0 for v in diff.values()) else None
