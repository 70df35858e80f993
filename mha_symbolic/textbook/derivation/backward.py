"""The backward pass of an attention example (Theorem 14 of the proofs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .matrices import _matrix_chain
from .model import Display, Step
from .numbers import _sub, _tex


def _backward_steps(grads: Sequence[Any], scale: Any) -> list[Step]:
    """The backward pass of every head against the example's grad_output (Theorem 14)."""
    steps: list[Step] = []
    many = len(grads) > 1
    each = " (each head)" if many else ""
    rows: list[str] = []
    for g in grads:
        i = _sub(g.index)
        rows += _matrix_chain(f"dO_{{{i}}}", g.grad_output)
    steps.append(Step(
        "The gradient of the output" + each,
        "the example states $dO = \\partial L/\\partial O$, how the loss changes with each "
        "entry of the attention output; the backward pass carries it back to the inputs "
        "(Theorem 14 proves each formula below for every size).", (Display(tuple(rows)),)))
    rows = []
    for g in grads:
        i = _sub(g.index)
        rows += _matrix_chain(f"dV_{{{i}}}", g.dv, symbolic=f"A_{{{i}}}^{{\\top}} dO_{{{i}}}")
    steps.append(Step(
        "Values: $dV = A^{\\top} dO$" + each,
        "value $j$ reached output row $r$ with weight $A_{rj}$, so its gradient collects "
        "$A_{rj}\\, dO_r$ from every query row $r$.", (Display(tuple(rows)),)))
    rows = []
    for g in grads:
        i = _sub(g.index)
        rows += _matrix_chain(f"dP_{{{i}}}", g.dp, symbolic=f"dO_{{{i}}} V_{{{i}}}^{{\\top}}")
        rows += _matrix_chain(f"D_{{{i}}}", g.d,
                              symbolic=f"\\operatorname{{rowsum}}(A_{{{i}}} \\circ dP_{{{i}}})")
        rows += _matrix_chain(f"dS_{{{i}}}", g.ds,
                              symbolic=f"A_{{{i}}} \\circ (dP_{{{i}}} - D_{{{i}}})")
    steps.append(Step(
        "Scores: $dS = A \\circ (dP - D)$" + each,
        "$dP_{rj} = dO_r \\cdot v_j$ is how the loss would change if weight $A_{rj}$ alone "
        "moved; the softmax's Jacobian $\\operatorname{diag}(a) - aa^{\\top}$ turns it into the "
        "score gradient $A_{rj}(dP_{rj} - D_r)$ with $D_r = \\sum_j A_{rj} dP_{rj}$, so each "
        "row of $dS$ sums to $0$.", (Display(tuple(rows)),)))
    if grads[0].dq is not None:
        rows = []
        c = _tex(scale)
        for g in grads:
            i = _sub(g.index)
            rows += _matrix_chain(f"dQ_{{{i}}}", g.dq, symbolic=f"{c}\\, dS_{{{i}}} K_{{{i}}}")
            if g.dk is not None:
                rows += _matrix_chain(f"dK_{{{i}}}", g.dk,
                                      symbolic=f"{c}\\, dS_{{{i}}}^{{\\top}} Q_{{{i}}}")
        steps.append(Step(
            "Queries and keys: $dQ = c\\, dS\\, K$, $dK = c\\, dS^{\\top} Q$" + each,
            f"each scaled score is $c\\, q_r \\cdot k_j$ with $c = {c}$, so by the chain rule "
            "query $r$ collects $c\\, dS_{rj} k_j$ and key $j$ collects $c\\, dS_{rj} q_r$.",
            (Display(tuple(rows)),)))
    return steps

