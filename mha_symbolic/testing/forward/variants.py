"""Judge an attention output with variants (window, softcap, ALiBi, sinks, mask_mod,
score_mod, FP8 descale) or a packed varlen output against the exact answer.

:func:`mha_symbolic.testing.forward.compare.compare_attention` hands a call with variant
options to :func:`compare_variant_attention`; :func:`compare_attention_varlen` and
:func:`assert_attention_varlen_close` take FlashAttention's varlen layout.  The
verdict machinery (enclosure distance, tolerance rules, the guards that never let
an internal inf/NaN or a vacuous tolerance pass, the report) is that of
:mod:`.compare`; the tolerance model is the one of plain attention
(:mod:`.attention_bound`) with the variants' score pipeline
(:mod:`.tolerance_variants`), with the same options and defaults
(``error_model="probabilistic"``, false-alarm probability ≤ 1e-9 per check, or
``"worst_case"``; ``kernel``; ``subnormals``); the bug catalogue is
:mod:`.bugs_variants`.

Accumulation: fp16/bf16/fp8 kernels are modelled as accumulating in fp32 (as
FlashAttention, cuDNN, torch SDPA and FlexAttention do) unless
``accumulation_dtype`` says otherwise (``"same"``: in the output dtype); the report
states the accumulation.  FP8 kernels: with fp8 inputs (or ``weights_dtype=`` an fp8
format) the model assumes FlashAttention-3's forward: fp32 accumulation and the
unnormalised weights converted to the input's fp8 format before P·V.  The report says
so.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import SpecError
from ...oracle.inputs import as_exact_array
from ...oracle.variants.forward import reference_attention_varlen, variant_attention, varlen_inputs
from ...oracle.variants.protocol import VariantOptions
from ...oracle.variants.registry import kept, with_variant_keywords
from ...oracle.variants.semantics import Geometry
from ..call import AttentionCall
from ..options import asserting, checked
from ..pattern import key_clause, sequence_pattern
from ..tolerance import DEFAULT_SAFETY, FORMATS, ErrorModel
from ..verdict import (
    _as_actual,
    _check_enclosure,
    _check_shape,
    _index_names,
    _model,
    _refined,
    _rule_line,
    _rule_options,
    _tolerance,
    _with_diagnoses,
    _within,
    mid_of,
)
from ..verdict import _verdict as _judge
from .bugs import Candidate, _fits
from .bugs_variants import diagnose_variant, own_kept, plain_variant, variant_bug_classes
from .emulated import hull_violations
from .levels import dtype_factor, two_levels, variant_dtype_level
from .model_variants import FP8_FORMATS, variant_events

__all__ = ["assert_attention_varlen_close", "compare_attention_varlen",
           "compare_variant_attention"]


def _variant_model(actual: np.ndarray, in_dtype: str, accumulation_dtype: Any,
                   weights_dtype: Any, kernel: str, error_model: str,
                   subnormals: str) -> ErrorModel:
    """The :class:`~mha_symbolic.testing.tolerance.ErrorModel` of a variant kernel: the
    plain defaults (float32 accumulation for outputs narrower than float32), and FP8
    inputs mean an FP8 kernel (FlashAttention-3): float32 accumulation whatever the
    output, the weights in the input's fp8 format unless ``weights_dtype`` says."""

    fp8_in = in_dtype in FP8_FORMATS
    weights = weights_dtype if weights_dtype is not None else (in_dtype if fp8_in else None)
    model = _model(actual, accumulation_dtype, kernel, error_model, subnormals,
                   weights=weights)
    if fp8_in and accumulation_dtype is None and model.acc.p > FORMATS["float32"].p:
        model = replace(model, acc=FORMATS["float32"])
    return model


def _f64(x: Any, name: str) -> np.ndarray:
    return np.asarray(as_exact_array(x, name), dtype=np.float64)


def _lead(q: np.ndarray, k: np.ndarray, v: np.ndarray, enable_gqa: bool) -> tuple[int, ...]:
    hq = q.shape[-3] if q.ndim >= 3 else 1
    if enable_gqa and k.ndim >= 3:
        return tuple(np.broadcast_shapes(q.shape[:-2], (*k.shape[:-3], hq),
                                         (*v.shape[:-3], hq)))
    return tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))


def _variant_inputs(query: Any, key: Any, value: Any, opts: VariantOptions, *,
                    attn_mask: Any, is_causal: bool, scale: Any, enable_gqa: bool,
                    causal_alignment: str, masked_rows: str) -> AttentionCall:
    qa = as_exact_array(query, "query")
    q, k, v = _f64(query, "query"), _f64(key, "key"), _f64(value, "value")
    lead = _lead(q, k, v, enable_gqa)
    L, S = q.shape[-2], k.shape[-2]
    geo = Geometry(lead, lead[-1] if lead else 1, L, S,
                   0 if causal_alignment == "top_left" else S - L)
    # every registered variant's kept keys but those the float64 evaluation makes itself
    # (plain_keep: the bug catalogue moves their edges, bugs_variants.py)
    keep = None
    for part in kept(opts, geo, is_causal, exclude=own_kept(opts)):
        part = np.broadcast_to(part, (*lead, L, S))
        keep = part if keep is None else keep & part
    mask = None
    if attn_mask is not None:
        m = as_exact_array(attn_mask, "attn_mask")
        mask = m if m.dtype == np.bool_ else np.asarray(m, dtype=np.float64)
    return AttentionCall(q, k, v, opts=opts, attn_mask=mask, is_causal=is_causal,
                         scale=None if scale is None else float(scale), enable_gqa=enable_gqa,
                         causal_alignment=causal_alignment, masked_rows=masked_rows,
                         mod_keep=keep, in_format=qa.dtype.name)


def compare_variant_attention(
    actual: Any, query: Any, key: Any, value: Any, opts: VariantOptions, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left", masked_rows: str = "zero",
    rule: str | None = None, accumulation_dtype: Any = None, weights_dtype: Any = None,
    kernel: str = "fused", error_model: str = "probabilistic", subnormals: str = "keep",
    safety: float | None = None, rtol: float | None = None, atol: float | None = None,
    ulps: float | None = None, factor: float | None = None, diagnose_bugs: bool = True,
) -> Any:
    """compare_attention for a call with variants (options validated in ``opts``)."""

    rule = _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=factor, safety=safety)
    a = _as_actual(actual)
    x = _variant_inputs(query, key, value, opts, attn_mask=attn_mask, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
                        masked_rows=masked_rows)
    model = _variant_model(a, x.in_format, accumulation_dtype, weights_dtype, kernel,
                           error_model, subnormals)

    ref = variant_attention(query, key, value, opts, attn_mask=attn_mask, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa,
                            causal_alignment=causal_alignment, masked_rows=masked_rows,
                            return_weights=False)
    _check_shape(a, tuple(ref.shape), "attention output")
    vp = plain_variant(x)
    tol, vac = (np.broadcast_to(t_, a.shape) for t_ in vp.bound(model))
    model = model.with_events(*variant_events(vp))  # for the report's λ
    plain = None
    if rule == "flash":  # FlashAttention's out_pt: a plain kernel storing in a's dtype
        dt = a.dtype

        def store(t: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore", invalid="ignore"):
                return np.asarray(t).astype(dt).astype(np.float64)

        with np.errstate(over="ignore", invalid="ignore"):
            plain = np.broadcast_to(plain_variant(x, store=store).out, a.shape)
    # the dtype level (issue 22) where the variants lower to plain attention
    level = variant_dtype_level(x, vp, model) if rule == "model" else None
    return _verdict(a, ref, tol, vac, model=model, x=x, rule=rule, safety=safety, rtol=rtol,
                    atol=atol, ulps=ulps, factor=factor, diagnose_bugs=diagnose_bugs,
                    names=_index_names(a.ndim), title="attention output", plain=plain,
                    nan_ok=masked_rows == "nan", level=level)


def _verdict(a: np.ndarray, ref: Any, model_tol: np.ndarray, vacuous: np.ndarray, *,
             model: ErrorModel, x: Any, rule: str, safety: float | None,
             rtol: float | None, atol: float | None, ulps: float | None,
             factor: float | None, diagnose_bugs: bool, names: tuple[str, ...], title: str,
             diagnose: Any = None, plain: np.ndarray | None = None,
             nan_ok: bool = False, level: Any = None) -> Any:
    """The verdict of :mod:`.compare` (its guards included: a non-finite enclosure or
    tolerance, or a vacuous tolerance where the output would pass, raise
    ToleranceError), with the dtype level ``level`` where there is one (rule='model'),
    then the variant diagnosis."""

    lower, upper = np.asarray(ref.lower, np.float64), np.asarray(ref.upper, np.float64)
    _check_enclosure(lower, upper, nan_ok)
    if level is not None:     # refined for the tighter of the two levels, as compare's
        mid0 = mid_of(lower, upper)
        dtol, _, _ = level.tolerance(mid0, dtype_factor(rule, factor))
        lower, upper = _refined(ref, lower, upper, np.minimum(model_tol, dtol), "model",
                                model.fmt, None, None, None, None, mid=mid0)
    else:
        lower, upper = _refined(ref, lower, upper, model_tol, rule, model.fmt, safety, rtol,
                                atol, ulps)
    mid = mid_of(lower, upper)
    # flash: factor × the simulated plain kernel's error, never below the model's
    # tolerance (issue 10's floor: the simulated kernel may be the more accurate one)
    tol = _tolerance(rule, model=model_tol, mid=mid, fmt=model.fmt, rtol=rtol, atol=atol,
                     ulps=ulps, factor=factor, safety=safety, plain=plain)
    vac = vacuous if rule in ("model", "certified", "flash") else None
    rule_text = _rule_line(rule, model, safety, rtol, atol, ulps, factor)
    two = None
    if level is not None:
        two = two_levels(level, mid, tol, vacuous, rule, factor, None)
        tol, vac, rule_text = two.tol, two.vacuous, two.rule_line(rule_text)
    comp = _judge(a, lower, upper, tol, vac, model=model, rule=rule_text,
                  index_names=names, title=title, hull=_hull(a, x, model))
    if two is not None and not comp.passed:
        comp = replace(comp, notes=(*comp.notes, two.levels_note(a, lower, upper)))
    if comp.passed or not diagnose_bugs:
        return comp
    saf = DEFAULT_SAFETY if safety is None or rule != "model" else safety
    if not _within(a, lower, upper, saf * model_tol):
        if diagnose is None:
            found = diagnose_variant(np.asarray(a, dtype=np.float64), x, model=model,
                                     safety=saf)
        else:
            found = diagnose(saf)
        comp = _with_diagnoses(comp, found)
    elif two is not None and diagnose is None:
        # wrong for its dtype only: the bug classes whose float64 evaluation the output
        # lies within the dtype tolerance of (a correct kernel's noise around the bug)
        comp = _with_diagnoses(comp, _dtype_only_bugs(np.asarray(a, np.float64), x,
                                                      two.dtype_tol))
    return comp


def _dtype_only_bugs(a: np.ndarray, x: AttentionCall, dtol: np.ndarray
                     ) -> tuple[Candidate, ...]:
    """The variant bug classes that explain an output wrong only for its dtype: ``a``
    within the dtype tolerance ``dtol`` of the buggy evaluation everywhere (the
    truth's is not: the caller found it), best first."""
    found = []
    for bug in variant_bug_classes():
        try:
            if not bug.applies(x):
                continue
            out = plain_variant(x, **bug.switches(x)).out
        except (ValueError, IndexError):   # a variant that makes no sense for these shapes
            continue
        if out.shape == a.shape:
            ok, ratio = _fits(a, out, dtol)
            if ok:
                found.append(Candidate(bug.name, bug.description, ratio))
    return tuple(sorted(found, key=lambda c: c.ratio))


# --------------------------------------------------------------------------------------
# varlen


def _packed_whole(opts: VariantOptions) -> VariantOptions:
    """Sequence 0's options for the packed sequences read as one (each active variant's
    ``packed_whole`` changes)."""
    changes: dict[str, Any] = {}
    for v in opts.active():
        if v.packed_whole is not None:
            changes.update(v.packed_whole(opts))
    return opts.replace(**changes)


def _packed_bugs(x_parts: list[AttentionCall], cq: list[int], ck: list[int],
                 qp: np.ndarray, kp: np.ndarray, vp_: np.ndarray, base: AttentionCall,
                 actual: np.ndarray, model: ErrorModel, safety: float,
                 tol: np.ndarray | None = None) -> tuple[Any, ...]:
    """Diagnosis of a packed output: the per-sequence variant bugs (applied to every
    sequence) and the two varlen bugs (attention across the boundaries); each judged
    within ``safety`` × its own bound and, where given, the verdict's tolerance
    ``tol`` (never looser than the verdict)."""

    def within(bound: np.ndarray) -> np.ndarray:
        return bound if tol is None else np.minimum(bound, np.broadcast_to(tol, bound.shape))

    found: list[Any] = []

    def packed(outs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([np.swapaxes(o[0], 0, 1) for o in outs], axis=0)

    def check(name: str, desc: str, outs: list[Any]) -> None:
        out = packed([o.out for o in outs])
        bound = packed([o.bound(model)[0] for o in outs])
        ok, ratio = _fits(actual, out, within(safety * bound))
        if ok:
            found.append(Candidate(name, desc, ratio))

    for bug in variant_bug_classes():
        if not any(bug.applies(xp) for xp in x_parts):
            continue
        try:
            outs = [plain_variant(xp, **bug.switches(xp)) if bug.applies(xp)
                    else plain_variant(xp) for xp in x_parts]
        except (ValueError, IndexError):
            continue
        check(bug.name, bug.description, outs)
    nb = len(cq) - 1
    if nb > 1:
        # one sequence: the packed tokens attend to each other (cu_seqlens ignored)
        whole = replace(base, q=np.swapaxes(qp, 0, 1)[None], k=np.swapaxes(kp, 0, 1)[None],
                        v=np.swapaxes(vp_, 0, 1)[None], opts=_packed_whole(base.opts))
        try:
            o = plain_variant(whole)
            ok, ratio = _fits(actual, np.swapaxes(o.out[0], 0, 1),
                              within(safety * np.swapaxes(o.bound(model)[0][0], 0, 1)))
            if ok:
                found.append(Candidate("varlen_no_boundaries", "packed sequences attend to "
                                       "each other (cu_seqlens not applied)", ratio))
        except (ValueError, IndexError):
            pass
        # each sequence also sees the first key of the next one (an end offset + 1)
        outs = []
        for b, xp in enumerate(x_parts):
            if b + 1 < nb and ck[b + 1] < kp.shape[0]:
                kk = np.swapaxes(kp[ck[b]:ck[b + 1] + 1], 0, 1)[None]
                vv = np.swapaxes(vp_[ck[b]:ck[b + 1] + 1], 0, 1)[None]
                xp = replace(xp, k=kk, v=vv, mod_keep=None)
            outs.append(plain_variant(xp))
        with contextlib.suppress(ValueError):
            check("varlen_boundary_off_by_one", "each sequence also attends to the first key "
                  "of the next sequence (cu_seqlens_k end off by one)", outs)
    return tuple(sorted(found, key=lambda cand: cand.ratio))


@with_variant_keywords
@checked
def compare_attention_varlen(
    actual: Any, query: Any, key: Any, value: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, *,
    is_causal: bool = False, scale: float | None = None, causal_alignment: str = "top_left",
    masked_rows: str = "zero", rule: str | None = None,
    accumulation_dtype: Any = None, weights_dtype: Any = None, kernel: str = "fused",
    error_model: str = "probabilistic", subnormals: str = "keep",
    safety: float | None = None, rtol: float | None = None, atol: float | None = None,
    ulps: float | None = None, diagnose_bugs: bool = True, **variants: Any,
) -> Any:
    """Compare a packed varlen output (total_q, H, E_v) with the exact
    :func:`mha_symbolic.reference_attention_varlen` of the same arguments (the
    registered variants' keywords included: each sequence gets its options from the
    variants' ``sequence`` hooks, :class:`~mha_symbolic.oracle.variants.forward.Varlen`).

    >>> import numpy as np
    >>> x = np.arange(12.0, dtype=np.float32).reshape(3, 1, 4) / 8
    >>> wrong = np.repeat(x[:1], 3, axis=0)       # every token returns the first value
    >>> compare_attention_varlen(wrong, x, x, x, [0, 1, 3], [0, 1, 3], scale=0.0).passed
    False
    """

    rule = _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=None, safety=safety)
    if rule == "flash":
        raise SpecError("rule='flash' is not available for varlen attention")
    a = _as_actual(actual)
    ref = reference_attention_varlen(
        query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        is_causal=is_causal, scale=scale, causal_alignment=causal_alignment,
        masked_rows=masked_rows, **variants)
    _check_shape(a, tuple(ref.shape), "varlen attention output")
    vl = varlen_inputs(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, **variants)
    qp, kp, vp_ = (np.asarray(t, dtype=np.float64) for t in (vl.q, vl.k, vl.v))
    cq, ck = vl.cq, vl.ck
    model = _variant_model(a, vl.q.dtype.name, accumulation_dtype, weights_dtype, kernel,
                           error_model, subnormals)
    parts: list[AttentionCall] = []
    for b in range(vl.n):
        rq, rk, ob = vl.sequence(b)
        qb, kb, vb = (np.swapaxes(t[r], 0, 1)[None]
                      for t, r in ((vl.q, rq), (vl.k, rk), (vl.v, rk)))
        parts.append(_variant_inputs(qb, kb, vb, ob, attn_mask=None, is_causal=is_causal,
                                     scale=scale, enable_gqa=vl.hk != vl.H,
                                     causal_alignment=causal_alignment,
                                     masked_rows=masked_rows))
    plains = [plain_variant(xp) for xp in parts]
    # one check: λ from the events of every sequence together (union bound)
    ev = [variant_events(p_) for p_ in plains]
    events = (sum(e[0] for e in ev), sum(e[1] for e in ev))
    if plains:
        bounds = [p_.bound(model, events) for p_ in plains]
        tol = np.concatenate([np.swapaxes(t_[0], 0, 1) for t_, _ in bounds], axis=0)
        vac = np.concatenate([np.swapaxes(v_[0], 0, 1) for _, v_ in bounds], axis=0)
    else:
        tol, vac = np.zeros(a.shape), np.zeros(a.shape, dtype=bool)
    model = model.with_events(*events)

    def diagnose(saf: float, tol: np.ndarray | None = None) -> tuple[Any, ...]:
        base = replace(parts[0], mod_keep=None) if parts else None
        if base is None:
            return ()
        return _packed_bugs(parts, cq, ck, qp, kp, vp_, base, np.asarray(a, np.float64),
                            model, saf, tol)

    comp = _verdict(a, ref, tol, vac, model=model, x=None, rule=rule, safety=safety,
                    rtol=rtol, atol=atol, ulps=ulps, factor=None,
                    diagnose_bugs=diagnose_bugs, names=("token", "head", "feature"),
                    title="varlen attention output", diagnose=diagnose,
                    nan_ok=masked_rows == "nan")
    if comp.passed:
        return comp
    text = sequence_pattern(comp.mismatched, cq, comp.index_names)
    return replace(comp, pattern="; ".join(t for t in (text, key_clause(comp.diagnoses)) if t))


@asserting(compare_attention_varlen)
def assert_attention_varlen_close(actual: Any, query: Any, key: Any, value: Any,
                                  cu_seqlens_q: Any, cu_seqlens_k: Any, *args: Any,
                                  msg: Any = None, **options: Any) -> None:
    """:func:`compare_attention_varlen`, raising
    :class:`~mha_symbolic.errors.AttentionMismatchError` with the report (``msg`` as
    :func:`mha_symbolic.assert_attention_close`'s).

    >>> import numpy as np
    >>> x = np.arange(12.0, dtype=np.float32).reshape(3, 1, 4) / 8
    >>> assert_attention_varlen_close(np.repeat(x[:1], 3, axis=0), x, x, x, [0, 1, 3],
    ...                               [0, 1, 3], scale=0.0)
    Traceback (most recent call last):
    ...
    mha_symbolic.errors.AttentionMismatchError: FAIL [...] varlen attention output: 8 / 12 off...
    """


def _hull(a: np.ndarray, x: Any, model: ErrorModel) -> np.ndarray | None:
    """The value-hull verdict (emulated.hull_violations) of a call with variants: over
    every key of the row (a superset of the hull the masks, windows and block masks
    leave; a sink adds the value 0, which the hull holds); None when a variant changes
    the inputs (the protocol's ``inputs``: FP8 descale factors scale the values) or for
    packed varlen calls."""
    o = getattr(x, "opts", None)
    if o is None or any(v.inputs is not None for v in o.active()):
        return None
    try:
        xi = AttentionCall(x.q, x.k, x.v, enable_gqa=x.enable_gqa)
        bad = hull_violations(a, xi, model)
    except (ValueError, IndexError):
        return None
    return bad if bad.shape == a.shape else None
