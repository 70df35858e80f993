"""The tier-1 element formula, shared by the numpy twin (:mod:`.jit`) and the numba
kernels (:mod:`._numba_kernels`), which compiles it as it is: only +, -, *, /, abs, so
numpy and numba evaluate the same operations in the same order."""

from __future__ import annotations

from typing import Any

from . import constants as C

_U, _ETA, _UP, _FLOOR = C.U, C.ETA, C.UP, C.FLOOR  # frozen into compiled code as constants
_TN = C.TINY_N  # >= η, and normal: no slow subnormal operands in the per-element bounds


def _t1_elem(n: Any, a: Any, d: Any, dl: Any, tau0: Any, twt0: Any, taud: Any, vmax: Any,
             vr: Any, g: float, ascale: float, se: float, rf: float, rho_r: float,
             has_drop: bool, sc: Any) -> tuple[Any, Any]:
    """The tier-1 output and its error bound for one element (or, with numpy arrays,
    for all: only +, -, *, /, abs, so numpy and numba evaluate the same operations
    in the same order).  The derivation is in fast.py and docs/oracle.md §3.3; in the
    values' scaled units its underflow terms η are bounded by the smallest normal
    ``TINY_N`` and ``se`` by ``S·TINY_N`` (a subnormal ``se`` made every element three
    times slower); the last term, in true units, stays 2η."""
    y = n / d
    a_up = (a + se) * ascale / dl
    abs_y = abs(y)
    rnd = _U * abs_y * (1.0 + 2 * _U) + _TN
    e_fl = (g * (a_up + 2.01 * (abs_y + _TN)) + se / dl) * _UP
    yhat = (abs_y + e_fl + rnd) * _UP
    e_w = (tau0 * (a_up + yhat) + twt0 * (vmax + yhat) + (1.0 + taud) * vr) / (1.0 - taud)
    err = (e_w + e_fl + rnd) * _UP + _FLOOR
    if has_drop:
        y2 = y * rf
        err = (abs(rf) * err * (1 + _U) + rho_r * (yhat + err) + _U * abs(y2) + _TN) * _UP
        y = y2
    return y * sc, err * sc + 2 * _ETA
