"""Tier 2 by rows (mha_symbolic.oracle.forward.rows): compensated dot products and sums for a
few rows of float32-valued inputs.  Its enclosures contain the exact values (hand-written
Arb rows with exact Fraction scores, tests/kernels/oracle_reference.py), are as tight as the
sliced tier's, and its compiled kernels equal their numpy twins bit for bit."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mha_symbolic.oracle import reference_attention
from mha_symbolic.oracle.arith import jit
from mha_symbolic.oracle.conventions import Block, dd_scale, exact_scale
from mha_symbolic.oracle.forward.dd import KVdd, tier2_block
from mha_symbolic.oracle.forward.rows import KVrows, float32_valued, rows_path_pays, tier2_rows

flint = pytest.importorskip("flint")
arb = flint.arb

from oracle_reference import ref_row  # noqa: E402


def _f32(rng: Any, shape: tuple[int, ...], mult: float = 1.0) -> np.ndarray[Any, Any]:
    return (rng.standard_normal(shape) * mult).astype(np.float32).astype(np.float64)


def _contains(hi: Any, lo: Any, err: Any, balls: list[Any]) -> None:
    old = flint.ctx.prec
    flint.ctx.prec = 400
    try:
        for col, ball in enumerate(balls):
            c = arb(hi[col]) + arb(lo[col])  # exact at 400 bits
            assert abs(ball - c) <= arb(err[col]), col
    finally:
        flint.ctx.prec = old


CASES = {
    "plain, scale 1/sqrt(E) irrational": dict(E=12, scale=None, mask=False, keep=False),
    "float mask and masked keys, scale 0.3": dict(E=16, scale=0.3, mask=True, keep=False),
    "dropout keep mask": dict(E=8, scale=None, mask=False, keep=True),
    "power-of-two scale, values of all magnitudes": dict(E=64, scale=None, mask=False,
                                                         keep=False, spread=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_row_tier_contains_the_exact_value_and_is_tight(name: str) -> None:
    case = CASES[name]
    rng = np.random.default_rng(3)
    S, E, Ev, r = 300, int(case["E"]), 5, 4  # type: ignore[call-overload]
    q, k, v = _f32(rng, (r, E), 2.0), _f32(rng, (S, E), 2.0), _f32(rng, (S, Ev))
    if case.get("spread"):
        v = (v * np.exp2(rng.integers(-60, 60, v.shape))).astype(np.float32).astype(np.float64)
    allowed = madd = keep = None
    if case["mask"]:
        allowed = rng.random((r, S)) > 0.3
        madd = np.where(allowed, rng.standard_normal((r, S)), 0.0)
    if case["keep"]:
        keep = rng.random((r, S)) > 0.25
    scale = case["scale"]
    cs = dd_scale(exact_scale(scale, E)[0], E)
    blk = Block(allowed, madd, keep, None)
    factor = Fraction(4, 3) if keep is not None else None
    drop = None if factor is None else (float(factor), float(factor - Fraction(float(factor))), 0.0)
    res = tier2_rows(q, KVrows(k, v), blk, cs, drop)
    assert res.ok.all()
    sliced = tier2_block(q, None, None, KVdd(k, v), blk, cs, drop)
    for i in range(r):
        keep_i = allowed[i] if allowed is not None else np.ones(S, bool)
        outs, _ = ref_row(q[i], k, v, keep_i, None if madd is None else madd[i], scale, 400,
                          drop=None if keep is None else keep[i], factor=factor)
        _contains(res.hi[i], res.lo[i], res.err[i], outs)
        scale_v = np.max(np.abs(v), axis=0)
        assert np.all(res.err[i] <= 2.0**-75 * scale_v)
        # as tight as the sliced tier, within a factor 4
        assert np.all(res.err[i] <= 4 * sliced.err[i] + 2.0**-1000)


def test_row_tier_refuses_nothing_it_cannot_prove_and_float32_values_are_detected() -> None:
    assert float32_valued(np.array([1.5, 2.0**-149, -(2.0**127)]))
    assert not float32_valued(np.array([0.1]))  # 0.1 in float64 has 53 bits
    assert not float32_valued(np.array([2.0**200]))
    assert not float32_valued(np.array([np.inf]))
    assert not rows_path_pays(0)


def test_the_row_path_decides_the_same_roundings_as_the_sliced_tier(monkeypatch: Any) -> None:
    import mha_symbolic.oracle.forward.attention as fwd

    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 3, 40, 16)).astype(np.float32)
    k = rng.standard_normal((2, 3, 90, 16)).astype(np.float32) * 3
    v = rng.standard_normal((2, 3, 90, 4)).astype(np.float32)
    mask = np.where(rng.random((40, 90)) < 0.2, -np.inf, 0.0)
    outs = []
    for use_rows in (True, False):
        monkeypatch.setattr(fwd, "rows_path_pays", lambda n, on=use_rows: on and 0 < n <= 1000)
        res = reference_attention(q, k, v, attn_mask=mask, is_causal=False)
        rows = np.ones((6, 40), dtype=bool)
        res._refine_rows(rows)
        outs.append((res.lower.copy(), res.upper.copy(), res.rounded("float64"),
                     res.rounded("float32")))
    (lo_r, hi_r, r64_r, r32_r), (lo_s, hi_s, r64_s, r32_s) = outs
    assert np.array_equal(r64_r, r64_s) and np.array_equal(r32_r, r32_s)
    # both enclose the same value: their intersections are not empty
    assert np.all(np.maximum(lo_r, lo_s) <= np.minimum(hi_r, hi_s))


def test_row_kernels_equal_their_numpy_twins(monkeypatch: Any) -> None:
    pytest.importorskip("numba")
    rng = np.random.default_rng(5)
    q, kT = _f32(rng, (3, 20)), _f32(rng, (20, 33))
    wh = np.abs(rng.standard_normal((3, 33)))
    wl = wh * 2.0**-60 * rng.standard_normal((3, 33))
    keep = rng.random((3, 33)) > 0.4
    v = _f32(rng, (33, 6))
    got = []
    for flag in ("1", "0"):
        monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", flag)
        jit._kernels.cache_clear()
        try:
            got.append([*jit.row_dots(q, [kT], np.zeros(3, int)),
                        # the keys in their own layout, two heads (blocks of keys
                        # transposed in the kernel): the same chains
                        *jit.row_dots_k(q, [np.ascontiguousarray(kT.T)], np.zeros(3, int)),
                        *jit.row_dots_k(q, [np.ascontiguousarray(kT.T[::-1]),
                                            np.ascontiguousarray(kT.T)], np.array([1, 0, 1])),
                        *jit.row_sums(wh, wl, keep, [v], np.zeros(3, int), True),
                        *jit.row_sums(wh, wl, None, [v], np.zeros(3, int), False)[:2]])
        finally:
            jit._kernels.cache_clear()
    for a, b in zip(*got, strict=True):
        assert np.array_equal(a, b)
    # the (S, E) layout gives row_dots' scores; head 0 of the last call is the keys reversed
    assert np.array_equal(got[0][2], got[0][0]) and np.array_equal(got[0][3], got[0][1])
    for n in (4, 5):
        assert np.array_equal(got[0][n][[0, 2]], got[0][n - 4][[0, 2]])
        assert np.array_equal(got[0][n][1], got[0][n - 4][1][::-1])


def test_row_kernels_read_float32_heads_as_their_float64_widening(monkeypatch: Any) -> None:
    # tier 2 by rows passes float32 key/value heads as they are (issue 29, decode)
    pytest.importorskip("numba")
    rng = np.random.default_rng(6)
    q, k, v = _f32(rng, (4, 20)), _f32(rng, (40, 20)), _f32(rng, (40, 6))
    k[3, :] = -0.0
    v[::5, 2] = 2.0**-140                         # float32 subnormals, exact in float64
    wh = np.abs(rng.standard_normal((4, 40)))
    wl = wh * 2.0**-60 * rng.standard_normal((4, 40))
    keep = rng.random((4, 40)) > 0.4
    hidx = np.array([0, 1, 1, 0])
    for flag in ("1", "0"):
        monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", flag)
        jit._kernels.cache_clear()
        try:
            outs = [[*jit.row_dots_k(q, [kk, kk[::-1].copy()], hidx),
                     *jit.row_sums(wh, wl, keep, [vv, vv[::-1].copy()], hidx, True)]
                    for kk, vv in ((k, v), (k.astype(np.float32), v.astype(np.float32)))]
        finally:
            jit._kernels.cache_clear()
        for a, b in zip(*outs, strict=True):
            assert np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b))


def test_arrays_returned_before_a_rounding_are_not_modified_by_it() -> None:
    rng = np.random.default_rng(2)
    q, k, v = _f32(rng, (1, 40, 8)), _f32(rng, (1, 50, 8)), _f32(rng, (1, 50, 3))
    res = reference_attention(q, k, v)
    lower, upper, mid = res.lower, res.upper, res.midpoint
    saved = [a.copy() for a in (lower, upper, mid)]
    res.rounded("float64")  # refines every row: tighter bounds
    assert not np.array_equal(res.upper - res.lower, saved[1] - saved[0])
    for a, b in zip((lower, upper, mid), saved, strict=True):
        assert np.array_equal(a, b)
    # and the tightened bounds still hold the value the rounding chose
    r = res.rounded("float64")
    assert np.all((res.lower <= r) & (r <= res.upper))


@pytest.mark.parametrize("chunk", [1 << 16, 30 * 7], ids=["one block", "blocks of 7 rows"])
@pytest.mark.parametrize("kind", ["output", "weights"])
def test_rows_of_many_heads_in_one_block_equal_each_head_alone(kind: str, chunk: int,
                                                               monkeypatch: Any) -> None:
    """refine_many joins the undecided rows of every head into one block (masks present
    in some heads only, a dropout keep mask, a head whose keys are not float32 values
    and takes the sliced tier): each row's result is bit-identical to its head alone."""
    pytest.importorskip("numba")
    import mha_symbolic.oracle.forward.attention as fwd
    from mha_symbolic.oracle.forward.attention import dropout_dd

    monkeypatch.setattr(fwd, "CHUNK_ELEMS", chunk)  # rows per block: chunk // S

    rng = np.random.default_rng(8)
    q = rng.standard_normal((3, 20, 8)).astype(np.float32).astype(np.float64)
    k = rng.standard_normal((3, 30, 8)).astype(np.float32).astype(np.float64)
    v = rng.standard_normal((3, 30, 2)).astype(np.float32).astype(np.float64)
    k[2, 0, 0] = 0.1  # not a float32 value: head 2 takes the sliced tier
    mask = np.zeros((3, 20, 30))
    mask[1] = np.where(rng.random((20, 30)) < 0.3, -np.inf, rng.standard_normal((20, 30)))
    keep = rng.random((3, 20, 30)) > 0.2
    res = reference_attention(q, k, v, attn_mask=mask, dropout_p=0.2, dropout_mask=keep,
                              return_weights=True)
    prob = res._problem
    items = [(0, np.array([1, 4, 7])), (1, np.arange(20)), (2, np.array([3]))]
    got = dict(prob.refine_many(items, kind))
    assert sorted(got) == [0, 1, 2]
    for n, (b, rows) in enumerate(items):
        if b == 2:
            want = prob.refine(b, rows, kind)  # the sliced tier
        else:
            t = tier2_rows(q[b][rows], KVrows(k[b], v[b]), prob.model.block(b, rows), prob.cs,
                           dropout_dd(prob.factor), kind)
            want = (t.hi, t.lo, t.err, t.ok)
        for a, w in zip(got[n], want, strict=True):
            assert np.array_equal(a, w)


@pytest.mark.parametrize("seed", range(12))
def test_row_and_sliced_tiers_agree_on_random_problems(seed: int, monkeypatch: Any) -> None:
    """Random shapes, magnitudes (2**-140 to 2**60, values to 2**120), float16/float32
    inputs, causal alignments, float and bool masks, masked-row policies, dropout and
    scales: after tier 2 on every row, the two tiers' enclosures intersect and every
    rounding agrees (the long version: thousands of cases, bench/RESULTS.md issue 11)."""
    import mha_symbolic.oracle.forward.attention as fwd

    rng = np.random.default_rng(seed)
    B, H = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    L, S, E, Ev = (int(x) for x in (rng.integers(1, 30), rng.integers(1, 60),
                                    rng.integers(1, 33), rng.integers(1, 5)))
    mag, vmag = float(2.0 ** rng.integers(-140, 60)), float(2.0 ** rng.integers(-140, 120))
    dt = (np.float32, np.float16)[seed % 2]
    with np.errstate(all="ignore"):
        q = (rng.standard_normal((B, H, L, E)) * mag).astype(np.float32).astype(dt)
        k = (rng.standard_normal((B, H, S, E)) * mag).astype(np.float32).astype(dt)
        v = (rng.standard_normal((B, H, S, Ev)) * vmag).astype(np.float32).astype(dt)
    q, k, v = (np.where(np.isfinite(x), x, 1).astype(dt) for x in (q, k, v))
    kw: dict[str, Any] = {}
    case = seed % 5
    if case == 1:
        kw.update(is_causal=True, causal_alignment=("top_left", "bottom_right")[seed % 2])
    elif case == 2:
        kw["attn_mask"] = np.where(rng.random((L, S)) < 0.3, -np.inf,
                                   rng.standard_normal((L, S)) * 4)
    elif case == 3:
        kw.update(attn_mask=rng.random((L, S)) < 0.7, masked_rows=("zero", "uniform")[seed % 2])
    elif case == 4:
        kw.update(dropout_p=0.25, dropout_mask=rng.random((B, H, L, S)) > 0.25)
    if seed % 3 == 0:
        kw["scale"] = 0.3
    got = []
    for rows_path in (True, False):
        monkeypatch.setattr(fwd, "rows_path_pays", lambda n, on=rows_path: on and n > 0)
        r = reference_attention(q, k, v, **kw)
        r._refine_rows(np.ones(r._tier.shape, dtype=bool))
        got.append((r.lower.copy(), r.upper.copy(),
                    [r.rounded(f).astype(np.float64) for f in ("float64", "float32", "bfloat16")]))
    (lo1, hi1, r1), (lo2, hi2, r2) = got
    assert np.all(np.maximum(lo1, lo2) <= np.minimum(hi1, hi2))
    for a, b in zip(r1, r2, strict=True):
        assert np.array_equal(a, b, equal_nan=True)
