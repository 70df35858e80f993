"""``layout=`` on the comparisons, and the diagnosis of a layout read as the other.

:func:`with_layout` wraps a ``compare(actual, query, key, value, **options)`` in the
"bhsd" layout (SDPA's (B, H, S, D)) into one that also takes ``layout="bshd"``
(FlashAttention's (B, S, H, D), :mod:`mha_symbolic.oracle.layout`): the arrays are
viewed in "bhsd", compared, and the findings' indices moved back, so a report names
(batch, query, head, feature) as the caller holds them.

A failing comparison is re-run in the other layout (everything, then the output
alone); when that re-run *passes*, the failure is diagnosed "layout (B, S, H, D) read
as (B, H, S, D)" (or the converse): the diagnosis is a certified pass of the other
reading under the same tolerance, never a guess from shapes.  A shape error whose
shapes are consistent once read in the other layout says so.

>>> import numpy as np
>>> swapped_index((0, 1, 2, 3))
(0, 2, 1, 3)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..oracle.layout import LAYOUTS, check_layout, swap_layout

__all__ = ["BSHD_NAMES", "swapped_comparison", "swapped_index", "with_layout"]

#: the index names of a 4-D output in the "bshd" layout
BSHD_NAMES = ("batch", "query", "head", "feature")

OTHER = {"bhsd": "bshd", "bshd": "bhsd"}


def swapped_index(idx: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """``idx`` with its positions -3 and -2 swapped (None stays None)."""
    if idx is None or len(idx) < 3:
        return idx
    j = list(idx)
    j[-3], j[-2] = j[-2], j[-3]
    return tuple(j)


def swapped_comparison(comp: Any) -> Any:
    """An AttentionComparison of a "bhsd" view moved to the "bshd" layout: its shape,
    index names, worst and greatest-error indices, first non-finite index and the
    per-element mismatch mask."""
    if len(comp.shape) < 3:
        return comp
    names = list(comp.index_names)
    names[-3], names[-2] = names[-2], names[-3]
    worst = comp.worst
    if worst is not None:
        worst = replace(worst, index=swapped_index(worst.index))
    mism = comp.mismatched
    if getattr(mism, "ndim", 0) >= 3:
        mism = np.ascontiguousarray(np.swapaxes(mism, -3, -2))
    return replace(comp, shape=swapped_index(tuple(comp.shape)), index_names=tuple(names),
                   worst=worst, max_error_index=swapped_index(comp.max_error_index),
                   first_nonfinite=swapped_index(comp.first_nonfinite), mismatched=mism)


def _in_layout(compare: Callable[..., Any], layout: str, actual: Any, query: Any, key: Any,
               value: Any, options: dict[str, Any], *, output: str | None = None) -> Any:
    """``compare`` with the four arrays read in ``layout`` (``output``: the output's own
    layout when it differs from the inputs')."""
    out_layout = layout if output is None else output
    comp = compare(swap_layout(actual, out_layout, "actual"), swap_layout(query, layout, "query"),
                   swap_layout(key, layout, "key"), swap_layout(value, layout, "value"),
                   **options)
    return swapped_comparison(comp) if layout == "bshd" else comp


def _shape_hint(layout: str, query: Any, key: Any, value: Any) -> str:
    """The hint of a shape error when the inputs' shapes agree read in the other layout
    (same batch, E, S of key and value, H_q a multiple of H_kv), else ''."""
    try:
        shapes = [tuple(np.shape(x)) if not hasattr(x, "shape") else tuple(x.shape)
                  for x in (query, key, value)]
    except Exception:  # an unusable input: the original error says why
        return ""
    if any(len(s) < 3 for s in shapes):
        return ""
    q, k, v = (list(s) for s in shapes)
    for s in (q, k, v):
        s[-3], s[-2] = s[-2], s[-3]
    ok = (q[:-3] == k[:-3] == v[:-3] and q[-1] == k[-1] and k[-3] == v[-3]
          and k[-2] == v[-2] and k[-3] > 0 and q[-3] % k[-3] == 0)
    if not ok:
        return ""
    other = OTHER[layout]
    return (f"; these shapes agree read as {LAYOUTS[other]}: pass layout={other!r} "
            f"if the arrays are in that layout")


def with_layout(diagnosis: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The decorator of a "bhsd" ``compare``: it handles ``layout=`` and the layout
    diagnosis (built by ``diagnosis(bug, description, ratio, kind)``)."""

    def wrap(compare: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(compare)
        def run(actual: Any, query: Any, key: Any, value: Any, *, layout: str = "bhsd",
                **options: Any) -> Any:
            __tracebackhide__ = True
            check_layout(layout)
            try:
                comp = _in_layout(compare, layout, actual, query, key, value, options)
            except ShapeError as exc:
                hint = _shape_hint(layout, query, key, value)
                if not hint:
                    raise
                raise ShapeError(f"{exc}{hint}") from None
            if comp.passed or not options.get("diagnose_bugs", True) or comp.dtype_problem:
                return comp
            found = _layout_diagnosis(compare, layout, actual, query, key, value, options)
            if found is None:
                return comp
            text, ratio = found
            d = diagnosis("layout", text, ratio, "layout")
            return replace(comp, diagnosis_run=True, diagnoses=(d, *comp.diagnoses))

        return run

    return wrap


def _layout_diagnosis(compare: Callable[..., Any], layout: str, actual: Any, query: Any,
                      key: Any, value: Any, options: dict[str, Any]
                      ) -> tuple[str, float] | None:
    """(description, ratio) when the other reading passes: everything in the other
    layout, or the output alone; else None."""
    other = OTHER[layout]
    quiet = {**options, "diagnose_bugs": False}
    tries = (("all", other, None), ("output", layout, other))
    shape = tuple(np.shape(actual)) if not hasattr(actual, "shape") else tuple(actual.shape)
    for what, lay, out in tries:
        if what == "output" and (len(shape) < 3 or shape[-3] != shape[-2]):
            continue   # the swapped output cannot have the reference's shape
        try:
            comp = _in_layout(compare, lay, actual, query, key, value, quiet, output=out)
        except Exception:  # the other reading is not even well-shaped: no diagnosis
            continue
        if not comp.passed:
            continue
        ratio = comp.worst.ratio if comp.worst is not None else 0.0
        if what == "all":
            text = (f"layout {LAYOUTS[other]} read as {LAYOUTS[layout]}: the inputs and the "
                    f"output pass when read as {LAYOUTS[other]}; pass layout={other!r}")
        else:
            text = (f"layout: the output is in {LAYOUTS[other]} but the inputs in "
                    f"{LAYOUTS[layout]}; the output passes once its axes -3 and -2 are "
                    "swapped (the kernel returned the other layout)")
        return text, ratio
    return None
