"""A paged KV-cache decode step written in plain torch (the real-style kernel that
tests/testing/forward/test_kvcache_decode.py and bench/bench_kvcache.py judge), with the
cache bugs planted by ``bug``: "not_appended" (the new k/v not written), "one_long",
"one_short", "lengths_ignored"."""

from __future__ import annotations

from typing import Any


def paged_decode(torch: Any, q: Any, kp: Any, vp: Any, table: Any, seqlens: Any, kn: Any,
                 vn: Any, bug: str | None = None) -> Any:
    """flash_attn_with_kvcache in plain torch: write the new k/v into their pages, gather
    each sequence's pages, attend to its valid keys (causal from the end)."""
    kp, vp = kp.clone(), vp.clone()
    B, Ln = kn.shape[:2]
    page = kp.shape[1]
    if bug != "not_appended":
        for b in range(B):
            for t in range(Ln):
                pos = int(seqlens[b]) + t
                kp[table[b, pos // page], pos % page] = kn[b, t]
                vp[table[b, pos // page], pos % page] = vn[b, t]
    outs = []
    H, Hkv = q.shape[2], kp.shape[2]
    for b in range(B):
        n = int(seqlens[b]) + Ln
        n = {"one_long": n + 1, "one_short": n - 1, "lengths_ignored": table.shape[1] * page}.get(
            bug, n)
        kb = kp[table[b]].reshape(-1, Hkv, kp.shape[-1])[:n].transpose(0, 1)
        vb = vp[table[b]].reshape(-1, Hkv, vp.shape[-1])[:n].transpose(0, 1)
        kb, vb = kb.repeat_interleave(H // Hkv, 0), vb.repeat_interleave(H // Hkv, 0)
        qb = q[b].transpose(0, 1)
        L = qb.shape[1]
        mask = torch.arange(n)[None, :] <= torch.arange(L)[:, None] + (n - L)  # from the end
        o = torch.nn.functional.scaled_dot_product_attention(
            qb.float(), kb.float(), vb.float(), attn_mask=mask).to(q.dtype)
        outs.append(o.transpose(0, 1))
    return torch.stack(outs)
