"""Benchmark of the certified attention oracle (issue 6).

Run from the repository root:  python bench/bench_oracle.py  [--quick]

Measures, in one run and on the same fp32 inputs:
  (a) plain numpy float64 attention (max-shifted softmax), the baseline;
  (b) a straightforward mpmath reference at 128 bits (enough to decide float64
      rounding in all but rare cases) -- timed on a small shape and scaled by its
      cost model, because at the full shape it would take hours;
  (c) reference_attention(...).rounded("float32"): certified, correctly rounded fp32;
  (d) reference_attention(...).rounded("float64"): certified, correctly rounded fp64;
then how (c) and (d) grow with L = S from 64 to 1024 (batch 1, 2 heads, E = 64).
Prints ratios against (a) measured in the same run; no absolute-time claims.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mha_symbolic.oracle import reference_attention


def plain_attention(q: Any, k: Any, v: Any) -> Any:
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v


def mpmath_attention(q: Any, k: Any, v: Any, prec: int = 128) -> Any:
    import mpmath

    mpmath.mp.prec = prec
    B, H, L, E = q.shape
    S, Ev = v.shape[-2:]
    c = 1 / mpmath.sqrt(E)
    out = np.empty((B, H, L, Ev), dtype=object)
    for b in range(B):
        for h in range(H):
            K = [[mpmath.mpf(float(x)) for x in row] for row in k[b, h]]
            V = [[mpmath.mpf(float(x)) for x in row] for row in v[b, h]]
            for i in range(L):
                qi = [mpmath.mpf(float(x)) for x in q[b, h, i]]
                s = [c * mpmath.fsum(a * bb for a, bb in zip(qi, K[j], strict=False)) for j in range(S)]
                m = max(s)
                w = [mpmath.exp(x - m) for x in s]
                d = mpmath.fsum(w)
                for col in range(Ev):
                    out[b, h, i, col] = mpmath.fsum(w[j] * V[j][col] for j in range(S)) / d
    return out


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def inputs(B: int, H: int, L: int, S: int, E: int, seed: int = 0) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, L, E)).astype(np.float32),
            rng.standard_normal((B, H, S, E)).astype(np.float32),
            rng.standard_normal((B, H, S, E)).astype(np.float32))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller growth series (CI smoke)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    B, H, L, E = 2, 8, 256, 64
    q, k, v = inputs(B, H, L, L, E)
    print(f"shape: batch {B}, heads {H}, L = S = {L}, E = {E}, fp32 inputs; numpy {np.__version__}")

    t_a = best_of(lambda: plain_attention(q, k, v), 7)
    t_c = best_of(lambda: reference_attention(q, k, v).rounded("float32"), 5)
    t_d = best_of(lambda: reference_attention(q, k, v).rounded("float64"), 2)

    # (b) on 1 head, L = S = 16, E = 64; cost model: time ∝ B·H·L·S·(E + Ev + 1)
    qs, ks, vs = inputs(1, 1, 16, 16, E, seed=1)
    t_b_small = best_of(lambda: mpmath_attention(qs, ks, vs), 1)
    units = lambda b, h, l, s, e, ev: b * h * l * s * (e + ev + 1)  # noqa: E731
    t_b = t_b_small * units(B, H, L, L, E, E) / units(1, 1, 16, 16, E, E)

    print()
    print("| method | time (s) | ratio to (a) |")
    print("|---|---:|---:|")
    print(f"| (a) numpy float64 attention (best of 7) | {t_a:.4f} | 1 |")
    print(f"| (b) mpmath 128-bit reference (scaled from 1x1x16x16: {t_b_small:.2f} s) "
          f"| {t_b:.0f} | {t_b / t_a:.0f} |")
    print(f"| (c) oracle, correctly rounded float32 (best of 5) | {t_c:.3f} | {t_c / t_a:.1f} |")
    print(f"| (d) oracle, correctly rounded float64 (best of 2) | {t_d:.2f} | {t_d / t_a:.0f} |")
    print()
    print(f"targets: (c) <= 10x (a): {t_c / t_a:.1f}x; (d) <= 300x (a): {t_d / t_a:.0f}x; "
          f"(b)/(c) = {t_b / t_c:.0f}x, (b)/(d) = {t_b / t_d:.0f}x (target >= 100x)")

    print()
    print("growth with L = S (batch 1, heads 2, E = 64):")
    print("| L | (a) s | (c) s | (c)/(a) | (d) s | (d)/(a) |")
    print("|---:|---:|---:|---:|---:|---:|")
    lengths = [64, 128, 256] if args.quick else [64, 128, 256, 512, 1024]
    for n in lengths:
        qg, kg, vg = inputs(1, 2, n, n, E, seed=n)
        ta = best_of(lambda qg=qg, kg=kg, vg=vg: plain_attention(qg, kg, vg), 5)
        tc = best_of(lambda qg=qg, kg=kg, vg=vg: reference_attention(qg, kg, vg)
                     .rounded("float32"), 2)
        td = best_of(lambda qg=qg, kg=kg, vg=vg: reference_attention(qg, kg, vg)
                     .rounded("float64"), 1)
        print(f"| {n} | {ta:.4f} | {tc:.3f} | {tc / ta:.1f} | {td:.2f} | {td / ta:.0f} |")
    print()
    print(f"total bench time: {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
