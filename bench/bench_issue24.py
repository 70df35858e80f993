"""Issue 24's measurements: the LSE's rounding against mpmath, false alarms of the LSE
on real kernels, its bug classes, the layout diagnosis, the pattern line on planted
boundary bugs, and the cost of the key hypotheses.

    PYTHONPATH=. python bench/bench_issue24.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import mpmath
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mha_symbolic.oracle.lse import reference_lse
from mha_symbolic.testing import compare_attention
from mha_symbolic.testing.lse import compare_lse


def lse_rounding(n_cases: int) -> tuple[int, int]:
    """(rows compared, rows differing) of rounded("float32"/"float64") vs mpmath."""
    rows = bad = 0
    mpmath.mp.prec = 300
    for seed in range(n_cases):
        rng = np.random.default_rng(seed)
        L, S, E = int(rng.integers(1, 6)), int(rng.integers(1, 12)), int(rng.integers(1, 9))
        q = rng.standard_normal((L, E)).astype(np.float32) * float(rng.choice([0.1, 1, 8]))
        k = rng.standard_normal((S, E)).astype(np.float32)
        base = "e" if seed % 2 else 2
        r = reference_lse(q[None], k[None], is_causal=bool(seed % 3 == 0), base=base)
        g32, g64 = r.rounded("float32")[0], r.rounded("float64")[0]
        for i in range(L):
            js = range(S) if seed % 3 else range(min(S, i + 1))
            if not len(js):
                continue
            ts = [mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b))
                              for a, b in zip(q[i], k[j], strict=True)) / mpmath.sqrt(E)
                  for j in js]
            v = mpmath.log(mpmath.fsum(mpmath.exp(t) for t in ts))
            if base == 2:
                v /= mpmath.log(2)
            rows += 1
            f = np.float32(float(v))
            cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
            w32 = float(min(cands, key=lambda c: abs(mpmath.mpf(float(c)) - v)))
            if g64[i] != float(v) or g32[i] != w32:
                bad += 1
    return rows, bad


def lse_false_alarms(n: int) -> tuple[int, int]:
    """(checks, false alarms) of compare_attention(lse=) on torch FlexAttention,
    torch's CPU flash kernel (fp32/fp16/bf16) and the FA2-style split-KV."""
    import torch
    from testing.forward.test_compare_lse import _split_kv  # type: ignore[import-not-found]
    from torch.nn.attention.flex_attention import flex_attention

    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    checks = alarms = 0
    for seed in range(n):
        torch.manual_seed(seed)
        L, S = int(torch.randint(1, 40, ())), int(torch.randint(1, 300, ()))
        q = torch.randn(1, 2, L, 32)
        k, v = torch.randn(1, 2, S, 32), torch.randn(1, 2, S, 32)
        out, lse = flex_attention(q, k, v, return_lse=True)
        checks += 1
        alarms += not compare_attention(out, q, k, v, lse=lse).passed
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            qq, kk, vv = (x.to(dt) for x in (q, k, v))
            causal = seed % 2 == 1 and L <= S
            o2, l2 = op(qq, kk, vv, is_causal=causal)[:2]
            al = "bottom_right" if causal else "top_left"
            del al
            checks += 1
            alarms += not compare_attention(o2, qq, kk, vv, is_causal=causal, lse=l2).passed
        qn, kn, vn = (x.numpy() for x in (q, k, v))
        o3, l3 = _split_kv(qn, kn, vn, 1 + seed % 4)
        checks += 1
        alarms += not compare_attention(o3, qn, kn, vn, lse=l3).passed
    return checks, alarms


def lse_bugs() -> dict[str, str]:
    """bug planted -> the first diagnosis named."""
    from testing.forward.test_compare_lse import _split_kv  # type: ignore[import-not-found]

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 3, 24, 16)).astype(np.float32) for _ in range(3))
    s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k) / 4.0
    true = np.log(np.exp(s).sum(-1))
    planted = {"lse_missing_max": (true - s.max(-1), "e"),
               "lse_log2_for_ln": (true / math.log(2), "e"),
               "lse_ln_for_log2": (true, 2),
               "lse_unscaled": (np.log(np.exp(s * 4.0).sum(-1)), "e")}
    found = {}
    for name, (lse, base) in planted.items():
        c = compare_lse(lse.astype(np.float32), q, k, lse_base=base)
        found[name] = c.diagnoses[0].bug if c.diagnoses else "(none)"
    for merge in ("max", "sum", "last"):
        _, lse = _split_kv(q, k, v, 4, merge=merge)
        c = compare_lse(lse, q, k)
        found[f"lse_merge_{merge}"] = c.diagnoses[0].bug if c.diagnoses else "(none)"
    return found


def patterns() -> list[tuple[str, str, str, float]]:
    """(planted bug, headline, pattern, seconds) for the planted boundary bugs."""
    from testing.test_pattern import _attention, _qkv  # type: ignore[import-not-found]

    out = []
    q, k, v = _qkv(1, 4, 4, 16, 4096, 64)
    keep = np.ones((16, 4096), bool)
    keep[:, 4064:] = False
    t = time.perf_counter()
    c = compare_attention(_attention(q, k, v, keep).astype(np.float32), q, k, v)
    out.append(("last KV tile of 32 dropped (S=4096)", c.report().splitlines()[0], c.pattern,
                time.perf_counter() - t))
    t = time.perf_counter()
    c2 = compare_attention(_attention(q, k, v, keep).astype(np.float32), q, k, v,
                           diagnose_bugs=False)
    out.append(("same, diagnose_bugs=False", c2.report().splitlines()[0], c2.pattern,
                time.perf_counter() - t))
    q, k, v = _qkv(1, 8, 4, 16, 64, 16, seed=4)
    vb = v.copy()
    vb[:, 2] *= 1.5
    c = compare_attention(_attention(q, k, vb).astype(np.float32), q, k, v, enable_gqa=True)
    out.append(("key/value head 2 wrong (GQA 8/4)", c.report().splitlines()[0], c.pattern, 0.0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 20 if args.quick else 60
    t = time.perf_counter()
    rows, bad = lse_rounding(n)
    print(f"LSE rounding vs mpmath: {rows} rows (float32 and float64), {bad} differ "
          f"({time.perf_counter() - t:.1f} s)")
    t = time.perf_counter()
    checks, alarms = lse_false_alarms(n // 4)
    print(f"LSE false alarms: {alarms} of {checks} checks ({time.perf_counter() - t:.1f} s)")
    for planted, found in lse_bugs().items():
        print(f"LSE bug {planted}: diagnosed {found}")
    for planted, head, pat, sec in patterns():
        print(f"pattern: {planted}: {head} | {pat} | {sec:.2f} s")


if __name__ == "__main__":
    main()
