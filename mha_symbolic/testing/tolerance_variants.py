"""The rounding-error model of attention with variants, and of FP8 kernels.

It extends the model of :mod:`.tolerance` (read its docstring first: the steps and
constants are the same) to the score pipeline of :mod:`mha_symbolic.oracle.variants`
and to the FP8 kernels of FlashAttention-3.  Notation: ``u`` the unit roundoff of the
output dtype, ``u_a`` of the accumulation dtype, ``A_j`` the natural scale of a
score (|c| Σ|q||k|), ``n`` the kept keys of the row.

1. Scores.  As :mod:`.tolerance`, step 1: ``δs_j = (gamma_E(u_a) + u) A_j +
   K_SCORE u (|c q·k_j| + |m_j|)``, where m_j now sums the float mask and every
   additive bias (ALiBi, a bias table): each is computed and added in the kernel
   with at most K_SCORE roundings relative to its size.  A softcap ``s -> C
   tanh(s/C)`` is 1-Lipschitz, so an incoming error passes through unchanged; the
   kernel's own evaluation adds ``u_a |s|`` (the division by C), ``K_TANH u_a |s'|``
   (tanh within K_TANH ulps, libm and CUDA's tanhf are within 2) and ``u |s'|``
   (the product and its store), s' = C tanh(s/C).
2.–4. Softmax and the weighted sum as :mod:`.tolerance`, with an attention sink as
   one more term of the softmax sum (a key with δs = 0 and value 0): n -> n + 1 in
   the sums, the sink in Λ = log(Σ p_j e^{δs_j} + p_sink), and |s_j - s_max| measured
   from the larger of the row's top score and the sink.
5. FP8 (FlashAttention-3's forward, ``hopper/``): the inputs are fp8 and exact; Q Kᵀ
   multiplies fp8 values exactly and accumulates in fp32 (u_a = 2^-24); the
   unnormalised weights P̃_j = e^{s_j - m} (<= 1) are converted to the fp8 format
   ``p_format`` before P̃ V, and the row sum ℓ = Σ P̃ is kept in fp32.  Rounding P̃_j
   to a format of unit roundoff u_p whose subnormals are spaced 2η_p errs by
   <= max(u_p P̃_j, min(η_p, P̃_j)) (a normal value: relative u_p; a subnormal one:
   half a spacing, and never more than P̃_j itself, which may round to 0).  In
   normalised weights (P̃_j = p_j/p_ref, p_ref the largest weight, the sink's
   included): Δp_j gains ``max(u_p p_j, min(η_p p_ref, p_j))``.  The output is
   accumulated in fp32, multiplied by v_descale (one more u_a |y|) and stored.

Constants: :data:`K_TANH` below; K_SCORE, K_SOFTMAX from :mod:`.tolerance`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .tolerance import FORMATS, K_SCORE, K_SOFTMAX, FloatFormat, gamma

__all__ = ["FP8_FORMATS", "K_TANH", "variant_error_bound", "variant_format_of"]

#: ulps of the kernel's tanh (CUDA's tanhf: 2 ulp; glibc's tanh: within 2), doubled.
K_TANH = 4

#: The OCP 8-bit formats (OFP8 rev. 1.0): E4M3 ("fn": no infinities, max 448) and
#: E5M2 (IEEE-like, max 57344); precision counts the implicit bit.
FP8_FORMATS: dict[str, FloatFormat] = {
    name: FORMATS[name] for name in ("float8_e4m3fn", "float8_e5m2")}


def variant_format_of(dtype: Any) -> FloatFormat:
    """The FloatFormat of a dtype or name, the fp8 formats included."""
    name = dtype if isinstance(dtype, str) else str(getattr(dtype, "name", dtype))
    name = name.removeprefix("torch.")
    if name in FP8_FORMATS:
        return FP8_FORMATS[name]
    if name in FORMATS:
        return FORMATS[name]
    from ..errors import SpecError

    raise SpecError(f"dtype={name} is not a supported float format: expected one of "
                    f"{', '.join([*FORMATS, *FP8_FORMATS])}")


def variant_error_bound(vp: Any, fmt: FloatFormat, acc: FloatFormat,
                        p_format: FloatFormat | None = None) -> np.ndarray:
    """The model's bound on |ŷ - y| per output element for a float64 evaluation ``vp``
    (a :class:`~mha_symbolic.testing.bugs_variants.VariantPlain`) of attention with
    variants, in output format ``fmt``, accumulating in ``acc``, weights converted to
    ``p_format`` before P·V when given (FP8 kernels)."""
    u, ua = fmt.u, acc.u
    E = vp.q.shape[-1]
    allowed = vp.allowed
    # step 1: scores
    ds = (gamma(E, ua) + u) * vp.A + K_SCORE * u * vp.size
    for before, after in vp.caps:
        ds = ds + ua * before + (K_TANH * ua + u) * after
    ds = np.where(allowed, ds, 0.0)
    pz = np.where(allowed, vp.p, 0.0)
    ps = np.zeros((*pz.shape[:-1], 1)) if vp.p_sink is None else vp.p_sink[..., None]
    # step 2: Λ = log(Σ p_j e^{δs_j} + p_sink), capped so exp cannot overflow
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        lam = np.log(np.sum(pz * np.exp(np.minimum(ds, 700.0)), axis=-1, keepdims=True) + ps)
        r_scores = np.expm1(np.minimum(ds + lam, 700.0))
    n = np.sum(allowed, axis=-1, keepdims=True)
    n_norm = n + (0 if vp.p_sink is None else 1)
    # step 3: spread from the top of the row, the sink included
    s = np.where(allowed, vp.s, -np.inf)
    with np.errstate(invalid="ignore"):
        smax = np.max(s, axis=-1, keepdims=True) if s.shape[-1] else s
        if vp.sink_logit is not None:
            smax = np.maximum(smax, vp.sink_logit[..., None])
        spread = np.where(allowed, smax - s, 0.0)
    rho = (n_norm + K_SOFTMAX) * ua + ua * spread + u
    r = (1.0 + r_scores) * (1.0 + rho) - 1.0
    dp = np.where(allowed, np.minimum(pz * r, 1.0), 0.0)
    if p_format is not None:
        # step 5: P̃ rounded to p_format; η_p = half the smallest subnormal spacing
        p_ref = np.maximum(np.max(pz, axis=-1, keepdims=True, initial=0.0), ps)
        eta_p = math.ldexp(1.0, p_format.emin - p_format.precision)
        dp = dp + np.where(allowed, np.maximum(p_format.u * pz,
                                               np.minimum(eta_p * p_ref, pz)), 0.0)
    av = np.abs(vp.v)
    pv = pz @ av
    dpv = dp @ av
    # step 4 (+ the v_descale product in fp32)
    extra = ua if vp.v_descaled else 0.0
    bound = gamma(n_norm, ua) * (pv + dpv) + dpv + (u + extra) * np.abs(vp.out)
    vmax = (np.max(av, axis=-2, keepdims=True) if av.shape[-2]
            else np.zeros((*av.shape[:-2], 1, av.shape[-1])))
    bound = bound + fmt.eta * (n * vmax + 1.0)
    return np.asarray(bound, dtype=np.float64)
