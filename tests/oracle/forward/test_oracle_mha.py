"""reference_mha through the tiers, against independent references written here:
projections as exact Fractions, each head by tests/oracle_reference.ref_row (exact
scores, one arb.exp per key), the output projection in Arb; exact ties from
constructions whose value is known by hand (equal scores: the mean of the value
projections; two heads that cancel: the bias)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mha_symbolic.oracle import reference_mha

flint = pytest.importorskip("flint")
arb = flint.arb

from oracle_reference import ball_fractions, ball_inside, ref_round, ref_row  # noqa: E402

FORMATS = ("float64", "float32", "float16", "bfloat16")


def _frac(a: Any) -> list[list[Fraction]]:
    return [[Fraction(float(t)) for t in row] for row in np.atleast_2d(a)]


def _affine(x: list[list[Fraction]], w: Any, b: Any) -> list[list[Fraction]]:
    """x wᵀ + b exactly (w in torch layout)."""
    wf = _frac(w)
    bf = [Fraction(0)] * len(wf) if b is None else [Fraction(float(t)) for t in b]
    return [[sum((xi * wi for xi, wi in zip(row, wrow, strict=True)), Fraction(0)) + bb
             for wrow, bb in zip(wf, bf, strict=True)] for row in x]


def ref_mha_row(xq: Any, xk: Any, xv: Any, i: int, w: dict[str, Any], H: int, Hkv: int,
                keep: Any, prec: int = 320) -> list[Any]:
    """Output row i of an MHA block (unbatched (L, E) inputs) as Arb balls."""
    q = _affine(_frac(xq[i]), w["wq"], w["bq"])[0]
    k = _affine(_frac(xk), w["wk"], w["bk"])
    v = _affine(_frac(xv), w["wv"], w["bv"])
    E = len(q)
    hd = E // H
    rep = H // Hkv
    a: list[Any] = []
    for h in range(H):
        hk = h // rep
        sl = slice(h * hd, (h + 1) * hd)
        ksl = slice(hk * hd, (hk + 1) * hd)
        if not keep[h].any():
            a += [arb(0)] * hd
            continue
        outs, _ = ref_row(q[sl], [row[ksl] for row in k], [row[ksl] for row in v], keep[h],
                          None, None, prec)
        a += outs
    old = flint.ctx.prec
    flint.ctx.prec = prec
    try:
        res = []
        for r_ in range(w["wo"].shape[0]):
            acc = arb(0) if w["bo"] is None else arb(float(w["bo"][r_]))
            for col in range(E):
                acc += a[col] * arb(float(w["wo"][r_, col]))
            res.append(acc)
        return res
    finally:
        flint.ctx.prec = old


def _weights(rng: Any, E: int, kdim: int, vdim: int, H: int, Hkv: int, dtype: Any,
             bias: bool = True) -> dict[str, Any]:
    hd = E // H
    Ekv = Hkv * hd

    def f(*s: int) -> Any:
        return rng.standard_normal(s).astype(dtype).astype(np.float64)

    return {"wq": f(E, E), "wk": f(Ekv, kdim), "wv": f(Ekv, vdim), "wo": f(E, E),
            "bq": f(E) if bias else None, "bk": f(Ekv) if bias else None,
            "bv": f(Ekv) if bias else None, "bo": f(E) if bias else None}


def _call(xq: Any, xk: Any, xv: Any, w: dict[str, Any], H: int, Hkv: int, **kw: Any) -> Any:
    bias = None if w["bq"] is None else np.concatenate([w["bq"], w["bk"], w["bv"]])
    return reference_mha(xq, xk, xv, num_heads=H, num_kv_heads=Hkv, q_proj_weight=w["wq"],
                         k_proj_weight=w["wk"], v_proj_weight=w["wv"], in_proj_bias=bias,
                         out_proj_weight=w["wo"], out_proj_bias=w["bo"], **kw)


@pytest.mark.parametrize(("H", "Hkv", "dtype"), [(2, 2, np.float32), (4, 2, np.float64)])
def test_mha_tiers_enclose_the_truth_and_round_correctly(H: int, Hkv: int, dtype: Any) -> None:
    rng = np.random.default_rng(H + Hkv)
    E, L, S = 8, 3, 5
    xq = rng.standard_normal((L, E)).astype(dtype).astype(np.float64)
    xk = rng.standard_normal((S, 6)).astype(dtype).astype(np.float64)
    xv = rng.standard_normal((S, 5)).astype(dtype).astype(np.float64)
    w = _weights(rng, E, 6, 5, H, Hkv, dtype)
    kpm = np.zeros(S, dtype=bool)
    kpm[3] = True  # True = ignored (torch MHA)
    res = _call(xq, xk, xv, w, H, Hkv, key_padding_mask=kpm)
    tier1 = (res.lower.copy(), res.upper.copy())
    rounded = {f: res.rounded(f) for f in FORMATS}
    keep = np.broadcast_to(~kpm, (H, S))
    for i in range(L):
        balls = ref_mha_row(xq, xk, xv, i, w, H, Hkv, keep)
        for col, ball in enumerate(balls):
            assert ball_inside(ball, float(tier1[0][i, col]), float(tier1[1][i, col]))
            assert ball_inside(ball, float(res.lower[i, col]), float(res.upper[i, col]))
            lo, hi = ball_fractions(ball)
            for f in FORMATS:
                assert rounded[f][i, col] == ref_round(lo, f) == ref_round(hi, f), (i, col, f)
    # the refined (double-double) enclosures are at most two ulps wide
    assert np.all(res.upper - res.lower <= 2 * np.spacing(np.abs(res.midpoint)))


@pytest.mark.parametrize("seed", range(12))
def test_mha_exact_ties_with_equal_scores_are_decided(seed: int) -> None:
    """Identical keys: every head's scores are equal, its output is the mean of the
    value projections, and the block output is that mean projected, exactly; small
    integers put such outputs on rounding midpoints (the old oracle raised
    PrecisionError on 3 of 120 such cases)."""
    rng = np.random.default_rng(seed)
    E, H = int(rng.choice([4, 8])), 2
    L, S = 2, int(rng.integers(2, 5))
    xq = rng.integers(-3, 4, (L, E)).astype(float)
    xk = np.repeat(rng.integers(-3, 4, (1, E)).astype(float), S, axis=0)
    xv = rng.integers(-3, 4, (S, E)).astype(float)
    wi = rng.integers(-2, 3, (3 * E, E)).astype(float)
    wo = rng.integers(-2, 3, (E, E)).astype(float)
    bo = rng.integers(-4, 5, E).astype(float) / 4
    res = reference_mha(xq, xk, xv, num_heads=H, in_proj_weight=wi, out_proj_weight=wo,
                        out_proj_bias=bo)
    vproj = _affine(_frac(xv), wi[2 * E:], None)
    mean = [sum((row[c] for row in vproj), Fraction(0)) / S for c in range(E)]
    want = [sum((mean[c] * Fraction(float(wo[r_, c])) for c in range(E)), Fraction(0))
            + Fraction(float(bo[r_])) for r_ in range(E)]
    for f in FORMATS:
        got = res.rounded(f)
        for i in range(L):
            for r_ in range(E):
                assert got[i, r_] == ref_round(want[r_], f), (f, i, r_, want[r_])


def test_mha_heads_that_cancel_give_the_bias_exactly() -> None:
    """Two heads with the same scores and opposite values: each head's output is
    irrational, their sum is 0, so the output is the bias — here 1 + 2**-8, a
    bfloat16 rounding midpoint that must go to 1.0 (ties to even)."""
    rng = np.random.default_rng(5)
    E, H, L, S = 4, 2, 2, 3
    hd = E // H
    x = rng.standard_normal((S, E))
    wq_h = rng.standard_normal((hd, E))
    wk_h = rng.standard_normal((hd, E))
    wv_h = rng.standard_normal((hd, E))
    wq = np.concatenate([wq_h, wq_h])
    wk = np.concatenate([wk_h, wk_h])
    wv = np.concatenate([wv_h, -wv_h])
    wo = np.ones((E, E))
    bo = np.full(E, 1 + 2.0**-8)
    res = reference_mha(x[:L], x, x, num_heads=H, q_proj_weight=wq, k_proj_weight=wk,
                        v_proj_weight=wv, out_proj_weight=wo, out_proj_bias=bo)
    assert res.rounded("bfloat16").tolist() == [[1.0] * E] * L
    assert res.rounded("float64").tolist() == [[1 + 2.0**-8] * E] * L
    assert res.exact((0, 0)) == Fraction(257, 256)


@pytest.mark.parametrize("policy", ["uniform", "zero"])
def test_mha_fully_masked_heads_follow_the_policy(policy: str) -> None:
    rng = np.random.default_rng(8)
    E, H, L, S = 4, 2, 2, 3
    x = rng.standard_normal((S, E))
    w = _weights(rng, E, E, E, H, H, np.float64)
    am = np.zeros((H, L, S), dtype=bool)
    am[0, 1, :] = True  # head 0, row 1: every key masked out (torch: True = ignored)
    res = _call(x[:L], x, x, w, H, H, attn_mask=am, masked_rows=policy)
    keep = np.ones((H, S), dtype=bool)
    if policy == "zero":
        keep[0] = False  # head 0 adds 0
    else:
        w_uni = dict(w)  # uniform: head 0 of row 1 takes the mean of its value projections
        w_uni["wq"] = w["wq"].copy()
        w_uni["wq"][: E // H] = 0.0
        w_uni["bq"] = w["bq"].copy()
        w_uni["bq"][: E // H] = 0.0
        w = w_uni
    balls = ref_mha_row(x[:L], x, x, 1, w, H, H, keep)
    for col, ball in enumerate(balls):
        lo, hi = ball_fractions(ball)
        assert res.rounded("float64")[1, col] == ref_round(lo, "float64") == ref_round(hi, "float64")


def test_mha_integer_masks_are_refused() -> None:
    from mha_symbolic.errors import SpecError

    x = np.ones((2, 4))
    with pytest.raises(SpecError, match=r"key_padding_mask.dtype=.*integer masks"):
        reference_mha(x, x, x, num_heads=2, in_proj_weight=np.ones((12, 4)),
                      out_proj_weight=np.eye(4), key_padding_mask=np.zeros(2, dtype=np.uint8))


def test_mha_extreme_inputs_give_finite_enclosures() -> None:
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 4)) * 1e150
    w = _weights(rng, 4, 4, 4, 2, 2, np.float64)
    res = _call(x, x, x, w, 2, 2)
    assert np.all(np.isfinite(res.lower)) and np.all(np.isfinite(res.upper))
    assert np.all((res.lower <= res.midpoint) & (res.midpoint <= res.upper))
    r = res.rounded("float32")  # outputs near 1e150 overflow float32: ±inf, correctly
    for i in range(3):
        balls = ref_mha_row(x, x, x, i, w, 2, 2, np.ones((2, 3), bool), prec=2048)
        for col, ball in enumerate(balls):
            assert ball_inside(ball, float(res.lower[i, col]), float(res.upper[i, col]))
            lo, hi = ball_fractions(ball)
            assert r[i, col] == ref_round(lo, "float32") == ref_round(hi, "float32")
    assert math.isfinite(float(np.max(res.upper - res.lower)))
