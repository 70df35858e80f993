"""Judge a kernel's gradients against the exact ones: :func:`compare_attention_backward`
and :func:`assert_attention_backward_close`, with reports in the style of the
forward's (:mod:`.compare`): which gradient failed, its worst element against the
certified enclosure of the exact value, and the backward bug class it matches.

The tolerance of ``rule="model"`` is the rounding-error model of the backward pass
(:mod:`.backward_model`): FlashAttention-2's algorithm (and the autograd
formulation) in the gradients' dtype, accumulating in float32 for fp16/bf16 unless
``accumulation_dtype`` says otherwise ("same": the dtype itself), combined by the
probabilistic model of Higham & Mary (false-alarm probability at most 1e-9 per check)
or, with ``error_model="worst"``, the worst case.  Never infinite, never NaN: an
element whose bound is not finite is an error, not a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AttentionMismatchError, ShapeError, SpecError
from .backward_model import ERROR_MODELS, backward_error_bound
from .bugs import _fits
from .bugs_backward import (
    BACKWARD_BUG_CLASSES,
    BackwardInputs,
    plain_backward,
)
from .compare import (
    AttentionComparison,
    Diagnosis,
    _as_actual,
    _as_array,
    _as_mask,
    _f64,
    _formats,
    _judge,
    _refined,
    _rule_options,
    _rule_text,
    _tolerance,
)
from .tolerance import FORMATS, FloatFormat, format_of

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


@dataclass(frozen=True)
class BackwardComparison:
    """Everything :func:`compare_attention_backward` found: one
    :class:`~mha_symbolic.testing.compare.AttentionComparison` per gradient
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

    def __bool__(self) -> bool:
        return self.passed

    def report(self) -> str:
        return _render_backward(self)

    def __str__(self) -> str:
        return self.report()


def _render_backward(c: BackwardComparison) -> str:
    verdict = "are close to" if c.passed else "are not close to"
    lines = [f"attention gradients {verdict} the exact gradients."]
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
        body = comp.report().splitlines()[1:]   # the first line repeats the verdict
        lines.extend("  " + ln for ln in body if not ln.startswith("Diagnosis"))
    for d in c.diagnoses:
        lines.append(f"Diagnosis: matches backward bug class '{d.bug}' — {d.description} "
                     f"(every gradient within {d.ratio:.2g} × tolerance of that variant; "
                     "not within tolerance of the exact gradients)")
    if c.diagnosis_run and not c.diagnoses:
        lines.append("Diagnosis: no known backward bug class matches.")
    return "\n".join(lines)


def _index_names(ndim: int, rows: str) -> tuple[str, ...]:
    tail = ("head", rows, "feature")[-min(ndim, 3):]
    lead = ndim - len(tail)
    names = ("batch",) if lead == 1 else tuple(f"batch{i}" for i in range(lead))
    return names + tail


def _formats_bwd(arrays: list[np.ndarray], accumulation_dtype: Any) -> tuple[FloatFormat, FloatFormat]:
    """(the kernel's dtype: the least precise gradient's, the accumulation dtype):
    float32 for fp16/bf16 by default, ``"same"`` for the dtype itself."""
    kernel = max(arrays, key=lambda a: _formats(a, None)[0].u)
    same = accumulation_dtype is None or (isinstance(accumulation_dtype, str)
                                          and accumulation_dtype == "same")
    fmt, acc = _formats(kernel, None if same else accumulation_dtype)
    if accumulation_dtype is None and fmt.name in ("float16", "bfloat16"):
        acc = FORMATS["float32"]
    return fmt, acc


def compare_attention_backward(
    dq: Any, dk: Any, dv: Any,
    query: Any, key: Any, value: Any, grad_output: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left", masked_rows: str = "zero",
    dropout_p: float = 0.0, dropout_mask: Any = None, d_attn_mask: Any = None,
    rule: str = "model", accumulation_dtype: Any = None, safety: float | None = None,
    rtol: float | None = None, atol: float | None = None, ulps: float | None = None,
    factor: float | None = None, diagnose_bugs: bool = True,
    error_model: str = "probabilistic",
) -> BackwardComparison:
    """Compare a kernel's gradients ``dq, dk, dv`` (and ``d_attn_mask`` for a float
    mask, optional) with the exact gradients of attention(query, key, value) against
    ``grad_output`` (:func:`mha_symbolic.reference_attention_backward`, same options).

    ``rule``: "model" (default; the backward error model above in the gradients' dtype,
    accumulation float32 for fp16/bf16 unless ``accumulation_dtype`` says otherwise,
    "same" for a kernel that accumulates in its own dtype), "ulp", "allclose" (``rtol``
    and ``atol``), "flash" (``factor`` × the error of a simulated plain same-dtype
    backward, FlashAttention's tests).  Returns a :class:`BackwardComparison` (truthy
    when every gradient passes); never raises for a mismatch.

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
    _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=factor, safety=safety)
    if error_model not in ERROR_MODELS:
        raise SpecError(f"error_model={error_model!r}: expected one of {ERROR_MODELS}")
    from ..oracle.backward import reference_attention_backward

    acts = {"dq": _as_actual(dq), "dk": _as_actual(dk), "dv": _as_actual(dv)}
    if d_attn_mask is not None:
        acts["d_attn_mask"] = _as_actual(d_attn_mask)
    fmt, acc = _formats_bwd(list(acts.values()), accumulation_dtype)
    ref = reference_attention_backward(
        query, key, value, grad_output, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa, causal_alignment=causal_alignment, masked_rows=masked_rows,
        dropout_p=dropout_p, dropout_mask=dropout_mask)
    encs = {"dq": ref.dq, "dk": ref.dk, "dv": ref.dv}
    if "d_attn_mask" in acts:
        if ref.d_attn_mask is None:
            raise SpecError("d_attn_mask was given but attn_mask is not a float mask: only a "
                            "float mask has a gradient")
        encs["d_attn_mask"] = ref.d_attn_mask
    for name, a in acts.items():
        if tuple(a.shape) != tuple(encs[name].shape):
            raise ShapeError(f"{name}.shape={tuple(a.shape)} does not match the shape of the "
                             f"gradient it stands for {tuple(encs[name].shape)}")
    x = BackwardInputs(
        _f64(_as_array(query, "query")), _f64(_as_array(key, "key")),
        _f64(_as_array(value, "value")), _f64(_as_array(grad_output, "grad_output")),
        attn_mask=_as_mask(attn_mask), is_causal=is_causal,
        scale=None if scale is None else float(scale), enable_gqa=enable_gqa,
        causal_alignment=causal_alignment, masked_rows=masked_rows, dropout_p=float(dropout_p),
        dropout_mask=None if dropout_mask is None else np.asarray(_as_array(dropout_mask,
                                                                            "dropout_mask")))
    pb = plain_backward(x)
    shapes = {n: tuple(e.shape) for n, e in encs.items()}
    model = backward_error_bound(pb, fmt, acc, shapes=shapes, model=error_model)
    for name, bound in model.items():
        if not np.all(np.isfinite(bound)):
            raise ArithmeticError(f"internal error: the {name} tolerance is not finite; "
                                  "please report this case")
    kernel_dtype = max((a.dtype for a in acts.values()), key=lambda d: format_of(d).u)
    plain = None
    if rule == "flash":
        pd = plain_backward(x, dtype=kernel_dtype)
        plain = {"dq": pd.dq, "dk": pd.dk, "dv": pd.dv, "d_attn_mask": pd.d_mask}
    rule_text = _rule_text(rule, safety, rtol, atol, ulps, factor)
    comps: dict[str, AttentionComparison] = {}
    warns: list[str] = []
    fits_truth = True
    saf = 1.0 if safety is None or rule != "model" else safety
    for name, title in _GRADS:
        if name not in acts:
            continue
        a, enc = acts[name], encs[name]
        f_a = format_of(a.dtype)
        lower, upper = _f64(enc.lower), _f64(enc.upper)
        lower, upper = _refined(enc, lower, upper, model[name], rule, f_a, safety, rtol, atol,
                                ulps)
        mid = 0.5 * (lower + upper)
        tol = _tolerance(rule, model=model[name], mid=mid, fmt=f_a, rtol=rtol, atol=atol,
                         ulps=ulps, factor=factor, safety=safety,
                         plain=None if plain is None else plain[name])
        rows = "key" if name in ("dk", "dv") else "query"
        names = _index_names(a.ndim, rows) if name != "d_attn_mask" else tuple(
            f"dim{i}" for i in range(a.ndim))
        comp, _ = _judge(a, lower, upper, tol, fmt=f_a, acc=acc, rule=rule_text,
                         index_names=names, title=f"{title} ({name})")
        comps[name] = comp
        fits_truth &= _within(a, lower, upper, saf * model[name])
        if np.any(np.isfinite(mid) & (mid != 0)) and _within(np.zeros_like(a), lower, upper, tol):
            warns.append(f"the {title} tolerance admits an all-zero gradient: this check cannot "
                         f"tell a missing {title} from the right one (dtype {f_a.name}, "
                         f"accumulation {acc.name})")
    passed = all(c_.passed for c_ in comps.values())
    result = BackwardComparison(passed, rule_text, fmt.name, acc.name, comps, bounds=model,
                                warnings=tuple(warns))
    if passed or not diagnose_bugs or fits_truth:
        return result
    found = diagnose_backward(acts, x, fmt=fmt, acc=acc, safety=saf, shapes=shapes,
                              error_model=error_model)
    from dataclasses import replace

    return replace(result, diagnosis_run=True, diagnoses=found)


def _within(a: np.ndarray, lower: np.ndarray, upper: np.ndarray, tol: np.ndarray) -> bool:
    with np.errstate(invalid="ignore"):
        a64 = _f64(a)
        dist = np.maximum(np.maximum(a64 - upper, lower - a64), 0.0)
        ok = (np.isnan(lower) & np.isnan(a64)) | (dist <= tol)
    return bool(np.all(ok))


def diagnose_backward(actual: dict[str, np.ndarray], x: BackwardInputs, *, fmt: FloatFormat,
                      acc: FloatFormat, safety: float, shapes: dict[str, tuple[int, ...]],
                      error_model: str = "probabilistic") -> tuple[Diagnosis, ...]:
    """Backward bug classes whose float64 gradients every actual gradient matches
    within the model tolerance of that variant, best match first."""
    found = []
    for bug in BACKWARD_BUG_CLASSES:
        try:
            if not bug.applies(x):
                continue
            pv = bug.variant(x)
            bound = backward_error_bound(pv, fmt, acc, shapes=shapes, model=error_model)
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


def assert_attention_backward_close(dq: Any, dk: Any, dv: Any, query: Any, key: Any,
                                    value: Any, grad_output: Any, **options: Any) -> None:
    """Raise :class:`~mha_symbolic.errors.AttentionMismatchError` (an AssertionError)
    with a report unless :func:`compare_attention_backward` passes.

    >>> import numpy as np
    >>> q = k = v = do = np.eye(2, dtype=np.float32)[None]
    >>> assert_attention_backward_close(np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 2),
    ...     np.float32), np.zeros((1, 2, 2), np.float32), q, k, v, do)
    Traceback (most recent call last):
    ...
    mha_symbolic.errors.AttentionMismatchError: attention gradients are not close to the exact gradients...
    """
    __tracebackhide__ = True
    comp = compare_attention_backward(dq, dk, dv, query, key, value, grad_output, **options)
    if not comp.passed:
        exc = AttentionMismatchError(comp.report())
        exc.comparison = comp  # type: ignore[attr-defined]
        raise exc from None
