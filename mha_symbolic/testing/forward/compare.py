"""Judge an attention output against the exact answer.

:func:`compare_attention` returns the findings as data (:class:`AttentionComparison`);
:func:`assert_attention_close` raises :class:`~mha_symbolic.errors.AttentionMismatchError`
with a report in the style of ``torch.testing``.  :func:`compare_mha` and
:func:`assert_mha_close` do the same for a whole multi-head attention block.

The exact answer is the oracle's certified enclosure ``[lower, upper]``; an element is
a mismatch only when the *certified* distance from ``actual`` to the enclosure exceeds
the tolerance, so the oracle's own uncertainty can never raise a false alarm.  No
verdict is ever given on an internal inf or NaN: an enclosure or a tolerance that is
not finite for finite inputs, or a tolerance that is vacuous where the output would
otherwise pass, raises :class:`~mha_symbolic.errors.ToleranceError` naming the cause.

Tolerance rules (``rule=``; not given: ``"allclose"`` when ``rtol``/``atol`` are,
else ``"model"``):

``"model"`` (default)
    the rounding-error model of a correct kernel in the dtype of ``actual``
    (:mod:`mha_symbolic.testing.tolerance`): ``accumulation_dtype`` (default float32
    for fp16/bf16 outputs, ``"same"`` for a kernel that accumulates in the output
    dtype), ``kernel`` (``"fused"``, ``"eager"``, ``"eager_scaled_query"``),
    ``error_model`` (``"probabilistic"``, false-alarm probability ≤ 1e-9 per check,
    or ``"worst_case"``), ``subnormals`` (``"keep"``, or ``"flush"`` for a kernel that
    flushes subnormal results to zero), times ``safety``; see docs/testing.md.
``"ulp"``
    ``|actual - exact| <= ulps × ulp(exact)`` in the dtype of ``actual``.
``"allclose"``
    ``|actual - exact| <= atol + rtol × |exact|`` (both required; giving them without
    ``rule=`` implies this rule, as in torch.testing).

The ``assert_*`` functions take the options of their ``compare_*`` twin (the one
signature, :mod:`.options`) and ``msg=`` (a string above the report, or a callable
from the report to the message); the first line of the error is a one-line summary.
``"flash"``
    FlashAttention's rule: ``|actual - exact| <= factor × max|plain - exact|``,
    where ``plain`` is a plain implementation in the same dtype, simulated here
    (inputs, scores, weights and output stored in the dtype, products in float32 for
    fp16/bf16), and never below the model's tolerance for that dtype.

>>> import numpy as np
>>> from mha_symbolic.testing.forward.compare import compare_attention
>>> rng = np.random.default_rng(0)
>>> q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
>>> s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k) / 2.0
>>> w = np.exp(s - s.max(-1, keepdims=True)); w /= w.sum(-1, keepdims=True)
>>> compare_attention((w @ v).astype(np.float32), q, k, v).passed
True
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import SpecError
from ...oracle.api import reference_attention
from ...oracle.progress import Progress
from ...oracle.variants.protocol import VariantOptions
from ...oracle.variants.registry import (
    sdpa_variant_options,
    split_variant_keywords,
    with_variant_keywords,
)
from ..call import AttentionCall
from ..layout import with_layout
from ..lse import with_lse
from ..options import asserting, checked
from ..pattern import locate_keys, patterned
from ..tolerance import DEFAULT_SAFETY, ErrorModel
from ..verdict import (
    AttentionComparison,
    Diagnosis,
    _as_actual,
    _as_array,
    _as_mask,
    _check_enclosure,
    _check_shape,
    _f64,
    _index_names,
    _model,
    _refined,
    _rule_line,
    _rule_options,
    _rule_tolerance,
    _verdict,
    _with_diagnoses,
    _within,
    mid_of,
)
from .bugs import Candidate, diagnose
from .emulated import dtype_level, hull_violations
from .levels import (
    dtype_factor,
    dtype_promise,
    precision_candidates,
    two_levels,
)
from .plain import Plain, plain_in_dtype
from .variants import compare_variant_attention

__all__ = ["assert_attention_close", "compare_attention"]


#: The tolerance model and the dtype level together, seconds per score on one core
#: (bench/bench_compare.py, issue 29): a bar is shown above ~2 s on a terminal.
SECONDS_PER_SCORE = 1.5e-7


@with_lse
@with_layout(Diagnosis)
@patterned
@with_variant_keywords
@checked
def compare_attention(
    actual: Any,
    query: Any,
    key: Any,
    value: Any,
    *,
    attn_mask: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    causal_alignment: str = "top_left",
    masked_rows: str = "zero",
    dropout_p: float = 0.0,
    dropout_mask: Any = None,
    rule: str | None = None,
    accumulation_dtype: Any = None,
    kernel: str = "fused",
    error_model: str = "probabilistic",
    subnormals: str = "keep",
    safety: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    ulps: float | None = None,
    factor: float | None = None,
    diagnose_bugs: bool = True,
    weights_dtype: Any = None,
    out_dtype: Any = None,
    layout: str = "bhsd",
    lse: Any = None,
    lse_base: Any = "e",
    lse_masked: str = "-inf",
    **variants: Any,
) -> AttentionComparison:
    """Compare ``actual`` with the exact ``scaled_dot_product_attention(query, key,
    value, ...)``; the attention options are those of
    :func:`mha_symbolic.reference_attention`, the variants included (window, softcap,
    alibi_slopes, sinks, mask_mod, score_mod, FP8 descale: :mod:`.variants`;
    ``weights_dtype`` names the format a kernel converts its weights to before P·V,
    the input's fp8 format by default for fp8), the tolerance options those of the
    module docstring.

    Returns an :class:`AttentionComparison` (truthy when it passed); never raises for
    a mismatch.  Raises :class:`~mha_symbolic.errors.SpecError` /
    :class:`~mha_symbolic.errors.ShapeError` for unusable arguments and
    :class:`~mha_symbolic.errors.ToleranceError` when no verdict can be given.

    >>> import numpy as np
    >>> q = k = v = np.eye(2, dtype=np.float32)[None]
    >>> compare_attention(np.zeros((1, 2, 2), np.float32), q, k, v).passed
    False

    ``layout="bshd"``: the arrays in FlashAttention's (B, S, H, D) layout, the report's
    indices too (:mod:`..layout`); a failure that passes read in the other layout is
    diagnosed ``layout``.

    ``lse=``: the kernel's softmax_lse (…, H_q, L), judged too (:mod:`..lse`;
    ``lse_base`` "e" or 2, ``lse_masked`` "-inf" or "+inf"); ``.lse`` has its findings.
    """
    del layout, lse, lse_base, lse_masked  # handled by with_layout and with_lse

    split_variant_keywords(variants, door=compare_attention)
    variant = sdpa_variant_options(dropout_p, dropout_mask, **variants)
    fp8 = any("float8" in str(getattr(x, "dtype", "")) for x in (actual, query, key, value))
    promise = dtype_promise(actual, (query, key, value), out_dtype, fp8)
    if variant is not None or weights_dtype is not None or fp8:

        if dropout_mask is not None or dropout_p:
            raise SpecError("dropout with fp8 inputs or weights_dtype is not supported: "
                            "pass dropout_p=0 without a dropout_mask")
        return _kept_promise(promise, compare_variant_attention(
            actual, query, key, value, variant or VariantOptions(), attn_mask=attn_mask,
            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
            causal_alignment=causal_alignment, masked_rows=masked_rows, rule=rule,
            accumulation_dtype=accumulation_dtype, weights_dtype=weights_dtype,
            kernel=kernel, error_model=error_model, subnormals=subnormals,
            safety=safety, rtol=rtol, atol=atol, ulps=ulps, factor=factor,
            diagnose_bugs=diagnose_bugs))
    rule = _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=factor, safety=safety)
    a = _as_actual(actual)
    model = _model(a, accumulation_dtype, kernel, error_model, subnormals)

    ref = reference_attention(
        query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa, causal_alignment=causal_alignment, masked_rows=masked_rows,
        dropout_p=dropout_p, dropout_mask=dropout_mask)
    _check_shape(a, tuple(ref.shape), "attention output")
    lower, upper = _f64(ref.lower), _f64(ref.upper)
    _check_enclosure(lower, upper, masked_rows == "nan")
    x = AttentionCall(
        _f64(_as_array(query, "query")), _f64(_as_array(key, "key")),
        _f64(_as_array(value, "value")), attn_mask=_as_mask(attn_mask), is_causal=is_causal,
        scale=None if scale is None else float(scale), enable_gqa=enable_gqa,
        causal_alignment=causal_alignment, masked_rows=masked_rows,
        dropout_p=float(dropout_p or 0.0),
        dropout_mask=None if dropout_mask is None else _as_array(dropout_mask,
                                                                 "dropout_mask").astype(bool),
    )
    model, model_tol, vacuous, plain_err, notes, level = _levels(x, a, model, rule, lower,
                                                                 upper)
    mid = mid_of(lower, upper)
    coarse = lower, upper
    if level is not None:   # refine for the tighter of the two levels
        dtol, _, _ = level.tolerance(mid, dtype_factor(rule, factor))
        lower, upper = _refined(ref, lower, upper, np.minimum(model_tol, dtol), "model",
                                model.fmt, None, None, None, None, mid=mid)
    else:
        lower, upper = _refined(ref, lower, upper, model_tol, rule, model.fmt, safety, rtol,
                                atol, ulps, mid=mid)
    if lower is not coarse[0] or upper is not coarse[1]:
        mid = mid_of(lower, upper)          # refined: a new midpoint
    tol = _rule_tolerance(rule, model_tol=model_tol, mid=mid, fmt=model.fmt, rtol=rtol,
                     atol=atol, ulps=ulps, factor=factor, safety=safety, plain_err=plain_err)
    vac = vacuous if rule in ("model", "certified", "flash") else None
    rule_text = _rule_line(rule, model, safety, rtol, atol, ulps, factor)
    two = None
    if level is not None:
        two = two_levels(level, mid, tol, vacuous, rule, factor, plain_err)
        tol, vac = two.tol, two.vacuous
        rule_text = two.rule_line(rule_text)
    hull = hull_violations(a, x, model)
    comp = _verdict(a, lower, upper, tol, vac, model=model, rule=rule_text,
                    index_names=_index_names(a.ndim), title="attention output",
                    notes=tuple(notes), hull=hull, mid=mid)
    if two is not None and not comp.passed:
        comp = replace(comp, notes=(*comp.notes, two.levels_note(a, lower, upper)))
    comp = _kept_promise(promise, comp)
    if comp.passed or not diagnose_bugs:
        return comp
    return _diagnosed(comp, a, x, model, lower, upper, model_tol, two, mid, rule, safety,
                      (query, key, value))


def _levels(x: AttentionCall, a: np.ndarray, model: ErrorModel, rule: str,
            lower: np.ndarray, upper: np.ndarray) -> tuple[ErrorModel, np.ndarray,
                                                           np.ndarray, Any, list[str], Any]:
    """The error model's tolerance (and which elements it leaves vacuous), the simulated
    kernel's error (``rule="flash"``) and the dtype level, with their progress bars:
    (the model with the call's events, model_tol, vacuous, plain_err, notes, level)."""
    plain = Plain(x)
    model = model.with_events(*plain.events())
    lay = plain.layout
    prog = Progress(None, lay.B * lay.L * lay.S * SECONDS_PER_SCORE)
    bar = prog.bar(lay.B * lay.L, "tolerance")
    try:
        model_tol, vacuous = plain.bound(model, bar)
    finally:
        if bar is not None:
            bar.close()
    notes: list[str] = []
    plain_err = None
    if rule == "flash":
        plain_err, note = _plain_error(x, a.dtype, lower, upper)
        if note:
            notes.append(note)
    bar = prog.bar(lay.B * lay.L, "dtype level") if rule in ("model", "flash") else None
    try:
        level = dtype_level(x, model, bar) if rule in ("model", "flash") else None
    finally:
        if bar is not None:
            bar.close()
    return model, model_tol, vacuous, plain_err, notes, level


def _diagnosed(comp: AttentionComparison, a: np.ndarray, x: AttentionCall,
               model: ErrorModel, lower: np.ndarray, upper: np.ndarray,
               model_tol: np.ndarray, two: Any, mid: np.ndarray, rule: str,
               safety: float | None, inputs: tuple[Any, Any, Any]) -> AttentionComparison:
    """A failed comparison with the bug classes its output fits (the catalogue, the key
    hypotheses, and with two levels the precision bugs)."""
    saf = DEFAULT_SAFETY if safety is None or rule != "model" else safety
    found: tuple[Candidate, ...] = ()
    if not _within(a, lower, upper, saf * model_tol):
        found = diagnose(a, x, model=model, safety=saf) or locate_keys(a, x, model=model,
                                                                       safety=saf)
    diags = [Diagnosis(c.name, c.description, c.ratio) for c in found]
    if two is not None:
        diags += [Diagnosis(n, d, r, "explains" if ex else "size") for n, d, r, ex
                  in precision_candidates(a, x, mid, model, *inputs, two.dtype_tol)]
    return _with_diagnoses(comp, comp.diagnoses + tuple(diags))


def _plain_error(x: AttentionCall, dtype: Any, lower: np.ndarray,
                 upper: np.ndarray) -> tuple[float, str]:
    """max |plain − exact| of the simulated same-dtype plain kernel (0 where it
    overflows, which the report says)."""
    run = plain_in_dtype(x, dtype)
    mid = mid_of(lower, upper)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(run.out) & np.isfinite(mid)
        e = float(np.max(np.abs(run.out - mid)[ok])) if np.any(ok) else 0.0
    note = ""
    if run.n_overflow:
        note = (f"the simulated plain {np.dtype(dtype).name} kernel overflows at "
                f"{run.n_overflow} element(s) (first at {run.overflow_index}): its error "
                "there is not used; the model's tolerance applies")
    return e, note


@asserting(compare_attention)
def assert_attention_close(actual: Any, query: Any, key: Any, value: Any, *,
                           msg: Any = None, **options: Any) -> None:
    """Raise :class:`~mha_symbolic.errors.AttentionMismatchError` (an AssertionError)
    with a readable report unless :func:`compare_attention` passes: the options are
    compare_attention's (``help()`` lists them), and ``msg`` a string put above the
    report or a callable from the report to the message (as torch.testing's).  The
    error's first line is the one-line summary; its ``.comparison`` the findings.

    >>> import numpy as np
    >>> q = k = v = np.eye(2, dtype=np.float32)[None]
    >>> assert_attention_close(np.zeros((1, 2, 2), np.float32), q, k, v, msg="layer 3")
    Traceback (most recent call last):
    ...
    mha_symbolic.errors.AttentionMismatchError: layer 3
    FAIL [no known bug] attention output: 4 / 4 off
    attention output is not close to the exact answer: ...
    """


# ------------------------------------------------------------------------------------
# Helpers


def _kept_promise(problem: str, comp: AttentionComparison) -> AttentionComparison:
    if not problem:
        return comp
    d = Diagnosis("output_dtype", problem, 0.0, "dtype")
    return replace(comp, passed=False, dtype_problem=problem, diagnosis_run=True,
                   diagnoses=(d, *comp.diagnoses))
