"""The rounding-error model of attention, as data and functions.

The testing tool judges an attention output against the *exact* answer (the
oracle's certified enclosure).  How far may a correct floating-point
implementation be from it?  This module answers with a first-principles bound
for a plain implementation working in unit roundoff ``u`` (the dtype of the
output) with dot products accumulated in ``u_acc`` (the dtype of the output
too, unless the caller states a wider accumulation dtype).

Notation (one row of one head; ``c`` the scale, ``n`` the unmasked keys of the
row, ``E`` the query/key width, ``gamma_k(u) = k u / (1 - k u)``)::

    s_j  = c q·k_j + m_j                       exact scores (m: float mask)
    A_j  = c Σ_e |q_e| |k_je|                  natural scale of a score
    p_j  = softmax(s)_j                         exact weights
    y_f  = Σ_j p_j v_jf                         exact output

1. Scores.  A dot product of length E accumulated in u_acc is off by at most
   ``gamma_E(u_acc) Σ|q||k|`` (Higham, *Accuracy and Stability*, §3.1); rounding
   the scaled query to the dtype first adds ``u A_j``.  The other roundings of a
   plain kernel are relative to the score itself: the scale, the stored product,
   the mask addition, the stored sum; each adds at most ``u (|c q·k_j| + |m_j|)``::

       |ŝ_j - s_j| <= δs_j := (gamma_E(u_acc) + u) A_j + K_SCORE u (|c q·k_j| + |m_j|)

2. Propagation through softmax.  With ŝ = s + d, |d_j| <= δs_j, the weights of
   the perturbed scores satisfy ``p̃_j / p_j = e^{d_j} / Σ_k p_k e^{d_k}``, and
   by Jensen ``Σ_k p_k e^{-δs_k} >= e^{-Σ p_k δs_k}``, so (exactly, no first-order
   step)::

       |p̃_j - p_j| <= p_j expm1(δs_j + Λ),   Λ := log Σ_k p_k e^{δs_k}

3. Evaluating softmax.  Blanchard, Higham & Higham (IMA J. Numer. Anal. 41(4),
   2021) bound the shifted algorithm by ``[n + 2 + 2(s_max - s_min)] u`` in norm;
   componentwise, the argument ``ŝ_j - ŝ_max`` carries a relative error u,
   i.e. an absolute error ``u |s_j - s_max|`` in the exponent, and the exp, the
   sum of n terms and the division contribute ``(n + K_SOFTMAX) u``.  A kernel
   that stores P in the low dtype before P@V (FlashAttention does) adds one more
   ``u``::

       ρ_j := (n + K_SOFTMAX) u_acc + u_acc |s_j - s_max| + u

4. The weighted sum.  ``ŷ_f = fl(Σ p̂_j v_jf)`` with
   ``|p̂_j - p_j| <= Δp_j := min(p_j r_j, 1)``, ``r_j = (1 + expm1(δs_j + Λ))(1 + ρ_j) - 1``
   (a computed weight lies in [0, 1], hence the min)::

       |ŷ_f - y_f| <= gamma_n(u_acc) Σ_j (p_j + Δp_j)|v_jf| + Σ_j Δp_j |v_jf|
                      + u |y_f| + η (n max_j |v_jf| + 1)

   The natural scale is ``Σ_j p_j |v_jf|``, not ``|y_f|`` (y can cancel to 0
   while the terms are large).  ``u |y_f|`` is the final rounding to the output
   dtype; η (half the smallest subnormal of the dtype) covers underflow of the
   exponentials and of the output.

The bound is a worst case (gamma_k charges every addition its full u), so a
correct implementation lands far inside it; a ``safety`` factor (default
:data:`DEFAULT_SAFETY`) multiplies it for the few legitimate kernels that do
more roundings than the model names.  The constants are data below; the
derivation is repeated in docs/testing.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_SAFETY",
    "FORMATS",
    "K_SCORE",
    "K_SOFTMAX",
    "FloatFormat",
    "attention_error_bound",
    "format_of",
    "gamma",
    "linear_error_bound",
    "ulp",
]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: ``precision`` bits (with the implicit one),
    smallest normal exponent ``emin``, largest finite value ``max``."""

    name: str
    precision: int
    emin: int
    max: float

    @property
    def u(self) -> float:
        """Unit roundoff 2^-p (half an ulp of 1)."""
        return math.ldexp(1.0, -self.precision)

    @property
    def eta(self) -> float:
        """Half the smallest subnormal: the absolute error of underflow."""
        return math.ldexp(1.0, self.emin - self.precision)


# name -> format.  u = 2^-53, 2^-24, 2^-11, 2^-8.
FORMATS: dict[str, FloatFormat] = {
    "float64": FloatFormat("float64", 53, -1022, 1.7976931348623157e308),
    "float32": FloatFormat("float32", 24, -126, 3.4028234663852886e38),
    "float16": FloatFormat("float16", 11, -14, 65504.0),
    "bfloat16": FloatFormat("bfloat16", 8, -126, 3.3895313892515355e38),
}

# Roundings relative to a score: the scale (or 1/sqrt(E)) rounded to the dtype, the
# stored product, the mask addition, the stored sum.
K_SCORE = 4
# Softmax beyond the n additions of the row sum: the exp (libm and SLEEF exps are
# within 1-2 ulps: charged 4u), the division by the sum (1u), the stored weight (1u).
K_SOFTMAX = 6
# The bound holds for the plain algorithm under these counts (assuming an exp within
# 4u; the weights are evaluated in float64), so the default multiplies it by 1.
# Measured (bench/bench_verdicts.py, bench/RESULTS.md): the worst correct kernel seen
# (numpy, torch SDPA, torch MultiheadAttention, all four dtypes) stays below 0.25 of
# it, and below 0.6 with accumulation_dtype stated.
DEFAULT_SAFETY = 1.0


def format_of(dtype: object) -> FloatFormat:
    """The :class:`FloatFormat` of a numpy dtype (ml_dtypes bfloat16 included) or a name."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name  # type: ignore[call-overload]
    fmt = FORMATS.get(str(name))
    if fmt is None:
        from ..errors import SpecError

        raise SpecError(
            f"dtype={name!s} is not a supported float format: expected one of "
            f"{', '.join(FORMATS)}"
        )
    return fmt


def gamma(k: int | np.ndarray, u: float) -> np.ndarray:
    """Higham's ``gamma_k = k u / (1 - k u)``; +inf where ``k u >= 1``."""
    ku = np.asarray(k, dtype=np.float64) * u
    with np.errstate(divide="ignore"):
        return np.where(ku < 1.0, ku / np.maximum(1.0 - ku, 0.0), np.inf)


def ulp(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """The ulp of the format at |x| (x given in float64): 2^(e - p + 1) for
    |x| in [2^e, 2^(e+1)), with e clamped below at emin (subnormals)."""
    ax = np.abs(np.asarray(x, dtype=np.float64))
    _, ex = np.frexp(ax)  # ax = m 2^ex, m in [0.5, 1): e = ex - 1
    e = np.maximum(ex.astype(np.int64) - 1, fmt.emin)
    e = np.where(ax == 0, fmt.emin, e)
    return np.ldexp(1.0, (e - (fmt.precision - 1)).astype(np.int32))


def attention_error_bound(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    p: np.ndarray,
    *,
    scale: float,
    allowed: np.ndarray,
    mask_add: np.ndarray | None,
    out: np.ndarray,
    fmt: FloatFormat,
    acc: FloatFormat,
    dq: np.ndarray | None = None,
    dk: np.ndarray | None = None,
    dv: np.ndarray | None = None,
    softmax_axis: int = -1,
) -> np.ndarray:
    """The model's bound on ``|ŷ - y|`` per output element (float64, shape of ``out``).

    ``q (..., L, E)``, ``k (..., S, E)``, ``v (..., S, Ev)`` with heads already
    matched (GQA expanded); ``p (..., L, S)`` the weights (float64 is accurate
    enough for a tolerance); ``allowed (..., L, S)`` which keys take part;
    ``mask_add`` the finite float mask or None; ``out`` the exact output (float64).
    ``dq, dk, dv``: bounds on errors already in q, k, v (from projections, for
    multi-head attention), propagated through the same steps.  ``softmax_axis=-2``
    bounds the (buggy) variant that normalises over the queries instead.
    """
    ax = softmax_axis
    u, ua = fmt.u, acc.u
    E = q.shape[-1]
    aq, ak = np.abs(q), np.abs(k)
    kt = np.swapaxes(k, -1, -2)
    A = abs(scale) * (aq @ np.swapaxes(ak, -1, -2))
    qk = scale * (q @ kt)                                  # c q·k_j (float64)
    madd = None if mask_add is None else np.broadcast_to(mask_add, qk.shape)
    # step 1: (gamma_E(u_acc) + u) A_j for the dot product of the rounded scaled
    # query; K_SCORE u (|c q·k_j| + |m_j|) for the stores, the scale, the mask add
    size = np.abs(qk) if madd is None else np.abs(qk) + np.abs(madd)
    ds = (gamma(E, ua) + u) * A + K_SCORE * u * size
    if dq is not None or dk is not None:
        # |(q+dq)(k+dk) - qk| <= dq|k| + |q|dk + dq dk
        dqq = np.zeros_like(q) if dq is None else dq
        dkk = np.zeros_like(k) if dk is None else dk
        ds = ds + abs(scale) * (
            dqq @ np.swapaxes(ak, -1, -2) + aq @ np.swapaxes(dkk, -1, -2)
            + dqq @ np.swapaxes(dkk, -1, -2)
        ) * (1.0 + gamma(E, ua))
    ds = np.where(allowed, ds, 0.0)
    pz = np.where(allowed, p, 0.0)
    # step 2: Λ = log Σ p_k e^{δs_k}; capped so that exp never overflows (a cap
    # this large only makes the bound void, never smaller than the truth)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        lam = np.log(np.sum(pz * np.exp(np.minimum(ds, 700.0)), axis=ax, keepdims=True))
        r_scores = np.expm1(np.minimum(ds + lam, 700.0))
    n_norm = np.sum(allowed, axis=ax, keepdims=True)        # terms of the softmax sum
    n = np.sum(allowed, axis=-1, keepdims=True)             # terms of the weighted sum
    # step 3: BHH, with |s_j - s_max| from the float64 scores
    s = qk if madd is None else qk + madd
    s = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore"):
        smax = np.max(s, axis=ax, keepdims=True) if s.shape[ax] else s
        spread = np.where(allowed, smax - s, 0.0)
    rho = (n_norm + K_SOFTMAX) * ua + ua * spread + u
    r = (1.0 + r_scores) * (1.0 + rho) - 1.0
    # a computed weight lies in [0, 1]: |p̂_j - p_j| <= max(p_j, 1 - p_j) <= 1
    dp = np.where(allowed, np.minimum(pz * r, 1.0), 0.0)
    av = np.abs(v)
    pv = pz @ av                                    # Σ p_j |v_jf|
    dpv = dp @ av                                   # Σ |p̂_j - p_j| |v_jf|
    # step 4
    bound = gamma(n, ua) * (pv + dpv) + dpv + u * np.abs(out)
    if dv is not None:
        bound = bound + (pz + dp) @ dv
    vmax = (np.max(av, axis=-2, keepdims=True) if av.shape[-2]
            else np.zeros((*av.shape[:-2], 1, av.shape[-1])))
    bound = bound + fmt.eta * (n * vmax + 1.0)
    return np.asarray(bound, dtype=np.float64)


def linear_error_bound(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    *,
    y: np.ndarray,
    fmt: FloatFormat,
    acc: FloatFormat,
    dx: np.ndarray | None = None,
) -> np.ndarray:
    """Bound on ``|fl(x W^T + b) - (x W^T + b)|`` (torch layout, W (out, in)):
    ``gamma_{in+1}(u_acc)(|x||W|^T + |b|) + |dx||W|^T (1 + gamma) + u|y| + η``."""
    n_in = x.shape[-1]
    g = gamma(n_in + 1, acc.u)
    aw = np.abs(w)
    t = np.abs(x) @ aw.T
    if b is not None:
        t = t + np.abs(b)
    bound = g * t + fmt.u * np.abs(y) + fmt.eta
    if dx is not None:
        bound = bound + (dx @ aw.T) * (1.0 + g)
    return np.asarray(bound, dtype=np.float64)
