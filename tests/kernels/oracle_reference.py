"""Independent references for the oracle's tests (no oracle code is used here).

* :func:`ref_round` rounds an exact Fraction to a format by searching the
  neighbouring bit patterns of a candidate and comparing exact distances;
* :func:`ref_row` computes one attention row: scores as Fractions (shifted
  exactly by the largest one), one ``arb.exp`` per key at the given precision,
  sums one element at a time (no ``arb_mat``); dropout keep flags and the factor
  1/(1-p) as Fractions; uniform rows (all scores 0);
* :func:`ref_sign` decides the side of a rounding boundary for values too close
  to it, merging keys of equal exact score;
* :func:`check_against_reference` checks an Enclosure element by element.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import flint
import ml_dtypes
import numpy as np

arb = flint.arb

DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
_UINT = {"float64": np.uint64, "float32": np.uint32, "float16": np.uint16,
         "bfloat16": np.uint16}


# ---------------------------------------------------------------------------
# Independent reference: round a Fraction to a format by neighbour search
# ---------------------------------------------------------------------------

def _finfo(name: str) -> Any:
    return ml_dtypes.finfo(DTYPES[name]) if name == "bfloat16" else np.finfo(DTYPES[name])


def _bits_value(bits: int, name: str) -> Fraction:
    arr = np.array([bits], dtype=_UINT[name]).view(DTYPES[name])
    return Fraction(float(arr.astype(np.float64)[0]))


def ref_round(x: Fraction, name: str) -> float:
    """Round x to the format: nearest by exact distance, ties to the even bit pattern."""
    if x == 0:
        return 0.0
    a = abs(x)
    fi = _finfo(name)
    max_f = Fraction(float(fi.max))
    max_bits = int(np.array([fi.max], dtype=DTYPES[name]).view(_UINT[name])[0])
    ulp_max = max_f - _bits_value(max_bits - 1, name)
    if a >= max_f + ulp_max / 2:
        return math.copysign(math.inf, x)
    with np.errstate(over="ignore"):
        guess = np.array([min(float(a), float(fi.max))]).astype(DTYPES[name])
    b0 = int(guess.view(_UINT[name])[0])
    best = None
    for b in range(max(0, b0 - 3), min(max_bits, b0 + 3) + 1):
        dist = abs(_bits_value(b, name) - a)
        key = (dist, b & 1)
        if best is None or key < best[0]:
            best = (key, b)
    assert best is not None
    val = float(_bits_value(best[1], name))
    return val if x > 0 else -val


_CLAMP = 1100  # |x| < 2**-1100 rounds to ±0 and |x| > 2**1100 to ±inf in every format


def _end_fraction(m: int, e: int) -> Fraction:
    """m·2**e as a Fraction, clamped to ±2**∓1100 (same rounding in every format,
    and no 2**(10**10)-sized integers for weights like e^-3e10)."""
    if m == 0:
        return Fraction(0)
    top = e + abs(m).bit_length()
    if top < -_CLAMP:
        return Fraction(1 if m > 0 else -1, 2**_CLAMP)
    if top > _CLAMP:
        return Fraction(2**_CLAMP if m > 0 else -(2**_CLAMP))
    return Fraction(m) * Fraction(2) ** e


def ball_fractions(x: Any) -> tuple[Fraction, Fraction]:
    """Endpoints for rounding (Arb rounds x.lower() to the working precision: raise it)."""
    ctx = flint.ctx
    old = ctx.prec
    ctx.prec = 2**16
    try:
        lo_m, lo_e = x.lower().man_exp()
        hi_m, hi_e = x.upper().man_exp()
    finally:
        ctx.prec = old
    return (_end_fraction(int(lo_m), int(lo_e)), _end_fraction(int(hi_m), int(hi_e)))


def ball_inside(x: Any, lower: float, upper: float) -> bool:
    """lower <= every point of the ball <= upper, by exact Arb comparisons."""
    ctx = flint.ctx
    old = ctx.prec
    ctx.prec = 2**16
    try:
        return bool(arb(lower) <= x.lower() and x.upper() <= arb(upper))
    finally:
        ctx.prec = old


# ---------------------------------------------------------------------------
# Independent reference: attention of one row, exact scores + Arb exp
# ---------------------------------------------------------------------------

def _scale_rat(scale: Any, E: int) -> Fraction | None:
    """The scale as an exact rational, or None for an irrational 1/sqrt(E)."""
    if scale is not None:
        return Fraction(float(scale))
    if E == 0:
        return Fraction(0)
    rt = math.isqrt(E)
    return Fraction(1, rt) if rt * rt == E else None


def _q(x: Fraction) -> Any:
    return arb(flint.fmpq(x.numerator, x.denominator))


def _fr(x: Any) -> Fraction:
    """An input entry as an exact Fraction (floats of any dtype are read exactly)."""
    return x if isinstance(x, Fraction) else Fraction(float(x))


def ref_row(q: Any, k: Any, v: Any, keep: Any, madd: Any, scale: Any,
            prec: int, drop: Any = None, factor: Fraction | None = None
            ) -> tuple[list[Any], list[Any]]:
    """(outputs, weights) of one query row as Arb balls; keep: bool per key; drop:
    dropout keep flag per key (None: no dropout) with the exact factor 1/(1-p).
    The shift is exact (Fractions), so scores of any size give tight balls."""
    ctx = flint.ctx
    old = ctx.prec
    ctx.prec = prec
    try:
        E = len(q)
        c_rat = _scale_rat(scale, E)
        c = _q(c_rat) if c_rat is not None else arb(1) / arb(E).sqrt()
        g: dict[int, Fraction] = {}
        m: dict[int, Fraction] = {}
        for j, kj in enumerate(k):
            if not keep[j]:
                continue
            g[j] = sum((_fr(a) * _fr(b) for a, b in zip(q, kj, strict=False)), Fraction(0))
            m[j] = _fr(madd[j]) if madd is not None else Fraction(0)
        assert g, "ref_row needs an unmasked key"
        if c_rat is not None:
            top = max(g, key=lambda j: c_rat * g[j] + m[j])
            t = {j: _q(c_rat * (g[j] - g[top]) + (m[j] - m[top])) for j in g}
        else:
            top = max(g, key=lambda j: (c * _q(g[j]) + _q(m[j])).mid())  # exact arb mids
            t = {j: c * _q(g[j] - g[top]) + _q(m[j] - m[top]) for j in g}
        tiny = (arb(-(10**6)).exp() * arb(0.5, 0.5)).nonnegative_part()  # [0, e**-1e6]
        w = {j: (tj.exp() if not tj.upper() < -(10**6) else tiny) for j, tj in t.items()}
        d = sum(w.values(), arb(0))
        f = arb(1) if factor is None else _q(factor)
        kept = {j: (drop is None or bool(drop[j])) for j in w}
        outs = []
        for col in range(len(v[0]) if len(v) else 0):
            acc = arb(0)
            for j, wj in w.items():
                if kept[j]:
                    acc += wj * _q(_fr(v[j][col]))
            outs.append(acc * f / d)
        weights = [w[j] * f / d if j in w and kept[j] else arb(0) for j in range(len(k))]
        return outs, weights
    finally:
        ctx.prec = old


def ref_sign(q: Any, k: Any, v: Any, keep: Any, madd: Any, scale: Any, col: int,
             output: bool, t_b: Fraction, drop: Any = None, factor: Fraction | None = None) -> int:
    """sign(y - t_b) for one element, for values too close to t_b for ref_row:
    y - t = Σ_j e^{s_j}(v_j - t) / Σ_j e^{s_j} (weights: Σ_j e^{s_j}([j = col] - t)).
    Keys with exactly equal scores are merged first (their terms share e^{s}, so
    the rational coefficients add exactly); each merged term is then a ball with
    full relative accuracy, however far apart the scores are.  Groups whose
    coefficient is 0 drop out before the shift: the shift is the largest score of a
    group that counts, so the sum always has a term e^0·c with c != 0, and terms
    more than 10**6 below it cannot change its sign.  (Shifting by the largest score
    of *all* groups left only tiny terms when that group's coefficient cancelled,
    e.g. two equal scores whose values average to t_b, and their signs can differ:
    the largest of them decides.)  Score differences come from the exact differences
    of the keys, so scores of any size (1e400) keep the terms' relative accuracy."""
    E = len(q)
    merged: dict[Any, Fraction] = {}
    for j, kj in enumerate(k):
        if not keep[j]:
            continue
        g = sum((Fraction(float(a)) * Fraction(float(b)) for a, b in zip(q, kj, strict=True)),
                Fraction(0))
        mj = Fraction(0) if madd is None else Fraction(float(madd[j]))
        if scale is not None:
            key: Any = Fraction(float(scale)) * g + mj
        elif math.isqrt(E) ** 2 == E:
            key = (g / math.isqrt(E) if E else Fraction(0)) + mj
        else:
            key = (g, mj)  # 1/sqrt(E) irrational: equal scores iff equal g and M
        kap = Fraction(1) if drop is None else (factor if drop[j] else Fraction(0))
        assert kap is not None
        coef = kap * (Fraction(float(v[j][col])) if output else Fraction(int(j == col))) - t_b
        merged[key] = merged.get(key, Fraction(0)) + coef
    merged = {key: c for key, c in merged.items() if c != 0}
    if not merged:
        return 0
    ctx = flint.ctx
    old = ctx.prec
    # 1024 bits below the largest exact score component of the row, so that every
    # difference of scores below has 1024 correct bits however large the scores are
    mag = max(abs(x) for key in merged for x in (key if isinstance(key, tuple) else (key,)))
    ctx.prec = 1024 + max(0, mag.numerator.bit_length() - mag.denominator.bit_length())
    try:
        def diff(a: Any, b: Any) -> Any:
            """score(a) - score(b) as a ball, from the exact differences of the keys."""
            if isinstance(a, tuple):
                return _q(a[0] - b[0]) / arb(E).sqrt() + _q(a[1] - b[1])
            return _q(a - b)

        top = next(iter(merged))
        for key in merged:
            dk = diff(key, top)
            assert key == top or dk > 0 or dk < 0, dk  # distinct keys: distinct scores
            if dk > 0:
                top = key
        big = arb(0)
        for key, c in merged.items():
            d = diff(key, top)  # exactly 0 for the top group
            if not d.upper() < -(10**6):  # else 0 < e**d < e**-1e6: bounded by `rest`
                big += d.exp() * _q(c)
        rest = arb(-(10**6)).exp() * _q(sum((abs(c) for c in merged.values()), Fraction(0)))
        assert abs(big) > rest, big  # the tiny terms cannot change the sign
        assert big > 0 or big < 0, big
        return 1 if big > 0 else -1
    finally:
        ctx.prec = old


def _same(a: float, b: float) -> bool:
    """Equal format values with equal signs (so -0.0 and +0.0 differ)."""
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def check_against_reference(res: Any, q: Any, k: Any, v: Any, keep: Any, madd: Any,
                            scale: Any, formats: tuple[str, ...] = tuple(DTYPES),
                            drop: Any = None, factor: Fraction | None = None,
                            rows: Any = None) -> None:
    """Every element (of ``rows``, an iterable of (batch index, i), default all):
    reference ball inside [lower, upper]; rounded == ref rounding.  ``drop``: the
    dropout keep flags broadcast to (batch..., L, S), with the exact factor."""
    L = q.shape[-2]
    rounded = {f: res.rounded(f).astype(np.float64) for f in formats}
    wts = res.weights
    w_rounded = {f: wts.rounded(f).astype(np.float64) for f in formats} if wts else {}
    todo = rows if rows is not None else [(bidx, i) for bidx in np.ndindex(*q.shape[:-2])
                                          for i in range(L)]
    for bidx, i in todo:
        if True:
            kp = keep[(*bidx, i)]
            if not kp.any():
                continue
            mrow = None if madd is None else madd[(*bidx, i)]
            drow = None if drop is None else drop[(*bidx, i)]
            outs, ws = ref_row(q[(*bidx, i)], k[bidx], v[bidx], kp, mrow, scale, 640, drow,
                               factor)
            pairs = [(res, rounded, outs, lambda c, b=bidx, i=i: (*b, i, c))]
            if wts is not None:
                pairs.append((wts, w_rounded, ws, lambda c, b=bidx, i=i: (*b, i, c)))
            for enc, rnd, balls, index in pairs:
                for col, ball in enumerate(balls):
                    idx = index(col)
                    lo_f, hi_f = ball_fractions(ball)
                    if enc is res and drop is None:
                        # without dropout an output is a convex combination of the kept
                        # keys' values: the part of the ball outside their hull holds no
                        # candidate, and the oracle may clamp to the hull (issue 30)
                        kept = [Fraction(float(x)) for x in np.asarray(v[bidx])[kp, col]]
                        lo_f, hi_f = max(lo_f, min(kept)), min(hi_f, max(kept))
                    assert Fraction(float(enc.lower[idx])) <= lo_f <= hi_f <= Fraction(
                        float(enc.upper[idx])), (idx, enc.lower[idx], enc.upper[idx], ball)
                    for f in formats:
                        a, b = ref_round(lo_f, f), ref_round(hi_f, f)
                        prec = 640
                        while not _same(a, b) and prec < 2**15:
                            # closer to a boundary than 2**-640 (e.g. an offset of one
                            # subnormal): redo the reference row with more bits
                            prec *= 4
                            again = ref_row(q[(*bidx, i)], k[bidx], v[bidx], kp, mrow, scale,
                                            prec, drow, factor)
                            ball2 = (again[0] if enc is res else again[1])[col]
                            a, b = (ref_round(x, f) for x in ball_fractions(ball2))
                        if not _same(a, b):  # y within 2**-32768 of the boundary a|b
                            t_b = (Fraction(a) + Fraction(b)) / 2
                            sg = ref_sign(q[(*bidx, i)], k[bidx], v[bidx], kp, mrow, scale,
                                          col, enc is res, t_b, drow, factor)
                            if sg == 0:  # an exact tie: the oracle must know the value
                                ex = enc.exact(idx)
                                assert isinstance(ex, Fraction), (idx, f, ball)
                                a = ref_round(ex, f)
                            else:
                                a = b if sg > 0 else a
                        got = rnd[f][idx]
                        assert got == a and math.copysign(1, got) == math.copysign(1, a), (
                            f, idx, got, a, ball)


