"""Issue 22: are the verdicts as tight as the kernels?  Correct kernels and realistic
precision bugs, written from real kernels' code by an engineer who had not read the
error model (bench/verdict_kernels.py), judged by ours and by the rules of other test
suites on the same outputs.

    python bench/bench_tight.py            # the quick grid (a few minutes)
    python bench/bench_tight.py --full     # the recorded grid (bench/RESULTS.md)

For every dtype × S × input kind (standard normal, LLM-like outlier channels,
shifted values; causal and GQA mixed in) every correct kernel and every mutant runs
on the same inputs:

* a correct kernel judged "fail" by ours is a false alarm; "no verdict"
  (ToleranceError) a refusal; the largest error/tolerance is the tightness;
* a mutant is *visible* when max|mutant − exact| ≥ 10 × max|naive_fp32acc − exact| (the
  correct same-dtype kernel on the same inputs), or when it breaks the dtype promise;
  a visible mutant judged "pass" by ours is a missed bug;
* beside ours, on the same outputs: torch.testing.assert_close's defaults against the
  exact answer rounded to the dtype (rtol/atol by dtype, check_dtype=True), and
  FlashAttention's rule, max|out − exact| ≤ 2·max|naive same-dtype − exact|.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import verdict_kernels as vk  # noqa: E402

from mha_symbolic import ToleranceError, compare_attention, reference_attention  # noqa: E402

TT = {"float64": (1e-7, 1e-7), "float32": (1.3e-6, 1e-5), "float16": (1e-3, 1e-5),
      "bfloat16": (1.6e-2, 1e-5)}


def _name(dt: np.dtype) -> str:
    return "bfloat16" if dt == vk.BF16 else dt.name


def torch_testing(out: np.ndarray, exact: np.ndarray, dt_in: str) -> bool:
    """torch.testing.assert_close's default rule (check_dtype=True)."""
    if _name(out.dtype) != dt_in:
        return False
    rtol, atol = TT[dt_in]
    o = out.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.abs(o - exact) <= atol + rtol * np.abs(exact)
    return bool(np.all(ok | (np.isnan(o) & np.isnan(exact))))


def flash2(out: np.ndarray, exact: np.ndarray, lp_err: float) -> bool:
    o = out.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return bool(np.nanmax(np.abs(o - exact), initial=0.0) <= 2 * lp_err)


#: the options that describe a correct kernel that is not tiled (the default)
OPTIONS = {"sequential_fp32": {"kernel": "sequential"}, "eager_lowp": {"kernel": "eager"}}


def ours(out: np.ndarray, q: Any, k: Any, v: Any, causal: Any, **opts: Any) -> tuple[str, float]:
    kw: dict[str, Any] = {"enable_gqa": q.shape[1] != k.shape[1], **opts}
    if causal:
        kw.update(is_causal=True, causal_alignment="top_left" if causal is True else causal)
    try:
        c = compare_attention(out, q, k, v, **kw)
    except ToleranceError:
        return "refused", float("nan")
    return ("pass" if c.passed else "fail"), (c.worst.ratio if c.worst else 0.0)


def run(dtypes: list[str], sizes: list[int], Ls: list[int], kinds: list[str], seeds: int,
        H: int, E: int) -> None:
    rng = np.random.default_rng(22)
    good: dict[tuple[str, int], dict[str, Any]] = defaultdict(
        lambda: {"n": 0, "fa": 0, "ref": 0, "tight": 0.0, "tt_fa": 0, "fl_fa": 0})
    bad: dict[tuple[str, int], dict[str, Any]] = defaultdict(
        lambda: {"vis": 0, "ours": 0, "tt": 0, "fl": 0, "missed": []})
    t0 = time.time()
    for dname in dtypes:
        dt = vk.as_dtype(dname)
        for S in sizes:
            for L in Ls:
                for kind in kinds:
                    for seed in range(seeds):
                        causal: Any = False
                        H_kv = H
                        if seed % 3 == 1:
                            causal = "bottom_right" if L <= S else True
                        if seed % 3 == 2 and H % 2 == 0:
                            H_kv = H // 2
                        q, k, v = vk.draw(rng, 1, H, H_kv, L, S, E, dt, kind)
                        kw = {"enable_gqa": H_kv != H}
                        if causal:
                            kw.update(is_causal=True, causal_alignment="top_left"
                                      if causal is True else causal)
                        exact = reference_attention(q, k, v, **kw).midpoint
                        lp = vk.naive_fp32acc(q, k, v, causal=causal, dtype=dt)
                        lp_err = float(np.nanmax(np.abs(lp.astype(np.float64) - exact),
                                                 initial=0.0))
                        key = (dname, S)
                        for name, fn in vk.CORRECT.items():
                            try:
                                out = fn(q, k, v, causal=causal, dtype=dt)
                            except ImportError:
                                continue
                            verdict, ratio = ours(out, q, k, v, causal, **OPTIONS.get(name, {}))
                            g = good[key]
                            g["n"] += 1
                            g["fa"] += verdict == "fail"
                            g["ref"] += verdict == "refused"
                            if verdict == "refused":
                                print(f"  REFUSED {name} {dname} S={S} L={L} {kind} "
                                      f"seed={seed} causal={causal} H_kv={H_kv}")
                            if verdict == "fail":
                                print(f"  FALSE ALARM {name} {dname} S={S} L={L} {kind} "
                                      f"seed={seed} causal={causal} H_kv={H_kv} ratio={ratio:.3g}")
                            if ratio == ratio:
                                g["tight"] = max(g["tight"], ratio)
                            g["tt_fa"] += not torch_testing(out, exact, dname)
                            g["fl_fa"] += not flash2(out, exact, lp_err)
                        for name, (fn, _cls) in vk.BUGGY.items():
                            if dt not in vk.MUTANT_DTYPES.get(name, ()):
                                continue
                            out = fn(q, k, v, causal=causal, dtype=dt)
                            promise = _name(out.dtype) != dname
                            with np.errstate(invalid="ignore"):
                                o = out.astype(np.float64)
                                e = float(np.nanmax(np.abs(o - exact), initial=0.0))
                                nan_diff = bool(np.any(np.isnan(o) != np.isnan(exact)))
                            if not (promise or nan_diff or e >= 10 * max(lp_err, 1e-300)):
                                continue
                            verdict, ratio = ours(out, q, k, v, causal)
                            b = bad[key]
                            b["vis"] += 1
                            caught = verdict == "fail"
                            b["ours"] += caught
                            b["tt"] += not torch_testing(out, exact, dname)
                            b["fl"] += not flash2(out, exact, lp_err)
                            if not caught:
                                b["missed"].append(f"{name}({kind},L={L},{verdict},"
                                                   f"{e / max(lp_err, 1e-300):.3g}x)")
        print(f"  [{dname} done, {time.time() - t0:.0f} s]", flush=True)
    print()
    print("Correct kernels: false alarms (ours / torch.testing / FA 2x), refusals, "
          "tightness (worst error / our tolerance)")
    print(f"{'dtype':9} {'S':>5} {'runs':>5} {'ours':>5} {'tt':>5} {'fa2':>5} {'refused':>7} "
          f"{'tight':>7}")
    for (d, S), g in sorted(good.items(), key=lambda t: (dtypes.index(t[0][0]), t[0][1])):
        print(f"{d:9} {S:5d} {g['n']:5d} {g['fa']:5d} {g['tt_fa']:5d} {g['fl_fa']:5d} "
              f"{g['ref']:7d} {g['tight']:7.3f}")
    print()
    print("Visible bugs: caught by ours / torch.testing / FA 2x")
    print(f"{'dtype':9} {'S':>5} {'vis':>5} {'ours':>5} {'tt':>5} {'fa2':>5}")
    for (d, S), b in sorted(bad.items(), key=lambda t: (dtypes.index(t[0][0]), t[0][1])):
        print(f"{d:9} {S:5d} {b['vis']:5d} {b['ours']:5d} {b['tt']:5d} {b['fl']:5d}  "
              + (" missed: " + ", ".join(b["missed"][:6]) if b["missed"] else ""))
    G = sum(g["n"] for g in good.values())
    FA = sum(g["fa"] for g in good.values())
    V = sum(b["vis"] for b in bad.values())
    C = sum(b["ours"] for b in bad.values())
    print(f"\ntotal: {G} correct runs, {FA} false alarms; {V} visible bugs, {C} caught "
          f"({100.0 * C / max(V, 1):.1f} %); min tightness over cells "
          f"{min((g['tight'] for g in good.values()), default=0):.3f}; "
          f"{time.time() - t0:.0f} s wall, load {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--dtypes", default=None)
    ap.add_argument("--sizes", default=None)
    a = ap.parse_args()
    if a.full:
        sizes, Ls, seeds = [1, 16, 256, 1024, 2048, 4096, 8192], [1, 32], 3
    else:
        sizes, Ls, seeds = [1, 16, 256, 2048, 8192], [1, 16], 2
    if a.sizes:
        sizes = [int(s) for s in a.sizes.split(",")]
    dtypes = (a.dtypes.split(",") if a.dtypes else ["float32", "float16", "bfloat16"])
    print(f"bench_tight: dtypes {dtypes}, S {sizes}, L {Ls}, {seeds} seeds per kind, "
          f"H 4, E 64, kinds normal/llm/shifted")
    run(dtypes, sizes, Ls, ["normal", "llm", "shifted"], seeds, 4, 64)


if __name__ == "__main__":
    main()
