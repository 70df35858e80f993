"""Chunked attention (FlashAttention's ``attention_chunk``, issue 24 / the protocol's
proof of issue 23): a chunked kernel written in plain torch (SDPA with the chunk mask
built from FlashAttention's limits in torch ops), judged by ``compare_attention(...,
attention_chunk=c)`` over random cases — fp32, bf16 and fp16, L = S and L < S with
bottom-right chunks, causal or not, GQA, chunk sizes 1–128 — counting false alarms on
the correct kernel and the planted chunk bugs caught and named.  Also checks, per case,
that the certified reference with ``attention_chunk`` equals the reference with the
mask built element by element (rounded to the kernel's dtype: bit-identical).

    python bench/bench_chunk.py [--cases N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))

from chunk_reference import fa_chunk_mask

import mha_symbolic as ms

BUGS = {"ignored": "attention_chunk_ignored", "early": "attention_chunk_boundary_off_by_one",
        "late": "attention_chunk_boundary_off_by_one_late",
        "misaligned": "attention_chunk_misaligned"}


def _mask(torch, L: int, S: int, c: int, causal: bool, off: int, shift: int = 0):
    """FlashAttention's limits (hopper/mask.h) in torch ops."""
    p = torch.arange(L)[:, None] + off
    lo = torch.div(p + shift, c, rounding_mode="floor") * c
    j = torch.arange(S)[None, :]
    m = (j >= lo) & (j < lo + c)
    if causal:
        m = m & (j <= p)
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=12)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    F = torch.nn.functional
    print(f"# bench_chunk: {args.cases} cases per dtype; torch {torch.__version__}; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    t0 = time.process_time()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        fa = differ = 0
        caught = {b: 0 for b in BUGS}
        named = {b: 0 for b in BUGS}
        applies = {b: 0 for b in BUGS}
        for seed in range(args.cases):
            rng = np.random.default_rng(seed)
            g = torch.Generator().manual_seed(seed)
            H, Hkv, D = 4, 2, 32
            S = int(rng.integers(16, 257))
            L = S if seed % 2 == 0 else int(rng.integers(1, S + 1))
            c = int(rng.choice([1, 3, 16, 32, 64, 128]))
            causal = bool(seed % 3)
            off = S - L
            q = torch.randn(1, H, L, D, generator=g).to(dtype)
            k = torch.randn(1, Hkv, S, D, generator=g).to(dtype)
            v = torch.randn(1, Hkv, S, D, generator=g).to(dtype)
            kk, vv = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            kw = dict(attention_chunk=c, is_causal=causal, causal_alignment="bottom_right",
                      enable_gqa=True)

            def run(mask, q=q, kk=kk, vv=vv):
                return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)

            ref = ms.reference_attention(q, k, v, **kw).rounded(str(dtype).split(".")[1])
            want = ms.reference_attention(q, k, v, enable_gqa=True,
                                          attn_mask=fa_chunk_mask(L, S, c, causal, off))
            differ += int(np.sum(ref != want.rounded(str(dtype).split(".")[1])))
            ok = ms.compare_attention(run(_mask(torch, L, S, c, causal, off)), q, k, v, **kw)
            fa += not ok.passed
            bugs = {"ignored": fa_chunk_mask(L, S, 10**9, causal, off),
                    "early": _mask(torch, L, S, c, causal, off, 1),
                    "late": _mask(torch, L, S, c, causal, off, -1),
                    "misaligned": _mask(torch, L, S, c, False, 0)
                    & fa_chunk_mask(L, S, 10**9, causal, off)}
            for bug, m in bugs.items():
                m = torch.as_tensor(m).bool()
                if bool(torch.equal(m, _mask(torch, L, S, c, causal, off))) or not bool(
                        m.any(-1).all()):
                    continue                   # the bug changes nothing here, or empties rows
                applies[bug] += 1
                comp = ms.compare_attention(run(m), q, k, v, **kw)
                caught[bug] += not comp.passed
                named[bug] += bool(comp.diagnoses) and comp.diagnoses[0].bug == BUGS[bug]
        print(f"{dtype!s:16s} rounding: {differ} elements differ from the loop-built mask; "
              f"false alarms {fa}/{args.cases}; " + "; ".join(
                  f"{b} {caught[b]}/{applies[b]} caught, {named[b]} named" for b in BUGS))
    print(f"# CPU {time.process_time() - t0:.1f} s")


if __name__ == "__main__":
    main()
