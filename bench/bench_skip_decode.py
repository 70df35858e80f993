"""Issue 29 items 2 and 5: causal block skipping and the decode set-up.

    python bench/bench_skip_decode.py                  # all three parts, 3 runs each
    python bench/bench_skip_decode.py --runs 5 --parts causal decode

1. ``causal``: ``reference_attention(...).rounded("float32")`` at (1, 8, L, 64), L = S =
   --len (4096), float32 inputs: unmasked, causal, and causal with the block skipping
   switched off (``ScoreModel.block_keys`` handing out every key; only in a tree that
   has it).  Ratios causal / unmasked.
1b. ``causal64``: the same fp64-rounded at (1, 2, 2048, 2048, 64) (float32 inputs: tier
   2 by rows refines almost every row), unmasked, causal, causal without skipping.
2. ``decode``: (1, 32 query heads, 8 kv heads, L = 1, S = 4096, E = 128), float32
   inputs, GQA (``decode_small``: many small heads, (8, 64 query heads, 1 kv head,
   S = 512, E = 64), MQA): ``reference_attention(..., enable_gqa=True).rounded("float32")`` against
   numpy float64 attention (the query heads of a group against their key head by one
   broadcast matmul, no copies) and torch SDPA in float64 (``enable_gqa=True``).
3. ``bound``: the tolerance model alone (``Plain.bound``) at (1, 8, 2048, 2048, 64) bf16,
   unmasked, causal, and causal without the restriction (``Chunk.restricted`` switched
   off).

One thread on every side (OMP/OpenBLAS/MKL_NUM_THREADS = 1 before numpy is imported,
``torch.set_num_threads(1)``); each case once to warm up, then --runs times: min and
median of CPU time (``time.process_time``) and wall time; the load average
(/proc/loadavg) is printed with each line: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mha_symbolic import reference_attention  # noqa: E402


def _load() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return fh.read().split()[0]
    except OSError:
        return "?"


def measure(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    fn()
    cpu, wall = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"cpu_min": min(cpu), "cpu_med": statistics.median(cpu),
            "wall_min": min(wall), "wall_med": statistics.median(wall)}


def show(name: str, m: dict[str, float], base: dict[str, float] | None = None,
         base_name: str = "") -> None:
    line = (f"  {name:<34} CPU min {m['cpu_min']:8.4f} s  med {m['cpu_med']:8.4f} s   "
            f"wall min {m['wall_min']:8.4f} s  med {m['wall_med']:8.4f} s")
    if base is not None:
        line += (f"   /{base_name}: CPU {m['cpu_min'] / base['cpu_min']:.2f}x (min) "
                 f"{m['cpu_med'] / base['cpu_med']:.2f}x (med)")
    print(line + f"   load {_load()}", flush=True)


class _NoSkip:
    """Switch the block skipping off while inside (a no-op in a tree without it)."""

    def __enter__(self) -> bool:
        from mha_symbolic.oracle.conventions import ScoreModel
        from mha_symbolic.testing.forward import plain
        self.saved: list[tuple[Any, str, Any]] = []
        if hasattr(ScoreModel, "block_keys"):
            self.saved.append((ScoreModel, "block_keys", ScoreModel.block_keys))
            ScoreModel.block_keys = lambda self, c, rows: (  # type: ignore[method-assign]
                self.block(c, rows), 0, self.S)
        from mha_symbolic.oracle.forward import attention
        if hasattr(attention, "restrict_keys"):
            self.saved.append((attention, "restrict_keys", attention.restrict_keys))
            attention.restrict_keys = lambda blk, S: (blk, 0, S)  # type: ignore[attr-defined]
        if hasattr(plain.Chunk, "restricted"):
            self.saved.append((plain.Chunk, "restricted", plain.Chunk.restricted))
            plain.Chunk.restricted = lambda self: self  # type: ignore[method-assign]
        return bool(self.saved)

    def __exit__(self, *exc: Any) -> None:
        for obj, name, val in self.saved:
            setattr(obj, name, val)


def part_causal(runs: int, L: int) -> None:
    print(f"1. oracle fp32-rounded at (1, 8, {L}, {L}, 64), float32 inputs")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, L, 64)).astype(np.float32) for _ in range(3))
    plain = measure(lambda: reference_attention(q, k, v).rounded("float32"), runs)
    show("unmasked", plain)
    causal = measure(lambda: reference_attention(q, k, v, is_causal=True).rounded("float32"),
                     runs)
    show("causal", causal, plain, "unmasked")
    with _NoSkip() as has:
        if has:
            noskip = measure(lambda: reference_attention(q, k, v, is_causal=True).rounded(
                "float32"), runs)
            show("causal, skipping off", noskip, plain, "unmasked")


def part_causal64(runs: int) -> None:
    print("1b. oracle fp64-rounded at (1, 2, 2048, 2048, 64), float32 inputs (tier 2 by rows)")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 2048, 64)).astype(np.float32) for _ in range(3))
    plain = measure(lambda: reference_attention(q, k, v).rounded("float64"), runs)
    show("unmasked", plain)
    show("causal", measure(lambda: reference_attention(q, k, v, is_causal=True).rounded(
        "float64"), runs), plain, "unmasked")
    with _NoSkip() as has:
        if has:
            show("causal, skipping off", measure(lambda: reference_attention(
                q, k, v, is_causal=True).rounded("float64"), runs), plain, "unmasked")


def part_decode(runs: int, B: int = 1, H: int = 32, Hk: int = 8, S: int = 4096,
                E: int = 128) -> None:
    import torch
    torch.set_num_threads(1)
    print(f"2. decode ({B}, {H} q heads / {Hk} kv heads, L = 1, S = {S}, {E}), float32 inputs")
    rng = np.random.default_rng(1)
    q = rng.standard_normal((B, H, 1, E)).astype(np.float32)
    k, v = (rng.standard_normal((B, Hk, S, E)).astype(np.float32) for _ in range(2))

    def numpy64() -> Any:
        q64 = q.astype(np.float64).reshape(B, Hk, H // Hk, E)     # (b, kv head, group, E)
        k64, v64 = k.astype(np.float64), v.astype(np.float64)
        s = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(float(E))
        s -= s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        return (p @ v64).reshape(B, H, 1, E)

    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))

    def torch64() -> Any:
        return torch.nn.functional.scaled_dot_product_attention(
            tq.double(), tk.double(), tv.double(), enable_gqa=True)

    ref = numpy64()
    got = reference_attention(q, k, v, enable_gqa=True).rounded("float64")
    assert np.allclose(ref, got, rtol=1e-12, atol=1e-13)
    m_np = measure(numpy64, runs)
    show("numpy float64", m_np)
    m_t = measure(torch64, runs)
    show("torch SDPA float64", m_t, m_np, "numpy")
    for dt in ("float32", "float64"):
        m = measure(lambda dt=dt: reference_attention(q, k, v, enable_gqa=True).rounded(dt),
                    runs)
        show(f"oracle rounded {dt}", m, m_np, "numpy")
        print(f"  {'':<34} /torch: CPU {m['cpu_min'] / m_t['cpu_min']:.2f}x (min) "
              f"{m['cpu_med'] / m_t['cpu_med']:.2f}x (med)")


def part_bound(runs: int) -> None:
    import ml_dtypes

    try:                     # this tree, or one from before testing/call.py
        from mha_symbolic.testing.call import AttentionCall as AttentionInputs
        from mha_symbolic.testing.forward.plain import Plain
    except ImportError:
        from mha_symbolic.testing.forward.plain import (  # type: ignore[attr-defined,no-redef]
            AttentionInputs,
            Plain,
        )
    from mha_symbolic.testing.tolerance import error_model
    print("3. the tolerance model alone (Plain.bound) at (1, 8, 2048, 2048, 64) bf16")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 8, 2048, 64)).astype(ml_dtypes.bfloat16).astype(
        np.float64) for _ in range(3))
    res = {}
    for name, causal in (("unmasked", False), ("causal", True)):
        pl = Plain(AttentionInputs(q, k, v, is_causal=causal))
        model = error_model("bfloat16").with_events(*pl.events())
        res[name] = measure(lambda pl=pl, model=model: pl.bound(model), runs)
        show(name, res[name], res.get("unmasked") if causal else None, "unmasked")
    with _NoSkip() as has:
        if has:
            pl = Plain(AttentionInputs(q, k, v, is_causal=True))
            model = error_model("bfloat16").with_events(*pl.events())
            show("causal, skipping off", measure(lambda: pl.bound(model), runs),
                 res["unmasked"], "unmasked")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--len", type=int, default=4096, help="L = S of part 1")
    ap.add_argument("--parts", nargs="+", default=["causal", "causal64", "decode", "bound"],
                    choices=["causal", "causal64", "decode", "decode_small", "bound"])
    args = ap.parse_args()
    print(f"tree {Path(__file__).resolve().parents[1]}, runs {args.runs}, 1 thread")
    if "causal" in args.parts:
        part_causal(args.runs, args.len)
    if "causal64" in args.parts:
        part_causal64(args.runs)
    if "decode" in args.parts:
        part_decode(args.runs)
    if "decode_small" in args.parts:
        part_decode(args.runs, 8, 64, 1, 512, 64)
    if "bound" in args.parts:
        part_bound(args.runs)


if __name__ == "__main__":
    main()
