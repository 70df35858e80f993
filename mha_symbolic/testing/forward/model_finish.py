"""The last steps of the forward tolerance model (:mod:`.model`): the final roundings
of the output, the underflow of the stored weights, and the way back to unscaled units
with the vacuity test (split from :mod:`.model` to keep it under the size limit)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..tolerance import _FMAX, gamma, underflow_eta
from .moments import Bound

if TYPE_CHECKING:
    from .model import _Work


def _final_roundings(w: _Work) -> float:
    """The final division and the extra output roundings in u_a, and the store in u."""
    n_fin = 2 + (0 if w.extras is None else w.extras.final_roundings)
    g = float(gamma(n_fin, w.model.ua))
    return g + w.model.u * (1.0 + g)


def _underflow(w: _Work, N: np.ndarray | None) -> np.ndarray | float:
    """Keys whose weight may fall below the output dtype's normal range when stored:
    |fl(p) − p| ≤ max(u p, η_u), so η_u per such key on top of the relative terms
    (unscaled units)."""
    model, allowed, p, vals, ev = w.model, w.allowed, w.p, w.vals, w.ev
    lam, eta_u = model.lam, model.eta
    wf = model.weights
    eta_term: np.ndarray | float = 0.0
    if wf is not None:
        # weights stored unnormalised in the format wf (FP8 kernels): P̃_j = p_j / p_ref
        # ≤ 1, p_ref the row's largest weight; |fl(P̃) − P̃| ≤ max(u_w P̃, min(η_w, P̃)) (a
        # subnormal rounds by at most half a spacing, never by more than itself), so in
        # normalised weights min(η_w p_ref, p_j) per key that can fall below wf's normal
        # range, on top of the relative u_w charged above
        p_ref = w.rowmax(p)
        eta_w = underflow_eta(wf)
        smallw = allowed & (p < 4.0 * math.ldexp(1.0, wf.emin) * p_ref)
        if np.any(smallw):
            a_eta = np.where(smallw, np.minimum(eta_w * p_ref, p), 0.0)
            Mw = vals.moments(a_eta, li=False, sq=False)
            assert Mw.ab is not None
            eta_s = Mw.ab
            if N is not None:
                nmax = w.rowmax(N)
                sq2 = vals.moments(a_eta * a_eta, ab=False, li=False).sq
                assert sq2 is not None
                eta_s = np.minimum(eta_s, lam * np.sqrt(nmax * sq2))
            eta_term = np.ldexp(eta_s, ev) if abs(ev) < 2000 else eta_s * 2.0**ev
        return eta_term
    small = w.on(p < 4.0 * math.ldexp(1.0, model.fmt.emin), False)
    if np.any(small):
        Ms = vals.moments(small.astype(np.float64), li=False)
        assert Ms.ab is not None and Ms.sq is not None
        n_w_u = 1.0 + (1.0 if w.kappa is not None else 0.0)     # the P store, dropout
        eta_s = n_w_u * Ms.ab                                     # Σ_small |ã_j|, scaled
        if N is not None:
            nmax = w.rowmax(N)
            eta_s = np.minimum(eta_s, lam * np.sqrt(n_w_u * nmax * Ms.sq))
        eta_term = np.ldexp(eta_s, ev) * eta_u if abs(ev) < 2000 else eta_s * eta_u * 2.0**ev
    return eta_term


def _finish(w: _Work, tolb: np.ndarray, eta_term: np.ndarray | float, v: np.ndarray,
            pv: np.ndarray) -> Bound:
    """Back to unscaled units, the underflow in absolute terms, vacuity."""
    model, ev, kappa = w.model, w.ev, w.kappa
    tolb = tolb * (1.0 + 2.0**-40)              # the float64 rounding of the bound itself
    # fully masked rows: an exact zero (or NaN) is expected
    tolb = np.where(w.alive if w.centred else True, tolb, 0.0)
    tol = np.ldexp(tolb, ev) if abs(ev) < 2000 else tolb * math.ldexp(1.0, ev)
    pv_u = np.ldexp(pv, ev)
    vmax = float(np.max(np.abs(v), initial=0.0)) * (
        1.0 if kappa is None else float(np.max(np.abs(kappa), initial=1.0)))
    # underflow, in absolute terms: the weights stored in the output dtype (and the
    # dropout product) err by η_u only where they fall below its normal range (the
    # keys `small`; above it the relative terms hold), the final store by η_u; in the
    # accumulation dtype every exp, product, rescaling and division may underflow
    # (the tiny unit first: n_row (vmax + 1) alone overflows for values near the float64
    # maximum, where the product with eta_a is far inside the range)
    tol_kernel = tol + (4.0 * model.eta_a * w.n_row) * (vmax + 1.0) + 4.0 * model.eta_a
    tol = tol_kernel + eta_term + model.eta * 2.0
    vacuous = np.broadcast_to(w.vac_rows[:, None], tol.shape) | ~np.isfinite(tol)
    row_alive = np.any(w.allowed, axis=-1, keepdims=True)
    # vacuous: the kernel's own errors (relative terms, underflow or flushing in the
    # accumulation) reach the natural size Σ p|v|: every digit may be lost.  The output
    # format's underflow (the stores of P and O) is not counted: an answer whose natural
    # size is below it sits in the format's subnormal range, where even the correctly
    # rounded answer may be zero (a fp16 value of 2^-24 with one key was refused; found by
    # the property-based example)
    vacuous = vacuous | ((tol_kernel >= pv_u) & (pv_u > 0) & row_alive)
    tol = np.where(np.isfinite(tol), np.minimum(tol, _FMAX), _FMAX)
    return Bound(np.asarray(tol, dtype=np.float64), np.asarray(vacuous))
