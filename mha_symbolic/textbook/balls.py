"""Attention in Arb ball arithmetic, from a worked example's inputs (some of them balls).

The exact engine builds SymPy expressions; this evaluates the same computation with
python-flint ``arb`` balls, so that an input may stand for a whole interval (interval
evaluation: every output ball contains the output for every choice of the inputs in
their balls).  It follows ``exact_attention``'s conventions exactly — projections
``x W + b``, heads side by side, GQA by ``g // group``, scale ``1/sqrt(d_k)`` unless
given, a softcap ``cap·tanh(s/cap)`` of the scaled scores (before the masks),
boolean/causal masks (``AttentionSpec.takes_part``), additive masks, ``mask_fill``
replacing the scaled (or raw) score, fully masked rows zero — and is used by
:mod:`.intervals` to judge claims against inputs printed rounded, and by
:mod:`.alternative_screen` to skip alternatives that cannot fit.

The softmax is evaluated as e^(t_j − c) / Σ_k e^(t_k − c) with c the row's largest
midpoint (any c gives the same value; this one keeps the balls tight).

>>> from flint import arb
>>> att = ball_attention({"scores": [[0, 0]], "scale": 1}, {("scores", (0, 0)): arb(0, 1)})
>>> att.weights[0][0][0].contains(arb("0.5")), att.weights[0][0][0].contains(arb("0.73"))
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BallAttention", "ball_attention"]


@dataclass
class BallAttention:
    """Per head (lists of rows of balls): q, k, v, scores, scaled, weights, outputs; and
    concat, output."""

    q: list[Any]
    k: list[Any]
    v: list[Any]
    scores: list[Any]
    scaled: list[Any]
    weights: list[Any]
    outputs: list[Any]
    concat: Any
    output: Any


def _matrix(value: Any, key: str, env: dict[tuple[str, tuple[int, ...]], Any]) -> list[list[Any]]:
    """A 2-D input as rows of balls; entries in ``env`` (by key and index path) replace
    the exact ones."""
    from ..exact.certified import to_arb
    from ..exact.engine import exact_number

    rows = value if value and isinstance(value[0], list) else [value]
    flat = not (value and isinstance(value[0], list))

    def ball(i: int, j: int, e: Any) -> Any:
        path = (j,) if flat else (i, j)
        if (key, path) in env:
            return env[(key, path)]
        return to_arb(exact_number(e, key), 128)

    return [[ball(i, j, e) for j, e in enumerate(row)] for i, row in enumerate(rows)]


def _mul(a: list[list[Any]], b: list[list[Any]]) -> list[list[Any]]:
    from flint import arb

    return [[sum((a[i][t] * b[t][j] for t in range(len(b))), arb(0)) for j in range(len(b[0]))]
            for i in range(len(a))]


def _add_bias(m: list[list[Any]], b: list[list[Any]] | None) -> list[list[Any]]:
    if b is None:
        return m
    return [[x + b[0][j] for j, x in enumerate(row)] for row in m]


def _cols(m: list[list[Any]], a: int, b: int) -> list[list[Any]]:
    return [row[a:b] for row in m]


def ball_attention(kwargs: dict[str, Any], env: dict[tuple[str, tuple[int, ...]], Any]
                   ) -> BallAttention:
    """Evaluate attention in Arb from ``exact_attention`` keyword arguments."""
    from flint import arb

    from ..exact.certified import to_arb
    from ..exact.engine import exact_number
    from ..exact.spec import AttentionSpec

    heads = int(kwargs.get("heads", 1))
    kv = int(kwargs.get("kv_heads") or heads)
    group = heads // kv

    def m(key: str) -> list[list[Any]] | None:
        return _matrix(kwargs[key], key, env) if kwargs.get(key) is not None else None

    q = k = v = None
    if kwargs.get("x") is not None:
        x = m("x")
        assert x is not None
        xkv = m("x_kv") or x
        q = _add_bias(_mul(x, m("w_q") or []), m("b_q"))
        k = _add_bias(_mul(xkv, m("w_k") or []), m("b_k"))
        v = _add_bias(_mul(xkv, m("w_v") or []), m("b_v"))
    else:
        q, k, v = m("query"), m("key"), m("value")
    d_k = kwargs.get("d_k")
    if q is not None and k is not None:
        width = len(q[0]) // heads
        d_k = width
        qh = [_cols(q, i * width, (i + 1) * width) for i in range(heads)]
        kh = [_cols(k, g * width, (g + 1) * width) for g in range(kv)]
        scores = [_mul(qh[i], [list(c) for c in zip(*kh[i // group], strict=True)])
                  for i in range(heads)]
    else:
        raw = kwargs["scores"] if heads > 1 else [kwargs["scores"]]
        qh, kh = [], []
        scores = [_matrix(s, "scores", {(("scores"), p[1:] if heads > 1 else p): b
                                        for (key, p), b in env.items()
                                        if key == "scores" and (heads == 1 or p[0] == i)})
                  for i, s in enumerate(raw)]
    vh = None
    if v is not None:
        dv = len(v[0]) // kv
        vh = [_cols(v, g * dv, (g + 1) * dv) for g in range(kv)]
    n_q, n_k = len(scores[0]), len(scores[0][0])
    scale_given = kwargs.get("scale")
    if scale_given is not None:
        scale = to_arb(exact_number(scale_given, "scale"), 128)
    elif d_k is not None and q is not None:
        scale = arb(d_k).rsqrt()
    elif d_k is not None:
        scale = arb(int(d_k)).rsqrt()
    else:
        scale = arb(1)
    cap_given = kwargs.get("softcap")
    cap = to_arb(exact_number(cap_given, "softcap"), 128) if cap_given is not None else None
    spec = AttentionSpec(n_q=n_q, n_k=n_k, heads=heads, kv_heads=kv, mask=kwargs.get("mask"),
                         causal_alignment=kwargs.get("causal_alignment", "top_left"))
    fill_given = kwargs.get("mask_fill")
    fill = None
    if fill_given is not None and not (isinstance(fill_given, str) and "inf" in fill_given):
        fill = to_arb(exact_number(fill_given, "mask_fill"), 128)
        if kwargs.get("mask_fill_stage", "scaled") == "raw":
            fill = fill * scale
    scaled_all, weights_all, outs = [], [], []
    for h in range(heads):
        additive = spec.head_additive_mask(h)
        t: list[list[Any]] = []
        for r in range(n_q):
            row: list[Any] = []
            for j in range(n_k):
                if not spec.takes_part(r, j, h):
                    row.append(fill)  # None: removed
                    continue
                e = scores[h][r][j] * scale
                if cap is not None:  # as exact_attention: after the scale, before masks
                    e = cap * (e / cap).tanh()
                if additive is not None:
                    a = additive[r][j]
                    if (isinstance(a, str) and "inf" in a) or (isinstance(a, float)
                                                                and a == float("-inf")):
                        row.append(None)
                        continue
                    e = e + to_arb(exact_number(a, "mask"), 128)
                row.append(e)
            t.append(row)
        w: list[list[Any]] = []
        for row in t:
            live = [x for x in row if x is not None]
            if not live:
                w.append([arb(0)] * n_k)
                continue
            c = max(x.mid() for x in live)
            exps = [None if x is None else (x - c).exp() for x in row]
            total = sum((e for e in exps if e is not None), arb(0))
            w.append([arb(0) if e is None else e / total for e in exps])
        scaled_all.append(t)
        weights_all.append(w)
        if vh is not None:
            outs.append(_mul(w, vh[h // group]))
    concat = output = None
    if outs:
        concat = [[x for o in outs for x in o[r]] for r in range(n_q)]
        if kwargs.get("w_o") is not None:
            output = _add_bias(_mul(concat, m("w_o") or []), m("b_o"))
    return BallAttention(qh, [kh[i // group] for i in range(heads)] if kh else [],
                         [vh[i // group] for i in range(heads)] if vh else [], scores, scaled_all,
                         weights_all, outs, concat, output)
