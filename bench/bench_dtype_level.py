"""The dtype level alone at (4, 8, 512, 512, 64), CPU s (``time [runs]``), or its
arrays saved for a byte comparison across trees (``save OUT.npz``; issue 29, h29e).

    OMP_NUM_THREADS=1 PYTHONPATH=<tree> python bench/bench_dtype_level.py time 3
"""

from __future__ import annotations

import os
import sys
import time

import ml_dtypes
import numpy as np

import mha_symbolic
from mha_symbolic.testing.call import AttentionCall
from mha_symbolic.testing.forward.emulated import dtype_level
from mha_symbolic.testing.forward.plain import Plain
from mha_symbolic.testing.tolerance import error_model

D = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
CASES = [("bfloat16", (2, 4, 4, 384, 384, 64), False, None, False, "fused", 1.0),
         ("float16", (1, 8, 2, 300, 777, 32), True, None, True, "fused", 1.0),
         ("float32", (2, 2, 2, 200, 900, 16), False, "bool", False, "fused", 1.0),
         ("bfloat16", (1, 4, 4, 1, 4096, 128), False, None, False, "fused", 1.0),
         ("float16", (1, 2, 2, 500, 500, 16), True, "float", False, "eager", 1.0),
         ("bfloat16", (1, 4, 4, 256, 1024, 64), True, None, False, "sequential", 1.0),
         ("float16", (1, 2, 2, 130, 200, 16), False, None, False, "fused", 300.0),
         ("float16", (1, 2, 2, 130, 200, 16), False, None, False, "fused", 1e-4),
         ("bfloat16", (1, 2, 2, 70, 65, 8), False, "float", False, "fused", 30.0),
         ("float32", (1, 2, 2, 100, 129, 16), True, None, False, "sequential", 1.0),
         ("float16", (1, 2, 2, 64, 100, 16), False, "bool", False, "eager", 2.0)]


def mk(dt, shape, causal=False, mask=None, gqa=False, seed=0, scale=1.0):
    B, Hq, Hkv, L, S, E = shape
    rng = np.random.default_rng(seed)
    q = (scale * rng.standard_normal((B, Hq, L, E))).astype(D[dt]).astype(np.float64)
    k, v = ((scale * rng.standard_normal((B, Hkv, S, E))).astype(D[dt]).astype(np.float64)
            for _ in range(2))
    attn = None
    if mask == "bool":
        attn = rng.random((L, S)) < 0.6
    elif mask == "float":
        attn = np.where(rng.random((L, S)) < 0.1, -np.inf,
                        np.round(rng.standard_normal((L, S))))
    return AttentionCall(q, k, v, attn_mask=attn, is_causal=causal, enable_gqa=gqa)


def timing(runs: int) -> None:
    for dt in ("bfloat16", "float16"):
        for causal in (False, True):
            x = mk(dt, (4, 8, 8, 512, 512, 64), causal)
            model = error_model(dt, kernel="fused").with_events(*Plain(x).events())
            ts = []
            for _ in range(runs):
                t0 = time.process_time()
                dtype_level(x, model)
                ts.append(time.process_time() - t0)
            print(dt, "causal" if causal else "none",
                  f"cpu min {min(ts):.3f} med {sorted(ts)[len(ts) // 2]:.3f}")


def save(path: str) -> None:
    out = {}
    for i, (dt, sh, causal, mask, gqa, ker, sc) in enumerate(CASES):
        x = mk(dt, sh, causal, mask, gqa, seed=i, scale=sc)
        pl = Plain(x)
        lev = dtype_level(x, error_model(dt, kernel=ker).with_events(*pl.events()))
        for j, o in enumerate(lev.outputs):
            out[f"{i}_o{j}"] = o
        out[f"{i}_a"], out[f"{i}_a2"], out[f"{i}_un"] = lev.a, lev.a2, lev.unstable
        t, u, w = lev.tolerance(pl.out)
        out[f"{i}_t"], out[f"{i}_u"], out[f"{i}_w"] = t, u, np.array(w)
    np.savez(path, **out)
    print("saved", len(out))


if __name__ == "__main__":
    print(mha_symbolic.__file__, "load", os.getloadavg())
    if sys.argv[1] == "time":
        timing(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    else:
        save(sys.argv[2])
