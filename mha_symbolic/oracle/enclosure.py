"""Enclosures and correct rounding: :class:`Enclosure` holds rigorous bounds of an
exact result, refines undecided elements with Arb (Ziv's strategy, capped) and
decides exact ties on rounding boundaries without unbounded precision."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import PrecisionError, SpecError
from .arb import Prec, ball_bounds
from .constants import ETA, MAX_PREC, RATIONAL_AT_PREC, START_PREC, UP
from .formats import FloatFormat, get_format, half_gaps, round_dyadic, round_float64_to, round_fraction

__all__ = ["Enclosure"]


def _round_ends(x: Any, fmt: FloatFormat) -> tuple[float, float] | None:
    """Both exact endpoints of the ball rounded to ``fmt`` (call inside Prec)."""
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
    r_f = float(res) and R >= rad + |res - r_f| (|res - r_f| <= 2**-52|r_f| + ETA),
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
        big_r = (rad * (1.0 + 2.0**-51) + np.abs(rf) * 2.0**-52 + 2 * ETA) * UP
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




class Problem:
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




class Enclosure:
    """Rigorous elementwise enclosure of an exact attention result.

    Attributes: ``lower``, ``upper`` (float64, outward rounded: lower <= true <=
    upper), ``midpoint`` (float64, an approximation inside the enclosure),
    ``shape``; ``weights`` (an Enclosure of the softmax probabilities, or None).
    Rows under ``masked_rows="nan"`` hold NaN in every array.
    """

    def __init__(self, problem: Problem, kind: str, shape: tuple[int, ...],
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
            with Prec(4 * 128):
                for col, x in enumerate(balls):
                    lo[b, i, col], hi[b, i, col] = ball_bounds(x)
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
        # rounding is monotone: lo <= y <= hi => same rounding; -0.0 == +0.0 in floats,
        # so the signs must agree too (an exact 0 inside [-tiny, +tiny] is +0.0)
        decided = (lo == hi) & (np.signbit(lo) == np.signbit(hi))
        value = np.where(decided, lo, np.nan)
        decided |= self._nan_rows[..., None]
        todo = np.argwhere(~decided)
        if todo.size == 0:
            return value
        # group the undecided elements by row
        rows: dict[tuple[int, int], list[int]] = {}
        for b, i, col in todo.tolist():
            rows.setdefault((b, i), []).append(col)
        prec = START_PREC.get(fmt.p, 96)
        while rows:
            if prec > MAX_PREC:
                (b, i), cols = next(iter(rows.items()))
                raise PrecisionError(
                    f"could not decide the {fmt.name} rounding of element "
                    f"{self._user_index(b, i, cols[0])} within {MAX_PREC} bits"
                )
            if prec >= RATIONAL_AT_PREC:
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
            with Prec(2 * prec):  # endpoints and mid - float(mid) stay exact
                ok, vals = _decide_balls(balls, fmt)
            new_rows: dict[tuple[int, int], list[int]] = {}
            for n, ((b, i, col), good, val) in enumerate(
                    zip(where, ok.tolist(), vals.tolist(), strict=True)):
                if good:
                    value[b, i, col] = val
                    continue
                if prec >= RATIONAL_AT_PREC:
                    # one boundary inside the ball: decide the side exactly (a tie
                    # sits on it; a huge score gap can put y within e^-10000 of it)
                    with Prec(2 * prec):
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
