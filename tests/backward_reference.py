"""Independent references for the gradient tests (no oracle code, no backward formula).

``forward_mode_gradients`` differentiates Σ grad_output ∘ attention by *forward-mode*
automatic differentiation in Arb: every input element in turn carries a Taylor series
x + ε (python-flint ``arb_series`` truncated at ε²), the forward pass is written out
element by element (scores, exp, sums, division), and the ε-coefficient of the scalar
is the derivative.  Nothing here knows dS = P ∘ (dP − D): it is the chain rule done by
the series arithmetic, so it checks the backward formulas, not restates them.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from flint import arb, arb_series, ctx, fmpq


def _arb_of(x: float | Fraction) -> Any:
    fr = Fraction(x)
    return arb(fmpq(fr.numerator, fr.denominator))


def _scalar(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, keep: np.ndarray,
            madd: np.ndarray | None, scale: Any, drop: np.ndarray | None, f: Fraction,
            which: tuple[str, tuple[int, ...]] | None, policy: str) -> Any:
    """Σ dO ∘ out for one problem (2-D arrays), with ``which`` input element perturbed."""

    def entry(name: str, arr: np.ndarray, idx: tuple[int, ...]) -> Any:
        val = _arb_of(float(arr[idx]))
        if which is not None and which[0] == name and which[1] == idx:
            return arb_series([val, 1], prec=2)
        return arb_series([val], prec=2)

    L, E = q.shape
    S, Ev = v.shape
    total = arb_series([0], prec=2)
    for i in range(L):
        idx = [j for j in range(S) if keep[i, j]]
        if not idx:
            if policy == "uniform" and S:
                w = {j: arb_series([1], prec=2) for j in range(S)}
            else:
                continue
        else:
            w = {}
            for j in idx:
                g = arb_series([0], prec=2)
                for l in range(E):
                    g = g + entry("q", q, (i, l)) * entry("k", k, (j, l))
                s = g * scale
                if madd is not None:
                    s = s + entry("m", madd, (i, j))
                w[j] = s.exp()
        z = arb_series([0], prec=2)
        for wj in w.values():
            z = z + wj
        for j, wj in w.items():
            p = wj / z
            if drop is not None:
                if not drop[i, j]:
                    continue
                p = p * _arb_of(f)
            for l in range(Ev):
                total = total + p * entry("v", v, (j, l)) * _arb_of(float(do[i, l]))
    return total


def forward_mode_gradients(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray,
                           keep: np.ndarray, madd: np.ndarray | None, scale: Any,
                           drop: np.ndarray | None = None, f: Fraction = Fraction(1),
                           policy: str = "zero", prec: int = 300) -> dict[str, np.ndarray]:
    """Arb balls of d/dx Σ dO∘out for every element x of q, k, v (and madd) of one
    problem: q (L,E), k (S,E), v (S,Ev), do (L,Ev), keep (L,S) bool, madd (L,S) or None,
    ``scale``: a Fraction or the string "rsqrt" for 1/sqrt(E)."""
    old = ctx.prec
    ctx.prec = prec
    try:
        c = arb(q.shape[1]).rsqrt() if scale == "rsqrt" else _arb_of(scale)
        out: dict[str, np.ndarray] = {}
        names = [("q", q), ("k", k), ("v", v)] + ([("m", madd)] if madd is not None else [])
        for name, arr in names:
            res = np.empty(arr.shape, dtype=object)
            for idx in np.ndindex(*arr.shape):
                val = _scalar(q, k, v, do, keep, madd, c, drop, f, (name, idx), policy)
                res[idx] = val.coeffs()[1] if len(val.coeffs()) > 1 else arb(0)
            out[name] = res
        return out
    finally:
        ctx.prec = old
