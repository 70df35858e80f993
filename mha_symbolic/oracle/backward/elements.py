"""The backward's tier-1 elementwise steps, one formula for numpy and numba.

Only +, -, *, / and abs, in one order: numpy (on arrays, :mod:`.fast`) and numba (on
scalars, :mod:`._kernels`, compiled without fast-math) evaluate the same IEEE
operations, so the two paths give bit-identical results (tests/oracle/backward/test_backward_tiers.py);
the reductions between the two steps (D's row sums) are numpy's in both paths."""

from __future__ import annotations

from typing import Any

from ..arith.constants import ETA, UP, U


def _elem_dp(x: Any, ex: Any, f_f: float, rho_f: float) -> tuple[Any, Any]:
    """Step (3) for a kept key: dP = f X with its bound."""
    dp = f_f * x
    edp = (rho_f * (abs(x) + ex) + f_f * ex + U * abs(dp) + ETA) * UP
    return dp, edp


def _elem_t(p: Any, ep: Any, dp: Any, edp: Any, g_d: float) -> Any:
    """D's bound term of one key: e_P(|dP~| + e_dP) + P~ e_dP + g_d P~|dP~|."""
    return ep * (abs(dp) + edp) + p * edp + g_d * p * abs(dp)


def _elem_ds(p: Any, ep: Any, dp: Any, edp: Any, d: Any, ed: Any, g_q: float, g_r: float
             ) -> tuple[Any, Any, Any, Any]:
    """Steps (5)-(6) for a live key: Y = dP − D, dS = P∘Y with bounds, and the terms
    e_dS + g|dS| of the dQ (key blocks, g_q) and dK (row block, g_r) bounds."""
    y = dp - d
    ey = (edp + ed + U * abs(y) * (1 + 2 * U)) * UP
    ds = p * y
    eds = (ep * (abs(y) + ey) + p * ey + U * abs(ds) + ETA) * UP
    return ds, eds, eds + g_q * abs(ds), eds + g_r * abs(ds)


def _elem_w(p: Any, ep: Any, f_f: float, rho_f: float, g_r: float) -> tuple[Any, Any, Any]:
    """Step (1) for a kept key: W = f P with its bound, and e_W + γ_r W (dV's bound)."""
    w = f_f * p
    ew = (rho_f * (p + ep) + f_f * ep + U * w + ETA) * UP
    return w, ew, ew + g_r * w
