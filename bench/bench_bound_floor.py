"""What the tolerance model's bound cannot lose while its values stay bit-identical
(issue 29 item 1): its float64 transcendental passes and its BLAS products, timed alone
on the chunk shapes ``Plain.bound`` uses, against the bound itself and the baseline.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/bench_bound_floor.py [--runs 5] [--causal]

At (4, 8, 512, 512, 64) bf16 (unmasked: 64 chunks of 256 rows × 512 keys) each chunk of
the bound makes, whatever the fusion: two float64 ``np.exp`` (the exact weights; the
log-space perturbation Λ) and two ``np.expm1`` (the weights' relative errors; expm1(x))
over its (R, S) scores -- numpy's, since a libm's may differ in the last bit (on a CPU
without AVX-512 these are the libm's scalar functions) -- and four float64 GEMMs: the
scores q̄k̄ᵀ and |q̄||k̄|ᵀ (R×E·E×S), the moments p·[|v|, v, v²] (R×S·S×3Ev) and the
Hoeffding weights ·[v, v²] (R×S·S×2Ev), whose shapes fix the bits (BLAS sums rows in
another order in its tail kernels).  Prints CPU min / median (``time.process_time``) of
the bound, of the floor (those eight calls per chunk, on arrays allocated once), of the
baseline (torch float64 SDPA + ``assert_close``), and the load; also the like floors of
the dtype level (its float32 products and exps, its two float64 natural-scale products)
and of the certified reference's tier 1 (its two float64 products and an exp per score),
so that the three floors together say what no fusion can go below.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    import ml_dtypes
    import numpy as np
    import torch

    from mha_symbolic.testing.call import AttentionCall
    from mha_symbolic.testing.forward.plain import Plain
    from mha_symbolic.testing.tolerance import error_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    B, H, L, S, E = 4, 8, 512, 512, 64
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, L, E)).astype(ml_dtypes.bfloat16)
               .astype(np.float64) for _ in range(3))
    x = AttentionCall(q, k, v, is_causal=args.causal)
    pl = Plain(x)
    model = error_model("bfloat16").with_events(*pl.events())
    shapes = [(ch.q.shape[0], ch.restricted().k.shape[0])
              for ch in pl.chunks(pl._bound_chunk_scores())]
    bufs: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
    for R, Sk in set(shapes):
        s = rng.standard_normal((R, Sk)) * 3.0 - 3.0
        bufs[(R, Sk)] = (s, np.abs(s) * 2.0**-20, np.empty((R, Sk)),
                         rng.standard_normal((R, E)), rng.standard_normal((Sk, E)),
                         rng.standard_normal((Sk, 3 * E)))

    def floor() -> None:
        for R, Sk in shapes:
            s, small, out, qb, kb, rhs = bufs[(R, Sk)]
            np.exp(s, out=out)
            np.exp(s, out=out)
            np.expm1(small, out=out)
            np.expm1(small, out=out)
            qb @ kb.T
            np.abs(qb) @ np.abs(kb).T
            out @ rhs
            out @ rhs[:, E:]

    # the dtype level (fused kernel, bf16 in float32; one chunk per head, 512 × 512):
    # three score products and three exps (the plain/P-stored pair, the online order,
    # the √c split), four P·V products, and the natural scales' two float64 products
    n_heads = B * H
    f32 = [a.astype(np.float32) for a in (rng.standard_normal((L, E)),
                                          rng.standard_normal((S, E)),
                                          rng.standard_normal((L, S)) - 3.0)]
    p64, v64, o32 = rng.random((L, S)), rng.standard_normal((S, E)), np.empty((L, S),
                                                                             np.float32)

    def level_floor() -> None:
        q32, k32, s32 = f32
        for _ in range(n_heads):
            for _ in range(3):
                q32 @ k32.T
            np.exp(s32, out=o32)
            np.exp2(s32, out=o32)
            np.exp(s32, out=o32)
            for _ in range(4):
                o32 @ k32
            p64 @ v64
            p64 @ v64

    # the certified reference's tier 1 (blocks of 128 rows): G = q kᵀ, the exps (its own
    # exp_double; numpy's exp as a stand-in), N, A = w·[v', |v'|] (float64)
    ref_bufs = (rng.standard_normal((128, E)), rng.standard_normal((S, E)),
                rng.standard_normal((128, S)) - 3.0, np.empty((128, S)),
                rng.standard_normal((S, 2 * E)))

    def ref_floor() -> None:
        qr, kr, sr, outr, vcat = ref_bufs
        for _ in range(B * H * L // 128):
            qr @ kr.T
            np.exp(sr, out=outr)
            outr @ vcat

    tq, tk, tv = (torch.from_numpy(a).to(torch.bfloat16) for a in (q, k, v))
    with torch.no_grad():
        out_t = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv,
                                                                 is_causal=args.causal)

    def baseline() -> None:
        with torch.no_grad():
            ref = torch.nn.functional.scaled_dot_product_attention(
                tq.double(), tk.double(), tv.double(), is_causal=args.causal)
        with contextlib.suppress(AssertionError):
            torch.testing.assert_close(out_t, ref.to(out_t.dtype))

    res: dict[str, list[float]] = {"bound": [], "floor": [], "level floor": [],
                                   "ref floor": [], "baseline": []}
    fns = {"bound": lambda: pl.bound(model), "floor": floor, "level floor": level_floor,
           "ref floor": ref_floor, "baseline": baseline}
    for fn in fns.values():
        fn()                                      # warm-up
    for _ in range(args.runs):                    # interleaved
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            res[name].append(time.process_time() - t0)
    with open("/proc/loadavg") as fh:
        load = " ".join(fh.read().split()[:3])
    print(f"(4, 8, 512, 512, 64) bf16 {'causal' if args.causal else 'plain'}: "
          f"{len(shapes)} chunks, shapes {sorted(set(shapes))[:3]}; load {load}")
    for name, t in res.items():
        print(f"{name:11s} CPU min {min(t):.3f} / median {statistics.median(t):.3f} s")
    b, f, base = min(res["bound"]), min(res["floor"]), min(res["baseline"])
    allf = f + min(res["level floor"]) + min(res["ref floor"])
    print(f"bound's floor / bound {f / b:.2f}; bound's floor / baseline {f / base:.2f}x; "
          f"the three floors / baseline {allf / base:.2f}x")


if __name__ == "__main__":
    main()
