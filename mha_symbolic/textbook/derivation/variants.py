"""The attention variants in a derivation: what the scaling step says and shows when
a worked example has a sliding window, a softcap, ALiBi or sinks (the mathematics
is :mod:`mha_symbolic.exact.variants`)."""

from __future__ import annotations

from typing import Any

from .matrices import _matrix_chain
from .numbers import _sub, _tex

__all__ = ["variant_note", "variant_rows", "variant_symbolic"]


def _side(w: int | None) -> str:
    return "unbounded" if w is None else str(w)


def variant_note(att: Any) -> str:
    """Sentences explaining each variant of the example (empty without variants)."""
    v = att.variants
    align = att.spec.causal_alignment
    where = "" if align == "top_left" else " (positions aligned bottom-right: $i + n_k - n_q$)"
    parts: list[str] = []
    if v.get("softcap") is not None:
        cap = _tex(v["softcap"])
        form = "\\tanh(s)" if v["softcap"] == 1 else f"{cap}\\tanh(s/{cap})"
        parts.append(f" The softcap ${cap}$ maps each scaled score $s$ to ${form}$"
                     " before the mask: scores stay inside $(-" + cap + ", " + cap + ")$, and "
                     "$\\tanh$ is increasing, so the order of the scores is kept.")
    if v.get("alibi_slopes") is not None:
        parts.append(" ALiBi adds $B_{rj} = -m\\,|j - r|$ (slope $m$ per head"
                     f"{where}): the farther key $j$ is from query $r$, the larger the penalty.")
    if v.get("window") is not None:
        left, right = v["window"]
        parts.append(f" The sliding window (left {_side(left)}, right {_side(right)}) keeps "
                     "keys $j$ with $r - \\text{left} \\le j \\le r + \\text{right}$"
                     f"{where}; the others get $-\\infty$ in $M$.")
    if v.get("sinks") is not None:
        parts.append(" The attention sink $\\sigma$ adds $e^{\\sigma}$ to every row's "
                     "softmax denominator and nothing to the numerators: each row's weights "
                     "sum to $1 - w_{r,\\text{sink}}$.")
    return "".join(parts)


def variant_symbolic(att: Any, i: str, base: str) -> str:
    """The formula of T_i: ``base`` (scale · S_i) with the softcap and ALiBi around it."""
    v = att.variants
    if v.get("softcap") is not None:
        cap = _tex(v["softcap"])
        base = (f"\\tanh\\left({base}\\right)" if v["softcap"] == 1 else
                f"{cap} \\tanh\\left(\\frac{{{base}}}{{{cap}}}\\right)")
    if v.get("alibi_slopes") is not None:
        base += f" + B_{{{i}}}"
    return base


def variant_rows(att: Any, head: Any) -> list[str]:
    """Display lines of the head's ALiBi bias (and sink logit), or none."""
    rows: list[str] = []
    i = _sub(head.index)
    if head.bias is not None:
        slope = att.variants["alibi_slopes"][head.index]
        rows += _matrix_chain(f"B_{{{i}}}", head.bias,
                              symbolic=f"-{_tex(slope)}\\,|j - r|" if slope != 0 else "0")
    if head.sink is not None:
        rows.append(f"\\sigma_{{{i}}} &= {_tex(head.sink)}")
    return rows
