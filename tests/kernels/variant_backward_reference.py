"""Independent reference for the gradients of attention variants (no oracle code, no
backward formula): forward-mode differentiation in Arb, as tests/kernels/backward_reference.py.

Every differentiated input in turn carries a Taylor series x + ε (python-flint
``arb_series`` truncated at ε²); the forward pass is written out element by element
from the conventions as their sources state them — FP8 inputs times their descale
factor (FlashAttention-3's ``attention_ref``), the scaled score, the softcap
C·tanh(s/C) (FlashAttention, Gemma-2; tanh as 1 − 2/(e^{2x} + 1), the only series
function used besides exp), a relative-position bias table entry
table[clip(j − (i + off), −W, W) + W] (FlexAttention score_mod), the ALiBi bias
−slope·|j − (i + off)|, a float mask entry, the window and causal limits, the sink
logit σ joining the denominator only (gpt-oss) — and the ε-coefficient of
Σ grad_output ∘ output is the derivative.  Nothing here knows dS = P ∘ (dP − D),
sech² or the sink formula: the chain rule is done by the series arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from flint import arb, arb_series, ctx, fmpq


def _arb_of(x: float | Fraction) -> Any:
    fr = Fraction(x)
    return arb(fmpq(fr.numerator, fr.denominator))


@dataclass
class Problem:
    """One attention problem (2-D arrays) and its variant parameters."""

    q: np.ndarray                      # (L, E), as stored (fp8 values before descale)
    k: np.ndarray                      # (S, E)
    v: np.ndarray                      # (S, Ev)
    do: np.ndarray                     # (L, Ev)
    scale: Any = "rsqrt"               # a Fraction or "rsqrt" (1/sqrt(E))
    keep: np.ndarray | None = None     # (L, S) bool: window ∧ causal ∧ mask_mod
    cap: float | None = None
    table: np.ndarray | None = None    # (2W + 1,) entries of this head
    table_offset: int = 0
    slope: float | None = None
    slope_offset: int = 0
    madd: np.ndarray | None = None     # (L, S) float mask (-inf = masked)
    sink: float | None = None
    descale: tuple[float, float, float] = (1.0, 1.0, 1.0)
    params: dict[str, np.ndarray] = field(default_factory=dict)


def _scalar(p: Problem, which: tuple[str, tuple[int, ...]] | None, c: Any) -> Any:
    def entry(name: str, arr: np.ndarray, idx: tuple[int, ...]) -> Any:
        val = _arb_of(float(arr[idx]))
        if which is not None and which[0] == name and which[1] == idx:
            return arb_series([val, 1], prec=2)
        return arb_series([val], prec=2)

    L, E = p.q.shape
    S, Ev = p.v.shape
    dq_, dk_, dv_ = (_arb_of(d) for d in p.descale)
    total = arb_series([0], prec=2)
    for i in range(L):
        scores: dict[int, Any] = {}
        for j in range(S):
            if p.keep is not None and not p.keep[i, j]:
                continue
            if p.madd is not None and p.madd[i, j] == -np.inf:
                continue
            g = arb_series([0], prec=2)
            for e in range(E):
                g = g + entry("q", p.q, (i, e)) * dq_ * entry("k", p.k, (j, e)) * dk_
            s = g * c
            if p.cap is not None:
                cap = _arb_of(p.cap)
                x2 = (s / cap) * 2
                s = cap * (1 - 2 / (x2.exp() + 1))           # C·tanh(s/C)
            if p.table is not None:
                w = (len(p.table) - 1) // 2
                col = min(max(j - (i + p.table_offset), -w), w) + w
                s = s + entry("table", p.table, (col,))
            if p.slope is not None:
                s = s - entry("slope", np.array([p.slope]), (0,)) * abs(j - (i + p.slope_offset))
            if p.madd is not None:
                s = s + entry("m", p.madd, (i, j))
            scores[j] = s
        den = arb_series([0], prec=2)
        w_exp = {j: s.exp() for j, s in scores.items()}
        for wj in w_exp.values():
            den = den + wj
        if p.sink is not None:
            den = den + entry("sink", np.array([p.sink]), (0,)).exp()
        if not w_exp:
            continue
        for j, wj in w_exp.items():
            pij = wj / den
            for col in range(Ev):
                total = total + pij * entry("v", p.v, (j, col)) * dv_ * _arb_of(float(p.do[i, col]))
    return total


def forward_mode(p: Problem, wrt: tuple[str, ...] = ("q", "k", "v"), prec: int = 300
                 ) -> dict[str, np.ndarray]:
    """Arb balls of d/dx Σ dO∘out for every element x of the inputs named in ``wrt``:
    "q", "k", "v" (the stored inputs: descale factors included by the chain rule),
    "sink", "slope", "table", "m"."""
    old = ctx.prec
    ctx.prec = prec
    try:
        c = arb(p.q.shape[1]).rsqrt() if p.scale == "rsqrt" else _arb_of(p.scale)
        arrays = {"q": p.q, "k": p.k, "v": p.v, "table": p.table, "m": p.madd,
                  "sink": None if p.sink is None else np.array([p.sink]),
                  "slope": None if p.slope is None else np.array([p.slope])}
        out: dict[str, np.ndarray] = {}
        for name in wrt:
            arr = arrays[name]
            assert arr is not None, name
            res = np.empty(arr.shape, dtype=object)
            for idx in np.ndindex(*arr.shape):
                if name == "m" and arr[idx] == -np.inf:
                    res[idx] = arb(0)
                    continue
                val = _scalar(p, (name, idx), c)
                res[idx] = val.coeffs()[1] if len(val.coeffs()) > 1 else arb(0)
            out[name] = res
        return out
    finally:
        ctx.prec = old


def window_keep(L: int, S: int, window: tuple[int, int] | None, causal: bool,
                 off: int) -> np.ndarray:
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    d = j - (i + off)
    keep = np.ones((L, S), dtype=bool)
    if window is not None:
        keep &= (d >= -window[0]) & (d <= window[1])
    if causal:
        keep &= d <= 0
    return keep


def _heads(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, group: int,
           **kw: Any) -> list[tuple[int, int, Problem]]:
    """One reference problem per (batch, query head) (GQA: kv head h // group)."""
    out = []
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            out.append((b, h, Problem(q[b, h], k[b, h // group], v[b, h // group], do[b, h],
                                      **{key: (val(b, h) if callable(val) else val)
                                         for key, val in kw.items()})))
    return out


def reference_gradients(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray,
                        group: int = 1, params: tuple[str, ...] = (), **kw: Any
                        ) -> dict[str, np.ndarray]:
    """dq, dk, dv (object arrays of balls shaped like the inputs; dk, dv summed over the
    query heads of a GQA group, as autograd) and each parameter's derivative per
    (batch, head) (an object array (B, H) of the per-problem arrays)."""
    B, H = q.shape[:2]
    dq = np.empty(q.shape, dtype=object)
    dk = np.empty(k.shape, dtype=object)
    dv = np.empty(v.shape, dtype=object)
    for arr in (dk, dv):
        for idx in np.ndindex(*arr.shape):
            arr[idx] = arb(0)
    out: dict[str, np.ndarray] = {}
    for name in params:
        out[name] = np.empty((B, H), dtype=object)
    old = ctx.prec
    try:
        for b, h, prob in _heads(q, k, v, do, group, **kw):
            got = forward_mode(prob, ("q", "k", "v", *params))
            ctx.prec = 300   # the sums of balls too
            dq[b, h] = got["q"]
            for idx in np.ndindex(*got["k"].shape):
                dk[(b, h // group, *idx)] += got["k"][idx]
            for idx in np.ndindex(*got["v"].shape):
                dv[(b, h // group, *idx)] += got["v"][idx]
            for name in params:
                out[name][b, h] = got[name]
    finally:
        ctx.prec = old
    out.update(q=dq, k=dk, v=dv)
    return out
