"""Judge a kernel's gradients against the exact ones: :func:`compare_attention_backward`
and :func:`assert_attention_backward_close`, with reports in the style of the
forward's (:mod:`.compare`): which gradient failed, its worst element against the
certified enclosure of the exact value, and the backward bug class it matches.

The tolerance of ``rule="model"`` is the rounding-error model of the backward pass
(:mod:`.backward_model`): FlashAttention-2's algorithm (and the autograd
formulation) in the gradients' dtype, accumulating in float32 for fp16/bf16 unless
``accumulation_dtype`` says otherwise ("same": the dtype itself), combined by the
probabilistic model of Higham & Mary (false-alarm probability at most 1e-9 per check)
or, with ``error_model="worst_case"``, the worst case — the error model, defaults and
λ of every check (:mod:`.tolerance`).  No verdict on an internal inf/NaN: an enclosure
or a bound that is not finite, or a tolerance that is vacuous (at least the gradient's
natural size) where the gradients would pass, raises
:class:`~mha_symbolic.errors.ToleranceError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..._display import ReportDisplay
from ...errors import ShapeError, SpecError, ToleranceError
from ...oracle.api import reference_attention_backward
from ...oracle.variants.forward import lowered, lowered_after_cap, prepare, require_lowerable
from ...oracle.variants.protocol import VariantOptions
from ...oracle.variants.registry import (
    backward_bug_classes,
    cap_keywords,
    grad_params,
    refuse_backward_check,
    require_gradients,
    split_variant_keywords,
    variant_options,
    with_variant_keywords,
)
from ..call import AttentionCall
from ..forward.bugs import _fits
from ..options import asserting, checked
from ..report import headline
from ..tolerance import ErrorModel, format_of
from ..verdict import (
    AttentionComparison,
    Diagnosis,
    _acc_text,
    _as_actual,
    _as_array,
    _as_mask,
    _check_enclosure,
    _f64,
    _model,
    _refined,
    _rule_line,
    _rule_options,
    _tolerance,
    _verdict,
    mid_of,
)
from .bugs import (
    BACKWARD_BUG_CLASSES,
    BackwardBugClass,
    PlainBackward,
    plain_backward,
)
from .model import BACKWARD_KERNEL, backward_error_bound, backward_events, natural_scales
from .rotated import rotated_check
from .softmax_d import with_softmax_d
from .units import power_of_two_form

__all__ = [
    "BackwardComparison",
    "assert_attention_backward_close",
    "compare_attention_backward",
    "diagnose_backward",
]

_GRADS = (("dq", "grad_query"), ("dk", "grad_key"), ("dv", "grad_value"),
          ("d_attn_mask", "grad_attn_mask"))


# --------------------------------------------------------------------------------------
# Findings


@dataclass(frozen=True, repr=False)
class BackwardComparison(ReportDisplay):
    """Everything :func:`compare_attention_backward` found: one
    :class:`~mha_symbolic.testing.forward.compare.AttentionComparison` per gradient
    (``gradients["dq"]`` …) and the matched backward bug classes."""

    passed: bool
    rule: str
    dtype: str
    accumulation: str
    gradients: dict[str, AttentionComparison]
    diagnoses: tuple[Diagnosis, ...] = ()
    diagnosis_run: bool = False
    bounds: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    warnings: tuple[str, ...] = ()
    #: the kernel's D = rowsum(dO ∘ O) judged (``softmax_d=``, :mod:`.softmax_d`)
    softmax_d: Any = None

    def __bool__(self) -> bool:
        return self.passed

    def report(self) -> str:
        """The report: the one-line :meth:`summary`, then each failed gradient's."""
        return _render_backward(self)

    def summary(self) -> str:
        """One line: the verdict, each failed gradient's count, the diagnosis."""
        return _summary_backward(self)

    def table(self) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        """(header, rows) of the notebook display: one row per gradient."""
        rows: list[tuple[str, ...]] = []
        for comp in self.gradients.values():
            ratio = f"{comp.worst.ratio:.3g}" if comp.worst is not None else "–"
            rows.append((comp.title, "passed" if comp.passed else "FAILED",
                         f"{comp.n_mismatched} / {comp.n_elements}", ratio))
        rows += [("diagnosis", d.bug, d.description, f"{d.ratio:.2g}")
                 for d in self.diagnoses]
        return ("gradient", "verdict", "mismatched", "worst error / tolerance"), rows


def _summary_backward(c: BackwardComparison) -> str:
    """``attention gradients are [not] close to the exact gradients: <failed ones>``."""
    head = ("attention gradients are close to the exact gradients" if c.passed else
            "attention gradients are not close to the exact gradients")
    failed = [f"{comp.title} {comp.n_mismatched} / {comp.n_elements} mismatched"
              for comp in c.gradients.values() if not comp.passed]
    text = head + (": " + ", ".join(failed) if failed else
                   f" ({', '.join(c.gradients)} checked)")
    if c.diagnoses:
        text += f"; matches backward bug class {', '.join(repr(d.bug) for d in c.diagnoses)}"
    return text


def _headline_backward(c: BackwardComparison) -> str:

    failed = [f"{comp.title} {comp.n_mismatched} / {comp.n_elements}"
              for comp in c.gradients.values() if not comp.passed]
    bugs = [d.bug for d in c.diagnoses] if c.diagnosis_run or c.diagnoses else None
    return headline(bugs, "gradients", ", ".join(failed) + " off" if failed else "off")


def _render_backward(c: BackwardComparison) -> str:
    lines = ([] if c.passed else [_headline_backward(c)]) + [_summary_backward(c)]
    summary = []
    for comp in c.gradients.values():
        status = "passed" if comp.passed else (
            f"FAILED ({comp.n_mismatched} / {comp.n_elements} elements)")
        summary.append(f"{comp.title}: {status}")
    lines.append("  " + "; ".join(summary))
    lines.append(f"  dtype: {c.dtype}, accumulation: {c.accumulation}; tolerance: {c.rule}")
    lines.extend(f"Warning: {w}" for w in c.warnings)
    for comp in c.gradients.values():
        if comp.passed:
            continue
        lines.append(f"--- {comp.title}")
        body = comp.report().splitlines()[2:]   # headline and summary repeat the verdict
        lines.extend("  " + ln for ln in body if not ln.startswith("Diagnosis"))
    for d in c.diagnoses:
        lines.append(f"Diagnosis: matches backward bug class '{d.bug}' — {d.description} "
                     f"(every gradient within {d.ratio:.2g} × tolerance of that variant; "
                     "not within tolerance of the exact gradients)")
    if c.diagnosis_run and not c.diagnoses:
        lines.append("Diagnosis: no known backward bug class matches.")
    if c.softmax_d is not None:
        lines += ["", *c.softmax_d.report().splitlines()[(0 if c.softmax_d.passed else 1):-1]]
    return "\n".join(lines)


def _index_names(ndim: int, rows: str) -> tuple[str, ...]:
    tail = ("head", rows, "feature")[-min(ndim, 3):]
    lead = ndim - len(tail)
    names = ("batch",) if lead == 1 else tuple(f"batch{i}" for i in range(lead))
    return names + tail


def _model_bwd(arrays: list[np.ndarray], accumulation_dtype: Any, error_model: str
               ) -> ErrorModel:
    """The error model of a backward check: the kernel's dtype is the least precise
    gradient's; float32 accumulation for fp16/bf16 by default, ``"same"`` for the dtype
    itself (the defaults and options of every check, :func:`.compare._model`)."""
    kernel = max(arrays, key=lambda a: _model(a, "same", "fused", "worst_case").u)
    return _model(kernel, accumulation_dtype, "fused", error_model)


def _vacuity(tol: np.ndarray, nat: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Elements whose tolerance reaches the gradient's natural size where that stands
    above the bound's absolute floor (backward_model.natural_scales)."""
    size, floor = nat
    return np.asarray((size > 4.0 * floor) & (tol >= size))


def _refuse_vacuous(comps: dict[str, AttentionComparison], model: ErrorModel) -> None:
    """A passing check whose tolerance was vacuous somewhere gives no verdict."""
    if not all(c_.passed for c_ in comps.values()):
        return
    for comp in comps.values():
        if comp.n_vacuous:
            raise ToleranceError(
                f"no verdict: the gradients would pass, but for {comp.n_vacuous} of "
                f"{comp.n_elements} element(s) of the {comp.title} the tolerance of the "
                f"{model.describe(BACKWARD_KERNEL)} with accumulation in {model.acc.name} "
                "reaches the gradient's natural size, or admits an all-zero gradient: the "
                "check cannot tell a wrong or missing gradient from the right one there. "
                "Use a wider accumulation_dtype or dtype, error_model='probabilistic', or "
                "rule='ulp'/'allclose'")


@with_softmax_d
@with_variant_keywords
@checked
def compare_attention_backward(
    dq: Any, dk: Any, dv: Any,
    query: Any, key: Any, value: Any, grad_output: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left", masked_rows: str = "zero",
    dropout_p: float = 0.0, dropout_mask: Any = None, d_attn_mask: Any = None,
    rule: str | None = None, accumulation_dtype: Any = None, safety: float | None = None,
    rtol: float | None = None, atol: float | None = None, ulps: float | None = None,
    factor: float | None = None, diagnose_bugs: bool = True,
    error_model: str = "probabilistic",
    d_sinks: Any = None, d_alibi_slopes: Any = None, softmax_d: Any = None,
    **variants: Any,
) -> BackwardComparison:
    """Compare a kernel's gradients ``dq, dk, dv`` (and ``d_attn_mask`` for a float
    mask, optional) with the exact gradients of attention(query, key, value) against
    ``grad_output`` (:func:`mha_symbolic.reference_attention_backward`, same options).

    ``rule``: "model" (default; the backward error model above in the gradients' dtype,
    accumulation float32 for fp16/bf16 unless ``accumulation_dtype`` says otherwise,
    "same" for a kernel that accumulates in its own dtype; ``error_model``
    "probabilistic" or "worst_case"), "ulp", "allclose" (``rtol`` and ``atol``), "flash"
    (``factor`` × the error of a simulated plain same-dtype backward, FlashAttention's
    tests, never below the model's tolerance).  Returns a :class:`BackwardComparison`
    (truthy when every gradient passes); never raises for a mismatch; raises
    :class:`~mha_symbolic.errors.ToleranceError` when no verdict can be given.

    Variants: ``window``, ``mask_mod`` (or a BlockMask), ``alibi_slopes``, bias-table
    ``score_mod`` entries and ``sinks`` are plain attention of other exact inputs
    (oracle/variant_forward.py, "lowering"), judged by the plain model and catalogue;
    a sink is one extra key whose dk, dv rows the kernel does not return (they are
    filled with the exact values and judge nothing).  A ``softcap`` (or a softcap
    ``score_mod``) applied first, on the scaled score, as FlashAttention does, is
    judged by the worst-case propagation with the cap's factor 1 − tanh² in dS
    (backward_model.py), the catalogue adding ``softcap_derivative_missing``.
    ``d_sinks`` (H,) and ``d_alibi_slopes`` (the slopes' shape), optional: the
    kernel's gradients of the sink logits and ALiBi slopes, judged against
    :func:`mha_symbolic.reference_attention_backward`'s with the sums of the mask
    gradient's bounds they add (docs/gradients.md §11.6).  Tables' gradients and
    ``d_attn_mask`` with variants have no tolerance model here.  Rotary embeddings
    (``rotary_base`` or ``rotary_cos``/``rotary_sin``, with masks): the plain model at
    the rotated inputs with the rotation's terms and Rᵀ, worst-case propagation
    (:mod:`.rotated`), the diagnosis naming ``rotation_not_transposed`` and
    ``rotation_missing``.

    ``softmax_d``: the kernel's D = rowsum(dO ∘ O) (…, H_q, L) where it exposes it
    (FlashAttention's ``softmax_d``), judged too (:mod:`.softmax_d`; plain attention;
    ``.softmax_d`` has its findings, and the comparison fails when it fails).

    >>> import numpy as np
    >>> from mha_symbolic import reference_attention_backward
    >>> rng = np.random.default_rng(0)
    >>> q, k, v, do = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(4))
    >>> g = reference_attention_backward(q, k, v, do)
    >>> exact = [e.rounded("float32") for e in g]
    >>> compare_attention_backward(*exact, q, k, v, do).passed
    True
    >>> compare_attention_backward(exact[0], 2 * exact[1], exact[2], q, k, v, do).passed
    False
    """
    del softmax_d  # handled by with_softmax_d

    split_variant_keywords(variants, door=compare_attention_backward)
    variant = variant_options(**variants)
    kernel_params = {"d_sinks": d_sinks, "d_alibi_slopes": d_alibi_slopes}  # grad_params
    judge = {"rule": rule, "accumulation_dtype": accumulation_dtype, "safety": safety,
             "rtol": rtol, "atol": atol, "ulps": ulps, "factor": factor,
             "diagnose_bugs": diagnose_bugs, "error_model": error_model}
    call = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale,
            "enable_gqa": enable_gqa, "causal_alignment": causal_alignment,
            "masked_rows": masked_rows}
    if variant is not None:
        return _compare_variant(dq, dk, dv, query, key, value, grad_output, variant, variants,
                                call, judge, d_attn_mask=d_attn_mask,
                                dropout=(dropout_p, dropout_mask), kernel_params=kernel_params)
    _refuse_params_without_variants(kernel_params)
    return _compare_plain(dq, dk, dv, query, key, value, grad_output, d_attn_mask, call,
                          judge, dropout_p=dropout_p, dropout_mask=dropout_mask)


def _compare_plain(dq: Any, dk: Any, dv: Any, query: Any, key: Any, value: Any,
                   grad_output: Any, d_attn_mask: Any, call: dict[str, Any],
                   judge: dict[str, Any], **dropout: Any) -> BackwardComparison:
    """:func:`compare_attention_backward` of plain attention, in power-of-two units for
    huge values or grad_output (:func:`power_of_two_form`)."""
    shifted = power_of_two_form(value, grad_output, dq, dk, dv, d_attn_mask)
    note: tuple[str, ...] = ()
    floor = 1.0
    if shifted is not None:
        value, grad_output, dq, dk, dv, d_attn_mask, note, floor = shifted
    result = _compare_backward(dq, dk, dv, query, key, value, grad_output, **call, **dropout,
                               d_attn_mask=d_attn_mask, **judge, sink_keys=0, cap=None,
                               floor_scale=floor)
    return replace(result, warnings=(*result.warnings, *note)) if note else result


def _judged_params() -> dict[str, tuple[Any, Any]]:
    """keyword -> (variant, GradParam) of the parameter gradients the door judges (those
    with a ``reduce``: a tolerance model)."""
    return {p.keyword: (v, p) for v, p in grad_params() if p.reduce is not None}


def _refuse_params_without_variants(kernel_params: dict[str, Any]) -> None:
    if any(x is not None for x in kernel_params.values()):
        owners = _judged_params()
        raise SpecError(f"{' and '.join(kernel_params)} need "
                        f"{' and '.join(owners[kw][0].keywords[0] + '=' for kw in kernel_params)}")


def _compare_variant(dq: Any, dk: Any, dv: Any, query: Any, key: Any, value: Any,
                     grad_output: Any, variant: Any, variants: dict[str, Any],
                     call: dict[str, Any], judge: dict[str, Any], *, d_attn_mask: Any,
                     dropout: tuple[Any, Any], kernel_params: dict[str, Any]
                     ) -> BackwardComparison:
    """:func:`compare_attention_backward` of a call with variants: as plain attention of
    exact inputs (:mod:`mha_symbolic.oracle.variants.forward`), so that the gradients,
    the model and the bug catalogue are the plain ones; a rotating variant through
    :func:`_compare_rotated`.  ``call``: the SDPA options; ``judge``: the rule's;
    ``kernel_params``: the kernel's variant-parameter gradients by keyword."""
    require_gradients(variant)
    refuse_backward_check(variant, "compare_attention_backward")
    if dropout[1] is not None or dropout[0]:
        raise SpecError("dropout with attention variants is not supported")
    if d_attn_mask is not None:
        raise SpecError("d_attn_mask with attention variants is not available "
                        "(reference_attention_backward computes that gradient)")
    given = any(x is not None for x in kernel_params.values())
    if given and judge["rule"] == "flash":
        raise SpecError(f"rule='flash' has no simulated kernel for {' and '.join(kernel_params)}"
                        ": use rule='model', 'ulp' or 'allclose'")
    prep = prepare(query, key, value, variant, **call)
    if any(v.rotate is not None for v in variant.active()):
        params = _parameter_gradients(kernel_params, prep, variant, query, key, value,
                                      grad_output, **call, **variants)
        return _compare_rotated(dq, dk, dv, query, key, value, grad_output, prep, variant,
                                call=call, variants=variants, params=params, **judge)
    cap = None
    if variant.has_cap:
        cap, k64, v64, mask = lowered_after_cap(prep)
    else:
        require_lowerable(prep)
        k64, v64, mask = lowered(prep)
    return _compare_backward(
        dq, dk, dv, prep.q64, k64, v64, grad_output, attn_mask=mask, is_causal=False,
        scale=call["scale"], enable_gqa=prep.group > 1, causal_alignment="top_left",
        masked_rows=call["masked_rows"], dropout_p=0.0, dropout_mask=None, d_attn_mask=None,
        **judge, sink_keys=prep.extra_keys, cap=cap,
        extra_bugs=_variant_backward_bugs(query, key, value, variant, **call),
        params=_parameter_gradients(kernel_params, prep, variant, query, key, value,
                                    grad_output, **call, **variants))


def _compare_rotated(dq: Any, dk: Any, dv: Any, query: Any, key: Any, value: Any,
                     grad_output: Any, prep: Any, variant: Any, *, call: dict[str, Any],
                     variants: dict[str, Any], rule: str | None, accumulation_dtype: Any,
                     safety: float | None, rtol: float | None, atol: float | None,
                     ulps: float | None, factor: float | None, diagnose_bugs: bool,
                     error_model: str, params: dict[str, _Param] | None = None
                     ) -> BackwardComparison:
    """compare_attention_backward of a call whose variant rotates q and k: the reference
    and tolerance of :mod:`.rotated`, judged as the plain check's; ``params``: the
    kernel's variant-parameter gradients (d_sinks, d_alibi_slopes), bounded by the
    rotated check's mask-gradient bound (:meth:`.rotated.RotatedCheck.param_bounds`)."""
    acts = {"dq": _as_actual(dq), "dk": _as_actual(dk), "dv": _as_actual(dv)}
    base = _model_bwd(list(acts.values()), accumulation_dtype, error_model)
    chk = rotated_check(acts, query, key, value, grad_output, prep, variant, base, rule=rule,
                        call=call, variants=variants, with_mask_events=bool(params))
    titles = {n: f"{t} ({n})" for n, t in _GRADS}
    if params:
        p_bounds, p_nats = chk.param_bounds(params)
        chk.bounds.update(p_bounds)
        chk.nats.update(p_nats)
        for name, (a, enc, _) in params.items():
            acts[name], chk.encs[name] = a, enc
        titles.update({p.keyword: f"{p.title} ({p.keyword})" for _, p in grad_params()})
    rule = _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=factor, safety=safety)
    rule_text = _rule_line(rule, chk.shown, safety, rtol, atol, ulps, factor,
                           kernel=BACKWARD_KERNEL + " with rotary")
    comps, warns, fits_truth = _judge_gradients(
        acts, chk.encs, chk.bounds, chk.nats, chk.shown, rule=rule, rule_text=rule_text,
        safety=safety, rtol=rtol, atol=atol, ulps=ulps, factor=factor, plain=None,
        titles=titles, masked_nan=call["masked_rows"] == "nan")
    _refuse_vacuous(comps, chk.shown)
    passed = all(c_.passed for c_ in comps.values())
    result = BackwardComparison(passed, rule_text, base.fmt.name, _acc_text(base), comps,
                                bounds=chk.bounds, warnings=tuple(warns))
    if passed or not diagnose_bugs or fits_truth:
        return result
    saf = 1.0 if safety is None or rule != "model" else safety
    grads = {n: a for n, a in acts.items() if n not in (params or {})}
    return replace(result, diagnosis_run=True, diagnoses=chk.diagnose(grads, saf))


def _variant_backward_bugs(query: Any, key: Any, value: Any, variant: Any, **call: Any
                           ) -> tuple[BackwardBugClass, ...]:
    """The registered variants' backward bug classes (their ``backward_bugs`` hooks) as
    catalogue entries for this call: each reads the call record of the lowered problem
    with the call's own options; a class whose switches change the options
    (``variant_changes``) recomputes P = exp(S − lse) with the forward's lse but the
    scores of the changed call (plain_backward's ``backward_attn_mask``: the window or
    ALiBi missing in the backward).  Built lazily, only when a diagnosis runs."""

    def bwd_mask(changes: dict[str, Any]) -> Any:
        other = prepare(query, key, value, variant.replace(**changes), **call)
        return (lowered_after_cap(other)[3] if variant.has_cap else lowered(other)[2])

    def entry(bug: Any) -> BackwardBugClass:
        memo: list[Any] = []

        def make(x: AttentionCall, dtype: Any = None) -> PlainBackward:
            switches = dict(bug.switches(replace(x, opts=variant)))
            changes = switches.pop("variant_changes", None)
            if changes is not None:
                if not memo:
                    memo.append(bwd_mask(changes))
                m = memo[0]
                switches["backward_attn_mask"] = np.ones((1, 1), dtype=bool) if m is None else m
            return plain_backward(x, dtype=dtype, **switches)
        return BackwardBugClass(bug.name, bug.description,
                                lambda x: bool(bug.applies(replace(x, opts=variant))), make)

    return tuple(entry(b) for b in backward_bug_classes())


#: (actual, reference enclosure, reducer): a parameter's gradient is a nonnegative
#: weighted sum of the lowered mask gradient's elements (…, L, S + sinks)
_Param = tuple[np.ndarray, Any, Any]


def _parameter_gradients(kernel_params: dict[str, Any], prep: Any, variant: Any, query: Any,
                         key: Any, value: Any, grad_output: Any, **call: Any
                         ) -> dict[str, _Param]:
    """The kernel's variant-parameter gradients (the ``grad_params`` hooks: the sink
    logits', ∂/∂σ_h = Σ_{batch, i} dS_{i,sink}; the ALiBi slopes', ∂/∂m_h = −Σ_{i,j}
    |j − (i + off)| dS_ij) as linear functionals of dS (the lowered mask's gradient),
    each with its reducer.  Their reference comes from reference_attention_backward of
    the call itself."""
    given = {kw: x for kw, x in kernel_params.items() if x is not None}
    if not given:
        return {}
    owners = _judged_params()
    active = variant.active()
    for kw in given:
        owner = owners[kw][0]
        if owner not in active:
            raise SpecError(f"{kw} was given but the call has no {owner.keywords[0]}")
    ref = reference_attention_backward(query, key, value, grad_output, **call)
    out: dict[str, _Param] = {}
    for kw, x in given.items():
        enc = getattr(ref, kw)
        out[kw] = (_as_actual(x), enc, owners[kw][1].reduce(prep.geo, tuple(enc.shape)))
    for name, (a, enc, _) in out.items():
        if tuple(a.shape) != tuple(enc.shape):
            raise ShapeError(f"{name}.shape={tuple(a.shape)} does not match the shape of the "
                             f"gradient it stands for {tuple(enc.shape)}")
    return out


def _with_sink_keys(acts: dict[str, np.ndarray], encs: dict[str, Any], n: int) -> None:
    """Sinks lowered to ``n`` extra keys (k = 0, v = 0, mask column σ;
    oracle/variant_forward.lowered): the kernel returns dk, dv for its S keys only, so
    the extra keys' rows are filled with the exact gradients (the enclosure's midpoint
    in the kernel's dtype, within the enclosure's half-width plus half an ulp of the
    truth, below every tolerance's store term u|x|).  Every element the kernel returned
    is judged as it came; the filled rows pass by construction and carry no verdict
    about the kernel."""
    for name in ("dk", "dv"):
        a, enc = acts[name], encs[name]
        want = tuple(enc.shape)
        if a.ndim != len(want) or tuple(a.shape[:-2]) != want[:-2] \
                or a.shape[-1] != want[-1] or a.shape[-2] + n != want[-2]:
            raise ShapeError(f"{name}.shape={tuple(a.shape)} does not match the shape of "
                             f"the gradient it stands for {(*want[:-2], want[-2] - n, want[-1])}")
        lo, hi = _f64(enc.lower)[..., -n:, :], _f64(enc.upper)[..., -n:, :]
        fill = np.asarray(0.5 * lo + 0.5 * hi).astype(a.dtype)
        acts[name] = np.concatenate([a, fill], axis=-2)


def _compare_backward(
    dq: Any, dk: Any, dv: Any, query: Any, key: Any, value: Any, grad_output: Any, *,
    attn_mask: Any, is_causal: bool, scale: float | None, enable_gqa: bool,
    causal_alignment: str, masked_rows: str, dropout_p: float, dropout_mask: Any,
    d_attn_mask: Any, rule: str | None, accumulation_dtype: Any, safety: float | None,
    rtol: float | None, atol: float | None, ulps: float | None, factor: float | None,
    diagnose_bugs: bool, error_model: str, sink_keys: int, cap: float | None,
    extra_bugs: tuple[BackwardBugClass, ...] = (), params: dict[str, _Param] | None = None,
    floor_scale: float = 1.0,
) -> BackwardComparison:
    """compare_attention_backward of plain attention; ``sink_keys``: the last keys
    are lowered sinks (:func:`_with_sink_keys`); ``cap``: C·tanh(s/C) on the scaled
    scores before the mask (backward_model.py: the worst-case propagation), put there
    by the variant whose ``cap_keywords`` hook says how."""
    rule = _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=factor, safety=safety)

    acts = {"dq": _as_actual(dq), "dk": _as_actual(dk), "dv": _as_actual(dv)}
    if d_attn_mask is not None:
        acts["d_attn_mask"] = _as_actual(d_attn_mask)
    emodel = _model_bwd(list(acts.values()), accumulation_dtype, error_model)
    if floor_scale != 1.0:   # power-of-two units scaled up (units.py)
        emodel = replace(emodel, floor_scale=floor_scale)
    cap_kw = cap_keywords(cap)
    ref = reference_attention_backward(
        query, key, value, grad_output, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa, causal_alignment=causal_alignment, masked_rows=masked_rows,
        dropout_p=dropout_p, dropout_mask=dropout_mask, **cap_kw)
    encs = _reference_gradients(ref, acts, sink_keys)
    x = AttentionCall(
        _f64(_as_array(query, "query")), _f64(_as_array(key, "key")),
        _f64(_as_array(value, "value")), do=_f64(_as_array(grad_output, "grad_output")),
        attn_mask=_as_mask(attn_mask), is_causal=is_causal,
        scale=None if scale is None else float(scale), enable_gqa=enable_gqa,
        causal_alignment=causal_alignment, masked_rows=masked_rows, dropout_p=float(dropout_p),
        dropout_mask=None if dropout_mask is None else np.asarray(_as_array(dropout_mask,
                                                                            "dropout_mask")),
        opts=variant_options(**cap_kw) or VariantOptions())
    pb = plain_backward(x)
    shapes = {n: tuple(e.shape) for n, e in encs.items()}
    model, nats, shapes = _bounds(pb, emodel, shapes, acts, encs, params)
    kernel_dtype = max((a.dtype for a in acts.values()), key=lambda d: format_of(d).u)
    plain = None
    if rule == "flash":
        pd = plain_backward(x, dtype=kernel_dtype)
        plain = {"dq": pd.dq, "dk": pd.dk, "dv": pd.dv, "d_attn_mask": pd.d_mask}

    n_el = float(sum(np.prod(sh) for sh in shapes.values()))
    shown = emodel.with_events(*backward_events(pb, max(n_el, 1.0)))   # the report's λ
    rule_text = _rule_line(rule, shown, safety, rtol, atol, ulps, factor,
                           kernel=BACKWARD_KERNEL)
    titles = {n: f"{t} ({n})" for n, t in _GRADS}
    titles.update({p.keyword: f"{p.title} ({p.keyword})" for _, p in grad_params()})
    comps, warns, fits_truth = _judge_gradients(
        acts, encs, model, nats, shown, rule=rule, rule_text=rule_text, safety=safety,
        rtol=rtol, atol=atol, ulps=ulps, factor=factor, plain=plain, titles=titles,
        masked_nan=masked_rows == "nan")
    _refuse_vacuous(comps, shown)
    passed = all(c_.passed for c_ in comps.values())
    result = BackwardComparison(passed, rule_text, emodel.fmt.name, _acc_text(emodel), comps,
                                bounds=model, warnings=tuple(warns))
    saf = 1.0 if safety is None or rule != "model" else safety
    if passed or not diagnose_bugs or fits_truth:
        return result
    grads = {n: a for n, a in acts.items() if n not in (params or {})}
    found = diagnose_backward(grads, x, model=emodel, safety=saf, shapes=shapes,
                              extra=extra_bugs)
    return replace(result, diagnosis_run=True, diagnoses=found)


def _reference_gradients(ref: Any, acts: dict[str, np.ndarray], sink_keys: int
                         ) -> dict[str, Any]:
    """The reference Enclosures of the gradients the kernel returned (the lowered sink
    keys' rows of dk, dv filled in ``acts``), their shapes checked."""
    encs = {"dq": ref.dq, "dk": ref.dk, "dv": ref.dv}
    if "d_attn_mask" in acts:
        if ref.d_attn_mask is None:
            raise SpecError("d_attn_mask was given but attn_mask is not a float mask: only a "
                            "float mask has a gradient")
        encs["d_attn_mask"] = ref.d_attn_mask
    if sink_keys:
        _with_sink_keys(acts, encs, sink_keys)
    for name, a in acts.items():
        if tuple(a.shape) != tuple(encs[name].shape):
            raise ShapeError(f"{name}.shape={tuple(a.shape)} does not match the shape of the "
                             f"gradient it stands for {tuple(encs[name].shape)}")
    return encs


def _bounds(pb: PlainBackward, emodel: ErrorModel, shapes: dict[str, tuple[int, ...]],
            acts: dict[str, np.ndarray], encs: dict[str, Any], params: dict[str, _Param] | None
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, tuple[int, ...]]]:
    """(model bounds, natural scales, shapes) of every judged gradient; with variant
    parameters (added to ``acts`` and ``encs``) their bounds: sums of the mask
    gradient's per-element bounds (each holds on the check's event, so their sum bounds
    the sum's error), plus the kernel's own sum γ̃_n(u) Σ w|dS|; its elements count as
    events of the check."""
    if not params:
        return (backward_error_bound(pb, emodel, shapes=shapes),
                natural_scales(pb, shapes, emodel.eta), shapes)
    full = tuple(pb.p.shape)
    model = backward_error_bound(pb, emodel, shapes={**shapes, "d_attn_mask": full})
    nat_m, floor_m = natural_scales(pb, {"d_attn_mask": full}, emodel.eta)["d_attn_mask"]
    e_m = model.pop("d_attn_mask")
    ds_abs = np.abs(np.where(pb.allowed, pb.ds if pb.ds_pre is None else pb.ds_pre, 0.0))
    nats = natural_scales(pb, shapes, emodel.eta)
    for name, (a, enc, reduce) in params.items():
        n_terms = max(float(np.prod(full)) / max(float(np.prod(a.shape)), 1.0), 1.0)
        gam = emodel.gamma_sum(n_terms, format_of(a.dtype).u)
        model[name] = np.asarray(reduce(e_m) + gam * reduce(ds_abs), dtype=np.float64)
        nats[name] = (np.asarray(reduce(nat_m), dtype=np.float64),
                      np.full(a.shape, float(np.max(floor_m, initial=0.0)) * n_terms))
        acts[name], encs[name] = a, enc
    return model, nats, {**shapes, "d_attn_mask": full}


def _judge_gradients(
    acts: dict[str, np.ndarray], encs: dict[str, Any], bounds: dict[str, np.ndarray],
    nats: dict[str, tuple[np.ndarray, np.ndarray]] | None, model: ErrorModel, *, rule: str,
    rule_text: str, safety: float | None, rtol: float | None, atol: float | None,
    ulps: float | None, factor: float | None, plain: dict[str, Any] | None,
    titles: dict[str, str], masked_nan: bool = False,
) -> tuple[dict[str, AttentionComparison], list[str], bool]:
    """One verdict per gradient (the forward's, with its guards: a non-finite
    enclosure or bound raises ToleranceError; vacuous elements are not judged and are
    counted, :func:`_refuse_vacuous` decides); (verdicts, warnings, whether every
    gradient lies within the model's tolerance of the truth)."""
    comps: dict[str, AttentionComparison] = {}
    warns: list[str] = []
    fits_truth = True
    saf = 1.0 if safety is None or rule != "model" else safety
    for name, a in acts.items():
        enc = encs[name]
        f_a = format_of(a.dtype)
        m_a = replace(model, fmt=f_a)
        lower, upper = _f64(enc.lower), _f64(enc.upper)
        _check_enclosure(lower, upper, masked_nan)
        lower, upper = _refined(enc, lower, upper, bounds[name], rule, f_a, safety, rtol,
                                atol, ulps)
        mid = mid_of(lower, upper)
        bound, unbounded = _finite_part(bounds[name], rule)
        tol = _tolerance(rule, model=bound, mid=mid, fmt=f_a, rtol=rtol, atol=atol,
                         ulps=ulps, factor=factor, safety=safety,
                         plain=None if plain is None else plain[name])
        title = titles[name]
        if name in ("dq", "dk", "dv"):
            names = _index_names(a.ndim, "key" if name in ("dk", "dv") else "query")
        elif name in ("query", "key", "value", "input"):
            names = _index_names(a.ndim, "position")
        else:
            names = tuple(f"dim{i}" for i in range(a.ndim))
        vac = None if unbounded is None else np.broadcast_to(unbounded, a.shape)
        if nats is not None and name in nats and rule in ("model", "flash"):
            vac = np.broadcast_to(_vacuity(bound, nats[name]), a.shape) | (
                False if vac is None else vac)
        # "the exact one is not zero": certifiably so somewhere (its enclosure excludes
        # 0); an exact gradient of e^(−1e200), enclosed as [−1e-38, 1e-38], is zero to
        # every float and a zero gradient is then right (issue 30), not undetectable
        nonzero = np.isfinite(mid) & ((lower > 0) | (upper < 0))
        judged = np.ones(a.shape, bool) if vac is None else ~vac
        zero_passes = bool(np.any(nonzero & judged)
                           and _within(np.zeros_like(a), lower, upper, tol, judged))
        if zero_passes:
            warns.append(f"the {title} tolerance admits an all-zero gradient: this check cannot "
                         f"tell a missing gradient from the right one (dtype {f_a.name}, "
                         f"accumulation {model.acc.name})")
            if rule in ("model", "flash"):
                # the model's tolerance would pass a missing gradient: vacuous where the
                # exact gradient is certifiably non-zero (a zero is not wrong where it is
                # enclosed, and those elements stay judged: a wrong value there fails;
                # issue 30); a rule the caller chose, ulp or allclose, stays a warning
                vac = np.asarray(nonzero) | (False if vac is None else vac)
        comps[name] = _verdict(a, lower, upper, tol, vac, model=m_a, rule=rule_text,
                               index_names=names, title=title, raise_vacuous=False)
        fits_truth &= _within(a, lower, upper, saf * bounds[name])
    return comps, warns, fits_truth


def _finite_part(bound: np.ndarray, rule: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(the model bound with its non-finite elements set to 0, those elements): an
    element whose model bound left the float64 range (a score error so large that
    e^(score error) overflows) has no finite tolerance, so it is vacuous and not judged
    (counted; a passing check with it gives no verdict, :func:`_refuse_vacuous`); the
    others keep their finite bounds (issue 30).  Only for the rules built on the model
    ("model", "flash"); (bound, None) where every element is finite."""
    bound = np.asarray(bound, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(bound) & (bound >= 0))
    if rule not in ("model", "flash") or not np.any(bad):
        return bound, None
    return np.where(bad, 0.0, bound), bad


def _within(a: np.ndarray, lower: np.ndarray, upper: np.ndarray, tol: np.ndarray,
            where: np.ndarray | None = None) -> bool:
    """Every element (of ``where``) of ``a`` within ``tol`` of ``[lower, upper]``."""
    with np.errstate(invalid="ignore"):
        a64 = _f64(a)
        dist = np.maximum(np.maximum(a64 - upper, lower - a64), 0.0)
        ok = (np.isnan(lower) & np.isnan(a64)) | (dist <= tol)
    return bool(np.all(ok if where is None else ok | ~where))


def diagnose_backward(actual: dict[str, np.ndarray], x: AttentionCall, *, model: ErrorModel,
                      safety: float, shapes: dict[str, tuple[int, ...]],
                      extra: tuple[BackwardBugClass, ...] = ()) -> tuple[Diagnosis, ...]:
    """Backward bug classes (the catalogue and ``extra``, the attention variants'
    classes of a call) whose float64 gradients every actual gradient matches within
    the model tolerance of that variant, best match first."""
    found = []
    # the call's own variant classes first: on a tie (a window lowered to the only
    # bool mask: window_missing_in_backward = mask_missing_in_backward) the
    # variant's name is the one shown first
    for bug in extra + BACKWARD_BUG_CLASSES:
        try:
            if not bug.applies(x):
                continue
            pv = bug.variant(x)
            bound = backward_error_bound(pv, model, shapes=shapes)
            worst = 0.0
            ok = True
            for name, a in actual.items():
                val = {"dq": pv.dq, "dk": pv.dk, "dv": pv.dv, "d_attn_mask": pv.d_mask}[name]
                if val is None or val.shape != a.shape:
                    ok = False
                    break
                fit, ratio = _fits(_f64(a), val, safety * bound[name])
                ok &= fit
                worst = max(worst, ratio)
        except (ValueError, IndexError):
            continue
        if ok:
            found.append(Diagnosis(bug.name, bug.description, worst))
    return tuple(sorted(found, key=lambda d: d.ratio))


@asserting(compare_attention_backward)
def assert_attention_backward_close(dq: Any, dk: Any, dv: Any, query: Any, key: Any,
                                    value: Any, grad_output: Any, *, msg: Any = None,
                                    **options: Any) -> None:
    """Raise :class:`~mha_symbolic.errors.AttentionMismatchError` (an AssertionError)
    with a report unless :func:`compare_attention_backward` passes (its options;
    ``msg`` as :func:`mha_symbolic.assert_attention_close`'s).

    >>> import numpy as np
    >>> q = k = v = do = np.eye(2, dtype=np.float32)[None]
    >>> assert_attention_backward_close(np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 2),
    ...     np.float32), np.zeros((1, 2, 2), np.float32), q, k, v, do)
    Traceback (most recent call last):
    ...
    mha_symbolic.errors.AttentionMismatchError: FAIL [...] gradients: grad_query (dq) 4 / 4,...
    """
