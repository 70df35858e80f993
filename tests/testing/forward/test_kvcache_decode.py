"""compare_kvcache_decode (testing/forward/kvcache.py): a paged decode step written in
plain torch (pages written, gathered through the block table, SDPA per sequence,
causal from the end) is judged with the kernel's own arguments; the correct step
passes, and a step that forgot to write the new k/v is caught and named
kv_cache_new_kv_not_appended, the length bugs by their classes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import SpecError
from mha_symbolic.testing.forward.kvcache import KV_NOT_APPENDED

torch = pytest.importorskip("torch")

from kvcache_kernels import paged_decode  # noqa: E402


def _paged_decode(q: Any, kp: Any, vp: Any, table: Any, seqlens: Any, kn: Any, vn: Any,
                  bug: str | None = None) -> Any:
    return paged_decode(torch, q, kp, vp, table, seqlens, kn, vn, bug=bug)


def _case(seed: int, dtype: Any, Ln: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    B, H, Hkv, D, page, pages = 2, 4, 2, 16, 8, 10
    table = torch.randperm(pages, generator=g)[:B * 4].reshape(B, 4)
    seqlens = torch.randint(Ln, 4 * page - Ln, (B,), generator=g)
    kp, vp = (torch.randn(pages, page, Hkv, D, generator=g).to(dtype) for _ in range(2))
    kn, vn = (torch.randn(B, Ln, Hkv, D, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(B, Ln, H, D, generator=g).to(dtype)
    return q, kp, vp, table, seqlens, kn, vn


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("Ln", [1, 3])
def test_a_paged_decode_passes_and_its_cache_bugs_are_named(dtype: str, Ln: int) -> None:
    q, kp, vp, table, seqlens, kn, vn = _case(Ln, getattr(torch, dtype), Ln)
    kw = dict(k=kn, v=vn, block_table=table.numpy(), is_causal=True)
    out = _paged_decode(q, kp, vp, table, seqlens, kn, vn)
    c = ms.compare_kvcache_decode(out, q, kp, vp, seqlens.numpy(), **kw)
    assert c.passed, c.report()
    bad = _paged_decode(q, kp, vp, table, seqlens, kn, vn, bug="not_appended")
    c = ms.compare_kvcache_decode(bad, q, kp, vp, seqlens.numpy(), **kw)
    assert not c.passed
    assert c.diagnoses[0].bug == KV_NOT_APPENDED, c.report()
    assert KV_NOT_APPENDED in c.report()
    short = _paged_decode(q, kp, vp, table, seqlens, kn, vn, bug="one_short")
    c = ms.compare_kvcache_decode(short, q, kp, vp, seqlens.numpy(), **kw)
    assert not c.passed
    assert c.diagnoses[0].bug == "kv_cache_length_one_short", c.report()


def test_a_cache_already_updated_is_not_read_as_not_appended() -> None:
    """FlashAttention writes the new k/v in place: given the updated cache, the two
    readings coincide, a wrong output is caught and the bug is not claimed."""
    q, kp, vp, table, seqlens, kn, vn = _case(7, torch.float32, 1)
    k_full, v_full, _ = ms.gather_kv_cache(kp, vp, seqlens.numpy(), k=kn, v=vn,
                                         block_table=table.numpy())
    kc = torch.from_numpy(k_full.astype(np.float32))
    vc = torch.from_numpy(v_full.astype(np.float32))
    wrong = torch.zeros(q.shape[0], 1, q.shape[2], vp.shape[-1])
    c = ms.compare_kvcache_decode(wrong, q, kc, vc, seqlens.numpy(), k=kn, v=vn)
    assert not c.passed
    assert all(d.bug != KV_NOT_APPENDED for d in c.diagnoses)


def test_new_kv_in_another_dtype_than_the_cache_is_one_clear_error() -> None:
    q, kp, vp, table, seqlens, kn, _vn = _case(8, torch.bfloat16, 1)
    kn64 = torch.randn(kn.shape, dtype=torch.float64)
    out = torch.zeros(q.shape, dtype=torch.bfloat16)
    with pytest.raises(SpecError, match="not representable in the cache's dtype"):
        ms.compare_kvcache_decode(out, q, kp, vp, seqlens.numpy(), k=kn64, v=kn64,
                                  block_table=table.numpy())
