"""``compare_attention`` against what users do today, at production sizes (issue 29).

    python bench/bench_compare.py                       # both shapes, bf16 + fp16, plain + causal
    python bench/bench_compare.py --shape small --runs 5
    python bench/bench_compare.py --shape big --runs 3 --dtypes bfloat16 --masks causal
    python bench/bench_compare.py --shape small --profile 25   # cProfile of one compare

The output under test is torch SDPA in bf16/fp16 (CPU).  The baseline is the float64
torch SDPA reference plus ``torch.testing.assert_close(out, ref.to(out.dtype))`` (its
defaults; a mismatch is caught, not counted).  ``compare_attention`` gets the torch
tensors as a user passes them (``diagnose_bugs`` at its default).  Both run in this
process, one after the other, each case once to warm up (imports, numba caches) and then
``--runs`` times: min and median of CPU time
(``time.process_time``) and wall time.  Threads are pinned before numpy is imported
(OMP/OpenBLAS/MKL_NUM_THREADS) and by ``torch.set_num_threads``: the same count on both
sides (``--threads``, default 1).  Peak memory: the resident set's high-water mark
above the RSS at the start of the call (Linux: VmHWM reset by /proc/self/clear_refs),
in MB, the worst over the runs.  The load (/proc/loadavg) is printed per case.
"""

from __future__ import annotations

import argparse
import os
import sys

_ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
_ap.add_argument("--shape", choices=["small", "big", "both"], default="both")
_ap.add_argument("--runs", type=int, default=5)
_ap.add_argument("--big-runs", type=int, default=None,
                 help="runs at the big shape (default: --runs)")
_ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
_ap.add_argument("--masks", nargs="+", default=["plain", "causal"])
_ap.add_argument("--threads", type=int, default=1)
_ap.add_argument("--profile", type=int, default=0, metavar="N",
                 help="cProfile one compare of the first case, print the top N entries")
ARGS = _ap.parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(ARGS.threads)

import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"small": (4, 8, 512, 512, 64), "big": (1, 16, 2048, 2048, 128)}


def _status_mb(key: str) -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def _reset_hwm() -> None:
    try:                     # reset the high-water mark to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def measure(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    """min/median CPU and wall over ``runs`` calls, and the worst peak RSS above start."""
    cpu, wall, peak = [], [], 0.0
    for _ in range(runs):
        _reset_hwm()
        base = _status_mb("VmRSS")
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        peak = max(peak, _status_mb("VmHWM") - base)
    return dict(cpu_min=min(cpu), cpu_med=statistics.median(cpu), wall_min=min(wall),
                wall_med=statistics.median(wall), peak_mb=peak, runs=runs)


def case(shape: tuple[int, ...], dtype: str, causal: bool, seed: int = 0
         ) -> tuple[Any, Any, Any, Any]:
    import torch

    B, H, L, S, E = shape
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(B, H, L, E, generator=g).to(dt)
    k = torch.randn(B, H, S, E, generator=g).to(dt)
    v = torch.randn(B, H, S, E, generator=g).to(dt)
    with torch.no_grad():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out, q, k, v


def baseline(out: Any, q: Any, k: Any, v: Any, causal: bool) -> bool:
    """What users do today: a float64 SDPA reference and torch.testing.assert_close."""
    import torch

    with torch.no_grad():
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), is_causal=causal)
    try:
        torch.testing.assert_close(out, ref.to(out.dtype))
    except AssertionError:
        return False
    return True


def main() -> None:
    import torch

    import mha_symbolic as ms

    assert ARGS is not None
    torch.set_num_threads(ARGS.threads)
    shapes = ["small", "big"] if ARGS.shape == "both" else [ARGS.shape]
    print(f"threads={ARGS.threads} (torch.set_num_threads and OMP/OPENBLAS/MKL_NUM_THREADS)")
    print("| shape | dtype | mask | baseline CPU min/med s | compare CPU min/med s | "
          "ratio (min, med) | wall baseline / compare min s | peak MB baseline / compare "
          "| passed (ours / assert_close) | runs | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in shapes:
        shape = SHAPES[name]
        runs = ARGS.runs if name == "small" or ARGS.big_runs is None else ARGS.big_runs
        for dtype in ARGS.dtypes:
            for mask in ARGS.masks:
                causal = mask == "causal"
                out, q, k, v = case(shape, dtype, causal)
                ok_base = [True]
                ok_ours = [True]

                def run_base() -> None:
                    ok_base[0] = baseline(out, q, k, v, causal)  # noqa: B023

                def run_ours() -> None:
                    ok_ours[0] = bool(ms.compare_attention(out, q, k, v,  # noqa: B023
                                                           is_causal=causal))  # noqa: B023

                run_base()              # warm-up (imports, numba caches) on both sides
                run_ours()
                if ARGS.profile:
                    import cProfile
                    import pstats

                    pr = cProfile.Profile()
                    pr.enable()
                    run_ours()
                    pr.disable()
                    pstats.Stats(pr).sort_stats("cumulative").print_stats(ARGS.profile)
                    pstats.Stats(pr).sort_stats("tottime").print_stats(ARGS.profile)
                    return
                mb = measure(run_base, runs)
                mo = measure(run_ours, runs)
                with open("/proc/loadavg") as fh:
                    load = fh.read().split()[:3]
                print(f"| {shape} | {dtype} | {mask} | {mb['cpu_min']:.3f} / {mb['cpu_med']:.3f}"
                      f" | {mo['cpu_min']:.3f} / {mo['cpu_med']:.3f} | "
                      f"{mo['cpu_min'] / mb['cpu_min']:.2f}×, "
                      f"{mo['cpu_med'] / mb['cpu_med']:.2f}× | "
                      f"{mb['wall_min']:.3f} / {mo['wall_min']:.3f} | "
                      f"{mb['peak_mb']:.0f} / {mo['peak_mb']:.0f} | "
                      f"{ok_ours[0]} / {ok_base[0]} | {runs} | {' '.join(load)} |",
                      flush=True)


if __name__ == "__main__":
    main()
