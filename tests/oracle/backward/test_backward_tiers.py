"""The backward's tiers, each against independent references.

* tier 1 (oracle/backward/fast.py) and tier 2 (oracle/backward/dd.py): values within
  their proved bounds of forward-mode Arb derivatives (tests/kernels/backward_reference.py:
  Taylor series through the forward pass, no backward formula) or, for sizes where
  that is too slow, of the backward formulas written out in python-flint alone;
* the double-double building blocks' bounds against exact Fractions;
* the Arb tier by rows and key columns against the forward-mode reference;
* the numba and numpy twins bit-identical;
* perturbing a tier (its value, or its bound) makes these checks fail.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))

from backward_reference import formula_gradients, forward_mode_gradients
from oracle_reference import ball_fractions
from test_backward import _check_enclosure_and_rounding

from mha_symbolic import reference_attention_backward
from mha_symbolic.oracle.arith import dd as ddops
from mha_symbolic.oracle.arith import jit
from mha_symbolic.oracle.backward import dd as bdd
from mha_symbolic.oracle.backward import fast as bfast
from mha_symbolic.oracle.conventions import Block, DDScale, dd_scale

U = 2.0**-53
KINDS = {"dq": "q", "dk": "k", "dv": "v", "dmask": "m"}


def _fr(x: float) -> Fraction:
    return Fraction(float(x))


def _violations(val: np.ndarray, err: np.ndarray, ref: np.ndarray,
                lo: np.ndarray | None = None) -> int:
    """Elements whose reference ball is not inside val (+ lo) ± err (exact comparisons)."""
    bad = 0
    for idx in np.ndindex(*ref.shape):
        a, b = ball_fractions(ref[idx])
        mid = _fr(val[idx]) + (_fr(lo[idx]) if lo is not None else 0)
        e = _fr(err[idx])
        if 4 * (b - a) > 2 * e:
            # the bound is tighter than the reference ball (an exact value, a structural
            # zero): the truth is in both, so they must meet
            bad += not (mid - e <= b and a <= mid + e)
        elif not (mid - e <= a and b <= mid + e):
            bad += 1
    return bad


# --------------------------------------------------------------------------------------
# Cases: one attention problem each, with the score model the API would build


def _case(seed: int, kind: str) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    L, S, E, Ev = 7, 9, 3, 2
    q = rng.standard_normal((L, E)).astype(np.float32).astype(np.float64)
    k = rng.standard_normal((S, E)).astype(np.float32).astype(np.float64)
    v = rng.standard_normal((S, Ev)).astype(np.float32).astype(np.float64)
    do = rng.standard_normal((L, Ev)).astype(np.float32).astype(np.float64)
    kw: dict[str, Any] = {}
    keep = np.ones((L, S), dtype=bool)
    madd = None
    drop = None
    f = Fraction(1)
    uniform = np.zeros(L, dtype=bool)
    if kind == "float mask":
        m = np.round(rng.standard_normal((L, S)) * 4) / 4
        m[rng.random((L, S)) < 0.2] = -np.inf
        m[2] = -np.inf  # a row without keys
        kw["attn_mask"] = m
        keep = m != -np.inf
        madd = np.where(keep, m, 0.0)
    elif kind == "causal, dropout":
        kw["is_causal"] = True
        keep = np.arange(S)[None, :] <= np.arange(L)[:, None]
        drop = rng.random((L, S)) < 0.7
        kw.update(dropout_p=0.3, dropout_mask=drop)
        f = 1 / (1 - Fraction(0.3))
    elif kind == "bool mask, uniform rows":
        mask = rng.random((L, S)) < 0.5
        mask[4] = False
        kw.update(attn_mask=mask, masked_rows="uniform")
        keep = mask
        uniform = ~mask.any(axis=-1)
    elif kind == "scale 0.75, large scores":
        q, k = q * 6, k * 6
        kw["scale"] = 0.75
    scale: Any = Fraction(kw["scale"]) if "scale" in kw else "rsqrt"
    return dict(q=q, k=k, v=v, do=do, kw=kw, keep=keep, madd=madd, drop=drop, f=f,
                uniform=uniform, scale=scale)


CASES = ["plain", "float mask", "causal, dropout", "bool mask, uniform rows",
         "scale 0.75, large scores"]


def _reference(c: dict[str, Any]) -> dict[str, np.ndarray]:
    keep = c["keep"] | c["uniform"][:, None]
    # a zero additive mask changes nothing and gives dS as the mask's derivative
    madd = c["madd"] if c["madd"] is not None else np.zeros(c["keep"].shape)
    ref = forward_mode_gradients(c["q"], c["k"], c["v"], c["do"], c["keep"], madd,
                                 c["scale"], drop=c["drop"], f=c["f"],
                                 policy="uniform" if c["uniform"].any() else "zero")
    # the mask gradient of a key that takes no part is exactly 0
    ref["m"] = np.where(keep & ~c["uniform"][:, None], ref["m"], ref["m"] * 0)
    return ref


# --------------------------------------------------------------------------------------
# Tier 1


@pytest.mark.parametrize("kind", CASES)
def test_tier1_values_lie_within_their_bounds_over_row_and_key_blocks(kind: str) -> None:
    c = _case(1, kind)
    g = reference_attention_backward(c["q"], c["k"], c["v"], c["do"], **c["kw"])
    st = g.dq._problem.st   # the API's score model, so the blocks are the real ones
    f_f, rho_f = (float(c["f"]), abs(float(c["f"] - Fraction(float(c["f"])))) * 2)
    # 2 rows per block (4 row blocks), 4 keys per BLAS sum (3 key blocks)
    hg = bfast.tier1_backward(c["q"], c["k"], c["v"], c["do"], partial(st.block, 0), st.c_f,
                              st.rho_c, f_f, rho_f, want_ds=True, chunk=2 * 9, key_block=4)
    ref = _reference(c)
    ok = hg.row_ok
    assert ok.all() and hg.all_ok
    live = ~c["uniform"]
    for val, err, name in ((hg.dq, hg.e_dq, "q"), (hg.dk, hg.e_dk, "k"), (hg.dv, hg.e_dv, "v")):
        r = ref[name]
        if name == "q":  # rows without keys, with one key (P = 1: dS = 0) and uniform
            # rows: 0 by the API's structure
            keep_rows = (c["keep"].sum(axis=-1) > 1) & live
            r = np.where(keep_rows[:, None], r, r * 0)
        assert _violations(val, err, r) == 0, name
    assert hg.ds is not None and hg.e_ds is not None
    assert _violations(hg.ds, hg.e_ds, ref["m"]) == 0


def test_tier1_bound_does_not_grow_with_the_blocks() -> None:
    # the same problem in one block and in many: the bounds differ by the accumulation
    # terms only (a few u of the magnitudes), not by a factor growing with S or L
    rng = np.random.default_rng(2)
    q, k, v, do = (rng.standard_normal((40, 8)) for _ in range(4))

    def blk(rows: Any) -> Block:
        return Block(None, None, None, None)

    one = bfast.tier1_backward(q, k, v, do, blk, 8**-0.5, 2.01 * U * 8**-0.5)
    many = bfast.tier1_backward(q, k, v, do, blk, 8**-0.5, 2.01 * U * 8**-0.5, chunk=4 * 40,
                                key_block=8)
    for a, b in ((one.e_dq, many.e_dq), (one.e_dk, many.e_dk), (one.e_dv, many.e_dv)):
        assert np.all(b <= a * 2) and np.all(a <= b * 2)


# --------------------------------------------------------------------------------------
# Tier 2


ORDERS: dict[str, tuple[tuple[str, str], ...]] = {
    # (kind, rows): "all", "some" (every other) or "few" (two) — each order takes another
    # path through dd.py
    "dq all rows first (dK, dV formed in that pass)": (("dq", "all"), ("dk", "all"),
                                                       ("dv", "all")),
    "dk first (statistics pass with the key columns)": (("dk", "some"), ("dv", "some"),
                                                        ("dq", "some")),
    "dq few rows, then key columns": (("dq", "some"), ("dk", "all"), ("dv", "some")),
    "dq few rows with prefetched columns, then more columns": (("dq", "few"), ("dk", "some"),
                                                                ("dv", "all")),
}
PREFETCH = {"dq few rows with prefetched columns, then more columns": {"dk": [0, 2, 4, 6, 8],
                                                                       "dv": [1, 5]}}


def _t2_check(c: dict[str, Any], order: tuple[tuple[str, str], ...],
              tamper: Callable[[Any], Any] | None = None,
              prefetch: dict[str, list[int]] | None = None) -> tuple[int, float]:
    """(violations, largest bound relative to the size of the summed terms) of the
    tier-2 values of every kind in ``order`` against the forward-mode reference."""
    g = reference_attention_backward(c["q"], c["k"], c["v"], c["do"], **c["kw"])
    encs = {"dq": g.dq, "dk": g.dk, "dv": g.dv, "dmask": g.d_attn_mask}
    ref = _reference(c)
    bad, worst = 0, 0.0
    # the size of the terms every gradient element sums: |c| |q or k| |dO| |v| E_v
    # (dS = P(dP - D) with |dP| <= Σ|dO||v|); the bounds are relative to it
    c_abs = 1.0 if c["scale"] == "rsqrt" else abs(float(c["scale"]))
    scale = (max(c_abs, 1.0) * max(np.abs(c["q"]).max(), np.abs(c["k"]).max(), 1.0)
             * np.abs(c["do"]).max() * np.abs(c["v"]).max() * c["v"].shape[1])
    todo = list(order) + ([("dmask", "all")] if g.d_attn_mask is not None else [])
    if prefetch is not None:  # the key rows the format hint would name (api.hint)
        prob = g.dq._problem
        for kind, keys in prefetch.items():
            m = np.zeros(encs[kind]._mid.shape[:2], dtype=bool)
            m[0, keys] = True
            prob._cand[kind] = m
    for kind, which in todo:
        enc = encs[kind]
        assert enc is not None
        live = np.flatnonzero(~enc._zero_rows[0] & ~enc._nan_rows[0])
        rows = live if which == "all" else live[::2] if which == "some" else live[:2]
        h, lo, err, ok = enc._problem.refine(0, rows, kind)
        if tamper is not None:
            h, lo, err = tamper((h, lo, err))
        assert ok.all(), kind
        r = ref[KINDS[kind]][rows]
        bad += _violations(h, err, r, lo)
        worst = max(worst, float(np.max(err)) / scale)
    return bad, worst


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("kind", CASES)
def test_tier2_values_lie_within_their_bounds_and_the_bounds_are_tiny(kind: str,
                                                                      order: str) -> None:
    bad, worst = _t2_check(_case(3, kind), ORDERS[order], prefetch=PREFETCH.get(order))
    assert bad == 0
    assert worst < 2.0**-70   # the tier decides float64 roundings: about 2**-80


def test_tier2_checks_fail_when_a_value_or_a_bound_is_perturbed() -> None:
    c = _case(4, "float mask")
    order = ORDERS["dk first (statistics pass with the key columns)"]
    assert _t2_check(c, order)[0] == 0
    shifted = _t2_check(c, order, lambda t: (t[0], t[1] + np.abs(t[0]) * 2.0**-60, t[2]))
    assert shifted[0] > 0
    shrunk = _t2_check(c, order, lambda t: (t[0], t[1], t[2] * 2.0**-40))
    assert shrunk[0] > 0


def test_tier1_checks_fail_when_the_chain_is_perturbed(monkeypatch: Any) -> None:
    c = _case(5, "plain")
    ref = _reference(c)
    orig = bfast.step_ds

    def perturbed(*a: Any) -> Any:
        out = list(orig(*a))
        out[0] = out[0] * (1 + 2.0**-30)   # dS off by 2**-30 relative, bound unchanged
        return tuple(out)

    monkeypatch.setattr(bfast, "step_ds", perturbed)
    g = reference_attention_backward(c["q"], c["k"], c["v"], c["do"])
    assert _violations(g.dq._mid[0], (g.dq._hi - g.dq._lo)[0] / 2 * 1.01, ref["q"]) > 0


# --------------------------------------------------------------------------------------
# The double-double building blocks against exact Fractions


def _dd_cases(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    h = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    lo = h * U * rng.uniform(-1, 1, n)
    h2, lo2 = ddops.two_sum(h, lo)
    return h2, lo2


def test_dd_add_error_is_bounded_relative_to_the_inputs_under_cancellation() -> None:
    rng = np.random.default_rng(6)
    ah, al = _dd_cases(rng, 400)
    bh, bl = -ah * (1 + rng.uniform(-1e-12, 1e-12, 400)), -al * rng.uniform(0, 2, 400)
    bh, bl = ddops.two_sum(bh, bl)
    sh, sl = ddops.dd_add(ah, al, bh, bl)
    for i in range(400):
        exact = _fr(ah[i]) + _fr(al[i]) + _fr(bh[i]) + _fr(bl[i])
        bound = U * (U * (abs(ah[i]) + abs(bh[i])) * 1.01 + 2.01 * (abs(al[i]) + abs(bl[i])))
        assert abs(_fr(sh[i]) + _fr(sl[i]) - exact) <= _fr(bound)
        assert abs(sl[i]) <= U * abs(sh[i])


@pytest.mark.parametrize("cs", [DDScale(1.0, 0.0, -3, 0.0), DDScale(-1.0, 0.0, 2, 0.0),
                                dd_scale(Fraction(3, 10), 4), dd_scale(None, 7)])
def test_scale_dd_bound_holds(cs: DDScale) -> None:
    rng = np.random.default_rng(7)
    h, lo = _dd_cases(rng, 300)
    e = np.abs(h) * rng.uniform(0, 2.0**-70, 300)
    mh, ml, me = bdd.scale_dd(h, lo, e, cs)
    # c exactly: a float scale is its dyadic value; 1/sqrt(7) within cs.rho of the dd
    c_dd = (_fr(cs.hi) + _fr(cs.lo)) * Fraction(2) ** cs.e
    slack = _fr(cs.rho) * Fraction(2) ** cs.e
    for i in range(300):
        v = _fr(h[i]) + _fr(lo[i])
        # the worst true value within e of v and the worst true scale within rho
        for tv in (v - _fr(e[i]), v + _fr(e[i])):
            for c in (c_dd - slack, c_dd + slack):
                assert abs(c * tv - _fr(mh[i]) - _fr(ml[i])) <= _fr(me[i])


def test_ddsum_and_row_dot_bounds_hold() -> None:
    rng = np.random.default_rng(8)
    acc = bdd.DDSum()
    parts = []
    for _ in range(5):
        h, lo = _dd_cases(rng, 50)
        e = np.abs(h) * 2.0**-90
        acc.add(h, lo, e)
        parts.append((h, lo, e))
    sh, sl, se = acc.result((50,))
    for i in range(50):
        exact = sum((_fr(h[i]) + _fr(lo[i]) for h, lo, _ in parts), Fraction(0))
        extra = sum((_fr(e[i]) for _, _, e in parts), Fraction(0))
        assert abs(_fr(sh[i]) + _fr(sl[i]) - exact) + extra <= _fr(se[i])
    oh, ol = (x.reshape(10, 30) for x in _dd_cases(rng, 300))
    oe = np.abs(oh) * 2.0**-85
    b = rng.standard_normal((10, 30))
    dh, dl, de = bdd._row_dot(oh, ol, oe, b)
    for i in range(10):
        exact = sum((_fr(b[i, j]) * (_fr(oh[i, j]) + _fr(ol[i, j])) for j in range(30)),
                    Fraction(0))
        slack = sum((abs(_fr(b[i, j])) * _fr(oe[i, j]) for j in range(30)), Fraction(0))
        assert abs(_fr(dh[i]) + _fr(dl[i]) - exact) + slack <= _fr(de[i])


def test_block_sums_bound_the_accumulation_exactly() -> None:
    rng = np.random.default_rng(9)
    a = rng.standard_normal((6, 40)) * 2.0 ** rng.integers(-20, 20, (6, 40))
    b = rng.standard_normal((40, 5))
    v, g = bfast.blocked_matmul(a, b, 7)
    assert g == bfast.matmul_g(40, 7)
    mag = np.abs(a) @ np.abs(b)
    for i in range(6):
        for j in range(5):
            exact = sum((_fr(a[i, t]) * _fr(b[t, j]) for t in range(40)), Fraction(0))
            assert abs(_fr(v[i, j]) - exact) <= _fr(g) * _fr(mag[i, j]) * (1 + _fr(2.0**-40))
    x = rng.standard_normal((6, 40))
    d, g2 = bfast.blocked_rowdot(a, x, 7)
    for i in range(6):
        exact = sum((_fr(a[i, t]) * _fr(x[i, t]) for t in range(40)), Fraction(0))
        m = sum((abs(_fr(a[i, t]) * _fr(x[i, t])) for t in range(40)), Fraction(0))
        assert abs(_fr(d[i]) - exact) <= _fr(g2) * m
    acc = bfast.BlockSum()
    ts = [rng.standard_normal(8) * 2.0 ** rng.integers(-30, 30, 8) for _ in range(9)]
    es = [np.abs(t) * 1e-20 for t in ts]
    for t, e in zip(ts, es, strict=True):
        acc.add(t, e)
    val, err = acc.result((8,))
    for i in range(8):
        exact = sum((_fr(t[i]) for t in ts), Fraction(0))
        extra = sum((_fr(e[i]) for e in es), Fraction(0))
        assert abs(_fr(val[i]) - exact) + extra <= _fr(err[i])


# --------------------------------------------------------------------------------------
# Tier 3 by rows and key columns


def test_arb_tier_by_key_columns_and_rows_matches_forward_mode() -> None:
    from flint import arb

    c = _case(10, "causal, dropout")
    g = reference_attention_backward(c["q"], c["k"], c["v"], c["do"], **c["kw"])
    ref = _reference(c)
    for enc, name, rows in ((g.dk, "k", [1, 5]), (g.dv, "v", [0, 8]), (g.dq, "q", [3, 6])):
        balls = enc._problem.arb_rows(0, rows, 256, enc._kind)
        for n, r in enumerate(rows):
            for col, x in enumerate(balls[n]):
                y = ref[name][r, col]
                assert x.overlaps(y), (name, r, col)
                assert x.rad() <= 2.0**-200 * (abs(y.mid()) + arb(2.0**-300))


# --------------------------------------------------------------------------------------
# The compiled twins


def _grads_run(monkeypatch: Any, use_numba: bool) -> list[np.ndarray]:
    monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", "1" if use_numba else "0")
    jit._kernels.cache_clear()
    bfast._compiled.cache_clear()
    try:
        rng = np.random.default_rng(11)
        q = rng.standard_normal((2, 4, 30, 8)).astype(np.float32)
        k = rng.standard_normal((2, 2, 600, 8)).astype(np.float32)
        v = rng.standard_normal((2, 2, 600, 3)).astype(np.float32)
        do = rng.standard_normal((2, 4, 30, 3)).astype(np.float32)
        m = np.where(rng.random((30, 600)) < 0.2, -np.inf, rng.standard_normal((30, 600)))
        keep = rng.random((30, 600)) < 0.8
        g = reference_attention_backward(q, k, v, do, attn_mask=m, enable_gqa=True,
                                         dropout_p=0.25, dropout_mask=keep)
        out = []
        for enc in (g.dq, g.dk, g.dv, g.d_attn_mask):
            assert enc is not None
            out += [enc.lower.copy(), enc.upper.copy(), enc.midpoint.copy()]
            out += [enc.rounded(f).astype(np.float64) for f in ("float32", "bfloat16")]
        return out
    finally:
        monkeypatch.delenv("MHA_SYMBOLIC_NUMBA")
        jit._kernels.cache_clear()
        bfast._compiled.cache_clear()


def test_numba_and_numpy_twins_give_bit_identical_gradients(monkeypatch: Any) -> None:
    pytest.importorskip("numba")
    a = _grads_run(monkeypatch, True)
    b = _grads_run(monkeypatch, False)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.view(np.uint64), y.view(np.uint64))


def test_compiled_chain_equals_the_numpy_chain_bit_for_bit(monkeypatch: Any) -> None:
    """tier 2's dS = P∘(dP − D) and its bound without dropout (the compiled twin of
    :func:`.dd._chain`) against the numpy formulas, on blocks with huge, tiny and
    overflowing values and dead keys."""
    pytest.importorskip("numba")
    if bfast._compiled() is None:
        pytest.skip("compiled kernels off")
    rng = np.random.default_rng(1)
    r, S = 37, 53
    for trial in range(12):
        sc = 10.0 ** int(rng.integers(-300, 300)) if trial % 3 == 0 else 1.0
        ph = rng.random((r, S))
        pl = ph * 2.0**-54 * rng.standard_normal((r, S))
        pe = ph * 1e-25
        xh = rng.standard_normal((r, S)) * sc
        xl = xh * 2.0**-54 * rng.standard_normal((r, S))
        xe = np.abs(xh) * 1e-30
        dh = rng.standard_normal(r) * sc
        dl, de = dh * 2.0**-55, np.abs(dh) * 1e-24
        live = rng.random((r, S)) < 0.8
        if trial == 5:
            xh[0, 0], dh[0] = 1e308, -1e308   # dP − D overflows: ok must be False
        args = ((ph, pl, pe), (xh, xl, xe), (dh, dl, de), live, None, None)
        with np.errstate(over="ignore", invalid="ignore"):
            a = bdd._chain(*args)
            with monkeypatch.context() as mp:
                mp.setattr(bdd, "_compiled", lambda: None)
                b = bdd._chain(*args)
        for u, v in ((a.sh, b.sh), (a.sl, b.sl), (a.se, b.se), (a.wh, b.wh), (a.we, b.we)):
            assert np.array_equal(u.view(np.uint64), v.view(np.uint64)), trial
        assert a.ok == b.ok and (trial != 5 or not a.ok), trial


def test_compiled_row_sums_equal_ddsum_bit_for_bit() -> None:
    """row_sums_dd (the compiled row-by-row DDSum) against DDSum over the columns."""
    pytest.importorskip("numba")
    if bfast._compiled() is None:
        pytest.skip("compiled kernels off")
    rng = np.random.default_rng(2)
    for n in (2, 3, 64, 257):
        h = rng.standard_normal((19, n)) * np.exp(rng.standard_normal((19, n)) * 8)
        lo = h * 2.0**-54 * rng.standard_normal((19, n))
        e = np.abs(h) * 1e-25
        acc = bdd.DDSum()
        for j in range(n):
            acc.add(h[:, j], lo[:, j], e[:, j])
        want = acc.result((19,))
        got = bdd.row_sums_dd(h, lo, e)
        for u, v in zip(got, want, strict=True):
            assert np.array_equal(u.view(np.uint64), v.view(np.uint64)), n


# --------------------------------------------------------------------------------------
# Float64 rounding at a size where every element goes through tier 2


def test_float64_rounding_of_a_gqa_block_matches_the_formula_reference() -> None:
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 2, 24, 4)).astype(np.float32).astype(np.float64)
    k = rng.standard_normal((1, 1, 20, 4)).astype(np.float32).astype(np.float64)
    v = rng.standard_normal((1, 1, 20, 3)).astype(np.float32).astype(np.float64)
    do = rng.standard_normal((1, 2, 24, 3)).astype(np.float32).astype(np.float64)
    g = reference_attention_backward(q, k, v, do, is_causal=True, enable_gqa=True,
                                     causal_alignment="bottom_right")
    keep = np.arange(20)[None, :] <= np.arange(24)[:, None] - 4
    ref_q = np.empty(q.shape, dtype=object)
    ref_k = np.full(k.shape, None, dtype=object)
    ref_v = np.full(v.shape, None, dtype=object)
    from flint import arb
    for h in range(2):
        r = formula_gradients(q[0, h], k[0, 0], v[0, 0], do[0, h], keep, None, "rsqrt")
        ref_q[0, h] = r["q"]
        ref_k[0, 0] = r["k"] if h == 0 else ref_k[0, 0] + r["k"]
        ref_v[0, 0] = r["v"] if h == 0 else ref_v[0, 0] + r["v"]
    ref_q[0, :, :4] = arb(0) * 0   # rows without a key: 0 exactly
    _check_enclosure_and_rounding(g.dq, ref_q, ("float64",))
    _check_enclosure_and_rounding(g.dk, ref_k, ("float64",))
    _check_enclosure_and_rounding(g.dv, ref_v, ("float64",))
