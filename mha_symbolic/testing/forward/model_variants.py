"""The rounding-error model of attention with variants, and of FP8 kernels.

It is the bound of :mod:`.attention_bound` (read its docstring first: the steps, the
worst-case and probabilistic models, λ and the vacuity rule are the same, with the
same :class:`~mha_symbolic.testing.tolerance.ErrorModel` and its defaults), given the
score pipeline of :mod:`mha_symbolic.oracle.variants.semantics` through
:class:`~mha_symbolic.testing.forward.model.ScoreExtras`.  Notation: ``u`` the unit
roundoff of the output dtype, ``u_a`` of the accumulation dtype, ``u_s`` of the dtype
that holds the scores (u_a for a fused kernel), ``t_j = c q·k_j``.

1. Window, causal masks, mask_mod and BlockMask only choose the keys: the plain bound
   with those keys.
2. Biases (ALiBi, a bias table, a float mask): each additive term is one rounding of
   the running score, at most ``u_s size_j`` (``size_j = |t_j| + Σ|b_j| + |m_j|``), and
   the bias as the kernel holds it (an ALiBi product in fp32, a table or an additive
   mask tensor stored in the output dtype) errs by at most ``(u + u_a)|b_j|``.
3. A softcap ``s -> C tanh(s/C)`` is 1-Lipschitz, so an incoming error passes through
   unchanged (no larger); the kernel's own evaluation adds ``u_a |s|`` (the division by
   C), ``K_TANH u_a |s'|`` (tanh within K_TANH/2 ulps) and ``u |s'|`` (the product and
   its store), s' = C tanh(s/C).  Behind a cap a shared relative error δ of the scale
   moves a final score by at most ``|δ t_j|`` but not by a common shift, so the shared
   errors are bounded per key (:attr:`ScoreExtras.centred` false).
4. An attention sink is one more key of the softmax (k = v = 0, the sink's logit as
   its score): it enters the sums (n -> n + 1), Λ, the spread from the top score and
   the centred values like any key, with no score error of its own.
5. FP8 (FlashAttention-3's forward, ``hopper/``): the inputs are fp8 and exact; Q Kᵀ
   multiplies fp8 values exactly and accumulates in fp32 (u_a = 2^-24, the default for
   outputs narrower than fp32); the scale and the q/k descale factors are multiplied in
   fp32 (three roundings shared by the row); the unnormalised weights P̃_j = e^{s_j − m}
   ≤ 1 are converted to the fp8 format ``weights`` before P̃ V (relative u_w, and
   ``min(η_w p_ref, p_j)`` for a weight below the format's normal range, p_ref the
   row's largest weight, the sink's included); the row sum ℓ = Σ P̃ is kept in fp32;
   the output is multiplied by v_descale (one more ``u_a |y|``) and stored.

6. A variant's own term (the ``error`` hook of :mod:`mha_symbolic.oracle.variants.protocol`,
   issue 23): an independent bound and its variance per score, added here.  Rotary
   embeddings (:func:`mha_symbolic.oracle.variants.rotary.error_terms`) are its first
   user: the kernel's rotation and its fp32 angles, as a bound on each score.

The float64 evaluation of the variant's scores (tanh, the bias products and sums) errs
by at most ``2^-50 (size_j + Σ_caps (|s| + |s'|))``, counted as a score error like the
plain evaluation's own.  Constants (K_TANH, …) live in :mod:`.tolerance`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..tolerance import FORMATS, K_EXP, K_TANH, ErrorModel, FloatFormat
from .model import ScoreExtras, attention_error_bound

__all__ = ["FP8_FORMATS", "variant_error_bound", "variant_events"]

#: The OCP 8-bit formats (OFP8 rev. 1.0), as the oracle defines them: E4M3 ("fn": no
#: infinities, max 448) and E5M2 (IEEE-like, max 57344).
FP8_FORMATS: dict[str, FloatFormat] = {
    name: FORMATS[name] for name in ("float8_e4m3fn", "float8_e5m2")}

#: Scores per chunk of the bound (rows × keys), as :data:`.plain.CHUNK_SCORES`.
_CHUNK = 1 << 19


def variant_events(vp: Any) -> tuple[float, float]:
    """The probabilistic events of one check of ``vp`` (for the model's λs, as
    :meth:`.plain.Plain.events`): the output elements, and the terms of every sum (the
    2S' terms of each weighted sum and of each row's softmax sum, S' counting a sink)."""
    n_out = float(np.prod(vp.out.shape))
    S = vp.allowed.shape[-1] + (vp.sink_logit is not None)
    rows = n_out / max(vp.v.shape[-1], 1)
    return n_out, float(2 * S * (n_out + rows) + 1)


def _extras(vp: Any, b: int, rows: slice, t: np.ndarray, model: ErrorModel,
            lead: tuple[int, ...]) -> ScoreExtras:
    """The score pipeline of rows ``rows`` of flat problem ``b`` (see the module
    docstring, steps 2–4)."""
    L, S = vp.q.shape[-2], vp.allowed.shape[-1]

    def pick(a: np.ndarray) -> np.ndarray:
        return np.broadcast_to(a, (*lead, L, S)).reshape(-1, L, S)[b, rows]

    u, ua, us = model.u, model.ua, model.us
    scores = pick(vp.s)
    size = pick(vp.size)
    bias = np.maximum(size - np.abs(t), 0.0)          # Σ|b_j| + |m_j|
    add = us * size
    ind = vp.n_add * add + (u + ua) * bias
    var = vp.n_add * add * add + ((u + ua) * bias) ** 2
    d_eval = 2.0**-50 * size
    for before, after in vp.caps:
        bf, af = pick(before), pick(after)
        ind = ind + ua * bf + (K_TANH * ua + u) * af
        var = var + (ua * bf) ** 2 + (K_TANH * ua * af) ** 2 + (u * af) ** 2
        d_eval = d_eval + 2.0**-50 * (bf + af)
    if vp.opts is not None:                            # the variants' own terms (hooks)
        for variant in vp.opts.active():
            if variant.error is not None:
                i2, v2 = variant.error(vp.opts, vp, b, rows, model)
                ind, var = ind + i2, var + v2
    if vp.sink_logit is not None:                      # the sink: one exact extra key
        sink = np.broadcast_to(vp.sink_logit, (*lead, L)).reshape(-1, L)[b, rows]
        scores = np.concatenate([scores, sink[:, None]], axis=1)
        zero = np.zeros((scores.shape[0], 1))
        ind, var, d_eval = (np.concatenate([np.broadcast_to(a, (zero.shape[0], S)), zero],
                                           axis=1) for a in (ind, var, d_eval))
    return ScoreExtras(scores, ind, var, d_eval, centred=not vp.caps,
                       scale_roundings=3 if vp.qk_descaled else 1,
                       final_roundings=1 if vp.v_descaled else 0)


def variant_error_bound(vp: Any, model: ErrorModel, events: tuple[float, float] | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The model's bound on |ŷ − y| per output element of a float64 evaluation ``vp``
    (a :class:`~mha_symbolic.testing.forward.bugs_variants.VariantPlain`) of attention with
    variants, and where it is vacuous: (tol, vacuous), output-shaped.  ``model`` as
    :func:`~mha_symbolic.testing.tolerance.error_model` makes it (its ``weights`` the
    FP8 format of the weights, if any); its λs are set here for the whole check, whose
    events are ``events`` (default: those of ``vp`` alone, :func:`variant_events`).

    >>> import numpy as np
    >>> from mha_symbolic.oracle.variants.registry import variant_options
    >>> from mha_symbolic.testing.forward.bugs_variants import plain_variant
    >>> from mha_symbolic.testing.call import AttentionCall
    >>> from mha_symbolic.testing.tolerance import error_model
    >>> x = AttentionCall(np.eye(2)[None], np.eye(2)[None], np.eye(2)[None],
    ...                   opts=variant_options(softcap=5.0))
    >>> tol, vac = variant_error_bound(plain_variant(x), error_model("bfloat16"))
    >>> bool(np.all((tol > 0) & (tol < 0.05))), bool(vac.any())
    (True, False)
    """
    model = model.with_events(*(events if events is not None else variant_events(vp)))
    L, E = vp.q.shape[-2:]
    S, Ev = vp.allowed.shape[-1], vp.v.shape[-1]
    assert vp.k is not None
    lead = tuple(np.broadcast_shapes(vp.q.shape[:-2], vp.k.shape[:-2], vp.v.shape[:-2],
                                     vp.allowed.shape[:-2]))
    B = math.prod(lead)
    q3 = np.broadcast_to(vp.q, (*lead, L, E)).reshape(B, L, E)
    k3 = np.broadcast_to(vp.k, (*lead, S, E)).reshape(B, S, E)
    v3 = np.broadcast_to(vp.v, (*lead, S, Ev)).reshape(B, S, Ev)
    al3 = np.broadcast_to(vp.allowed, (*lead, L, S)).reshape(B, L, S)
    uni3 = (None if vp.uniform is None
            else np.broadcast_to(vp.uniform, (*lead, L)).reshape(B, L))
    sink = vp.sink_logit is not None
    tol = np.zeros((B, L, Ev))
    vac = np.zeros((B, L, Ev), dtype=bool)
    step = max(1, _CHUNK // max(S + sink, 1))
    c = float(vp.scale)
    for b in range(B):
        kb, vb = k3[b], v3[b]
        if sink:
            kb = np.concatenate([kb, np.zeros((1, E))])
            vb = np.concatenate([vb, np.zeros((1, Ev))])
        for i0 in range(0, L, step):
            rows = slice(i0, min(L, i0 + step))
            qb = q3[b, rows]
            with np.errstate(over="ignore", invalid="ignore"):
                t = c * (qb @ k3[b].T)
            allowed = al3[b, rows]
            if sink:
                allowed = np.concatenate([allowed, np.ones((allowed.shape[0], 1), bool)],
                                         axis=1)
            bound = attention_error_bound(
                qb, kb, vb, scale=c, allowed=allowed, model=model,
                uniform_rows=None if uni3 is None else uni3[b, rows],
                extras=_extras(vp, b, rows, np.where(np.isfinite(t), t, 0.0), model, lead))
            tol[b, rows], vac[b, rows] = bound.tol, bound.vacuous
    shape = (*lead, L, Ev)
    tol = tol.reshape(shape)
    # a buggy variant whose weights are not a softmax (the sink in every numerator:
    # they sum to more than 1; diagnosis only): the softmax's errors grow with the
    # weights' sum, its centring no longer cancels their common part, and the output's
    # roundings are relative to its own, larger, value: the weights' relative errors
    # (exp, division, store) on Σ_j p_j|v_j|, and u + u_a of |out|
    tot = np.sum(vp.p, axis=-1) + (0.0 if vp.p_sink is None else vp.p_sink)
    if np.any(tot > 1.0 + 2.0**-20):
        tol = tol * np.maximum(np.broadcast_to(tot, shape[:-1]), 1.0)[..., None]
        rho = (K_EXP + 1) * model.ua + model.uw
        tol = tol + rho * (np.abs(vp.p) @ np.abs(vp.v)) + (model.u + model.ua) * np.abs(vp.out)
    return tol, vac.reshape(shape)
