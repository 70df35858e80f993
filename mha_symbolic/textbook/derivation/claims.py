"""The text's claims beside the checker's verdicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import MhaSymbolicError
from .labels import quantity_label, verdict_text
from .matrices import _vec_tex
from .model import SHORT, ClaimLine
from .numbers import _tex_if_short, _tidy, shape_latex

# ---------------------------------------------------------------------------
# Claims (from the textbook checker) and the public entry point
# ---------------------------------------------------------------------------


def _claim_lines(example: Any, records: Sequence[Any]) -> tuple[ClaimLine, ...]:
    """One line per claim, in the example's order, from the checker's records.

    The certified digits and the verdict are the checker's, as it reports them; the
    exact value's LaTeX comes from ``record.exact_expr`` when the record carries it,
    else from the checker's own evaluation of the claim's quantity."""
    out = []
    claims = list(getattr(example, "claims", ()) or ())
    for k, rec in enumerate(records):
        expr = getattr(rec, "exact_expr", None)
        if expr is None and k < len(claims) and len(records) == len(claims):
            expr = _claim_value(example, claims[k])
        exact_latex: str | None = None
        if expr is not None:
            text = _exact_tex(expr)
            if text is not None and len(text) <= SHORT * 2:
                exact_latex = text
        head = int(getattr(rec, "head", 1) or 1)
        batch = int(getattr(rec, "batch", 1) or 1)
        raw = str(getattr(rec, "quantity", ""))
        quantity = raw + (f" (head {head})" if head != 1 else "")
        precision = str(getattr(rec, "precision", "") or "")
        error_units = getattr(rec, "error_units", None)
        wrong_digits = not getattr(rec, "ok", False) and getattr(rec, "rounded", None)
        verdict = verdict_text(str(getattr(rec, "verdict", "")), precision,
                               None if wrong_digits else error_units)
        if wrong_digits:
            verdict += f"; correct answer {rec.rounded}"
            if error_units:
                verdict += f", off by {error_units} in the last printed digit"
        out.append(ClaimLine(
            quantity=quantity,
            label=quantity_label(raw, head=head, batch=batch) or "",
            claimed=str(getattr(rec, "claimed", "")),
            exact_latex=exact_latex,
            exact_digits=str(getattr(rec, "exact", "") or ""),
            verdict=verdict,
            ok=bool(getattr(rec, "ok", False)),
            diagnosis=str(getattr(rec, "diagnosis", "") or ""),
            note=" ".join(str(getattr(rec, "note", "") or "").split()),
        ))
    return tuple(out)


def _claim_value(example: Any, claim: Any) -> Any:
    """The exact value of a claim's quantity, as the checker computes it (None if unknown)."""
    try:
        from ..quantities import quantity_value
    except ImportError:  # pragma: no cover - textbook without that helper
        return None
    if getattr(claim, "error", None) is not None:
        return None  # an unreadable claim has no value
    try:
        return quantity_value(example, claim)
    except MhaSymbolicError:
        return None


def _exact_tex(expr: Any) -> str | None:
    import sympy as sp

    from ...exact.shapes import Shape

    if isinstance(expr, Shape):
        return shape_latex(expr)
    if isinstance(expr, (int, sp.Basic)):
        return _tex_if_short(_tidy(expr) if isinstance(expr, sp.Basic) else expr, SHORT * 2)
    if isinstance(expr, (tuple, list)) and all(isinstance(e, (int, sp.Basic)) for e in expr):
        parts = [_tex_if_short(e, SHORT * 2) for e in expr]
        return None if any(p is None for p in parts) else _vec_tex(parts)  # type: ignore[arg-type]
    return None

