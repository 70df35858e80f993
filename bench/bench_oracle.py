"""Benchmark of the certified attention oracle (issues 6 and 11).

Run from the repository root:  python bench/bench_oracle.py  [--quick] [--skip-growth]
[--skip-memory] [--max-len 8192]

Every ratio is against plain numpy float64 attention (max-shifted softmax) on the
same inputs, measured in the same run with the same thread count on both sides
(OMP/OPENBLAS/MKL_NUM_THREADS = 1, set before numpy is imported; the oracle's
optional numba kernels are single-threaded).  CPU time is ``time.process_time``,
wall time ``time.perf_counter``; min and median over the runs; the load average is
printed beside every table (the machine is shared: absolute times vary, ratios
much less).

1. Speed at (2, 8, 256, 64), float32 inputs, variants plain / causal / q,k × 8:
   ``reference_attention(...).rounded("float32")`` and ``.rounded("float64")``,
   with the numba kernels and with the numpy twins only (MHA_SYMBOLIC_NUMBA=0).
2. Peak memory above the inputs at (1, 8, L, 64), L = 2048 and 4096, each in a
   fresh process (VmHWM - VmRSS before the call): numpy attention vs the oracle.
3. Growth with L = S (1, 8, L, 64) from 256 to --max-len, fp32-rounded (and
   fp64-rounded up to 2048): ratio to numpy at the same L, each point in a fresh
   process (best of 3 up to L = 1024, one run above).
Targets (issue 11): fp32-rounded <= 4x (stretch 3x), fp64-rounded <= 30x (stretch
15x); peak memory not above numpy's; the growth ratio not growing with L.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from mha_symbolic.oracle import reference_attention  # noqa: E402


def plain_attention(q: Any, k: Any, v: Any, causal: bool = False) -> Any:
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None], s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v


def oracle(q: Any, k: Any, v: Any, fmt: str, causal: bool = False) -> Any:
    return reference_attention(q, k, v, is_causal=causal, progress=False).rounded(fmt)


def inputs(B: int, H: int, L: int, S: int, E: int, seed: int = 0, mult: float = 1.0
           ) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((B, H, L, E)) * mult).astype(np.float32),
            (rng.standard_normal((B, H, S, E)) * mult).astype(np.float32),
            rng.standard_normal((B, H, S, E)).astype(np.float32))


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"cpu_min": min(cpu), "cpu_med": statistics.median(cpu),
            "wall_min": min(wall), "wall_med": statistics.median(wall)}


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:  # pragma: no cover
        return "n/a"


def _child_env(numba: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    if not numba:
        env["MHA_SYMBOLIC_NUMBA"] = "0"
    return env


def child(mode: str, L: int, repeat: int) -> None:
    """Run one measurement in this (fresh) process and print JSON."""
    q, k, v = inputs(1, 8, L, L, 64, seed=L)
    if mode != "numpy":  # warm up the kernels (numba compile or cache load, tables)
        oracle(q[:, :1, :8], k[:, :1, :8], v[:, :1, :8], mode)

    def rss(field: str) -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024.0
        return float("nan")  # pragma: no cover

    fn = (lambda: plain_attention(q, k, v)) if mode == "numpy" else (
        lambda: oracle(q, k, v, mode))
    before = rss("VmRSS")
    t = timed(fn, repeat)
    t["peak_mb"] = rss("VmHWM") - before
    print(json.dumps(t))


def run_child(mode: str, L: int, repeat: int, numba: bool = True) -> dict[str, Any]:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, str(L),
                          str(repeat)], capture_output=True, text=True, env=_child_env(numba),
                         timeout=7200)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def speed_table(repeat: int) -> None:
    from mha_symbolic.oracle.arith import jit

    B, H, L, E = 2, 8, 256, 64
    print(f"## speed at ({B}, {H}, {L}, {E}), float32 inputs, 1 thread; numpy {np.__version__}")
    print(f"load average before: {load()}; numba kernels: {jit.numba_active()}")
    print()
    print("| variant | numpy fp64 cpu min / med (ms) | fp32-rounded cpu min / med: ratio | "
          "fp64-rounded cpu min / med: ratio | fp32 wall ratio (min) | fp64 wall ratio (min) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, causal, mult in (("plain", False, 1.0), ("causal", True, 1.0),
                               ("q,k x8", False, 8.0)):
        q, k, v = inputs(B, H, L, L, E, seed=1, mult=mult)
        oracle(q[:, :1], k[:, :1], v[:, :1], "float64", causal)  # warm-up
        base = timed(lambda q=q, k=k, v=v, c=causal: plain_attention(q, k, v, c), 3 * repeat)
        r32 = timed(lambda q=q, k=k, v=v, c=causal: oracle(q, k, v, "float32", c), repeat)
        r64 = timed(lambda q=q, k=k, v=v, c=causal: oracle(q, k, v, "float64", c), repeat)
        print(f"| {name} | {base['cpu_min'] * 1e3:.1f} / {base['cpu_med'] * 1e3:.1f} | "
              f"{r32['cpu_min'] * 1e3:.0f} / {r32['cpu_med'] * 1e3:.0f} ms: "
              f"**{r32['cpu_min'] / base['cpu_min']:.2f}x** / "
              f"{r32['cpu_med'] / base['cpu_med']:.2f}x | "
              f"{r64['cpu_min'] * 1e3:.0f} / {r64['cpu_med'] * 1e3:.0f} ms: "
              f"**{r64['cpu_min'] / base['cpu_min']:.1f}x** / "
              f"{r64['cpu_med'] / base['cpu_med']:.1f}x | "
              f"{r32['wall_min'] / base['wall_min']:.2f}x | "
              f"{r64['wall_min'] / base['wall_min']:.1f}x |")
    print(f"\nload average after: {load()}")


def numpy_only_table(repeat: int) -> None:
    """The same plain case with the numpy twins only (numba disabled), in a child."""
    code = (
        "import os, sys, json; sys.argv=['x']; "
        f"sys.path.insert(0, {ROOT!r}); "
        "import runpy; m = runpy.run_path(" + repr(os.path.abspath(__file__)) + ", run_name='b'); "
        f"q, k, v = m['inputs'](2, 8, 256, 256, 64, seed=1); "
        "m['oracle'](q[:, :1], k[:, :1], v[:, :1], 'float64'); "
        f"b = m['timed'](lambda: m['plain_attention'](q, k, v), {3 * repeat}); "
        f"r32 = m['timed'](lambda: m['oracle'](q, k, v, 'float32'), {repeat}); "
        f"r64 = m['timed'](lambda: m['oracle'](q, k, v, 'float64'), {repeat}); "
        "print(json.dumps([b, r32, r64]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_child_env(numba=False), timeout=3600)
    if out.returncode != 0:
        print("numpy-only run failed:", out.stderr.strip().splitlines()[-1:])
        return
    b, r32, r64 = json.loads(out.stdout.strip().splitlines()[-1])
    print("\n## the same, plain variant, numpy twins only (MHA_SYMBOLIC_NUMBA=0)\n")
    print(f"numpy fp64 {b['cpu_min'] * 1e3:.1f} ms; fp32-rounded "
          f"**{r32['cpu_min'] / b['cpu_min']:.2f}x** (median {r32['cpu_med'] / b['cpu_med']:.2f}x); "
          f"fp64-rounded **{r64['cpu_min'] / b['cpu_min']:.1f}x** "
          f"(median {r64['cpu_med'] / b['cpu_med']:.1f}x); load {load()}")


def memory_table() -> None:
    print("\n## peak memory above the inputs, (1, 8, L, 64) float32 inputs, fresh process each\n")
    print("| L | numpy fp64 attention | oracle fp32-rounded | oracle fp64-rounded |")
    print("|---:|---:|---:|---:|")
    for L in (2048, 4096):
        cells = []
        for mode in ("numpy", "float32", "float64"):
            r = run_child(mode, L, 1)
            cells.append(r.get("error") or f"+{r['peak_mb']:.0f} MB ({r['cpu_min']:.1f} s cpu)")
        print(f"| {L} | " + " | ".join(cells) + " |")
    print(f"\nload average: {load()}")


def growth_table(max_len: int) -> None:
    print("\n## growth with L = S, (1, 8, L, 64) float32 inputs, fresh process per point\n")
    print("| L | numpy cpu (s) | fp32-rounded cpu (s) | fp32 ratio | fp64-rounded cpu (s) | "
          "fp64 ratio | numpy peak | fp32 peak |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    L = 256
    while max_len >= L:
        rep = 3 if L <= 1024 else 1
        base = run_child("numpy", L, rep)
        r32 = run_child("float32", L, rep)
        r64 = run_child("float64", L, rep) if L <= 2048 else {"error": "not run"}

        def cell(r: dict[str, Any], key: str = "cpu_min") -> str:
            return r["error"] if "error" in r else f"{r[key]:.3f}"

        def ratio(r: dict[str, Any], base: dict[str, Any] = base) -> str:
            if "error" in r or "error" in base:
                return "-"
            return f"{r['cpu_min'] / base['cpu_min']:.2f}x"

        def peak(r: dict[str, Any]) -> str:
            return "-" if "error" in r else f"+{r['peak_mb']:.0f} MB"

        print(f"| {L} | {cell(base)} | {cell(r32)} | {ratio(r32)} | {cell(r64)} | {ratio(r64)} | "
              f"{peak(base)} | {peak(r32)} |", flush=True)
        L *= 2
    print(f"\nload average: {load()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer runs, growth up to 1024")
    ap.add_argument("--skip-growth", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "L", "REPEAT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    t0 = time.perf_counter()
    repeat = 3 if args.quick else 5
    speed_table(repeat)
    numpy_only_table(repeat)
    if not args.skip_memory and not args.quick:
        memory_table()
    if not args.skip_growth:
        growth_table(1024 if args.quick else args.max_len)
    print(f"\ntotal bench time: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
