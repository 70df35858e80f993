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
>>> from mha_symbolic.testing.compare import compare_attention
>>> rng = np.random.default_rng(0)
>>> q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
>>> s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k) / 2.0
>>> w = np.exp(s - s.max(-1, keepdims=True)); w /= w.sum(-1, keepdims=True)
>>> compare_attention((w @ v).astype(np.float32), q, k, v).passed
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .._display import ReportDisplay
from ..errors import PrecisionError, ShapeError, SpecError, ToleranceError
from ..oracle.inputs import as_exact_array
from ..oracle.progress import Progress
from .bugs import Candidate, diagnose
from .compare_report import _idx_text, _render, _summary, _table
from .emulated import dtype_level, hull_violations
from .levels import (
    DEFAULT_FLASH_FACTOR,
    dtype_factor,
    dtype_promise,
    precision_candidates,
    two_levels,
)
from .options import asserting, checked
from .plain import AttentionInputs, Plain, plain_in_dtype
from .tolerance import DEFAULT_SAFETY, ErrorModel, FloatFormat, error_model, ulp

__all__ = [
    "AttentionComparison",
    "Diagnosis",
    "ElementFinding",
    "assert_attention_close",
    "compare_attention",
]


def __getattr__(name: str) -> Any:
    """``compare_mha`` and ``assert_mha_close`` live in :mod:`.compare_mha` (which
    builds on this module); their old address keeps working."""
    if name in ("compare_mha", "assert_mha_close"):
        from . import compare_mha as _m

        return getattr(_m, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_RULES = ("model", "certified", "ulp", "allclose", "flash")
DEFAULT_ULPS = 4.0


# ------------------------------------------------------------------------------------
# Findings as data


@dataclass(frozen=True)
class ElementFinding:
    """One output element: where, the certified enclosure of the exact value, the
    actual value, and the error (distance from actual to the enclosure's midpoint)."""

    index: tuple[int, ...]
    exact_lower: float
    exact_upper: float
    actual: float
    error: float
    error_ulps: float
    tolerance: float

    @property
    def ratio(self) -> float:
        """error / tolerance (inf for a zero tolerance and a nonzero error)."""
        if self.error == 0:
            return 0.0
        return self.error / self.tolerance if self.tolerance > 0 else math.inf


@dataclass(frozen=True)
class Diagnosis:
    """A known bug class the actual output matches (checked: within tolerance of
    that buggy variant, while not within tolerance of the truth)."""

    bug: str
    description: str
    ratio: float  # max |actual - buggy| / tolerance of the buggy variant
    #: "fits": within tolerance of the bug's variant; "explains": a precision bug whose
    #: emulation is within half the actual's error of it; "size": one whose error has
    #: the actual's size (``ratio`` for both: actual error / the variant's);
    #: "dtype": the output's dtype is not the one promised
    kind: str = "fits"


@dataclass(frozen=True, repr=False)
class AttentionComparison(ReportDisplay):
    """Everything :func:`compare_attention` found; ``report()`` renders it, ``summary()``
    in one line (its ``repr``); notebooks show a table (``_repr_html_``)."""

    passed: bool
    rule: str
    shape: tuple[int, ...]
    dtype: str
    accumulation: str
    index_names: tuple[str, ...]
    n_elements: int
    n_mismatched: int
    n_nonfinite: int            # NaN/Inf where the exact value is finite
    first_nonfinite: tuple[int, ...] | None
    n_missing_nan: int          # finite where the exact answer is NaN (masked_rows="nan")
    worst: ElementFinding | None     # greatest error / tolerance among finite elements
    max_error: float
    max_error_index: tuple[int, ...] | None
    max_ulps: float
    diagnoses: tuple[Diagnosis, ...] = ()
    diagnosis_run: bool = False
    mismatched: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), repr=False)
    title: str = "attention output"
    n_vacuous: int = 0          # elements whose model tolerance is vacuous (not judged)
    notes: tuple[str, ...] = ()
    #: the output's dtype is not the one the inputs (or ``out_dtype=``) promise
    dtype_problem: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def report(self) -> str:
        """The report: for a failure the headline (``FAIL [bug class] …``, at most 60
        characters, what pytest's short summary shows), then the one-line :meth:`summary`
        and the details."""
        return _render(self)

    def summary(self) -> str:
        """One line: the verdict, the mismatched count, the worst element and the
        diagnosis (the report's first line when it passes, its second after the
        headline when it fails)."""
        return _summary(self)

    def table(self) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
        """(header, rows) of the notebook display: the findings, one per row."""
        return _table(self)


# ------------------------------------------------------------------------------------
# Inputs


def _as_array(x: Any, name: str) -> np.ndarray:
    """numpy view of an array-like (numpy, torch, jax, lists), keeping its dtype."""
    return np.asarray(as_exact_array(x, name))


def _as_mask(m: Any, name: str = "attn_mask") -> np.ndarray | None:
    if m is None:
        return None
    a = _as_array(m, name)
    return a if a.dtype == np.bool_ else np.asarray(a, dtype=np.float64)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _rule_options(
    rule: str | None, *, rtol: float | None, atol: float | None, ulps: float | None,
    factor: float | None, safety: float | None,
) -> str:
    """The rule the options ask for, checked: ``rule=None`` is ``"allclose"`` when
    ``rtol`` or ``atol`` is given (as in torch.testing, both then), else ``"model"``."""
    if rule is None:
        rule = "allclose" if rtol is not None or atol is not None else "model"
        if rule == "allclose" and (rtol is None or atol is None):
            raise SpecError(f"rtol={rtol!r}, atol={atol!r}: rtol and atol imply "
                            "rule='allclose' (|actual - exact| <= atol + rtol × |exact|), "
                            "which needs both; give both, or rule='ulp'/'model'")
    if rule not in _RULES:
        raise SpecError(f"rule={rule!r} is not a tolerance rule: expected one of {_RULES}")
    given = {"rtol": rtol, "atol": atol, "ulps": ulps, "factor": factor, "safety": safety}
    allowed = {"model": {"safety", "factor"}, "certified": {"safety"}, "ulp": {"ulps"},
               "allclose": {"rtol", "atol"}, "flash": {"factor"}}[rule]
    for key, val in given.items():
        if val is None:
            continue
        if key not in allowed:
            raise SpecError(f"{key}={val!r} does not apply to rule={rule!r} "
                            f"(it takes {', '.join(sorted(allowed))})")
        if isinstance(val, bool) or not (isinstance(val, (int, float)) and math.isfinite(val)
                                         and val >= 0):
            raise SpecError(f"{key}={val!r} must be a finite number >= 0")
    if rule == "allclose" and (rtol is None or atol is None):
        raise SpecError(f"rule='allclose' needs both rtol and atol (got rtol={rtol!r}, "
                        f"atol={atol!r})")
    return rule


def _as_actual(actual: Any) -> np.ndarray:
    """The actual output, refusing integer and bool arrays (an output must be floats)."""
    dt = str(getattr(actual, "dtype", ""))
    if "int" in dt or "bool" in dt:
        raise SpecError(f"actual.dtype={dt} is not a float format: expected float64, "
                        "float32, float16 or bfloat16")
    return _as_array(actual, "actual")


def _model(actual: np.ndarray, accumulation_dtype: Any, kernel: str,
           kind: str, subnormals: str = "keep", weights: Any = None) -> ErrorModel:
    """The error model of every check (forward, variants, gradients): the output's
    format, float32 accumulation for narrower outputs unless stated, the options."""
    try:
        fmt_ok = error_model(actual.dtype)
    except SpecError:
        raise SpecError(f"actual.dtype={actual.dtype} is not a float format: expected "
                        "float64, float32, float16, bfloat16, float8_e4m3fn or "
                        "float8_e5m2") from None
    del fmt_ok
    return error_model(actual.dtype, accumulation_dtype=accumulation_dtype, kernel=kernel,
                       kind=kind, subnormals=subnormals, weights=weights)


# ------------------------------------------------------------------------------------
# The core: one actual array against one enclosure, with one tolerance array


def _check_enclosure(lower: np.ndarray, upper: np.ndarray, nan_ok: bool) -> None:
    """An enclosure must be finite wherever the exact answer is not a NaN by policy."""
    with np.errstate(invalid="ignore"):
        policy_nan = np.isnan(lower) & np.isnan(upper) if nan_ok else np.zeros(lower.shape, bool)
        bad = ~(np.isfinite(lower) & np.isfinite(upper) & (lower <= upper)) & ~policy_nan
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ToleranceError(
            f"no verdict: the oracle's enclosure of the exact value is [{float(lower[idx])!r}, "
            f"{float(upper[idx])!r}] at index {idx} ({int(np.sum(bad))} element(s)) for finite "
            "inputs; an enclosure must be finite (please report this)")


def _verdict(
    actual: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    tol: np.ndarray,
    vacuous: np.ndarray | None,
    *,
    model: ErrorModel,
    rule: str,
    index_names: tuple[str, ...],
    title: str,
    notes: tuple[str, ...] = (),
    raise_vacuous: bool = True,
    hull: np.ndarray | None = None,
) -> AttentionComparison:
    """The findings for ``actual`` against ``[lower, upper]`` with tolerance ``tol``;
    elements flagged ``vacuous`` are not judged, and a passing comparison with any of
    them raises ToleranceError (unless ``raise_vacuous`` is false: the caller decides,
    as the gradients' check does over all its gradients)."""
    fmt = model.fmt
    if not np.all(np.isfinite(tol)) or np.any(tol < 0):
        idx = tuple(int(i) for i in np.argwhere(~(np.isfinite(tol) & (tol >= 0)))[0])
        raise ToleranceError(f"no verdict: the tolerance is {float(tol[idx])!r} at index {idx}; a "
                             "tolerance must be finite and >= 0 (please report this)")
    a = _f64(actual)
    mid = 0.5 * (lower + upper)
    exact_nan = np.isnan(lower) | np.isnan(upper)
    vac = np.zeros(a.shape, bool) if vacuous is None else np.asarray(vacuous, bool)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # certified lower bound of |actual - exact|: distance to the enclosure
        dist = np.maximum(np.maximum(a - upper, lower - a), 0.0)
        err = np.abs(a - mid)
        nonfinite = ~np.isfinite(a) & ~exact_nan
        missing_nan = exact_nan & ~np.isnan(a)
        finite = np.isfinite(a) & ~exact_nan
        judged = finite & ~vac
        bad = np.where(judged, dist > tol, False) | nonfinite | missing_nan
        if hull is not None:   # outside every convex combination of the values
            bad |= hull & finite
        # ulps are counted only where the exact value is at least the smallest normal:
        # below it the ulp is 2^(emin-p+1) and an error at an exact 0 reads 1e37 ulp (NaN)
        counted = finite & (np.abs(mid) >= math.ldexp(1.0, fmt.emin))
        ulps = np.where(counted, err / ulp(mid, fmt), np.where(finite, np.nan, 0.0))
        ratio = np.where(judged & (err > 0), err / np.where(tol > 0, tol, 0.0), 0.0)
        ratio = np.where(np.isnan(ratio), np.inf, ratio)
    worst = None
    max_err, max_idx, max_ulps = 0.0, None, 0.0
    if np.any(judged):
        flat = int(np.argmax(np.where(judged, ratio, -1.0)))
        idx = tuple(int(i) for i in np.unravel_index(flat, a.shape))
        worst = ElementFinding(idx, float(lower[idx]), float(upper[idx]), float(a[idx]),
                               float(err[idx]), float(ulps[idx]), float(tol[idx]))
    if np.any(finite):
        e_f = np.where(finite, err, -1.0)
        flat_e = int(np.argmax(e_f))
        max_idx = tuple(int(i) for i in np.unravel_index(flat_e, a.shape))
        max_err = float(e_f[max_idx])
        max_ulps = float(np.max(ulps[counted])) if np.any(counted) else math.nan
    first_nf = None
    if np.any(nonfinite):
        first_nf = tuple(int(i) for i in np.argwhere(nonfinite)[0])
    n_bad = int(np.sum(bad))
    n_vac = int(np.sum(finite & vac & ~bad))
    if hull is not None and np.any(hull & finite):
        n_hull = int(np.sum(hull & finite))
        notes = (*notes, f"{n_hull} element(s) lie outside the hull of their row's values "
                 "(an attention output is a convex combination of them): wrong whatever the "
                 "kernel's rounding")
    comp = AttentionComparison(
        passed=n_bad == 0, rule=rule, shape=tuple(a.shape), dtype=fmt.name,
        accumulation=_acc_text(model), index_names=index_names, n_elements=int(a.size),
        n_mismatched=n_bad, n_nonfinite=int(np.sum(nonfinite)), first_nonfinite=first_nf,
        n_missing_nan=int(np.sum(missing_nan)), worst=worst, max_error=max_err,
        max_error_index=max_idx, max_ulps=max_ulps, mismatched=bad, title=title,
        n_vacuous=n_vac, notes=notes,
    )
    if comp.passed and n_vac and raise_vacuous:
        idx = tuple(int(i) for i in np.argwhere(finite & vac & ~bad)[0])
        raise ToleranceError(
            f"no verdict: the {title} would pass, but for {n_vac} of {a.size} element(s) "
            f"(first at {_idx_text(idx, index_names)}) the tolerance of the "
            f"{model.describe()} with accumulation in {model.acc.name} is vacuous, and so "
            "is the error of correct kernels of that precision emulated on these inputs: a "
            "kernel of that kind can be wrong there by the whole size of the answer (its "
            "scores or sums overflow or lose every digit). The output is within its values' "
            "hull and has the expected NaN pattern; nothing else can be said without "
            "risking a false alarm. If the kernel accumulates in a wider format, say so "
            "with accumulation_dtype=")
    return comp


def _acc_text(model: ErrorModel) -> str:
    return model.acc.name + (" (default)" if model.accumulation_default else "")


def _rule_tolerance(
    rule: str, *, model_tol: np.ndarray, mid: np.ndarray, fmt: FloatFormat,
    rtol: float | None, atol: float | None, ulps: float | None, factor: float | None,
    safety: float | None, plain_err: float | None,
) -> np.ndarray:
    if rule in ("model", "certified"):
        return (DEFAULT_SAFETY if safety is None else safety) * model_tol
    if rule == "ulp":
        return (DEFAULT_ULPS if ulps is None else ulps) * ulp(mid, fmt)
    if rule == "allclose":
        assert rtol is not None and atol is not None
        return atol + rtol * np.abs(mid)
    # flash: factor × the error of a plain same-dtype implementation, never below the
    # model's tolerance for that dtype
    assert plain_err is not None
    f = DEFAULT_FLASH_FACTOR if factor is None else factor
    return np.maximum(f * plain_err, model_tol)


def _index_names(ndim: int, *, mha: bool = False) -> tuple[str, ...]:
    tail: tuple[str, ...]
    if mha:
        tail = ("query", "feature")
        lead = ndim - 2
        names = ("batch",) if lead == 1 else tuple(f"batch{i}" for i in range(lead))
        return names + tail
    tail = ("head", "query", "feature")[-min(ndim, 3):]
    lead = ndim - len(tail)
    names = ("batch",) if lead == 1 else tuple(f"batch{i}" for i in range(lead))
    return names + tail


def _check_shape(actual: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    if tuple(actual.shape) != tuple(shape):
        raise ShapeError(f"actual.shape={tuple(actual.shape)} does not match the {what} "
                         f"shape={tuple(shape)}")


# ------------------------------------------------------------------------------------
# Public API: scaled-dot-product attention


#: The tolerance model and the dtype level together, seconds per score on one core
#: (bench/bench_compare.py, issue 29): a bar is shown above ~2 s on a terminal.
SECONDS_PER_SCORE = 1.5e-7


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
    window: Any = None,
    softcap: float | None = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    mask_mod: Any = None,
    score_mod: Any = None,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
    weights_dtype: Any = None,
    out_dtype: Any = None,
) -> AttentionComparison:
    """Compare ``actual`` with the exact ``scaled_dot_product_attention(query, key,
    value, ...)``; the attention options are those of
    :func:`mha_symbolic.reference_attention`, the variants included (window, softcap,
    alibi_slopes, sinks, mask_mod, score_mod, FP8 descale: :mod:`.compare_variants`;
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
    """
    from ..oracle.variants import sdpa_variant_options

    variant = sdpa_variant_options(
        dropout_p, dropout_mask, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        sinks=sinks, mask_mod=mask_mod, score_mod=score_mod, q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale)
    fp8 = any("float8" in str(getattr(x, "dtype", "")) for x in (actual, query, key, value))
    promise = dtype_promise(actual, (query, key, value), out_dtype, fp8)
    if variant is not None or weights_dtype is not None or fp8:
        from ..oracle.variants import VariantOptions
        from .compare_variants import compare_variant_attention

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
    from ..oracle import reference_attention

    ref = reference_attention(
        query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa, causal_alignment=causal_alignment, masked_rows=masked_rows,
        dropout_p=dropout_p, dropout_mask=dropout_mask)
    _check_shape(a, tuple(ref.shape), "attention output")
    lower, upper = _f64(ref.lower), _f64(ref.upper)
    _check_enclosure(lower, upper, masked_rows == "nan")
    x = AttentionInputs(
        _f64(_as_array(query, "query")), _f64(_as_array(key, "key")),
        _f64(_as_array(value, "value")), attn_mask=_as_mask(attn_mask), is_causal=is_causal,
        scale=None if scale is None else float(scale), enable_gqa=enable_gqa,
        causal_alignment=causal_alignment, masked_rows=masked_rows,
        dropout_p=float(dropout_p or 0.0),
        dropout_mask=None if dropout_mask is None else _as_array(dropout_mask,
                                                                 "dropout_mask").astype(bool),
    )
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
    mid = 0.5 * (lower + upper)
    if level is not None:   # refine for the tighter of the two levels
        dtol, _, _ = level.tolerance(mid, dtype_factor(rule, factor))
        lower, upper = _refined(ref, lower, upper, np.minimum(model_tol, dtol), "model",
                                model.fmt, None, None, None, None)
    else:
        lower, upper = _refined(ref, lower, upper, model_tol, rule, model.fmt, safety, rtol,
                                atol, ulps)
    mid = 0.5 * (lower + upper)
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
                    notes=tuple(notes), hull=hull)
    if two is not None and not comp.passed:
        comp = replace(comp, notes=(*comp.notes, two.levels_note(a, lower, upper)))
    comp = _kept_promise(promise, comp)
    if comp.passed or not diagnose_bugs:
        return comp
    saf = DEFAULT_SAFETY if safety is None or rule != "model" else safety
    found: tuple[Candidate, ...] = ()
    if not _within(a, lower, upper, saf * model_tol):
        found = diagnose(a, x, model=model, safety=saf)
    diags = [Diagnosis(c.name, c.description, c.ratio) for c in found]
    if two is not None:
        diags += [Diagnosis(n, d, r, "explains" if ex else "size") for n, d, r, ex
                  in precision_candidates(a, x, mid, model, query, key, value, two.dtype_tol)]
    return _with_diagnoses(comp, comp.diagnoses + tuple(diags))


def _plain_error(x: AttentionInputs, dtype: Any, lower: np.ndarray,
                 upper: np.ndarray) -> tuple[float, str]:
    """max |plain − exact| of the simulated same-dtype plain kernel (0 where it
    overflows, which the report says)."""
    run = plain_in_dtype(x, dtype)
    mid = 0.5 * (lower + upper)
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


def _refined(ref: Any, lower: np.ndarray, upper: np.ndarray, model: np.ndarray, rule: str,
             fmt: FloatFormat, safety: float | None, rtol: float | None, atol: float | None,
             ulps: float | None) -> tuple[np.ndarray, np.ndarray]:
    """A tighter certified enclosure where the oracle's fast one is too wide for the
    verdict (typically float64 outputs: the fast enclosure is ~1e-11 relative).

    ``ref.rounded("float64")`` is the correctly rounded double r of the exact value,
    so the exact value lies strictly between r's two neighbours: intersecting
    ``[nextafter(r, -inf), nextafter(r, +inf)]`` with ``[lower, upper]`` keeps a
    certified enclosure, of width at most 2 ulp(float64)."""
    mid = 0.5 * (lower + upper)
    tol = _rule_tolerance(rule, model_tol=model, mid=mid, fmt=fmt, rtol=rtol, atol=atol, ulps=ulps,
                     factor=None, safety=safety, plain_err=None) if rule != "flash" else (
        model)
    with np.errstate(invalid="ignore"):
        need = np.isfinite(upper - lower) & (upper - lower > 0.01 * tol)
    if not np.any(need):
        return lower, upper
    try:
        r = _f64(ref.rounded("float64"))
    except PrecisionError:  # an exact tie the oracle could not settle: keep the coarse one
        return lower, upper
    ok = np.isfinite(r)
    lo2 = np.where(ok, np.maximum(lower, np.nextafter(r, -np.inf)), lower)
    hi2 = np.where(ok, np.minimum(upper, np.nextafter(r, np.inf)), upper)
    return lo2, hi2


def _within(a: np.ndarray, lower: np.ndarray, upper: np.ndarray, tol: np.ndarray) -> bool:
    with np.errstate(invalid="ignore"):
        dist = np.maximum(np.maximum(_f64(a) - upper, lower - _f64(a)), 0.0)
        both_nan = np.isnan(lower) & np.isnan(a)
        ok = both_nan | (dist <= tol)
    return bool(np.all(ok))


def _with_diagnoses(comp: AttentionComparison,
                    found: tuple[Candidate, ...] | tuple[Diagnosis, ...]) -> AttentionComparison:
    diags = tuple(c if isinstance(c, Diagnosis) else Diagnosis(c.name, c.description, c.ratio)
                  for c in found)
    return replace(comp, diagnosis_run=True, diagnoses=diags)


def _rule_line(rule: str, model: ErrorModel, safety: float | None, rtol: float | None,
               atol: float | None, ulps: float | None, factor: float | None,
               kernel: str | None = None) -> str:
    """The tolerance line of a report (``kernel``: how to name a kernel that is not one
    of the forward's KERNELS, as the gradients' model)."""
    if rule in ("model", "certified"):
        return (f"{model.describe(kernel)} × "
                f"{DEFAULT_SAFETY if safety is None else safety:g}")
    if rule == "ulp":
        return f"{DEFAULT_ULPS if ulps is None else ulps:g} ulp of the exact value"
    if rule == "allclose":
        return f"atol={atol:g} + rtol={rtol:g} × |exact|"
    return (f"{DEFAULT_FLASH_FACTOR if factor is None else factor:g} × the error of a "
            f"plain same-dtype implementation, at least the {model.describe(kernel)}")


# ------------------------------------------------------------------------------------
# The tolerance of a rule from a whole tolerance array (the variants' and the
# gradients' checks, whose model arrays are computed whole)


def _tolerance(rule: str, *, model: np.ndarray, mid: np.ndarray, fmt: FloatFormat,
               rtol: float | None, atol: float | None, ulps: float | None,
               factor: float | None, safety: float | None,
               plain: np.ndarray | None) -> np.ndarray:
    """:func:`_rule_tolerance` with the flash rule's plain run given as an array."""
    plain_err = None
    if rule == "flash":
        assert plain is not None
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(plain) & np.isfinite(mid)
            plain_err = float(np.max(np.abs(plain - mid)[ok])) if np.any(ok) else 0.0
    return _rule_tolerance(rule, model_tol=model, mid=mid, fmt=fmt, rtol=rtol, atol=atol,
                           ulps=ulps, factor=factor, safety=safety, plain_err=plain_err)


def _kept_promise(problem: str, comp: AttentionComparison) -> AttentionComparison:
    if not problem:
        return comp
    d = Diagnosis("output_dtype", problem, 0.0, "dtype")
    return replace(comp, passed=False, dtype_problem=problem, diagnosis_run=True,
                   diagnoses=(d, *comp.diagnoses))
