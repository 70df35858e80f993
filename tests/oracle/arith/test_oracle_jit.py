"""The compiled kernels (mha_symbolic.oracle.arith.jit, numba) and their numpy twins give
bit-identical enclosures and roundings, on either tier 2 (sliced, or by rows); without
numba the numpy twins run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from mha_symbolic.oracle import reference_attention, reference_mha
from mha_symbolic.oracle.arith import jit
from mha_symbolic.oracle.forward import attention as forward


def _run(monkeypatch: Any, use_numba: bool, make: Callable[[], Any],
         weights: bool = False, rows_path: bool = False) -> list[np.ndarray[Any, Any]]:
    monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", "1" if use_numba else "0")
    # the same tier 2 in both modes (compiled, the row path is the default for float32
    # inputs; without numba the sliced tier is): each path's kernels have their twins
    monkeypatch.setattr(forward, "rows_path_pays", lambda n: rows_path and n > 0)
    jit._kernels.cache_clear()
    try:
        res = make()
        out = [res.lower.copy(), res.upper.copy(), res.midpoint.copy()]
        for f in ("float64", "float32", "float16", "bfloat16"):
            out.append(res.rounded(f).astype(np.float64))
        out += [res.lower, res.upper]
        if weights:
            out += [res.weights.lower, res.weights.upper, res.weights.rounded("float64")]
        return out
    finally:
        monkeypatch.delenv("MHA_SYMBOLIC_NUMBA")
        jit._kernels.cache_clear()


rng = np.random.default_rng(17)
_q = rng.standard_normal((2, 4, 30, 16)).astype(np.float32)
_k = rng.standard_normal((2, 2, 700, 16)).astype(np.float32)
_v = rng.standard_normal((2, 2, 700, 3)).astype(np.float32)
_mask = np.where(rng.random((30, 700)) < 0.2, -np.inf, rng.standard_normal((30, 700)))
_mask[3] = -np.inf
_x = rng.standard_normal((5, 8))
_keep = rng.random((2, 30, 700)) > 0.25
_w_in, _b_in, _w_out = (rng.standard_normal((24, 8)), rng.standard_normal(24),
                        rng.standard_normal((8, 8)))

CASES: dict[str, tuple[Callable[[], Any], bool]] = {
    "gqa, float mask, weights, two key blocks": (lambda: reference_attention(
        _q, _k, _v, attn_mask=_mask, enable_gqa=True, return_weights=True,
        masked_rows="uniform"), True),
    "causal bottom right, scale 0.3, q and k × 8": (lambda: reference_attention(
        _q[0, :2] * 8, _k[0, :, :40] * 8, _v[0, :, :40], is_causal=True, scale=0.3,
        causal_alignment="bottom_right"), False),
    "dropout": (lambda: reference_attention(
        _q[0, :2], _k[0], _v[0], dropout_p=0.25,
        dropout_mask=_keep, return_weights=True), True),
    "extreme inputs": (lambda: reference_attention(
        _q[1, :2].astype(np.float64) * 1e150, _k[1, :, :9].astype(np.float64) * 1e150,
        _v[1, :, :9].astype(np.float64)), False),
    "multi-head block": (lambda: reference_mha(
        _x, _x, _x, num_heads=2, in_proj_weight=_w_in, in_proj_bias=_b_in,
        out_proj_weight=_w_out, is_causal=True), False),
}


@pytest.mark.parametrize("rows_path", [False, True], ids=["sliced tier 2", "row tier 2"])
@pytest.mark.parametrize("name", list(CASES))
def test_numba_and_numpy_paths_are_bit_identical(monkeypatch: Any, name: str,
                                                 rows_path: bool) -> None:
    pytest.importorskip("numba")
    make, weights = CASES[name]
    with_numba = _run(monkeypatch, True, make, weights, rows_path)
    without = _run(monkeypatch, False, make, weights, rows_path)
    for a, b in zip(with_numba, without, strict=True):
        assert np.array_equal(a, b, equal_nan=True)
        assert np.array_equal(np.signbit(a), np.signbit(b))


def test_numpy_twins_run_without_numba(monkeypatch: Any) -> None:
    monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", "0")
    jit._kernels.cache_clear()
    try:
        assert not jit.numba_active()
        r = reference_attention(np.ones((2, 3)), np.ones((4, 3)), np.arange(8.0).reshape(4, 2))
        assert r.rounded("float64").tolist() == [[3.0, 4.0], [3.0, 4.0]]
    finally:
        monkeypatch.delenv("MHA_SYMBOLIC_NUMBA")
        jit._kernels.cache_clear()


def test_value_scaling_kernel_equals_its_twin(monkeypatch: Any) -> None:
    # tier 1's [v·2^-F, |v·2^-F|] and the flag "a nonzero value scales below 2^-1022"
    pytest.importorskip("numba")
    r = np.random.default_rng(3)
    v = r.standard_normal((37, 5))
    v[::4, 1] = -0.0
    v[2, 2] = 0.0
    v[:, 3] *= 2.0**-1040                 # subnormal values
    v[5, 4] = 5e-324
    v[6, 4] = 1e300
    sc = np.ldexp(1.0, np.array([-3, 2, 0, 0, -997]))
    for check in (True, False):
        got = []
        for flag in ("1", "0"):
            monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", flag)
            jit._kernels.cache_clear()
            try:
                vcat = np.full((37, 10), np.nan)
                got.append((jit.vscale(v, sc, vcat, check), vcat))
            finally:
                jit._kernels.cache_clear()
        (f1, a), (f2, b) = got
        assert f1 == f2 == check                      # 5e-324·2^-997 underflows to 0
        assert np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b))
        assert np.array_equal(a[:, :5], v * sc) and np.array_equal(a[:, 5:], np.abs(v * sc))
    v32 = r.standard_normal((37, 5)).astype(np.float32)   # float32 values (plain tier 1)
    v32[::4, 1] = -0.0
    v32[:, 4] *= np.float32(2.0**-140)                      # float32 subnormals
    sc = np.ldexp(1.0, np.array([-3, 2, 0, 0, -900]))       # 2^-140·2^-900 < 2^-1022
    for flag in ("1", "0"):
        monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", flag)
        jit._kernels.cache_clear()
        try:
            vcat = np.full((37, 10), np.nan)
            f = jit.vscale(v32, sc, vcat, True)
        finally:
            jit._kernels.cache_clear()
        w = v32.astype(np.float64) * sc
        assert f and np.array_equal(vcat, np.hstack([w, np.abs(w)]))
        assert np.array_equal(np.signbit(vcat[:, :5]), np.signbit(w))
    vcat = np.empty((37, 10))
    assert not jit.vscale(np.abs(v[:, :3]) + 1.0, sc[:3], vcat[:, :6].copy(), True)
