"""Fused loops of the tolerance model (:mod:`.model`), the dtype level
(:mod:`.emulated`) and the verdict's element-wise pass (:mod:`..verdict`), compiled
with numba when it is installed (issue 29: the model's ~100 elementwise passes over
the (rows × keys) arrays of a chunk are most of a check's time).

Each kernel (:mod:`._model_kernels`) computes the arrays of a numpy step with the same
IEEE 754 operations in the same order (numba compiles without fast-math: nothing is
reassociated or contracted into an FMA); the exps, expm1s and logs stay numpy's (a
libm's may differ in the last bit); row maxima do not depend on the order; row sums
are numpy's pairwise summation reproduced.  So the tolerances are bit-identical with
and without numba (tests/testing/forward/test_model_jit.py).  Without numba, or with
the environment variable ``MHA_SYMBOLIC_NUMBA=0`` (the oracle's switch,
:mod:`mha_symbolic.oracle.arith.jit`), the numpy steps run: every function here
returns None / False when it did nothing, and the step then runs its numpy code."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..tolerance import _EXP_CAP, gamma

if TYPE_CHECKING:
    from .model import _Work


def kernels() -> Any:
    """The compiled kernels (a module), or None without numba / when disabled."""
    if os.environ.get("MHA_SYMBOLIC_NUMBA", "1") == "0":
        return None
    return _load()


_LOADED: list[Any] = []


def _load() -> Any:
    if not _LOADED:
        try:
            from . import _model_kernels
        except ImportError:
            _LOADED.append(None)
        else:
            _LOADED.append(_model_kernels)
    return _LOADED[0]


def _kern(w: _Work, *shaped: np.ndarray) -> Any:
    """The kernels when they apply to ``w``: softmax over the keys, at least one row and
    one key, the ``shaped`` arrays (R, S) float64; else None."""
    R, S = w.R, w.S
    if w.axis != -1 or R == 0 or S == 0 or any(
            a.shape != (R, S) or a.dtype != np.float64 for a in shaped):
        return None
    return kernels()


def _rows(a: np.ndarray | float, R: int) -> np.ndarray:
    """A per-row quantity ((R, 1), (1, 1) or a scalar) as a contiguous (R,) array."""
    return np.ascontiguousarray(np.broadcast_to(np.asarray(a, dtype=np.float64), (R, 1))[:, 0])


def shifted_scores(w: _Work) -> tuple[np.ndarray, np.ndarray] | None:
    """model._exact_weights up to its exps: (e^{on(s, −inf) − m}, m (R, 1)); sets
    w.spread = on(m − s, 0), w.arg_m = min(2 u_a spread, cap) (for _weight_errors) and
    w.top_fused = argmax(on(s, −inf)) (for _score_errors: one pass fewer)."""
    kern = _kern(w, w.s)
    if kern is None:
        return None
    R, S = w.R, w.S
    d, w.spread, w.arg_m = (np.empty((R, S)) for _ in range(3))
    smax = np.empty(R)
    w.top_fused = np.empty(R, dtype=np.intp)
    kern.shifted_scores(w.s, w.allowed, 2.0 * w.model.ua, _EXP_CAP, d, w.spread, w.arg_m,
                        smax, w.top_fused)
    return np.exp(d, out=d), smax[:, None]     # masked keys: exp(−inf) = 0, as on(·, 0)


def score_errors(w: _Work) -> bool:
    """model._score_errors and _finish_score_errors on the plain path (a fused kernel
    without stores, mask values or variant extras, scores centred at the top key; the
    caller checks there are no input errors dq, dk): w.sh, w.var_s, w.D, w.d_eval_row."""
    ker, model = w.model.kernel, w.model
    if (w.extras is not None or w.madd is not None or w.s is not w.t or ker.scaled_query
            or ker.score_stores != 0 or not w.centred or w.top is None):
        return False
    kern = _kern(w, w.t, w.A)
    if kern is None:
        return False
    R, S, E = w.R, w.S, w.E
    t_top = np.ascontiguousarray(w.t[np.arange(R), w.top])
    w.sh, w.var_s, w.D = (np.empty((R, S)) for _ in range(3))
    d_row = np.empty(R)
    kern.score_errors(w.t, w.A, t_top, w.allowed, model.ua, float(gamma(E, model.ua)),
                      float(E), model.eta_a, 1.0 + 4.0 * (model.u + model.ua),
                      float(gamma(E + 2, 2.0**-53)), w.sh, w.var_s, w.D, d_row)
    w.d_eval_row = d_row[:, None]
    return True


def weight_errors(w: _Work, c0: float, n_w: list[float], g_theta_w: np.ndarray) -> bool:
    """model._weight_errors' per-key arrays w.r, w.r1, w.var_w, w.F in one pass."""
    kern = _kern(w, w.spread)
    if kern is None:
        return False
    ua = w.model.ua
    if w.arg_m is not None:             # min(2 u_a spread, cap), from shifted_scores
        arg_rel = np.expm1(w.arg_m, out=w.arg_m)
    else:
        arg = 2.0 * ua * w.spread
        arg_rel = np.expm1(np.minimum(arg, _EXP_CAP, out=arg), out=arg)
    w.r, w.r1, w.var_w, w.F = (np.empty((w.R, w.S)) for _ in range(4))
    kern.weight_errors(w.spread, arg_rel, ua, c0, sum(n_w), sum(x * x for x in n_w),
                       _rows(g_theta_w, w.R), w.r, w.r1, w.var_w, w.F)
    return True


def log_weights(w: _Work, lse: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """model._log_perturbation's passes before Λ's sum: sets w.logp; returns (the row
    maxima of ld, 0 where not finite; max(0, max|s|); e^{ld − that})."""
    kern = _kern(w, w.s, w.D)
    if kern is None:
        return None
    w.logp, ld, st = np.empty((w.R, w.S)), np.empty((w.R, w.S)), np.empty((2, w.R))
    kern.log_weights(w.s, _rows(lse, w.R), w.D, w.allowed, w.logp, ld, st)
    mld = st[0][:, None]
    mld = np.where(np.isfinite(mld), mld, 0.0)
    return mld, st[1][:, None], np.exp(np.subtract(ld, mld, out=ld), out=ld)


def perturbed_weights(w: _Work, rows: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """model._perturbed_weights for ``rows`` in one pass; None (numpy's log-space
    branch) when a key of them has p = 0 or x ≥ cap."""
    kern = _kern(w, w.p, w.ex, w.F)
    if kern is None:
        return None
    dps, ptil, dpw = (np.empty((len(rows), w.S)) for _ in range(3))
    done = kern.perturbed_weights(np.ascontiguousarray(rows, dtype=np.int64), w.allowed,
                                  w.p, w.ex, np.broadcast_to(w.x, w.p.shape), w.F,
                                  _EXP_CAP, dps, ptil, dpw)
    return (dps, ptil, dpw) if done else None


def prob_passes(w: _Work, N: np.ndarray, g_theta_p: np.ndarray
                ) -> dict[str, np.ndarray] | None:
    """model._prob_passes in one loop (its names, the same values)."""
    kern = _kern(w, w.spread)
    if kern is None:
        return None
    R, S = w.R, w.S
    ww, stats = np.empty((R, S)), np.empty((8, R))
    kern.probabilistic(*(np.broadcast_to(a, (R, S)) for a in (
        w.p, N, w.var_s, w.var_w, w.r, w.r1, w.ex, w.F, w.D, w.sh, w.allowed)),
        _rows(g_theta_p, R), ww, stats)
    col = [stats[i][:, None] for i in range(8)]
    return dict(ww=ww, Dmax=col[0], shmax=col[1], pr_sum=col[2], nvw_sum=col[3],
                fx=col[4], Fmax=col[5], exmax=col[6], rem3=col[7])


def tie_counts(s: np.ndarray, allowed: np.ndarray, out: np.ndarray) -> bool:
    """moments._tie_counts into ``out`` (ones, (R, S)) by the compiled hash-table kernel
    (exact integer counts: the sort's values); False (nothing done) without numba or
    for other shapes and dtypes."""
    kern = kernels()
    if kern is None or s.ndim != 2 or s.dtype != np.float64 or allowed.shape != s.shape \
            or allowed.dtype != np.bool_ or out.shape != s.shape:
        return False
    s = np.ascontiguousarray(s)
    kern.tie_counts(s, s.view(np.uint64), allowed, out)
    return True
