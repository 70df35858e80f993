"""mpmath views of the oracle's results, and mpmath numbers as inputs.

:func:`enclosure_mpf` gives every element of an enclosure as an ``mpmath.mpf``
correctly rounded (to nearest, ties to even) to the binary precision mpmath uses for
``dps`` decimal digits; :func:`enclosure_mpi` an ``mpmath.mpi`` interval containing
each element.  Both return a numpy object array of the enclosure's shape (indexed as
``lower``/``upper``/``midpoint``, for any rank; ``mpmath.matrix(a.tolist())`` turns a
2-D one into an mpmath matrix).  They work element by element from
``Enclosure.exact(index, prec=…)`` (a Fraction, or an Arb ball at ``prec`` bits),
raising the precision until both ends of the ball round alike (Ziv's strategy, as
``rounded()``): meant for the small arrays one reads digit by digit.

:func:`mpmath_to_array` reads mpmath numbers (``mpf``, ``mpmath.matrix``, lists or
object arrays of them) as float64 when each is exactly a float64, and refuses the
rest with one line: an mpf holding more bits than float64 would be rounded, and the
oracle takes only the exact numbers its inputs hold.  ``mpc`` and ``mpi`` are refused.

>>> import mpmath, numpy as np
>>> from mha_symbolic import reference_attention
>>> q = k = v = np.eye(2)[None]
>>> out = reference_attention(q, k, v)
>>> mpmath.nstr(enclosure_mpf(out, 30)[0, 0, 0], 30)
'0.669761549326656925616794945834'
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from .._text import sanitize
from ..errors import InputValueError, PrecisionError, SpecError
from .arith.balls import Prec

__all__ = ["MpmathViews", "enclosure_mpf", "enclosure_mpi", "is_mpmath", "mpmath_to_array"]

#: Arb precisions (bits) tried in turn for one element before giving up.
_PRECISIONS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _check_dps(dps: Any) -> int:
    import mpmath

    if dps is None:
        return int(mpmath.mp.dps)
    if isinstance(dps, bool) or not isinstance(dps, int) or not 1 <= dps <= 10**5:
        raise SpecError(f"dps={dps!r} must be an integer from 1 to 100000")
    return dps


def _ends(ball: Any, bits: int) -> tuple[Fraction, Fraction] | None:
    """Exact endpoints of an Arb ball (taken at ``bits``: Arb rounds ``lower()`` down
    and ``upper()`` up to the context precision), or None when it is not finite."""

    if not ball.is_finite():
        return None
    with Prec(bits):
        (lm, le), (um, ue) = ball.lower().man_exp(), ball.upper().man_exp()
    return _dyadic(int(lm), int(le)), _dyadic(int(um), int(ue))


def _dyadic(man: int, exp: int) -> Fraction:
    return Fraction(man * 2**exp) if exp >= 0 else Fraction(man, 2 ** (-exp))


def _indices(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in idx) for idx in np.ndindex(*shape)]


def _element_mpf(enc: Any, idx: tuple[int, ...], prec: int) -> Any:
    import mpmath
    from mpmath.libmp import from_rational

    first = enc.exact(idx, prec=prec + 20)
    if isinstance(first, float):                  # a NaN row (masked_rows="nan")
        return mpmath.mpf("nan")
    if isinstance(first, Fraction):
        return mpmath.mp.make_mpf(from_rational(first.numerator, first.denominator, prec, "n"))
    for bits in (prec + 20, *(p for p in _PRECISIONS if p > prec + 20)):
        ball = first if bits == prec + 20 else enc.exact(idx, prec=bits)
        ends = _ends(ball, bits)
        if ends is None:
            continue
        lo, hi = (from_rational(x.numerator, x.denominator, prec, "n") for x in ends)
        if lo == hi:
            return mpmath.mp.make_mpf(lo)
    raise PrecisionError(f"element {idx} could not be rounded to {prec} bits within "
                         f"{_PRECISIONS[-1]} bits of Arb precision (an exact tie the "
                         "oracle does not know as a rational?)")


def enclosure_mpf(enc: Any, dps: int | None = None) -> np.ndarray[Any, Any]:
    """Every element of ``enc`` as an ``mpmath.mpf`` correctly rounded to
    ``dps_to_prec(dps)`` bits (``dps=None``: ``mpmath.mp.dps``), in a numpy object
    array of ``enc.shape``; NaN rows give ``mpf('nan')``."""
    from mpmath.libmp import dps_to_prec

    prec = int(dps_to_prec(_check_dps(dps)))
    out = np.empty(enc.shape, dtype=object)
    for idx in _indices(tuple(enc.shape)):
        out[idx] = _element_mpf(enc, idx, prec)
    return out


def enclosure_mpi(enc: Any, *, bits: int = 128) -> np.ndarray[Any, Any]:
    """Every element of ``enc`` as an ``mpmath.mpi`` interval containing it: the
    endpoints of its Arb ball at ``bits`` (at least ``mpmath.iv.prec + 10``) rounded
    outward to ``mpmath.iv.prec`` bits; a numpy object array of ``enc.shape`` (NaN
    rows: ``mpi('nan')``, the interval mpmath gives for NaN)."""
    import mpmath
    from mpmath.libmp import from_rational

    prec = int(mpmath.iv.prec)
    bits = max(int(bits), prec + 10)
    out = np.empty(enc.shape, dtype=object)
    for idx in _indices(tuple(enc.shape)):
        x = enc.exact(idx, prec=bits)
        if isinstance(x, float):
            out[idx] = mpmath.mpi(mpmath.mpf("nan"))
            continue
        if isinstance(x, Fraction):
            lo = hi = x
        else:
            ends = _ends(x, bits)
            if ends is None:
                raise PrecisionError(f"element {idx} has no finite enclosure at {bits} bits")
            lo, hi = ends
        a = mpmath.mp.make_mpf(from_rational(lo.numerator, lo.denominator, prec, "f"))
        z = mpmath.mp.make_mpf(from_rational(hi.numerator, hi.denominator, prec, "c"))
        out[idx] = mpmath.mpi(a, z)
    return out


class MpmathViews:
    """``.mpf(dps)`` and ``.mpi()`` for a class with ``shape`` and ``exact(index, prec=)``
    (every enclosure of the oracle)."""

    def mpf(self, dps: int | None = None) -> np.ndarray[Any, Any]:
        """Every element as an ``mpmath.mpf`` correctly rounded to ``dps`` digits'
        precision (:func:`enclosure_mpf`): a numpy object array of this shape."""
        return enclosure_mpf(self, dps)

    def mpi(self, *, bits: int = 128) -> np.ndarray[Any, Any]:
        """Every element as an ``mpmath.mpi`` interval containing it
        (:func:`enclosure_mpi`): a numpy object array of this shape."""
        return enclosure_mpi(self, bits=bits)


# --------------------------------------------------------------------------------------
# mpmath numbers as inputs


def is_mpmath(x: Any) -> bool:
    """Whether ``x`` is an mpmath object (a number, an interval or a matrix)."""
    return (type(x).__module__ or "").startswith("mpmath")


def _entry(x: Any, name: str, idx: tuple[int, ...]) -> float:
    """One entry as the float64 holding exactly its value, or one clear line."""
    import mpmath


    where = f"{name}[{', '.join(map(str, idx))}]" if idx else name
    if isinstance(x, bool):
        raise SpecError(f"{where}={x!r} is a boolean, expected a number")
    if isinstance(x, (int, float, np.integer, np.floating)):
        f = float(x)
        if isinstance(x, (int, np.integer)) and int(x) != f:
            raise InputValueError(f"{where} = {int(x)} is not exactly a float64; pass "
                                  "floats")
        return f
    kind = sanitize(type(x).__name__[:40])
    if kind in ("mpc", "ivmpc") or isinstance(x, mpmath.mpc):
        raise SpecError(f"{where} is an mpmath {kind} (complex): expected real numbers")
    if kind.startswith("iv") or hasattr(x, "delta") or "ctx_iv" in type(x).__module__:
        raise SpecError(f"{where} is an mpmath interval ({kind}): pass one exact number "
                        "(an mpf) per element, not an interval")
    if not isinstance(x, mpmath.mpf):
        raise SpecError(f"{where} ({kind}) is not a float, an integer or an mpmath mpf: "
                        "the oracle reads floating-point inputs (exact numbers: "
                        "exact_attention)")
    if not mpmath.isfinite(x):
        f = float(x)
        return f                               # NaN/±inf: validated by the caller
    sign, man, exp, bc = x._mpf_
    value = _dyadic(int(man), int(exp)) * (-1 if sign else 1)
    f = float(value) if abs(exp + bc) < 2000 else math.inf
    if not math.isfinite(f) or Fraction(f) != value:
        raise InputValueError(
            f"{where} = {mpmath.nstr(x, 20)} (an mpf of {bc} bits) is not exactly a "
            "float64, the oracle's format for mpmath inputs: round it first (float(x)), "
            "or use exact_attention, which reads an mpf exactly")
    return f


def mpmath_to_array(x: Any, name: str) -> np.ndarray[Any, Any]:
    """An mpmath number, ``mpmath.matrix``, or a (nested) list/object array holding
    mpmath numbers, as a float64 array of exactly the same values (see the module)."""
    import mpmath

    if isinstance(x, mpmath.matrix):
        rows = [[x[i, j] for j in range(x.cols)] for i in range(x.rows)]
        x = rows
    try:
        arr = np.empty(np.shape(x) if not is_mpmath(x) else (), dtype=object)
        arr[...] = x if is_mpmath(x) else np.asarray(x, dtype=object)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"{name} could not be read as an array of numbers (ragged nested "
                        f"lists?): {exc}") from None
    out = np.empty(arr.shape, dtype=np.float64)
    for idx in _indices(arr.shape):
        out[idx] = _entry(arr[idx], name, idx)
    return out
