"""Exact gradients of a worked example's attention: the backward pass of each head in
SymPy (Theorem 14: dV = Pᵀ dO, dP = dO Vᵀ, D = rowsum(P ∘ dP), dS = P ∘ (dP − D),
dQ = c·dS K, dK = c·dSᵀ Q).

``grad_output`` is the gradient of the loss with respect to the concatenated head
outputs (n_q × heads·d_v; for one head, its output): head h takes columns
h·d_v … (h+1)·d_v − 1.  The gradients of a head are with respect to that head's Q, K,
V (the matrices the scores are computed from) and its scaled scores (dS); with
grouped-query attention a key/value head's gradient is the sum of its query heads'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ShapeError, SpecError
from .engine import ExactAttention, exact_matrix

__all__ = ["HeadGradients", "exact_backward"]


@dataclass(frozen=True)
class HeadGradients:
    """Every intermediate of one head's backward pass, exactly (SymPy matrices)."""

    index: int
    grad_output: Any  # dO, n_q × d_v
    dp: Any           # dO Vᵀ, n_q × n_k
    d: Any            # D, n_q × 1
    ds: Any           # P ∘ (dP − D), the gradient of the scaled scores, n_q × n_k
    dq: Any           # c·dS K, n_q × d_k (None without queries)
    dk: Any           # c·dSᵀ Q, n_k × d_k (None without keys)
    dv: Any           # Pᵀ dO, n_k × d_v


def exact_backward(att: ExactAttention, grad_output: Any) -> tuple[HeadGradients, ...]:
    """The exact backward pass of every head of ``att`` against ``grad_output``.

    >>> from mha_symbolic import exact_attention
    >>> att = exact_attention(query=[[1, 0]], key=[[1, 0], [0, 1]], value=[[1], [3]], scale=0)
    >>> exact_backward(att, [[1]])[0].dv     # weights 1/2 each: dV = Pᵀ dO
    Matrix([
    [1/2],
    [1/2]])
    """
    import sympy as sp

    heads = att.heads
    if any(h.v is None for h in heads):
        raise SpecError("grad_output needs the values: the example gives scores only, so the "
                        "output (and its gradient) is not defined")
    d_v = heads[0].v.cols
    n_q = heads[0].weights.rows
    g = exact_matrix(grad_output, "grad_output")
    if (g.rows, g.cols) != (n_q, len(heads) * d_v):
        raise ShapeError(f"grad_output is {g.rows} × {g.cols}: expected {n_q} × "
                         f"{len(heads) * d_v} (n_q × heads·d_v, the concatenated head outputs)")
    c = att.scale
    out = []
    for h in heads:
        P = h.weights
        dO = g[:, h.index * d_v:(h.index + 1) * d_v]
        dP = dO * h.v.T
        D = sp.Matrix([[sp.Add(*[P[i, j] * dP[i, j] for j in range(P.cols)])]
                       for i in range(P.rows)])
        dS = sp.Matrix([[P[i, j] * (dP[i, j] - D[i, 0]) for j in range(P.cols)]
                        for i in range(P.rows)])
        dq = c * dS * h.k if h.k is not None else None
        dk = c * dS.T * h.q if h.q is not None else None
        out.append(HeadGradients(h.index, dO, dP, D, dS, dq, dk, P.T * dO))
    return tuple(out)
