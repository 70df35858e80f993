"""The independent Arb reference of the attention variants (exact fractions and
python-flint balls, written from the variants' published conventions, not from the
oracle): ``ref_attention`` and ``ref_rounded``, shared by tests/oracle/variants/ and
tests/exact/."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import flint
import ml_dtypes
import numpy as np

arb, fmpq, ctx = flint.arb, flint.fmpq, flint.ctx

PREC = 800
DT = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32),
      "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
      "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
      "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}


# ---------------------------------------------------------------------------
# Independent rounding: nearest bit pattern by exact distance, ties to even
# ---------------------------------------------------------------------------

def _uint(dt: np.dtype[Any]) -> Any:
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize]


def _val(bits: int, dt: np.dtype[Any]) -> float:
    return float(np.array([bits], dtype=_uint(dt)).view(dt).astype(np.float64)[0])


def ref_round_ball(x: Any, name: str) -> float:
    """Round the real number in ball x (must decide) to the format ``name``."""
    dt = DT[name]
    mid = x.mid()
    m, e = mid.man_exp()
    centre = Fraction(int(m)) * Fraction(2) ** int(e)
    rad_m, rad_e = x.rad().man_exp()
    rad = Fraction(int(rad_m)) * Fraction(2) ** int(rad_e)
    if centre == 0 and rad == 0:
        return 0.0
    fi = ml_dtypes.finfo(dt) if name not in ("float64", "float32", "float16") else np.finfo(dt)
    a = abs(centre)
    fmax = Fraction(float(fi.max))
    if a > fmax * 2:
        raise AssertionError("out of range in a test")
    with np.errstate(over="ignore"):
        guess = np.array([min(float(a), float(fi.max))]).astype(dt)
    b0 = int(guess.view(_uint(dt))[0])
    max_bits = int(np.array([fi.max], dtype=dt).view(_uint(dt))[0])
    cands = []
    for bb in range(max(0, b0 - 3), min(max_bits, b0 + 3) + 1):
        cands.append((Fraction(_val(bb, dt)), bb))
    # the true value y is in [a - rad, a + rad]; every y there must round alike
    results = set()
    for y in (a - rad, a + rad):
        best = min(cands, key=lambda c: (abs(c[0] - y), c[1] & 1))
        results.add(best[1])
    assert len(results) == 1, "undecided at this precision (test inputs avoid ties)"
    val = _val(results.pop(), dt)
    return val if centre > 0 else -val


# ---------------------------------------------------------------------------
# Independent exact semantics (conventions as the sources state them)
# ---------------------------------------------------------------------------

def F(x: Any) -> Fraction:
    return Fraction(float(x))


def A(fr: Fraction) -> Any:
    return arb(fmpq(fr.numerator, fr.denominator))


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: Any = None,
                  causal: bool = False, align: str = "top_left",
                  window: tuple[int, int] | None = None, softcap: float | None = None,
                  alibi: np.ndarray | None = None, sinks: np.ndarray | None = None,
                  keep: Any = None, rel_table: np.ndarray | None = None,
                  dq: Any = None, dk: Any = None, dv: Any = None) -> list[Any]:
    """Balls of every output element, (B, H, L, Ev) nested lists; q, k, v 4-D with
    equal heads.  Window: FlashAttention's "[i + S - L - left, i + S - L + right]"
    (with off = 0 for top-left); ALiBi: "-alibi_slope * |i + S - L - j|"; sinks:
    gpt-oss softmax(cat([QK, S]))[..., :-1]; descale: q·dq etc. (FA3 attention_ref)."""
    B, H, L, E = q.shape
    S = k.shape[2]
    off = 0 if align == "top_left" else S - L
    old = ctx.prec
    ctx.prec = PREC
    try:
        c = arb(1) / arb(E).sqrt() if scale is None else A(F(scale))
        out = []
        for b in range(B):
            hb = []
            for h in range(H):
                fq = F(1) if dq is None else F(dq[b, h])
                fk = F(1) if dk is None else F(dk[b, h])
                fv = F(1) if dv is None else F(dv[b, h])
                rows = []
                for i in range(L):
                    terms = []
                    idents: dict[tuple[Any, ...], list[int]] = {}
                    for j in range(S):
                        if causal and j > i + off:
                            continue
                        if window is not None:
                            lo_w, hi_w = window
                            if lo_w >= 0 and j < i + off - lo_w:
                                continue
                            if hi_w >= 0 and j > i + off + hi_w:
                                continue
                        if keep is not None and not keep(b, h, i, j):
                            continue
                        g = sum((F(q[b, h, i, e]) * fq * F(k[b, h, j, e]) * fk
                                 for e in range(E)), Fraction(0))
                        ident: tuple[Any, ...] = (g,)
                        s = A(g) * c
                        if softcap is not None:
                            cc = A(F(softcap))
                            s = cc * (s / cc).tanh()
                        if rel_table is not None:
                            w = (rel_table.shape[-1] - 1) // 2
                            d = j - i
                            s = s + A(F(rel_table[h, min(max(d, -w), w) + w]))
                            ident += (F(rel_table[h, min(max(d, -w), w) + w]),)
                        if alibi is not None:
                            s = s - A(F(alibi[b, h]) * abs(i + off - j))
                            ident += (F(alibi[b, h]) * abs(i + off - j),)
                        terms.append((s, j))
                        idents.setdefault(ident, []).append(j)
                    den = sum((t.exp() for t, _ in terms), arb(0))
                    if sinks is not None:
                        den = den + A(F(sinks[h])).exp()
                    row = []
                    for col in range(v.shape[3]):
                        if not terms:
                            row.append(arb(0))
                            continue
                        means = {sum((F(v[b, h, j, col]) * fv for j in js), Fraction(0))
                                 / len(js) for js in idents.values()}
                        if len(means) == 1 and sinks is None:
                            # keys with equal exact (q·k, biases) have equal scores; when
                            # every such group has the same mean value m, the output is m
                            # exactly, whatever the weights (a rational: ties are exact)
                            row.append(A(means.pop()))
                            continue
                        num = sum((t.exp() * A(F(v[b, h, j, col]) * fv) for t, j in terms),
                                  arb(0))
                        row.append(num / den)
                    rows.append(row)
                hb.append(rows)
            out.append(hb)
        return out
    finally:
        ctx.prec = old


def ref_rounded(balls: list[Any], name: str) -> np.ndarray:
    old = ctx.prec
    ctx.prec = PREC
    try:
        arr = np.array(balls, dtype=object)
        return np.vectorize(lambda x: ref_round_ball(x, name), otypes=[float])(arr)
    finally:
        ctx.prec = old


