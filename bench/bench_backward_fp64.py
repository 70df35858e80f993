"""Issue 29 item 4: the fp64-rounded reference backward vs torch float64 autograd.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/bench_backward_fp64.py [--shape B H L S E]
        [--repeats N] [--save FILE.npz]

torch float64 autograd of SDPA (forward + backward) against the oracle's construction
plus ``.rounded("float64")`` of dq, dk, dv, float32-valued inputs (seed 0), one thread
on both sides; CPU and wall, min and median of ``--repeats`` runs; the oracle's time in
the Arb tier (``arb_rows``) and its calls; the load.  ``--save`` writes the rounded
gradients (to compare two trees bit for bit).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mha_symbolic import reference_attention_backward  # noqa: E402
from mha_symbolic.oracle.backward import attention as _att  # noqa: E402

torch.set_num_threads(1)


def _load() -> str:
    with open("/proc/loadavg") as fh:
        return fh.read().strip()


def _med(x: list[float]) -> float:
    return sorted(x)[len(x) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=5, default=[1, 8, 1024, 1024, 64],
                    metavar=("B", "H", "L", "S", "E"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--save", default=None)
    a = ap.parse_args()
    B, H, L, S, E = a.shape
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, L, E)).astype(np.float32)
    k = rng.standard_normal((B, H, S, E)).astype(np.float32)
    v = rng.standard_normal((B, H, S, E)).astype(np.float32)
    do = rng.standard_normal((B, H, L, E)).astype(np.float32)

    def torch_run() -> None:
        tq, tk, tv = (torch.from_numpy(x).double().requires_grad_(True) for x in (q, k, v))
        out = F.scaled_dot_product_attention(tq, tk, tv)
        torch.autograd.grad(out, (tq, tk, tv), torch.from_numpy(do).double())

    arb_log: list[tuple[str, int, float]] = []
    orig = _att._BackwardProblem.arb_rows

    def logged(self: Any, b: int, rows: list[int], prec: int, kind: str,
               cols: list[int] | None = None) -> Any:
        t0 = time.process_time()
        got = orig(self, b, rows, prec, kind, cols)
        arb_log.append((kind, prec, time.process_time() - t0))
        return got

    _att._BackwardProblem.arb_rows = logged  # type: ignore[method-assign]
    out: list[np.ndarray] = []

    def ours() -> tuple[float, float]:
        c0 = time.process_time()
        g = reference_attention_backward(q, k, v, do)
        c1 = time.process_time()
        out[:] = [e.rounded("float64") for e in g]
        return c1 - c0, time.process_time() - c1

    torch_run()
    ours()  # warm: compiled kernels loaded
    res: dict[str, tuple[list[float], list[float]]] = {}
    split: list[tuple[float, float, float, int]] = []
    for name, fn in (("torch float64 autograd", torch_run), ("oracle fp64-rounded", ours)):
        cpu, wall = [], []
        for _ in range(a.repeats):
            arb_log.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            got = fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if got is not None:
                split.append((got[0], got[1], sum(x[2] for x in arb_log), len(arb_log)))
        res[name] = (cpu, wall)
        print(f"{name}: CPU min {min(cpu):.3f} s, median {_med(cpu):.3f} s; "
              f"wall min {min(wall):.3f} s, median {_med(wall):.3f} s", flush=True)
    t_cpu, o_cpu = res["torch float64 autograd"][0], res["oracle fp64-rounded"][0]
    print(f"ratio (CPU) min/min {min(o_cpu) / min(t_cpu):.1f}x, "
          f"median/median {_med(o_cpu) / _med(t_cpu):.1f}x")
    s = sorted(split, key=lambda x: x[0] + x[1])[len(split) // 2]
    print(f"oracle split (median run, CPU): construction (tier 1) {s[0]:.3f} s, rounding "
          f"{s[1]:.3f} s, of which Arb tier {s[2]:.3f} s in {s[3]} arb_rows calls")
    print(f"shape {tuple(a.shape)}; threads OMP={os.environ.get('OMP_NUM_THREADS')} "
          f"torch={torch.get_num_threads()}; load: {_load()}")
    if a.save:
        np.savez(a.save, dq=out[0], dk=out[1], dv=out[2])


if __name__ == "__main__":
    main()
