"""The verdict engine behind every ``compare_*``/``assert_*``: result types
(:class:`AttentionComparison`, :class:`Diagnosis`, :class:`ElementFinding`), the rules
and their tolerances, the guards (no verdict on an internal inf or NaN, no vacuous
tolerance), refinement of the enclosure where a verdict needs it, and the verdict
itself (:func:`_verdict`).  The doors are :mod:`.forward.compare`,
:mod:`.forward.variants`, :mod:`.forward.mha`, :mod:`.backward.compare` and
:mod:`.backward.mha`; the rendering is :mod:`.report`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .._display import ReportDisplay
from ..errors import PrecisionError, ShapeError, SpecError, ToleranceError
from ..oracle.inputs import as_exact_array
from .forward.bugs import Candidate
from .forward.levels import (
    DEFAULT_FLASH_FACTOR,
)
from .forward.model_jit import kernels
from .pattern import describe_pattern
from .report import _idx_text, _render, _summary, _table
from .tolerance import DEFAULT_SAFETY, ErrorModel, FloatFormat, error_model, ulp

__all__ = ["AttentionComparison", "Diagnosis", "ElementFinding"]


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
    #: where the failing elements lie (:mod:`.pattern`); '' when it passed
    pattern: str = ""
    #: the kernel's softmax_lse judged (``compare_attention(..., lse=)``, :mod:`.lse`)
    lse: Any = None

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


#: Why an enclosure or a tolerance is not finite for finite inputs (issue 30).  Values
#: and output gradients near the float64 maximum are handled (the value hull, exact
#: power-of-two units: oracle/shifted.py, testing/backward/compare.py); what is left
#: is scores (q·k) so large that the error model's bound of the weights' error, e^(the
#: score error) - 1, leaves float64: the backward with queries of 1e300.  Not a wrong
#: verdict: no verdict.
_BEYOND_RANGE = ("the bounds left the float64 range: the error model cannot bound a kernel's "
                 "error for scores this large (q·k beyond about 1e280: the weights' error bound "
                 "e^(score error) overflows); inputs near the float64 maximum in V or dO are "
                 "handled, scores are not")


def mid_of(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """The midpoint of ``[lower, upper]`` without overflow (issue 30): ``0.5 (l + u)``
    overflows for bounds near the float64 maximum, where ``0.5 l + 0.5 u`` does not (it
    may round a subnormal half, so the result is clipped back into the interval; an
    infinite end gives that end)."""
    with np.errstate(invalid="ignore", over="ignore"):
        mid = 0.5 * (lower + upper)
        far = ~np.isfinite(mid) & np.isfinite(lower) & np.isfinite(upper)
        if np.any(far):
            mid = np.where(far, 0.5 * lower + 0.5 * upper, mid)
        return np.where(lower == upper, lower, np.minimum(np.maximum(mid, lower), upper))


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
            f"inputs: {_BEYOND_RANGE}")


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
    mid: np.ndarray | None = None,
) -> AttentionComparison:
    """The findings for ``actual`` against ``[lower, upper]`` with tolerance ``tol``;
    elements flagged ``vacuous`` are not judged, and a passing comparison with any of
    them raises ToleranceError (unless ``raise_vacuous`` is false: the caller decides,
    as the gradients' check does over all its gradients).  ``mid``: ``mid_of(lower,
    upper)`` when the caller has it already."""
    fmt = model.fmt
    if not np.all(np.isfinite(tol)) or np.any(tol < 0):
        idx = tuple(int(i) for i in np.argwhere(~(np.isfinite(tol) & (tol >= 0)))[0])
        raise ToleranceError(f"no verdict: the tolerance is {float(tol[idx])!r} at index {idx}: "
                             f"{_BEYOND_RANGE}")
    a = _f64(actual)
    if mid is None:
        mid = mid_of(lower, upper)
    vac = np.zeros(a.shape, bool) if vacuous is None else np.asarray(vacuous, bool)
    el = _elements_fused(a, lower, upper, tol, vac, hull, mid, fmt)
    if el is None:
        el = _elements(a, lower, upper, tol, vac, hull, mid, fmt)
    bad, n_bad, n_vac, n_nf, n_miss, n_hull, first_nf, worst, max_err, max_idx, max_ulps = el
    if n_bad and not model.flush:
        notes = (*notes, *_flush_note(a, mid, bad, model))
    if n_hull:
        notes = (*notes, f"{n_hull} element(s) lie outside the hull of their row's values "
                 "(an attention output is a convex combination of them): wrong whatever the "
                 "kernel's rounding")
    comp = AttentionComparison(
        passed=n_bad == 0, rule=rule, shape=tuple(a.shape), dtype=fmt.name,
        accumulation=_acc_text(model), index_names=index_names, n_elements=int(a.size),
        n_mismatched=n_bad, n_nonfinite=n_nf, first_nonfinite=first_nf,
        n_missing_nan=n_miss, worst=worst, max_error=max_err,
        max_error_index=max_idx, max_ulps=max_ulps, mismatched=bad, title=title,
        n_vacuous=n_vac, notes=notes, pattern=describe_pattern(bad, index_names) if n_bad else "",
    )
    if comp.passed and n_vac and raise_vacuous:
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(a) & ~(np.isnan(lower) | np.isnan(upper))
        idx = tuple(int(i) for i in np.argwhere(finite & vac & ~bad)[0])
        raise _vacuous_error(title, n_vac, a.size, _idx_text(idx, index_names), model)
    return comp


_Elements = tuple[np.ndarray, int, int, int, int, int, tuple[int, ...] | None,
                  "ElementFinding | None", float, tuple[int, ...] | None, float]


def _elements(a: np.ndarray, lower: np.ndarray, upper: np.ndarray, tol: np.ndarray,
              vac: np.ndarray, hull: np.ndarray | None, mid: np.ndarray,
              fmt: FloatFormat) -> _Elements:
    """The element-wise findings of :func:`_verdict`: (bad, the counts of bad, vacuous
    not bad, non-finite, missing NaN and outside-the-hull elements, the first
    non-finite index, the worst judged element, the largest error, its index, the
    largest ulp count)."""
    exact_nan = np.isnan(lower) | np.isnan(upper)
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
    worst, max_err, max_idx, max_ulps = _extremes(a, lower, upper, tol, err, ulps, ratio,
                                                  judged, finite, counted)
    first_nf = None
    if np.any(nonfinite):
        first_nf = tuple(int(i) for i in np.argwhere(nonfinite)[0])
    n_hull = 0 if hull is None else int(np.sum(hull & finite))
    return (bad, int(np.sum(bad)), int(np.sum(finite & vac & ~bad)), int(np.sum(nonfinite)),
            int(np.sum(missing_nan)), n_hull, first_nf, worst, max_err, max_idx, max_ulps)


def _elements_fused(a: np.ndarray, lower: np.ndarray, upper: np.ndarray, tol: np.ndarray,
                    vac: np.ndarray, hull: np.ndarray | None, mid: np.ndarray,
                    fmt: FloatFormat) -> _Elements | None:
    """:func:`_elements` in one compiled pass (forward/model_jit.py: the same
    definitions, maxima and first-index argmaxima); None without numba or for arrays
    that are not all float64 (bool) C-contiguous of ``a``'s shape."""
    arrs = (a, lower, upper, tol, mid, vac) + (() if hull is None else (hull,))
    kern = kernels() if a.size else None
    if kern is None or any(x.shape != a.shape or not x.flags.c_contiguous for x in arrs) or any(
            x.dtype != np.float64 for x in arrs[:5]) or vac.dtype != bool or (
            hull is not None and hull.dtype != bool):
        return None
    bad = np.empty(a.shape, bool)
    counts, where_, vals = np.empty(5, np.int64), np.empty(3, np.int64), np.empty(1)
    kern.verdict_pass(*(x.reshape(-1) for x in arrs[:6]),
                      vac.reshape(-1) if hull is None else hull.reshape(-1), hull is not None,
                      math.ldexp(1.0, fmt.emin), math.ldexp(1.0, 1 - fmt.p),
                      bad.reshape(-1), counts, where_, vals)

    def at(i: int) -> tuple[int, ...] | None:
        return None if i < 0 else tuple(int(j) for j in np.unravel_index(i, a.shape))

    first_nf, w_idx, e_idx = at(int(where_[0])), at(int(where_[1])), at(int(where_[2]))
    worst = None
    if w_idx is not None:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            e = float(np.abs(a[w_idx] - mid[w_idx]))
            m = mid[w_idx]
            u = e / float(ulp(m, fmt)) if abs(m) >= math.ldexp(1.0, fmt.emin) else math.nan
        worst = ElementFinding(w_idx, float(lower[w_idx]), float(upper[w_idx]),
                               float(a[w_idx]), e, u, float(tol[w_idx]))
    max_err = 0.0 if e_idx is None else float(np.abs(a[e_idx] - mid[e_idx]))
    max_ulps = float(vals[0]) if e_idx is not None else 0.0
    return (bad, int(counts[0]), int(counts[1]), int(counts[2]), int(counts[3]),
            int(counts[4]), first_nf, worst, max_err, e_idx, max_ulps)


def _vacuous_error(title: str, n_vac: int, size: int, where: str, model: ErrorModel
                   ) -> ToleranceError:
    return ToleranceError(
        f"no verdict: the {title} would pass, but for {n_vac} of {size} element(s) "
        f"(first at {where}) the tolerance of the "
        f"{model.describe()} with accumulation in {model.acc.name} is vacuous, and so "
        "is the error of correct kernels of that precision emulated on these inputs: a "
        "kernel of that kind can be wrong there by the whole size of the answer (its "
        "scores or sums overflow or lose every digit). The output is within its values' "
        "hull and has the expected NaN pattern; nothing else can be said without "
        "risking a false alarm. If the kernel accumulates in a wider format, say so "
        "with accumulation_dtype=")



def _flush_note(a: np.ndarray, mid: np.ndarray, bad: np.ndarray,
                model: ErrorModel) -> tuple[str, ...]:
    """A hint when every mismatched element is an exact value below the smallest normal
    of the accumulation format returned as zero: the pattern of a kernel that flushes
    subnormal results (FTZ/DAZ), which ``subnormals="flush"`` models."""
    tiny = math.ldexp(1.0, model.acc.emin)
    with np.errstate(invalid="ignore"):
        flushed = (a == 0) & (np.abs(mid) < tiny) & (mid != 0)
    if not np.all(flushed[bad]):
        return ()
    return (f"every mismatched element is an exact value below {tiny:.3g} (the smallest "
            f"normal of {model.acc.name}) returned as 0: the kernel flushes subnormal "
            "results to zero (FTZ/DAZ: XLA on CPU, fast-math CUDA, torch's bfloat16 SDPA on "
            "some CPUs); if that is its behaviour, say so with subnormals=\"flush\"",)


def _extremes(a: np.ndarray, lower: np.ndarray, upper: np.ndarray, tol: np.ndarray,
              err: np.ndarray, ulps: np.ndarray, ratio: np.ndarray, judged: np.ndarray,
              finite: np.ndarray, counted: np.ndarray
              ) -> tuple[ElementFinding | None, float, tuple[int, ...] | None, float]:
    """The worst judged element (largest error over tolerance), and the largest error
    over the finite elements with its index and the largest ulp count."""
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
    return worst, max_err, max_idx, max_ulps


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


def _refined(ref: Any, lower: np.ndarray, upper: np.ndarray, model: np.ndarray, rule: str,
             fmt: FloatFormat, safety: float | None, rtol: float | None, atol: float | None,
             ulps: float | None, mid: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """A tighter certified enclosure where the oracle's fast one is too wide for the
    verdict (typically float64 outputs: the fast enclosure is ~1e-11 relative).

    ``ref.rounded("float64")`` is the correctly rounded double r of the exact value,
    so the exact value lies strictly between r's two neighbours: intersecting
    ``[nextafter(r, -inf), nextafter(r, +inf)]`` with ``[lower, upper]`` keeps a
    certified enclosure, of width at most 2 ulp(float64).  ``mid``: ``mid_of(lower,
    upper)`` when the caller has it already."""
    if mid is None:
        mid = mid_of(lower, upper)
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


