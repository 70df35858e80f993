"""An independent reference for rotary attention: a hand-written mpmath loop (exact
angles p/λ·β^(-2m/r) or exact table values, the rotation, softmax and weighted sum at
300 bits), then rounded correctly to float64 or float32.  Imports nothing from
mha_symbolic; small cases only (pure Python).  Inputs (L, E), (S, E), (S, Ev)."""

from __future__ import annotations

from typing import Any

import mpmath as mp
import numpy as np

PREC = 300


def _pairs(r: int, interleaved: bool) -> list[tuple[int, int]]:
    if interleaved:
        return [(2 * m, 2 * m + 1) for m in range(r // 2)]
    return [(m, m + r // 2) for m in range(r // 2)]


def _rotate(x: Any, p: int, r: int, interleaved: bool, base: float | None,
            scale: float, cos: Any, sin: Any) -> list[Any]:
    out = [mp.mpf(float(t)) for t in x]
    src = list(out)
    for m, (a, b) in enumerate(_pairs(r, interleaved)):
        if base is not None:
            th = mp.mpf(p) / mp.mpf(scale) * mp.power(mp.mpf(base), mp.mpf(-2 * m) / r)
            c, s = mp.cos(th), mp.sin(th)
        else:
            c, s = mp.mpf(float(cos[p, m])), mp.mpf(float(sin[p, m]))
        out[a] = src[a] * c - src[b] * s
        out[b] = src[b] * c + src[a] * s
    return out


def rotary_attention(q: Any, k: Any, v: Any, *, base: float | None = None,
                     scale_pos: float = 1.0, cos: Any = None, sin: Any = None,
                     interleaved: bool = False, rotary_dim: int | None = None,
                     q_offset: int | None = None, keep: Any = None) -> list[list[Any]]:
    """The exact output (mpf at PREC bits) of one head: queries at q_offset + i
    (default S - L), keys at j; ``keep`` (L, S) bool."""
    with mp.workprec(PREC):
        L, E = q.shape
        S = k.shape[0]
        r = rotary_dim if rotary_dim is not None else (2 * cos.shape[1] if cos is not None
                                                        else E)
        off = S - L if q_offset is None else q_offset
        qs = [_rotate(q[i], off + i, r, interleaved, base, scale_pos, cos, sin)
              for i in range(L)]
        ks = [_rotate(k[j], j, r, interleaved, base, scale_pos, cos, sin) for j in range(S)]
        c = 1 / mp.sqrt(E)
        rows = []
        for i in range(L):
            js = [j for j in range(S) if keep is None or keep[i][j]]
            sc = {j: c * mp.fsum(a * b for a, b in zip(qs[i], ks[j], strict=True)) for j in js}
            top = max(sc.values())
            w = {j: mp.exp(sc[j] - top) for j in js}
            d = mp.fsum(w.values())
            rows.append([mp.fsum(w[j] * mp.mpf(float(v[j, e])) for j in js) / d
                         for e in range(v.shape[1])])
        return rows


def rounded(rows: list[list[Any]], dtype: str) -> np.ndarray[Any, Any]:
    """Correct rounding (to nearest, ties to even) of the mpf values to float64 or
    float32 (normal range: mpmath rounds to 53 or 24 bits)."""
    bits = {"float64": 53, "float32": 24}[dtype]
    out = np.empty((len(rows), len(rows[0]) if rows else 0))
    for i, row in enumerate(rows):
        for e, x in enumerate(row):
            with mp.workprec(bits):
                out[i, e] = float(+x)
    return out.astype(np.float32) if dtype == "float32" else out
