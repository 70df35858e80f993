"""Chunked attention (mha_symbolic/oracle/variants/chunk.py, FlashAttention's
``attention_chunk``).  Expected values come from independent methods written here: a
boolean mask built by a Python loop over FlashAttention's own limits (hopper/mask.h:
``col_limit_left = max(window's, round_down(row + S - L, c))``, ``col_limit_right =
min(window's, that + c)``), run through plain attention; and a chunked kernel written
in plain torch (the queries of each chunk against that chunk's keys only)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from chunk_reference import fa_chunk_mask as _fa_mask  # tests/kernels (conftest)

import mha_symbolic as ms
from mha_symbolic.errors import SpecError


def _case(seed: int, L: int, S: int, H: int = 2, HKV: int = 2, D: int = 8,
          dtype: type = np.float32) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, H, L, D)).astype(dtype)
    k = rng.standard_normal((2, HKV, S, D)).astype(dtype)
    v = rng.standard_normal((2, HKV, S, D)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("L,S,c", [(9, 9, 4), (5, 13, 3), (13, 5, 2), (1, 37, 16), (8, 8, 1),
                                   (6, 6, 100)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_chunk_equals_flashattention_limits_as_a_mask(L: int, S: int, c: int, causal: bool,
                                                      align: str) -> None:
    q, k, v = _case(L * 100 + S, L, S)
    off = 0 if align == "top_left" else S - L
    mask = _fa_mask(L, S, c, causal, off)
    got = ms.reference_attention(q, k, v, attention_chunk=c, is_causal=causal,
                                 causal_alignment=align, masked_rows="zero")
    want = ms.reference_attention(q, k, v, attn_mask=mask, causal_alignment=align,
                                  masked_rows="zero")
    for fmt in ("float64", "float32", "bfloat16"):
        np.testing.assert_array_equal(got.rounded(fmt), want.rounded(fmt))


def test_chunk_with_a_window_and_gqa() -> None:
    L = S = 24
    q, k, v = _case(7, L, S, H=4, HKV=2)
    mask = _fa_mask(L, S, 8, True, 0, window=(5, 0))
    got = ms.reference_attention(q, k, v, attention_chunk=8, window=(5, 0), is_causal=True,
                                 enable_gqa=True)
    want = ms.reference_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    np.testing.assert_array_equal(got.rounded("float32"), want.rounded("float32"))


def test_chunk_gradients_and_lse_equal_the_mask() -> None:
    L, S = 7, 11
    q, k, v = _case(11, L, S, dtype=np.float64)
    dout = np.random.default_rng(12).standard_normal(q.shape)
    mask = _fa_mask(L, S, 4, True, S - L)
    kw = dict(is_causal=True, causal_alignment="bottom_right")
    got = ms.reference_attention_backward(q, k, v, dout, attention_chunk=4, **kw)
    want = ms.reference_attention_backward(q, k, v, dout, attn_mask=mask,
                                           causal_alignment="bottom_right")
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.rounded("float64"), b.rounded("float64"))
    lse = ms.reference_attention(q, k, v, attention_chunk=4, return_lse=True, **kw).lse
    lse2 = ms.reference_attention(q, k, v, attn_mask=mask, return_lse=True,
                                  causal_alignment="bottom_right").lse
    np.testing.assert_array_equal(lse.rounded("float64"), lse2.rounded("float64"))


@pytest.mark.parametrize("bad", [True, -1, 2.0, "4", [4]])
def test_bad_chunks_are_refused_in_one_line(bad: object) -> None:
    q, k, v = _case(1, 4, 4)
    with pytest.raises(SpecError, match="attention_chunk"):
        ms.reference_attention(q, k, v, attention_chunk=bad)


def test_chunk_zero_is_off_and_a_huge_chunk_is_unbounded() -> None:
    q, k, v = _case(2, 6, 6)
    plain = ms.reference_attention(q, k, v).rounded("float32")
    for c in (0, None, 10**40):
        np.testing.assert_array_equal(
            ms.reference_attention(q, k, v, attention_chunk=c).rounded("float32"), plain)


def _torch_chunked(q, k, v, c: int, causal: bool, bug: str = "", dtype=None):
    """Chunked attention in plain torch: each chunk of queries against its chunk of
    keys (L = S, so top-left and bottom-right agree), as Llama 4's local layers.
    ``bug`` plants a kernel mistake."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    dt = dtype or torch.float32
    tq, tk, tv = (torch.from_numpy(x).to(dt) for x in (q, k, v))
    L = tq.shape[-2]
    if bug == "ignored":
        return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).float().numpy()
    shift = {"early": 1, "late": -1}.get(bug, 0)
    i = torch.arange(L)[:, None] + shift
    j = torch.arange(L)[None, :]
    mask = torch.div(i, c, rounding_mode="floor") == torch.div(j, c, rounding_mode="floor")
    if causal:
        mask = mask & (j <= torch.arange(L)[:, None])
    return F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask).float().numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_compare_judges_a_torch_chunked_kernel_and_names_its_bugs(causal: bool) -> None:
    L = 64
    q, k, v = _case(21, L, L, D=16)
    kw = dict(attention_chunk=16, is_causal=causal)
    ok = _torch_chunked(q, k, v, 16, causal)
    assert ms.compare_attention(ok, q, k, v, **kw).passed
    for bug, name in [("ignored", "attention_chunk_ignored"),
                      ("early", "attention_chunk_boundary_off_by_one"),
                      ("late", "attention_chunk_boundary_off_by_one_late")]:
        out = _torch_chunked(q, k, v, 16, causal, bug=bug)
        comp = ms.compare_attention(out, q, k, v, **kw)
        assert not comp.passed, bug
        assert [d.bug for d in comp.diagnoses][:1] == [name], comp.report()


def test_compare_bf16_kernel_passes_and_misalignment_is_named() -> None:
    torch = pytest.importorskip("torch")
    q, k, v = _case(31, 8, 40, D=16)
    bf = [torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v)]
    # the correct kernel (bottom-right chunks of FlashAttention) in bf16
    mask = torch.from_numpy(_fa_mask(8, 40, 16, True, 32))
    ok = torch.nn.functional.scaled_dot_product_attention(*bf, attn_mask=mask)
    kw = dict(attention_chunk=16, is_causal=True, causal_alignment="bottom_right")
    assert ms.compare_attention(ok, *bf, **kw).passed
    # chunks counted from the top-left corner (the query index, not i + S - L)
    top = torch.from_numpy(_fa_mask(8, 40, 16, False, 0) & _fa_mask(8, 40, 10**9, True, 32))
    bad = torch.nn.functional.scaled_dot_product_attention(*bf, attn_mask=top)
    comp = ms.compare_attention(bad, *bf, **kw)
    assert not comp.passed
    assert "attention_chunk_misaligned" in [d.bug for d in comp.diagnoses], comp.report()


def test_compare_backward_with_chunks_against_torch_autograd() -> None:
    torch = pytest.importorskip("torch")
    L = 32
    q, k, v = _case(41, L, L, D=8, dtype=np.float64)
    dout = np.random.default_rng(42).standard_normal(q.shape)
    tq, tk, tv = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
    mask = torch.from_numpy(_fa_mask(L, L, 8, True, 0))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)
    out.backward(torch.from_numpy(dout))
    grads = (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())
    comp = ms.compare_attention_backward(*grads, q, k, v, dout, attention_chunk=8,
                                         is_causal=True)
    assert comp.passed, comp.report()
    # gradients of the unchunked (causal only) kernel are not those of the chunked one
    tq.grad = tk.grad = tv.grad = None
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    out.backward(torch.from_numpy(dout))
    wrong = (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())
    assert not ms.compare_attention_backward(*wrong, q, k, v, dout, attention_chunk=8,
                                             is_causal=True).passed


def test_chunks_restart_with_each_sequence_of_a_varlen_batch() -> None:
    rng = np.random.default_rng(51)
    cu = np.array([0, 5, 12, 13])
    T, H, D = 13, 2, 4
    q, k, v = (rng.standard_normal((T, H, D)) for _ in range(3))
    got = ms.reference_attention_varlen(q, k, v, cu, cu, attention_chunk=3, is_causal=True)
    parts = []
    for a, b in itertools.pairwise(cu.tolist()):
        n = int(b - a)
        mask = _fa_mask(n, n, 3, True, 0)
        t = [np.swapaxes(x[a:b], 0, 1)[None] for x in (q, k, v)]
        one = ms.reference_attention(*t, attn_mask=mask).rounded("float64")
        parts.append(np.swapaxes(one[0], 0, 1))
    np.testing.assert_array_equal(got.rounded("float64"), np.concatenate(parts))
