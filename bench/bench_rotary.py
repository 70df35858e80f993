"""Rotary embeddings (issue 24 item 3): rounding agreement with an independent mpmath
loop, false alarms on RoPE written as real code writes it (HF rotate_half with fp32
inv_freq/cos/sin, GPT-J interleaved, FlashAttention-style tables, partial rotary_dim,
position scaling), each rotary bug class caught and named, tightness (observed error /
tolerance of the correct kernels, median and max), and the reference's speed against
plain attention measured in the same run.

    python bench/bench_rotary.py [--cases N] [--seeds N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

import torch  # noqa: E402
from rotary_kernels import BUGS, fa_tables_attention, hf_attention  # noqa: E402
from rotary_reference import rotary_attention, rounded  # noqa: E402

import mha_symbolic as ms  # noqa: E402
from mha_symbolic.errors import ToleranceError  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KERNELS = {
    "hf_neox": ({"base": 10000.0}, {"rotary_base": 10000.0}),
    "gptj": ({"base": 10000.0, "interleaved": True},
             {"rotary_base": 10000.0, "rotary_interleaved": True}),
    "hf_partial16": ({"base": 10000.0, "rotary_dim": 16},
                     {"rotary_base": 10000.0, "rotary_dim": 16}),
    "hf_rdim24": ({"base": 10000.0, "rotary_dim": 24},
                  {"rotary_base": 10000.0, "rotary_dim": 24}),
    "llama3_scaled": ({"base": 500000.0, "scale": 8.0},
                      {"rotary_base": 500000.0, "rotary_position_scale": 8.0}),
    "fp32_rotation": ({"base": 10000.0, "fp32_rotation": True}, {"rotary_base": 10000.0}),
}


def agreement(cases: int) -> tuple[int, int]:
    rng = np.random.default_rng(7)
    same = total = 0
    for n in range(cases):
        L, S = int(rng.integers(1, 4)), int(rng.integers(4, 8))
        E = int(rng.choice([4, 6, 8]))
        r = int(rng.choice([x for x in (2, 4, E) if x <= E]))
        inter = bool(rng.integers(0, 2))
        q = rng.standard_normal((1, 1, L, E)).astype(np.float32)
        k = rng.standard_normal((1, 1, S, E)).astype(np.float32)
        v = rng.standard_normal((1, 1, S, E)).astype(np.float32)
        if n % 2:
            ang = rng.uniform(0, 40, (S, r // 2))
            cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
            kw = {"rotary_cos": cos, "rotary_sin": sin, "rotary_interleaved": inter}
            rk = {"cos": cos, "sin": sin, "interleaved": inter}
        else:
            base = float(rng.choice([10.0, 500.0, 10000.0]))
            sc = float(rng.choice([1.0, 2.0]))
            kw = {"rotary_base": base, "rotary_dim": r, "rotary_interleaved": inter,
                  "rotary_position_scale": sc}
            rk = {"base": base, "rotary_dim": r, "interleaved": inter, "scale_pos": sc}
        ref = rotary_attention(q[0, 0], k[0, 0], v[0, 0], **rk)
        enc = ms.reference_attention(q, k, v, **kw)
        for dt in ("float32", "float64"):
            total += 1
            same += bool(np.array_equal(enc.rounded(dt)[0, 0], rounded(ref, dt)))
    return same, total


def _ratio(res) -> float:
    w = res.worst
    return float("nan") if w is None else w.error / w.tolerance


def false_alarms(seeds: int) -> None:
    print("\nfalse alarms on real-style RoPE (checks failed / total), tightness = observed "
          "error / tolerance of the correct kernel (median, max over checks)")
    print(f"{'kernel':16s} {'dtype':9s} {'false':>6s} {'vacuous':>8s} {'median':>9s} "
          f"{'max':>9s}")
    shapes = [(8, 64), (1, 300), (16, 1024)]
    for name, (kern, ours) in [*KERNELS.items(), ("fa_tables", (None, None)),
                               ("fa_tables_gptj", (None, None))]:
        for dn, dt in DTYPES.items():
            fails = vac = n = 0
            ratios = []
            for seed in range(seeds):
                for L, S in shapes:
                    g = torch.Generator().manual_seed(seed * 31 + S)
                    q, k, v = (torch.randn(1, 2, m, 32, generator=g).to(dt) for m in (L, S, S))
                    if ours is None:
                        ang = torch.rand(S, 8, generator=g) * 2 * torch.pi * 60
                        cos, sin = ang.cos().to(dt), ang.sin().to(dt)
                        inter = name.endswith("gptj")
                        out = fa_tables_attention(q, k, v, cos, sin, interleaved=inter)
                        kw = {"rotary_cos": cos, "rotary_sin": sin, "rotary_interleaved": inter}
                    else:
                        out = hf_attention(q, k, v, **kern)
                        kw = ours
                    n += 1
                    try:
                        res = ms.compare_attention(out, q, k, v, **kw)
                    except ToleranceError:
                        vac += 1
                        continue
                    fails += not res.passed
                    ratios.append(_ratio(res))
            med = float(np.median(ratios)) if ratios else float("nan")
            mx = float(np.max(ratios)) if ratios else float("nan")
            print(f"{name:16s} {dn:9s} {fails:>3d}/{n:<3d} {vac:>5d}/{n:<3d} {med:9.4f} "
                  f"{mx:9.4f}")


def bugs() -> None:
    print("\nbug classes on an HF-style kernel (L=8, S=256, E=32; 3 seeds): caught / named "
          "first")
    for dn in ("float32", "bfloat16"):
        for bug in BUGS:
            caught = named = 0
            for seed in range(3):
                g = torch.Generator().manual_seed(100 + seed)
                q, k, v = (torch.randn(1, 2, m, 32, generator=g).to(DTYPES[dn])
                           for m in (8, 256, 256))
                kw = {"rotary_dim": 16} if bug == "rotary_dim_ignored" else {}
                out = hf_attention(q, k, v, base=10000.0, bug=bug, **kw)
                try:
                    res = ms.compare_attention(out, q, k, v, rotary_base=10000.0, **kw)
                except ToleranceError:
                    continue
                caught += not res.passed
                named += bool(res.diagnoses) and res.diagnoses[0].bug == bug
            print(f"  {dn:9s} {bug:30s} caught {caught}/3 named {named}/3")
    print("bug classes on FlashAttention-style fp32 tables (interleaved; 3 seeds)")
    for bug in BUGS[:4]:
        caught = named = 0
        for seed in range(3):
            g = torch.Generator().manual_seed(200 + seed)
            q, k, v = (torch.randn(1, 2, m, 32, generator=g) for m in (8, 128, 128))
            ang = torch.rand(128, 16, generator=g) * 2 * torch.pi * 40
            cos, sin = ang.cos(), ang.sin()
            out = fa_tables_attention(q, k, v, cos, sin, interleaved=True, bug=bug)
            res = ms.compare_attention(out, q, k, v, rotary_cos=cos, rotary_sin=sin,
                                       rotary_interleaved=True)
            caught += not res.passed
            named += bool(res.diagnoses) and res.diagnoses[0].bug == bug
        print(f"  float32   {bug:30s} caught {caught}/3 named {named}/3")


def speed() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 8, 256, 64)).astype(np.float32) for _ in range(3))
    ms.reference_attention(q, k, v).rounded("float32")            # warm-up (numba)
    ms.reference_attention(q, k, v, rotary_base=10000.0).rounded("float32")
    t = time.perf_counter()
    ms.reference_attention(q, k, v).rounded("float32")
    plain = time.perf_counter() - t
    t = time.perf_counter()
    ms.reference_attention(q, k, v, rotary_base=10000.0).rounded("float32")
    rot = time.perf_counter() - t
    t = time.perf_counter()
    ms.reference_attention(q, k, v, softcap=30.0).rounded("float32")
    cap = time.perf_counter() - t
    print(f"\nspeed (2, 8, 256, 64), float32 roundings (tables cached): plain {plain:.2f} s, "
          f"rotary {rot:.2f} s ({rot / plain:.2f}x), softcap {cap:.2f} s ({cap / plain:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    same, total = agreement(args.cases)
    print(f"rounding agreement with the independent mpmath loop (300 bits): {same}/{total} "
          "bit-identical (float32 and float64 roundings)")
    false_alarms(args.seeds)
    bugs()
    speed()


if __name__ == "__main__":
    main()
