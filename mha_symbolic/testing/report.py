"""The reports of :mod:`.compare`: the one-line summary (the first line of every
report and of the assert functions' error, what pytest's short summary shows), the
text report (metadata first, then counts, the worst element and the diagnosis) and
the notebook table of an :class:`~mha_symbolic.testing.forward.compare.AttentionComparison`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .verdict import AttentionComparison

__all__: list[str] = []


def _idx_text(idx: tuple[int, ...], names: tuple[str, ...]) -> str:
    if len(names) != len(idx):
        return str(idx)
    return "(" + ", ".join(f"{n}={i}" for n, i in zip(names, idx, strict=True)) + ")"


#: The longest headline: pytest's short summary line is cut at the terminal's width,
#: and ``FAILED path::test - `` takes its first 25-40 columns.
HEADLINE_WIDTH = 60


def headline(bugs: list[str] | None, what: str, detail: str) -> str:
    """The first line of a failure: the verdict and the bug class lead, then what failed.

    ``bugs``: the matching bug classes; ``[]`` when the diagnosis ran and none matched;
    None when it did not run.

    >>> headline(["no_scale"], "attention output", "40 / 64 off")
    'FAIL [no_scale] attention output: 40 / 64 off'
    >>> headline([], "dq", "3 / 12 off")
    'FAIL [no known bug] dq: 3 / 12 off'
    """
    tag = ", ".join(bugs) if bugs else ("no known bug" if bugs is not None
                                        else "undiagnosed")
    text = f"FAIL [{tag}] {what}: {detail}"
    return text if len(text) <= HEADLINE_WIDTH else text[:HEADLINE_WIDTH - 1] + "…"


def _bugs(c: Any) -> list[str] | None:
    return [d.bug for d in c.diagnoses] if c.diagnosis_run or c.diagnoses else None


def _headline(c: AttentionComparison) -> str:
    lse = getattr(c, "lse", None)
    if lse is not None and not lse.passed and c.n_mismatched == 0 and not c.n_nonfinite:
        return _headline(lse)
    detail = f"{c.n_mismatched} / {c.n_elements} off"
    if c.n_nonfinite:
        detail += f", {c.n_nonfinite} NaN/Inf"
    return headline(_bugs(c), c.title, detail)


def _ulps_text(value: float, dtype: str) -> str:
    """An ulp count, or why there is none (exact values below the smallest normal)."""
    if math.isnan(value):
        return "not counted (the exact value is below the smallest normal)"
    return f"{value:.4g} ulp({dtype})"


def _summary(c: AttentionComparison) -> str:
    """``<title> is [not] close to the exact answer: <counts>, worst <where>; <bug>``."""
    head = f"{c.title} {'is close to' if c.passed else 'is not close to'} the exact answer"
    parts: list[str] = []
    if not c.passed:
        parts.append(f"{c.n_mismatched} / {c.n_elements} elements mismatched")
        if c.n_nonfinite:
            parts.append(f"{c.n_nonfinite} NaN/Inf where the exact value is finite")
        if c.n_missing_nan:
            parts.append(f"{c.n_missing_nan} finite where NaN is expected")
    else:
        parts.append(f"{c.n_elements} elements")
    w = c.worst
    if w is not None:
        word = "worst" if not c.passed else "closest call"
        parts.append(f"{word} {w.ratio:.3g} × tolerance at {_idx_text(w.index, c.index_names)}: "
                     f"{w.actual!r} vs exact ≈ {0.5 * w.exact_lower + 0.5 * w.exact_upper:.6g}")
    text = f"{head}: " + ", ".join(parts)
    if c.diagnoses:
        text += f"; matches bug class {', '.join(repr(d.bug) for d in c.diagnoses)}"
    return text


def _table(c: AttentionComparison) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    """The findings as rows (finding, value), for the notebook display."""
    pct = 100.0 * c.n_mismatched / c.n_elements if c.n_elements else 0.0
    rows = [("verdict", "passed" if c.passed else "FAILED"),
            ("shape, dtype", f"{c.shape}, {c.dtype}"),
            ("accumulation", c.accumulation), ("tolerance", c.rule),
            ("mismatched elements", f"{c.n_mismatched} / {c.n_elements} ({pct:.1f}%)")]
    if getattr(c, "pattern", ""):
        rows.append(("pattern", c.pattern))
    if c.n_nonfinite:
        rows.append(("NaN/Inf where the exact value is finite", str(c.n_nonfinite)))
    if c.n_missing_nan:
        rows.append(("finite where NaN is expected", str(c.n_missing_nan)))
    if c.n_vacuous:
        rows.append(("not judged (vacuous tolerance)", str(c.n_vacuous)))
    w = c.worst
    if w is not None:
        rows.append(("worst element" if not c.passed else "closest call",
                     _idx_text(w.index, c.index_names)))
        rows.append(("exact value", f"{w.exact_lower!r} (exact)" if w.exact_lower ==
                     w.exact_upper else f"in [{w.exact_lower!r}, {w.exact_upper!r}]"))
        rows.append(("actual value", repr(w.actual)))
        ulps = "" if math.isnan(w.error_ulps) else f" = {w.error_ulps:.4g} ulp"
        rows.append(("error", f"{w.error:.4g}{ulps} = {w.ratio:.4g} × "
                              f"tolerance ({w.tolerance:.4g})"))
    rows += [("diagnosis", f"{d.bug}: {d.description}") for d in c.diagnoses]
    if c.diagnosis_run and not c.diagnoses:
        rows.append(("diagnosis", "no known bug class matches"))
    rows += [("note", n) for n in c.notes]
    return ("finding", "value"), rows


def _render(c: AttentionComparison) -> str:
    """The failure report: metadata first, then counts, the worst element, diagnosis."""
    lines: list[str] = ([] if c.passed else [_headline(c)]) + [_summary(c)]
    lines.append(f"  shape: {c.shape}, dtype: {c.dtype}, accumulation: {c.accumulation}")
    lines.append(f"  tolerance: {c.rule}")
    if c.n_nonfinite:
        where = _idx_text(c.first_nonfinite or (), c.index_names)
        lines.append(f"Non-finite: {c.n_nonfinite} element(s) are NaN/Inf where the exact "
                     f"value is finite, first at {where}")
    for note in c.notes:
        lines.append(f"Note: {note}")
    if c.n_vacuous:
        lines.append(f"Not judged: {c.n_vacuous} element(s) whose model tolerance is vacuous "
                     "(a kernel of that kind may be wrong there by the whole answer)")
    if c.n_missing_nan:
        lines.append(f"Expected NaN (fully masked rows, masked_rows='nan'): "
                     f"{c.n_missing_nan} element(s) are finite instead")
    pct = 100.0 * c.n_mismatched / c.n_elements if c.n_elements else 0.0
    lines.append(f"Mismatched elements: {c.n_mismatched} / {c.n_elements} ({pct:.1f}%)")
    if getattr(c, "pattern", ""):
        lines.append(f"Pattern: {c.pattern}")
    w = c.worst
    if w is not None:
        label = "Worst element" if not c.passed else "Closest call"
        lines.append(f"{label} (greatest error / tolerance) at index "
                     f"{_idx_text(w.index, c.index_names)}:")
        if w.exact_lower == w.exact_upper:
            lines.append(f"  exact value:  {w.exact_lower!r} (exact)")
        else:
            lines.append(f"  exact value:  in [{w.exact_lower!r}, {w.exact_upper!r}] "
                         "(certified enclosure)")
        lines.append(f"  actual value: {w.actual!r}")
        ulps = ("" if math.isnan(w.error_ulps) else f" = {w.error_ulps:.4g} ulp({c.dtype})")
        lines.append(f"  error:        {w.error:.4g}{ulps} = "
                     f"{w.ratio:.4g} × tolerance ({w.tolerance:.4g})")
        if c.max_error_index is not None and c.max_error_index != w.index:
            lines.append(f"Greatest absolute error: {c.max_error:.4g} at index "
                         f"{_idx_text(c.max_error_index, c.index_names)}")
        lines.append(f"Greatest error in ulps: {_ulps_text(c.max_ulps, c.dtype)}")
    for d in c.diagnoses:
        lines.append(_diagnosis_line(d))
    if c.diagnosis_run and not c.diagnoses:
        lines.append("Diagnosis: no known bug class matches.")
    lse = getattr(c, "lse", None)
    if lse is not None:
        lines += ["", *lse.report().splitlines()[(0 if lse.passed else 1):-1]]
    lines.append("(errors are distances to the midpoint of the certified enclosure, "
                 "shown to 4 digits; a mismatch is declared only when the distance to "
                 "the whole enclosure exceeds the tolerance)")
    return "\n".join(lines)


def _diagnosis_line(d: Any) -> str:
    """One diagnosis, saying what was checked for it."""
    kind = getattr(d, "kind", "fits")
    if kind in ("dtype", "layout"):
        return f"Diagnosis: '{d.bug}' — {d.description}"
    if kind == "explains":
        return (f"Diagnosis: explained by bug class '{d.bug}' — {d.description} (its "
                "emulation on these inputs is within half the output's error of it)")
    if kind == "size":
        return (f"Diagnosis: consistent with bug class '{d.bug}' — {d.description} (the "
                "emulated bug is not this kernel's rounding, so only its size is compared)")
    return (f"Diagnosis: matches bug class '{d.bug}' — {d.description} "
            f"(within {d.ratio:.2g} × tolerance of that variant; "
            "not within tolerance of the exact answer)")
