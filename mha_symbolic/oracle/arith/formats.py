"""Binary floating-point formats, exact conversion to dyadic rationals, and
correct rounding (round to nearest, ties to even) into a format.

A format is described by its precision ``p`` (significand bits, hidden bit
included) and exponent range ``[emin, emax]``: every finite value is
``±m · 2**(e - p + 1)`` with integer ``0 <= m < 2**p`` and ``emin <= e <= emax``
(subnormals have ``e = emin`` and ``m < 2**(p-1)``).

Rounding rule used everywhere (IEEE 754-2019 §4.3.1, roundTiesToEven): a real
``y`` rounds to the nearest format value; a tie goes to the value with an even
last significand bit; ``|y| >= (2 - 2**-p) · 2**emax`` (the midpoint between the
largest finite value and the next power of two) rounds to ±inf.

Three implementations of the same rule are here, for three kinds of input:

* :func:`round_float64_to` — a float64 ndarray, vectorised (exact: only scaling
  by powers of two and ``np.rint``, which rounds ties to even);
* :func:`round_dyadic` — an exact ``man · 2**exp`` in Python integers;
* :func:`round_fraction` — an exact :class:`fractions.Fraction`.

Out of range: a value that rounds beyond the largest finite number gives ±inf.  A
finite-only format (float8_e4m3fn) has no infinity: ml_dtypes casts such a value to
NaN and torch's cast saturates to ±448; here the rounding functions return ±inf and
:meth:`FloatFormat.numpy_dtype` casts make it NaN (the ml_dtypes convention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import SpecError

__all__ = [
    "FORMATS",
    "FloatFormat",
    "decide_rounding",
    "get_format",
    "half_gaps",
    "round_dyadic",
    "round_float64_to",
    "round_fraction",
    "to_dyadic",
]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format (precision and exponent range)."""

    name: str
    p: int  # significand bits, hidden bit included
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number
    # "fn" formats (float8_e4m3fn) have no infinities: the all-ones bit pattern of
    # the top binade is NaN, so the largest finite significand is 2 - 2**(2-p)
    finite_only: bool = False

    @property
    def max_finite(self) -> float:
        """Largest finite value, ``(2 - 2**(1-p)) · 2**emax`` (exact as a double);
        ``(2 - 2**(2-p)) · 2**emax`` for a finite-only format (448 for e4m3fn)."""
        return math.ldexp(2.0 - math.ldexp(1.0, (2 if self.finite_only else 1) - self.p),
                          self.emax)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value, ``2**(emin - p + 1)``."""
        return math.ldexp(1.0, self.emin - self.p + 1)

    def numpy_dtype(self) -> np.dtype[Any]:
        """The numpy dtype that stores this format (ml_dtypes for bfloat16)."""
        if self.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, self.name))
        return np.dtype(self.name)


# Parameters from IEEE 754-2019 Table 3.5 (binary64/32/16), the bfloat16
# definition (binary32's exponent range with an 8-bit significand) and the OCP 8-bit
# floating point specification (OFP8, rev. 1.0, 2023) as ml_dtypes and torch
# implement it: E4M3 ("fn": finite, max 448 = 1.75·2^8, subnormals down to 2^-9, no
# infinities) and E5M2 (IEEE-like: max 57344 = 1.75·2^15, subnormals down to 2^-16).
FORMATS: dict[str, FloatFormat] = {
    "float64": FloatFormat("float64", 53, -1022, 1023),
    "float32": FloatFormat("float32", 24, -126, 127),
    "float16": FloatFormat("float16", 11, -14, 15),
    "bfloat16": FloatFormat("bfloat16", 8, -126, 127),
    "float8_e4m3fn": FloatFormat("float8_e4m3fn", 4, -6, 8, finite_only=True),
    "float8_e5m2": FloatFormat("float8_e5m2", 3, -14, 15),
}

_ALIASES = {
    "fp64": "float64", "double": "float64", "f8": "float64",
    "fp32": "float32", "float": "float32", "f4": "float32", "single": "float32",
    "fp16": "float16", "half": "float16", "f2": "float16",
    "bf16": "bfloat16",
    "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2",
}


def get_format(dtype: Any) -> FloatFormat:
    """The format of ``dtype``: a numpy dtype, a dtype-like (``np.float32``,
    ``ml_dtypes.bfloat16``), a torch dtype or one of the strings
    ``"float64" "float32" "float16" "bfloat16"`` (and fp64/fp32/fp16/bf16)."""
    if isinstance(dtype, FloatFormat):
        return dtype
    if isinstance(dtype, str):
        low = dtype.lower().removeprefix("torch.")
        key = _ALIASES.get(low, low)
        if key in FORMATS:
            return FORMATS[key]
    else:
        text = str(dtype)
        if text.startswith("torch."):
            key = text[len("torch."):]
            key = {"half": "float16", "float": "float32", "double": "float64"}.get(key, key)
            if key in FORMATS:
                return FORMATS[key]
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = ""
        if name in FORMATS:
            return FORMATS[name]
    raise SpecError(
        f"dtype={dtype!r} is not a supported float format: expected one of "
        "float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2"
    )


def to_dyadic(x: float) -> tuple[int, int]:
    """The exact value of the finite double ``x`` as ``(man, exp)`` with
    ``x == man * 2**exp`` (``man`` odd or zero)."""
    if x == 0.0:
        return 0, 0
    m, e = math.frexp(x)  # x = m · 2**e, 0.5 <= |m| < 1, m has <= 53 bits
    man = int(math.ldexp(m, 53))  # exact: m · 2**53 is an integer
    exp = e - 53
    tz = (man & -man).bit_length() - 1
    return man >> tz, exp + tz


def _finish(sign: int, qt: int, shift: int, fmt: FloatFormat) -> float:
    """``sign · qt · 2**shift`` as a double, or ±inf beyond the format's range."""
    if qt == 0:
        return -0.0 if sign < 0 else 0.0
    # qt <= 2**p, so the value is in range unless its exponent exceeds emax
    if qt.bit_length() - 1 + shift > fmt.emax:
        return -math.inf if sign < 0 else math.inf
    value = math.ldexp(float(qt), shift)  # exact: qt has <= p + 1 <= 54 bits, a power 2 if 54
    if fmt.finite_only and value > fmt.max_finite:
        # rounded (ties to even) to the NaN pattern of a finite-only format: out of
        # range.  Reported as ±inf here (the boundary logic needs an ordered value);
        # casting to the format's numpy dtype turns it into NaN, as ml_dtypes does
        return -math.inf if sign < 0 else math.inf
    return -value if sign < 0 else value


def round_dyadic(man: int, exp: int, fmt: FloatFormat) -> float:
    """Round the exact value ``man · 2**exp`` to ``fmt`` (nearest, ties to even);
    the result is returned as a double (every format here is a subset of float64)."""
    if man == 0:
        return 0.0
    sign = -1 if man < 0 else 1
    a = -man if man < 0 else man
    e = exp + a.bit_length() - 1  # 2**e <= |value| < 2**(e+1)
    if e > fmt.emax + 1:  # beyond the overflow threshold (avoids building 2**huge)
        return -math.inf if sign < 0 else math.inf
    shift = max(e, fmt.emin) - fmt.p + 1  # exponent of one unit in the last place
    d = shift - exp
    if d > a.bit_length() + 1:  # |value| < 2**(shift-2): below half the smallest step
        return -0.0 if sign < 0 else 0.0
    if d <= 0:
        return _finish(sign, a << (-d), shift, fmt)
    qt, rem = divmod(a, 1 << d)
    half = 1 << (d - 1)
    if rem > half or (rem == half and qt & 1):
        qt += 1
    return _finish(sign, qt, shift, fmt)


def round_fraction(value: Fraction, fmt: FloatFormat) -> float:
    """Round the exact rational ``value`` to ``fmt`` (nearest, ties to even)."""
    if value == 0:
        return 0.0
    sign = -1 if value < 0 else 1
    a = -value if value < 0 else value
    num, den = a.numerator, a.denominator
    e = num.bit_length() - den.bit_length()  # a in [2**(e-1), 2**(e+1))
    if Fraction(2) ** e > a:
        e -= 1  # now 2**e <= a < 2**(e+1)
    shift = max(e, fmt.emin) - fmt.p + 1
    scaled = a / Fraction(2) ** shift
    qt = scaled.numerator // scaled.denominator
    rem = scaled - qt
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and qt & 1):
        qt += 1
    return _finish(sign, qt, shift, fmt)


def _hardware_rounding_ok() -> bool:
    """The float64 -> float32 cast rounds to nearest with gradual underflow (no
    flush-to-zero or directed rounding set by some other library in this process)."""
    probe = np.array([2.0**-140 * 1.5, 1.0 + 2.0**-24, 1.0 + 3 * 2.0**-24, -(1.0 + 2.0**-24)])
    got = probe.astype(np.float32).astype(np.float64).tolist()
    return got == [2.0**-140 * 1.5, 1.0, 1.0 + 2.0**-22, -1.0]


def round_float64_to(x: np.ndarray[Any, Any], fmt: FloatFormat,
                     native: bool = False) -> np.ndarray[Any, Any]:
    """Round every element of the float64 array ``x`` to ``fmt`` (nearest, ties
    to even); the result is a fresh float64 array whose values all belong to ``fmt``
    (``native``: a float32 array for float32, where the hardware conversion is used,
    half the memory; every float32 value is exactly assignable back).

    Exactness: ``ldexp`` by the element's quantum exponent is exact (the result
    stays within double range for the formats here), ``np.rint`` rounds a double
    to the nearest integer with ties to even, and scaling back is exact. So this
    is the correct rounding, with no double rounding.
    """
    x = np.asarray(x, dtype=np.float64)
    if fmt.p == 53:
        return x.copy()
    if fmt.name == "float32" and _hardware_rounding_ok():
        # IEEE 754 conversion binary64 -> binary32 is correctly rounded (nearest,
        # ties to even; overflow to ±inf, gradual underflow): one pass
        with np.errstate(over="ignore"):
            x32 = x.astype(np.float32)
        return x32 if native else x32.astype(np.float64)
    out = np.array(x, dtype=np.float64, copy=True)
    ax = np.abs(x)
    finite = np.isfinite(x) & (ax != 0)
    big = finite & (ax >= math.ldexp(1.0, fmt.emax + 1))
    work = finite & ~big
    if np.any(work):
        a = ax[work]
        _, e2 = np.frexp(a)  # a = m·2**e2, m in [0.5, 1): floor(log2 a) = e2 - 1
        shift = np.maximum(e2 - 1, fmt.emin) - fmt.p + 1
        r = np.rint(np.ldexp(a, -shift))
        val = np.ldexp(r, shift)
        val = np.where(val > fmt.max_finite, np.inf, val)
        out[work] = np.copysign(val, x[work])
    out[big] = np.copysign(np.inf, x[big])
    return out


def half_gaps(
    z: np.ndarray[Any, Any], fmt: FloatFormat
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """For format values ``z`` (finite, as float64), the half distances to the
    next format value below and above: a real ``y`` with
    ``z - below < y < z + above`` rounds to ``z``. Above the largest finite
    value the "next value" is the overflow threshold (IEEE: ``max + ulp/2``).
    Values may underflow to 0 in float64 for fmt=float64 subnormals; callers
    treat a zero gap as "undecided"."""
    if fmt.name in ("float64", "float32"):
        # the neighbours in the format itself: differences of adjacent values are exact
        # (halving can underflow to 0 for float64 subnormals: "undecided" for callers);
        # above the largest finite value the "next value" is the overflow threshold
        dt = np.float64 if fmt.name == "float64" else np.float32
        zz = np.asarray(z).astype(dt)
        with np.errstate(over="ignore", invalid="ignore"):
            lo_n = np.nextafter(zz, dt(-np.inf)).astype(np.float64)
            hi_n = np.nextafter(zz, dt(np.inf)).astype(np.float64)
            zf = zz.astype(np.float64)
            below = (zf - lo_n) / 2
            above = (hi_n - zf) / 2
            above = np.where(np.isfinite(hi_n), above, (zf - lo_n) / 2)
            below = np.where(np.isfinite(lo_n), below, (hi_n - zf) / 2)
        return below, above
    az = np.abs(z)
    _, e2 = np.frexp(np.where(az == 0, 1.0, az))
    e = np.where(az == 0, fmt.emin, np.maximum(e2 - 1, fmt.emin))
    quantum = np.ldexp(np.ones_like(az), e - fmt.p + 1)
    # |z| a power of two with exponent > emin: the gap towards zero is half a quantum
    pow2 = (az != 0) & (np.ldexp(np.ones_like(az), e2 - 1) == az) & (e2 - 1 > fmt.emin)
    toward_zero = np.where(pow2, quantum / 2, quantum) / 2
    away = quantum / 2
    below = np.where(z > 0, toward_zero, away)
    above = np.where(z < 0, toward_zero, away)
    return below, above


def decide_rounding(mf: np.ndarray[Any, Any], rf: np.ndarray[Any, Any],
                    rad: np.ndarray[Any, Any], fmt: FloatFormat
                    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Correct rounding of values known as ``mf + rf ± rad`` (float64 arrays; the
    value lies in ``[mf + rf - rad, mf + rf + rad]`` exactly): returns (decided, value).

    With z = RN_fmt(mf) and d = mf - z (exact: z is within a factor 2 of mf, or 0),
    every point rounds to z when d + rf - rad > -below(z) and d + rf + rad < above(z)
    (half gaps).  The two float sums err by <= 2u(|d| + |rf| + rad)(1 + u); requiring
    a margin of 2**-20·gap and |d| + |rf| + rad <= 2**20·gap makes that harmless.
    A result z = 0 also needs the sign: +0.0 when the whole interval is positive,
    -0.0 when it is negative (|rf| + rad < |mf|·(1 - 2**-50) decides it), undecided
    when the interval holds 0 (IEEE: a positive value that rounds to zero is +0).
    To float64 :func:`.jit.decide_float64` is its compiled twin (bit-identical)."""
    mf = np.asarray(mf, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        z = round_float64_to(mf, fmt)
        ok = np.isfinite(z) & np.isfinite(mf) & np.isfinite(rf) & np.isfinite(rad)
        ok &= (np.abs(mf) >= 2.0**-960) | (z == 0)
        d = mf - z
        below, above = half_gaps(np.where(ok, z, 1.0), fmt)
        base = d + rf
        ok &= (base - rad > -below * (1 - 2.0**-20)) & (base + rad < above * (1 - 2.0**-20))
        ok &= (np.abs(d) + np.abs(rf) + rad) <= np.minimum(below, above) * 2.0**20
        zero = z == 0
        if np.any(zero):
            sure = (np.abs(rf) + rad) < np.abs(mf) * (1 - 2.0**-50)
            sure |= (mf == 0) & (rf == 0) & (rad == 0)  # exactly zero: +0.0
            ok &= ~zero | sure
            z = np.where(zero, np.where(mf < 0, -0.0, 0.0), z)
    return ok, np.where(ok, z, np.nan)
