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
from dataclasses import dataclass, replace
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
from ..tolerance import FORMATS, ErrorModel
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
    mid_of,
)
from ..verdict import _verdict as _judge
from .bugs import Candidate
from .bugs_variants import own_kept, plain_variant, variant_bug_classes
from .emulated import hull_violations
from .levels import TwoLevels, dtype_factor, two_levels, variant_dtype_level
from .model_variants import FP8_FORMATS, variant_events
from .plain import fit_ratio

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


def _stored(dt: Any) -> Any:
    """The store of a plain kernel in ``dt`` (rule='flash': FlashAttention's out_pt)."""

    def store(t: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(t).astype(dt).astype(np.float64)

    return store


@dataclass(frozen=True)
class _Rule:
    """A check's tolerance options, and the tolerance the verdict gives a call under
    them (:meth:`tolerance`): the one code for the truth's verdict and for each bug
    class the diagnosis tries (:func:`_at_verdict_tolerance`)."""

    rule: str
    safety: float | None = None
    rtol: float | None = None
    atol: float | None = None
    ulps: float | None = None
    factor: float | None = None

    def tolerance(self, model_tol: np.ndarray, vacuous: np.ndarray, mid: np.ndarray,
                  model: ErrorModel, level: Any = None, plain: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray | None, TwoLevels | None]:
        """(tolerance, vacuous elements or None, the two levels or None) of a call whose
        model bound is ``model_tol`` (``vacuous``), exact value ``mid``, dtype level
        ``level`` (rule='model') and simulated plain kernel ``plain`` (rule='flash')."""
        r = self.rule
        # flash: factor × the simulated plain kernel's error, never below the model's
        # tolerance (issue 10's floor: the simulated kernel may be the more accurate one)
        tol = _tolerance(r, model=model_tol, mid=mid, fmt=model.fmt, rtol=self.rtol,
                         atol=self.atol, ulps=self.ulps, factor=self.factor,
                         safety=self.safety, plain=plain)
        vac = vacuous if r in ("model", "certified", "flash") else None
        two = None
        if level is not None:
            two = two_levels(level, mid, tol, vacuous, r, self.factor, None)
            tol, vac = two.tol, two.vacuous
        return tol, vac, two

    def for_bugs(self) -> _Rule:
        """The rule a bug class is judged by: this one, but the model's two levels for
        'ulp' and 'allclose' (tolerances stated for the truth's kernel, that say
        nothing of what a kernel implementing the bug rounds to)."""
        return self if self.rule in ("model", "certified", "flash") else _Rule("model")


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
        with np.errstate(over="ignore", invalid="ignore"):
            plain = np.broadcast_to(plain_variant(x, store=_stored(a.dtype)).out, a.shape)
    # the dtype level (issue 22) where the variants lower to plain attention
    level = variant_dtype_level(x, vp, model) if rule == "model" else None
    return _verdict(a, ref, tol, vac, model=model, x=x,
                    rules=_Rule(rule, safety, rtol, atol, ulps, factor),
                    diagnose_bugs=diagnose_bugs, names=_index_names(a.ndim),
                    title="attention output", plain=plain, nan_ok=masked_rows == "nan",
                    level=level)


def _verdict(a: np.ndarray, ref: Any, model_tol: np.ndarray, vacuous: np.ndarray, *,
             model: ErrorModel, x: Any, rules: _Rule, diagnose_bugs: bool,
             names: tuple[str, ...], title: str, diagnose: Any = None,
             plain: np.ndarray | None = None, nan_ok: bool = False, level: Any = None
             ) -> Any:
    """The verdict of :mod:`.compare` (its guards included: a non-finite enclosure or
    tolerance, or a vacuous tolerance where the output would pass, raise
    ToleranceError), with the dtype level ``level`` where there is one (rule='model'),
    then the variant diagnosis: the bug classes whose own verdict ``a`` passes
    (:func:`_at_verdict_tolerance`; ``diagnose(rules)``, the varlen doors')."""
    rule, safety, factor = rules.rule, rules.safety, rules.factor
    rtol, atol, ulps = rules.rtol, rules.atol, rules.ulps

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
    tol, vac, two = rules.tolerance(model_tol, vacuous, mid, model, level, plain)
    rule_text = _rule_line(rule, model, safety, rtol, atol, ulps, factor)
    if two is not None:
        rule_text = two.rule_line(rule_text)
    comp = _judge(a, lower, upper, tol, vac, model=model, rule=rule_text,
                  index_names=names, title=title, hull=_hull(a, x, model))
    if two is not None and not comp.passed:
        comp = replace(comp, notes=(*comp.notes, two.levels_note(a, lower, upper)))
    if comp.passed or not diagnose_bugs:
        return comp
    a64 = np.asarray(a, dtype=np.float64)
    if diagnose is not None:
        return _with_diagnoses(comp, diagnose(rules.for_bugs()))
    found = (_at_verdict_tolerance(a64, x, bug, model, rules.for_bugs())
             for bug in variant_bug_classes())
    return _with_diagnoses(comp, tuple(sorted((c for c in found if c is not None),
                                              key=lambda c: c.ratio)))


def _at_verdict_tolerance(a: np.ndarray, x: AttentionCall, bug: Any, model: ErrorModel,
                          rules: _Rule) -> Candidate | None:
    """``bug`` as a candidate for the failing output ``a``: named only if a correct
    kernel implementing that bug would have passed with ``a`` — ``a`` within, element
    by element, the tolerance the verdict gives the buggy call (:meth:`_Rule.tolerance`
    on the bug's float64 evaluation: its own model bound, its own dtype level — the
    emulated kernels with the bug's scale, keys, v and rotation — and, rule='flash',
    its own simulated plain kernel).  Never the truth's tolerance (a bug whose answer
    lies near the truth's would absorb any error up to it) nor the bug's model bound
    alone at 16 bits (``no_scale``'s larger scores widen it past the other bugs'
    answers).  None where the bug does not apply or its evaluation makes no sense for
    these shapes."""
    try:
        if not bug.applies(x):
            return None
        switches = bug.switches(x)
        pv = plain_variant(x, **switches)
        if pv.shape != a.shape:
            return None
        mtol, mvac = (np.broadcast_to(t, a.shape) for t in pv.bound(model))
        plain = None
        if rules.rule == "flash":
            with np.errstate(over="ignore", invalid="ignore"):
                plain = plain_variant(x, store=_stored(a.dtype), **switches).out
        tol, _, _ = rules.tolerance(mtol, mvac, pv.out, model, plain=plain)
        ratio = fit_ratio(a, pv.out, tol, 1.0)
        if ratio <= 1.0 and rules.rule == "model":
            # the levels only tighten the model's tolerance: emulated only when needed
            level = variant_dtype_level(x, pv, model)
            if level is not None:
                tol, _, _ = rules.tolerance(mtol, mvac, pv.out, model, level)
                ratio = fit_ratio(a, pv.out, tol, 1.0)
    except (ValueError, IndexError):  # a variant that makes no sense for these shapes
        return None
    return Candidate(bug.name, bug.description, ratio) if ratio <= 1.0 else None


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
                 actual: np.ndarray, model: ErrorModel, rules: _Rule) -> tuple[Any, ...]:
    """Diagnosis of a packed output: the per-sequence variant bugs (applied to every
    sequence) and the two varlen bugs (attention across the boundaries); each named
    only if ``actual`` is within the tolerance the verdict gives the buggy call
    (``rules`` on its own model bound, as :func:`_at_verdict_tolerance`; the varlen
    doors have no dtype level)."""

    found: list[Any] = []

    def packed(outs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([np.swapaxes(o[0], 0, 1) for o in outs], axis=0)

    def fit(name: str, desc: str, out: np.ndarray, bound: np.ndarray) -> None:
        tol, _, _ = rules.tolerance(bound, np.zeros(bound.shape, bool), out, model)
        ratio = fit_ratio(actual, out, tol, 1.0)
        if ratio <= 1.0:
            found.append(Candidate(name, desc, ratio))

    def check(name: str, desc: str, outs: list[Any]) -> None:
        fit(name, desc, packed([o.out for o in outs]),
            packed([o.bound(model)[0] for o in outs]))

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
            fit("varlen_no_boundaries", "packed sequences attend to each other (cu_seqlens "
                "not applied)", np.swapaxes(o.out[0], 0, 1),
                np.swapaxes(o.bound(model)[0][0], 0, 1))
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

    def diagnose(rules: _Rule) -> tuple[Any, ...]:
        base = replace(parts[0], mod_keep=None) if parts else None
        if base is None:
            return ()
        return _packed_bugs(parts, cq, ck, qp, kp, vp_, base, np.asarray(a, np.float64),
                            model, rules)

    comp = _verdict(a, ref, tol, vac, model=model, x=None,
                    rules=_Rule(rule, safety, rtol, atol, ulps),
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
