"""Judge the backward's row term D = rowsum(dO ∘ O) where a kernel exposes it
(FlashAttention's ``softmax_d``, the "dot(dO, O)" preprocessing kernel of FA2/FA3 and
Triton's ``_attn_bwd_preprocess``).

**The exact D.**  D_i = Σ_e dO_ie O_ie with O the exact attention output: O lies in the
certified enclosure [lo, hi] of :func:`mha_symbolic.reference_attention`, so D lies in
Σ_e dO_ie·[lo_ie, hi_ie] (each product's interval by its ends), evaluated in float64
and widened by γ_{E_v+1}(2⁻⁵³)·Σ_e |dO_ie|·max(|lo_ie|, |hi_ie|) for its own roundings.

**The tolerance** is the backward model's bound on D (``error_model``
"probabilistic", the smaller of it and the worst case, or "worst_case"; the same
λ rule as the gradients')
(:mod:`.model`: a FlashAttention kernel takes D from its own forward output, whose
error the forward bound gives, Σ_e |dO| δO_e, plus the sum's γ_{E_v}; a MATH kernel
takes rowsum(P ∘ dP) of its stored P and dP; the larger of the two, plus u_a|D|), so a
correct kernel of either kind passes.

**Bug classes** (the float64 D of the backward catalogue's variants, named only when
the kernel's D lies within the tolerance of it): ``d_term_from_grad_output``
(rowsum(dO ∘ dO)), ``d_term_unweighted`` (rowsum(dP), the weights forgotten),
``d_term_missing`` (D = 0).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import ShapeError, SpecError
from ...oracle.api import reference_attention
from ..call import AttentionCall
from ..forward.plain import Plain
from ..verdict import Diagnosis, _as_actual, _as_array, _as_mask, _f64, _model, _verdict
from .bugs import plain_backward
from .model import _Parts, _worst, backward_events

__all__ = ["D_BUGS", "compare_softmax_d", "with_softmax_d"]

#: bug class -> (plain_backward's d_term, what it means)
D_BUGS: dict[str, tuple[str, str]] = {
    "d_term_from_grad_output": ("from_grad_output", "D = rowsum(dO ∘ dO): the output O "
                                "replaced by the incoming gradient"),
    "d_term_unweighted": ("unweighted", "D = rowsum(dP): the weights P forgotten"),
    "d_term_missing": ("missing", "D = 0: the row term left out"),
}

_U64 = 2.0**-53


def _exact_d(lo: np.ndarray, hi: np.ndarray, do: np.ndarray) -> tuple[np.ndarray, ...]:
    """Enclosure (lower, upper) of Σ_e dO_e O_e for O in [lo, hi] (module docstring)."""
    a, b = do * lo, do * hi
    mag = np.sum(np.abs(do) * np.maximum(np.abs(lo), np.abs(hi)), axis=-1)
    n = do.shape[-1] + 1
    slack = n * _U64 / (1 - n * _U64) * mag + 2.0**-1074 * n
    return (np.sum(np.minimum(a, b), axis=-1) - slack,
            np.sum(np.maximum(a, b), axis=-1) + slack)


def compare_softmax_d(actual: Any, query: Any, key: Any, value: Any, grad_output: Any, *,
                      attn_mask: Any = None, is_causal: bool = False,
                      scale: float | None = None, enable_gqa: bool = False,
                      causal_alignment: str = "top_left", accumulation_dtype: Any = None,
                      error_model: str = "probabilistic", diagnose_bugs: bool = True) -> Any:
    """Compare a kernel's D (…, H_q, L) with the exact rowsum(dO ∘ O) (module
    docstring); an :class:`~mha_symbolic.testing.verdict.AttentionComparison` titled
    "softmax_d (D = rowsum(dO ∘ O))".

    >>> import numpy as np
    >>> x = np.zeros((1, 2, 4), np.float32); v = np.ones((1, 3, 4), np.float32)
    >>> do = np.ones((1, 2, 4), np.float32)          # O = 1 everywhere: D = 4 per row
    >>> compare_softmax_d(np.full((1, 2), 4.0, np.float32), x, np.zeros((1, 3, 4)), v,
    ...                   do).passed
    True
    """
    a = _as_actual(actual)
    ref = reference_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa,
                              causal_alignment=causal_alignment)
    do = _f64(_as_array(grad_output, "grad_output"))
    if do.shape != tuple(ref.shape):
        raise ShapeError(f"grad_output.shape={do.shape} does not match the output's shape "
                         f"{tuple(ref.shape)}")
    if tuple(a.shape) != do.shape[:-1]:
        raise ShapeError(f"softmax_d.shape={tuple(a.shape)} does not match the rows of the "
                         f"output {do.shape[:-1]} (…, H_q, L)")
    lower, upper = _exact_d(_f64(ref.lower), _f64(ref.upper), do)
    x = AttentionCall(_f64(_as_array(query, "query")), _f64(_as_array(key, "key")),
                      _f64(_as_array(value, "value")), do=do, attn_mask=_as_mask(attn_mask),
                      is_causal=is_causal, scale=None if scale is None else float(scale),
                      enable_gqa=enable_gqa, causal_alignment=causal_alignment)
    # the kernel's formats are its inputs' (its forward output O and dP are held in
    # them); D itself is stored in float32 at least (the u_a|D| term)
    model = _model(_as_actual(grad_output), accumulation_dtype, "fused", error_model)
    pb = plain_backward(x)
    worst = _worst(_Parts(pb, model.with_events(*backward_events(pb, float(a.size)))))
    tol = np.asarray(worst["softmax_d"][1], dtype=np.float64)[..., 0]
    if model.kind != "worst_case":
        # FlashAttention's D from its own output O: |Σ_e dO_e (Ô_e − O_e)| <=
        # Σ_e |dO_e| tol_O,e with the forward model's bound (one event per output
        # element, counted with the rows here), plus its float32 sum and store; a MATH
        # kernel's rowsum(P ∘ dP) keeps the worst-case bound; the smaller of that
        # larger one and the worst case holds with the probabilistic one's probability
        plain = Plain(x)
        n_out, n_terms = plain.events()
        fwd = model.with_events(n_out + a.size, n_terms + a.size * x.v.shape[-1])
        tol_o, _ = plain.bound(fwd)
        ado = np.abs(do)
        o_abs = np.abs(plain.out) + tol_o
        tol_fa = (np.sum(ado * tol_o, axis=-1)
                  + fwd.gamma_sum(x.v.shape[-1]) * np.sum(ado * o_abs, axis=-1)
                  + fwd.ua * np.sum(ado * o_abs, axis=-1))
        math_ = np.asarray(worst["softmax_d_math"][1], dtype=np.float64)[..., 0]
        tol_fa = np.broadcast_to(tol_fa, math_.shape)
        tol = np.minimum(tol, np.maximum(tol_fa, math_))
    tol = np.broadcast_to(tol, (*pb.d.shape[:-1],)).reshape(a.shape)
    names = ("batch", "head", "query")[-a.ndim:] if a.ndim <= 3 else (
        *(f"batch{i}" for i in range(a.ndim - 2)), "head", "query")
    # vacuous where the tolerance reaches D's natural size Σ_e |dO_e|·max_j |v_je| (a
    # bound on |D| for any weights): such an element judges nothing (a passing check
    # with one raises ToleranceError, as every door's)
    vmax = np.max(np.abs(pb.v), axis=-2, initial=0.0)
    natural = np.sum(np.abs(pb.do) * vmax[..., None, :], axis=-1).reshape(a.shape)
    vac = (natural > 0) & (tol >= natural)
    comp = _verdict(_f64(a), lower, upper, tol, vac, model=model,
                    rule=f"rounding-error model of D ({model.describe('FlashAttention or MATH backward')})",
                    index_names=names, title="softmax_d (D = rowsum(dO ∘ O))")
    if comp.passed or not diagnose_bugs:
        return comp
    a64 = _f64(a)
    found = []
    for bug, (term, text) in D_BUGS.items():
        d_bug = np.asarray(plain_backward(x, d_term=term).d[..., 0]).reshape(a.shape)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.abs(a64 - d_bug) / tol
        if ratio.size and np.all(np.isfinite(ratio)) and float(np.max(ratio)) <= 1.0:
            found.append(Diagnosis(bug, text, float(np.max(ratio))))
    found.sort(key=lambda d: d.ratio)
    return replace(comp, diagnosis_run=True, diagnoses=tuple(found[:2]))


def with_softmax_d(compare: Callable[..., Any]) -> Callable[..., Any]:
    """The decorator of ``compare_attention_backward``: ``softmax_d=`` (the kernel's D,
    judged by :func:`compare_softmax_d`); the comparison fails when either fails, its
    ``.softmax_d`` holds D's findings.  Plain attention only (no dropout, no variant)."""

    @functools.wraps(compare)
    def run(dq: Any, dk: Any, dv: Any, query: Any, key: Any, value: Any, grad_output: Any,
            *, softmax_d: Any = None, **options: Any) -> Any:
        __tracebackhide__ = True
        comp = compare(dq, dk, dv, query, key, value, grad_output, **options)
        if softmax_d is None:
            return comp
        plain = ("attn_mask", "is_causal", "scale", "enable_gqa", "causal_alignment",
                 "accumulation_dtype", "diagnose_bugs", "masked_rows", "rule", "safety",
                 "error_model")
        other = [n for n, v in options.items() if n not in plain and v not in (None, 0, 0.0)]
        if other or options.get("masked_rows", "zero") != "zero":
            raise SpecError(f"softmax_d= is judged for plain attention with masked_rows='zero' "
                            f"only (not with {', '.join(other) or 'this masked_rows'})")
        keep = (*plain[:7], "error_model")
        dc = compare_softmax_d(softmax_d, query, key, value, grad_output,
                               **{n: options[n] for n in keep if n in options})
        return replace(comp, passed=comp.passed and dc.passed, softmax_d=dc)

    return run
