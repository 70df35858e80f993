"""compare_attention(..., lse=) and compare_lse: real kernels' LSEs pass (torch's
FlexAttention and CPU flash kernel, an FA2-style split-KV written here), the planted
LSE bugs are caught and named."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_symbolic.testing import compare_attention
from mha_symbolic.testing.lse import compare_lse


def _split_kv(q: np.ndarray, k: np.ndarray, v: np.ndarray, splits: int, merge: str = "lse",
              causal: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """FA2-style split-KV in float32: per split (m, l, o), merged by the LSE; ``merge``
    plants a wrong merge of the partial LSEs ("max", "sum", "last")."""
    q, k, v = (np.asarray(x, np.float32) for x in (q, k, v))
    L, S = q.shape[-2], k.shape[-2]
    c = np.float32(1 / np.sqrt(q.shape[-1]))
    lses, outs = [], []
    for idx in np.array_split(np.arange(S), splits):
        s = (q @ np.swapaxes(k[..., idx, :], -1, -2)) * c
        if causal:
            s = np.where(idx[None, :] <= np.arange(L)[:, None], s, np.float32(-np.inf))
        m = s.max(-1, keepdims=True)
        mm = np.where(np.isfinite(m), m, np.float32(0))
        e = np.exp(s - mm)
        lsum = e.sum(-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            lses.append((mm + np.log(lsum))[..., 0])
            outs.append(np.where(lsum > 0, (e @ v[..., idx, :]) / lsum, np.float32(0)))
    P = np.stack(lses)
    M = P.max(0)
    with np.errstate(invalid="ignore"):
        w = np.exp(P - M)
    lse = M + np.log(w.sum(0))
    out = (w[..., None] * np.stack(outs)).sum(0) / w.sum(0)[..., None]
    bad = {"lse": lse, "max": M, "sum": P.sum(0), "last": P[-1]}[merge]
    return out.astype(np.float32), bad.astype(np.float32)


@pytest.mark.parametrize("splits", [1, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_an_fa2_style_split_kv_kernel_passes_output_and_lse(splits: int, causal: bool) -> None:
    rng = np.random.default_rng(splits + 10 * causal)
    q, k, v = (rng.standard_normal((2, 2, 24, 16)).astype(np.float32) for _ in range(3))
    out, lse = _split_kv(q, k, v, splits, causal=causal)
    c = compare_attention(out, q, k, v, is_causal=causal, lse=lse)
    assert c.passed, c.report()
    assert c.lse is not None and c.lse.passed and c.lse.title == "softmax_lse"


@pytest.mark.parametrize(("merge", "bug"), [("max", "lse_merge_max"), ("sum", "lse_merge_sum"),
                                            ("last", "lse_merge_last")])
def test_a_wrong_merge_of_split_partials_is_named(merge: str, bug: str) -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype(np.float32) for _ in range(3))
    out, lse = _split_kv(q, k, v, 4, merge=merge)
    c = compare_attention(out, q, k, v, lse=lse)
    assert not c.passed and c.n_mismatched == 0           # the output is right
    assert c.lse.diagnoses and c.lse.diagnoses[0].bug == bug
    assert "(4 splits)" in c.lse.diagnoses[0].description
    assert c.report().startswith(f"FAIL [{bug}] softmax_lse")


def test_missing_max_and_base_mixups_are_named() -> None:
    rng = np.random.default_rng(4)
    q, k = (rng.standard_normal((1, 3, 10, 8)).astype(np.float32) for _ in range(2))
    s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k) / np.sqrt(8)
    m = s.max(-1)
    true = np.log(np.exp(s).sum(-1))
    for lse, base, bug in ((true - m, "e", "lse_missing_max"),
                           (true / math.log(2), "e", "lse_log2_for_ln"),
                           (true, 2, "lse_ln_for_log2"),
                           (np.log(np.exp(s * np.sqrt(8)).sum(-1)), "e", "lse_unscaled")):
        c = compare_lse(lse.astype(np.float32), q, k, lse_base=base)
        assert not c.passed and c.diagnoses[0].bug == bug, (bug, c.report())
    assert compare_lse((true / math.log(2)).astype(np.float32), q, k, lse_base=2).passed


def test_fully_masked_rows_and_their_convention() -> None:
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((1, 2, 6, 8)).astype(np.float32) for _ in range(2))
    keep = np.ones((6, 6), bool)
    keep[3] = False
    s = np.where(keep, np.einsum("bhle,bhse->bhls", q.astype(np.float64), k) / np.sqrt(8),
                 -np.inf)
    with np.errstate(divide="ignore"):
        lse = np.log(np.exp(s).sum(-1)).astype(np.float32)       # -inf in row 3
    assert compare_lse(lse, q, k, attn_mask=keep).passed
    c = compare_lse(lse, q, k, attn_mask=keep, lse_masked="+inf")
    assert not c.passed and c.diagnoses[0].bug == "lse_masked_convention"
    fa = np.where(np.isneginf(lse), np.float32(np.inf), lse)        # FlashAttention's
    assert compare_lse(fa, q, k, attn_mask=keep, lse_masked="+inf").passed
    wrong = lse.copy()
    wrong[0, 0, 3] = 0.0
    assert not compare_lse(wrong, q, k, attn_mask=keep).passed


def test_flex_attention_return_lse_passes() -> None:
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 33, 16) for _ in range(3))
    out, lse = flex.flex_attention(q, k, v, return_lse=True)
    c = compare_attention(out, q, k, v, lse=lse)
    assert c.passed, c.report()
    bm = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 33, 33,
                                device="cpu")
    out, lse = flex.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    assert compare_attention(out, q, k, v, is_causal=True, lse=lse).passed
    c = compare_attention(out, q, k, v, is_causal=True, lse=lse, lse_base=2)
    assert not c.passed and c.lse.diagnoses[0].bug == "lse_ln_for_log2"


def test_torch_cpu_flash_kernel_logsumexp_passes() -> None:
    torch = pytest.importorskip("torch")
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None:
        pytest.skip("no CPU flash kernel op in this torch")
    torch.manual_seed(1)
    for dtype, causal in ((torch.float32, False), (torch.float32, True),
                          (torch.bfloat16, True)):
        q, k, v = (torch.randn(1, 2, 40, 16, dtype=dtype) for _ in range(3))
        out, lse = op(q, k, v, is_causal=causal)[:2]
        c = compare_attention(out, q, k, v, is_causal=causal, lse=lse)
        assert c.passed, (dtype, causal, c.report())


def test_check_attention_judges_a_kernel_that_returns_its_lse() -> None:
    torch = pytest.importorskip("torch")
    import mha_symbolic as ms

    F = torch.nn.functional
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 12, 8, dtype=torch.float64) for _ in range(3))

    def kernel(a, b, c):  # type: ignore[no-untyped-def]   # plain torch: (out, lse)
        lse = torch.logsumexp(a @ b.transpose(-1, -2) / math.sqrt(a.shape[-1]), dim=-1)
        return F.scaled_dot_product_attention(a, b, c), lse

    res = ms.check_attention(kernel, q, k, v, returns_lse=True)
    assert res.passed and res.output.lse is not None and res.output.lse.passed

    def log2_kernel(a, b, c):  # type: ignore[no-untyped-def]
        out, lse = kernel(a, b, c)
        return out, lse / math.log(2)

    res = ms.check_attention(log2_kernel, q, k, v, returns_lse=True, raise_on_failure=False)
    assert not res.passed and res.output.lse.diagnoses[0].bug == "lse_log2_for_ln"
    assert ms.check_attention(log2_kernel, q, k, v, returns_lse=True, lse_base=2).passed
