"""The dtype level for calls with variants (issues 22 and 24): a call whose variants only
keep keys (window, chunks, the KV cache, mask_mod) or rotate q and k (rotary) is judged
against correct kernels emulated on its own inputs too, so precision bugs that a naive
allclose against a same-dtype reference catches fail here as well — a rotary kernel
computing its angles in bfloat16, a windowed float32 kernel storing P in float16.  The
kernels are written in plain torch (tests/kernels/rotary_kernels.py, below), from the
code of HF transformers and FlashAttention, not from the model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mha_symbolic as ms

torch = pytest.importorskip("torch")

from tests.kernels.rotary_kernels import fa_tables_attention, hf_attention  # noqa: E402

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _qkv(seed: int, dt: Any, L: int = 8, S: int = 256, E: int = 32) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, m, E, generator=g).to(dt) for m in (L, S, S))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rotary_angles_in_bfloat16_fail_and_correct_rope_passes(dtype: str) -> None:
    # HF's RoPE with the angles pos·inv_freq computed in bfloat16 (instead of float32):
    # up to 0.5 rad wrong at position 255; its output errs ~30x a correct kernel's
    for seed in range(3):
        q, k, v = _qkv(100 + seed, DT[dtype])
        good = ms.compare_attention(hf_attention(q, k, v, base=1e4), q, k, v, rotary_base=1e4)
        assert good.passed, good.report()
        assert "two levels" in good.report()
        worst_good = good.worst.error / good.worst.tolerance
        assert worst_good < 0.5
        bad = ms.compare_attention(hf_attention(q, k, v, base=1e4, bug="rotary_angles_bf16"),
                                   q, k, v, rotary_base=1e4)
        assert not bad.passed, bad.report()
        # and named, though only wrong for its dtype (the certified model alone passes it
        # at bfloat16): the output lies within the dtype tolerance of that bug's evaluation
        assert [d.bug for d in bad.diagnoses][:1] == ["rotary_angles_bf16"], bad.report()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_flashattention_style_rotation_in_float32_passes(dtype: str) -> None:
    # the other correct order: rotation in float32, q', k' stored in the dtype, the
    # tables given (interleaved and not)
    for seed, inter in ((0, False), (1, True)):
        q, k, v = _qkv(200 + seed, DT[dtype], S=128)
        g = torch.Generator().manual_seed(seed)
        ang = torch.rand(128, 16, generator=g) * 2 * torch.pi * 40
        cos, sin = ang.cos().to(DT[dtype]), ang.sin().to(DT[dtype])
        out = fa_tables_attention(q, k, v, cos, sin, interleaved=inter)
        res = ms.compare_attention(out, q, k, v, rotary_cos=cos, rotary_sin=sin,
                                   rotary_interleaved=inter)
        assert res.passed, res.report()
        # and an HF-style rotation in the dtype of the same tables passes too
        out = hf_attention(q, k, v, base=1e4)   # different tables: a wrong answer
        assert not ms.compare_attention(out, q, k, v, rotary_cos=cos, rotary_sin=sin,
                                        rotary_interleaved=inter).passed


def _window_kernel(q: Any, k: Any, v: Any, W: int, p_dtype: Any = None) -> Any:
    """A float32 sliding-window kernel (keys i - W … i), optionally storing the
    normalised weights P in ``p_dtype`` before P·V (the precision bug)."""
    L, S = q.shape[-2], k.shape[-2]
    i = torch.arange(L)[:, None] + (S - L)
    j = torch.arange(S)[None, :]
    keep = (j <= i) & (j >= i - W)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    p = torch.softmax(s.masked_fill(~keep, -torch.inf), dim=-1)
    if p_dtype is not None:
        p = p.to(p_dtype).to(torch.float32)
    return p @ v


def test_a_windowed_float32_kernel_storing_p_in_float16_fails() -> None:
    # a float32 kernel whose weights are rounded to float16 errs ~2^-11 relative: far
    # below the certified model's worst case at 2048 keys, far above a float32 kernel's
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, m, 64, generator=g) for m in (64, 2048, 2048))
    call = dict(window=(1024, 0), is_causal=True, causal_alignment="bottom_right")
    good = ms.compare_attention(_window_kernel(q, k, v, 1024), q, k, v, **call)
    assert good.passed, good.report()
    bad = ms.compare_attention(_window_kernel(q, k, v, 1024, torch.float16), q, k, v, **call)
    assert not bad.passed, bad.report()
    # the certified model alone would pass it: the failure is the dtype level's
    assert "more wrong for float32" in bad.report()


def test_the_dtype_level_only_tightens_and_is_absent_for_score_pipelines() -> None:
    q, k, v = (t.numpy().astype(np.float64) for t in _qkv(7, torch.float32, L=4, S=64))
    out = hf_attention(*(torch.from_numpy(x).float() for x in (q, k, v)), base=1e4).numpy()
    for kw, level in (({"rotary_base": 1e4}, True), ({"softcap": 5.0}, False),
                      ({"alibi_slopes": np.array([0.5, 0.25])}, False)):
        res = ms.compare_attention(out.astype(np.float32), q.astype(np.float32),
                                   k.astype(np.float32), v.astype(np.float32), **kw)
        assert ("two levels" in res.report()) == level, kw
