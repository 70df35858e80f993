"""bench/verdict_kernels.py against a float64 reference computed in this file.

* every correct kernel is within a loose sanity bound of the reference, in every dtype,
  with and without causal masks and with GQA, and returns the input dtype;
* every fp32-precision mutant differs from the correct fp32 output by at least 10× the
  largest error of any correct fp32 kernel on a (1, 4, 32, 4096, 64) normal draw;
* the mutants that only show under a condition (scale not exact in bf16, S % block_n,
  exp overflow) show under it; the dtype-promise mutants return the wrong dtype.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import verdict_kernels as vk

F64, F32, F16, BF16 = vk.F64, vk.F32, vk.F16, vk.BF16


def ref64(q, k, v, *, scale=None, causal=False):
    """softmax(q kᵀ·scale) v in float64, written out here (not the module's own)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    H, Hkv = q.shape[1], k.shape[1]
    idx = np.arange(H) // (H // Hkv)
    k, v = k[:, idx], v[:, idx]
    L, S = q.shape[2], k.shape[2]
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhle,bhse->bhls", q, k) * sc
    if causal:
        shift = S - L if causal == "bottom_right" else 0
        s = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None] + shift, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    out = np.einsum("bhls,bhse->bhle", p, v)
    return np.divide(out, l, out=np.zeros_like(out), where=l > 0)


def err(out, ref) -> float:
    d = np.abs(np.asarray(out, dtype=np.float64) - ref)
    return float("inf") if not np.isfinite(d).all() else float(d.max())


def _call(name, fn, *args, **kw):
    if name in vk.TORCH_KERNELS:
        pytest.importorskip("torch")
    return fn(*args, **kw)


# ----------------------------------------------------------------------------- correct

BOUND = {F64: 1e-12, F32: 1e-5, F16: 5e-3, BF16: 3e-2}   # fp64/fp32: × max|v|; fp16/bf16: absolute


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16], ids=str)
def test_correct_kernels_within_sanity_bound(dtype, causal) -> None:
    rng = np.random.default_rng(7)
    q, k, v = vk.draw(rng, 1, 4, 2, 16, 200, 64, dtype, "normal")       # GQA 4/2; 200 % 64 != 0
    ref = ref64(q, k, v, causal=causal)
    vmax = float(np.abs(v.astype(np.float64)).max())
    bound = BOUND[dtype] * (vmax if dtype in (F64, F32) else 1.0)
    for name, fn in vk.CORRECT.items():
        out = _call(name, fn, q, k, v, causal=causal, dtype=dtype)
        assert out.dtype == dtype, name
        assert out.shape == q.shape[:3] + v.shape[-1:], name
        assert err(out, ref) < bound, (name, err(out, ref), bound)


@pytest.mark.parametrize("kind", vk.KINDS)
def test_correct_kernels_on_every_kind_fp16(kind) -> None:
    rng = np.random.default_rng(11)
    q, k, v = vk.draw(rng, 1, 2, 1, 8, 300, 64, F16, kind)
    ref = ref64(q, k, v)
    for name, fn in vk.CORRECT.items():
        if name == "eager_lowp" and kind == "llm":
            continue        # scores ~60 rounded to fp16 (ulp 1/32): a true eager fp16 error
        assert err(_call(name, fn, q, k, v, dtype=F16), ref) < (5e-3 if kind != "shifted" else 2e-2), name


def test_fa2_and_split_kv_lse() -> None:
    rng = np.random.default_rng(3)
    q, k, v = vk.draw(rng, 1, 2, 2, 8, 500, 32, F32, "normal")
    s = np.einsum("bhle,bhse->bhls", q.astype(F64), k.astype(F64)) / math.sqrt(32)
    lse_ref = np.log(np.exp(s).sum(-1))
    _, lse1 = vk.fa2_blocked(q, k, v, dtype=F32, block_n=64, return_lse=True)
    _, lse2 = vk.split_kv(q, k, v, dtype=F32, num_splits=3, return_lse=True)
    assert np.abs(lse1 - lse_ref).max() < 1e-5
    assert np.abs(lse2 - lse_ref).max() < 1e-5


def test_scale_argument_and_dtype_check() -> None:
    rng = np.random.default_rng(4)
    q, k, v = vk.draw(rng, 1, 1, 1, 4, 50, 16, F32, "normal")
    ref = ref64(q, k, v, scale=0.3)
    for name in ("naive_fp32acc", "fa2_blocked_64", "split_kv_4", "sequential_fp32"):
        assert err(vk.CORRECT[name](q, k, v, scale=0.3, dtype=F32), ref) < 1e-5
    with pytest.raises(TypeError):
        vk.naive_fp32acc(q, k, v, dtype=F16)


def test_round_tf32() -> None:
    one = 1.0
    x = np.array([one + 2**-11, one + 3 * 2**-11, one + 2**-11 + 2**-20, -2.5, np.inf, 0.0],
                 dtype=np.float32)
    r = vk.round_tf32(x)
    assert r.tolist() == [1.0, one + 2**-9, one + 2**-10, -2.5, np.inf, 0.0]
    assert np.isnan(vk.round_tf32(np.array([np.nan], np.float32)))[0]
    y = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert not (vk.round_tf32(y).view(np.uint32) & 0x1FFF).any()
    assert np.abs(vk.round_tf32(y) - y).max() <= np.abs(y).max() * 2**-11


def test_draw_kinds() -> None:
    rng = np.random.default_rng(0)
    q, k, v = vk.draw(rng, 1, 4, 4, 32, 1024, 64, F32, "llm")
    smax = np.abs(np.einsum("bhle,bhse->bhls", q, k)).max() / 8
    assert 25 < smax < 120
    _, _, v = vk.draw(rng, 1, 1, 1, 4, 1024, 64, BF16, "shifted")
    assert v.dtype == BF16 and 2.8 < float(v.astype(F32).mean()) < 3.2


# ----------------------------------------------------------------------------- mutants

# fp32-precision mutants visible on any fp32 normal draw
ALWAYS_FP32 = ["p_fp16_before_pv", "p_bf16_before_pv", "kv_cache_fp16", "kv_cache_bf16", "scores_bf16",
               "tf32_matmuls", "computed_in_bf16_returned_fp32", "sum_in_fp16", "rescale_missing"]


@pytest.fixture(scope="module")
def long_fp32():
    rng = np.random.default_rng(2026)
    q, k, v = vk.draw(rng, 1, 4, 4, 32, 4096, 64, F32, "normal")
    ref = ref64(q, k, v)
    correct = vk.naive_fp32acc(q, k, v, dtype=F32)
    errs = {}
    for name, fn in vk.CORRECT.items():
        if name in vk.TORCH_KERNELS:
            try:
                import torch  # noqa: F401
            except ImportError:
                continue
        errs[name] = err(fn(q, k, v, dtype=F32), ref)
    return q, k, v, ref, correct, errs


def test_registry_shape() -> None:
    assert set(vk.BUGGY) == set(vk.MUTANT_DTYPES)
    assert all(isinstance(bc, str) and bc for _, bc in vk.BUGGY.values())
    assert set(ALWAYS_FP32) <= set(vk.BUGGY)


@pytest.mark.parametrize("name", ALWAYS_FP32)
def test_fp32_mutant_visible(long_fp32, name) -> None:
    q, k, v, ref, correct, errs = long_fp32
    worst = max(errs.values())
    assert worst < 1e-5
    out = vk.BUGGY[name][0](q, k, v, dtype=F32)
    assert out.dtype == F32
    assert err(out, correct) >= 10 * worst, (name, err(out, correct), worst)
    assert err(out, ref) >= 10 * worst


def test_scale_bf16_visible_where_scale_inexact() -> None:
    rng = np.random.default_rng(5)
    for E, visible in ((80, True), (96, True), (64, False)):
        q, k, v = vk.draw(rng, 1, 4, 4, 32, 1024, E, F32, "normal")
        ref = ref64(q, k, v)
        c = max(err(vk.naive_fp32acc(q, k, v, dtype=F32), ref), err(vk.fa2_blocked(q, k, v, dtype=F32), ref))
        e = err(vk.scale_bf16(q, k, v, dtype=F32), ref)
        assert (e >= 10 * c) == visible, (E, e, c)


def test_last_block_dropped_visible_where_s_not_multiple() -> None:
    rng = np.random.default_rng(6)
    q, k, v = vk.draw(rng, 1, 4, 4, 32, 1000, 64, F32, "normal")     # 1000 = 7·128 + 104
    ref = ref64(q, k, v)
    c = err(vk.fa2_blocked(q, k, v, dtype=F32), ref)
    assert err(vk.last_block_dropped(q, k, v, dtype=F32), ref) >= 10 * c
    q, k, v = vk.draw(rng, 1, 4, 4, 32, 1024, 64, F32, "normal")
    ref = ref64(q, k, v)
    assert err(vk.last_block_dropped(q, k, v, dtype=F32), ref) < 1e-5      # S % 128 == 0: no bug


def test_no_max_subtraction_overflows() -> None:
    rng = np.random.default_rng(8)
    q, k, v = vk.draw(rng, 1, 2, 2, 16, 512, 64, F16, "llm")          # scores ≫ 11.09
    assert not np.isfinite(vk.no_max_subtraction(q, k, v, dtype=F16).astype(F32)).all()
    q, k, v = vk.draw(rng, 1, 2, 2, 16, 512, 64, F32, "llm")
    out = vk.no_max_subtraction(q, k, v, scale=0.25, dtype=F32)        # scores up to ~120 > 88.7
    assert not np.isfinite(out).all()
    q, k, v = vk.draw(rng, 1, 2, 2, 16, 512, 64, F32, "normal")
    assert err(vk.no_max_subtraction(q, k, v, dtype=F32), ref64(q, k, v)) < 1e-5   # harmless here


def test_dtype_promise_mutants() -> None:
    rng = np.random.default_rng(9)
    q, k, v = vk.draw(rng, 1, 4, 4, 32, 1024, 64, F16, "normal")
    ref = ref64(q, k, v)
    c = err(vk.naive_fp32acc(q, k, v, dtype=F16), ref)
    o1 = vk.fp16_in_bf16_out(q, k, v, dtype=F16)
    o2 = vk.fp16_in_fp32_out(q, k, v, dtype=F16)
    assert o1.dtype == BF16 and o2.dtype == F32
    assert err(o1, ref) > 2 * c                # bf16 rounding of inputs and output
    assert err(o2, ref) < c                    # more accurate than promised; wrong dtype only
