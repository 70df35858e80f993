"""KV-cache decode (issue 24 item 2): a paged decode written in plain torch, judged by
``compare_kvcache_decode`` with the step's own arguments (``compare_attention(...,
cache_seqlens=)`` on the gathered cache): false alarms on the correct kernel and the
planted cache bugs caught and named, over random cases (fp32 and bf16, GQA, q_len 1–4,
causal from the end, pages of 16).

    python bench/bench_kvcache.py [--cases N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))

from kvcache_kernels import paged_decode

import mha_symbolic as ms

BUGS = {"lengths_ignored": "kv_cache_lengths_ignored", "one_long": "kv_cache_length_one_long",
        "one_short": "kv_cache_length_one_short", "not_appended": "kv_cache_new_kv_not_appended"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=12)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"# bench_kvcache: {args.cases} cases per dtype; torch {torch.__version__}; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    t0 = time.process_time()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        fa = 0
        caught = {b: 0 for b in BUGS}
        named = {b: 0 for b in BUGS}
        for seed in range(args.cases):
            g = torch.Generator().manual_seed(seed)
            B, H, Hkv, D, page, pages = 3, 8, 2, 64, 16, 24
            Ln = 1 + seed % 4
            table = torch.randperm(pages, generator=g)[:B * 6].reshape(B, 6)
            seqlens = torch.randint(Ln, 6 * page - Ln - 1, (B,), generator=g)
            kp = torch.randn(pages, page, Hkv, D, generator=g).to(dtype)
            vp = torch.randn(pages, page, Hkv, D, generator=g).to(dtype)
            kn = torch.randn(B, Ln, Hkv, D, generator=g).to(dtype)
            vn = torch.randn(B, Ln, Hkv, D, generator=g).to(dtype)
            q = torch.randn(B, Ln, H, D, generator=g).to(dtype)
            # the step judged with the kernel's own arguments (the cache before it ran)
            kw = dict(k=kn, v=vn, block_table=table.numpy(), is_causal=True)
            out = paged_decode(torch, q, kp, vp, table, seqlens, kn, vn)
            ok = ms.compare_kvcache_decode(out, q, kp, vp, seqlens.numpy(), **kw)
            fa += not ok.passed
            for bug, name in BUGS.items():
                bad = paged_decode(torch, q, kp, vp, table, seqlens, kn, vn, bug=bug)
                c = ms.compare_kvcache_decode(bad, q, kp, vp, seqlens.numpy(), **kw)
                caught[bug] += not c.passed
                named[bug] += bool(name) and any(d.bug == name for d in c.diagnoses[:1])
        rows.append((str(dtype).split(".")[-1], fa, caught, named))
    print("\n| dtype | correct: false alarms | " + " | ".join(
        f"{b}: caught / named" for b in BUGS) + " |")
    print("|---|---:|" + "---:|" * len(BUGS))
    for dt, fa, caught, named in rows:
        print(f"| {dt} | {fa} / {args.cases} | " + " | ".join(
            f"{caught[b]} / {named[b] if BUGS[b] else '—'}" for b in BUGS) + " |")
    print(f"\nCPU {time.process_time() - t0:.1f} s; load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
