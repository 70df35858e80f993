"""Benchmark and evaluation of the attention variants (issue 13).

Run from the repository root:  python bench/bench_variants.py  [--quick]

Four measurements, each printed as a table (bench/RESULTS.md, section "Issue 13"):

1. **Rounding**: ``reference_attention(..., variant).rounded(fmt)`` against the
   independent Arb-loop reference of tests/oracle/variants/test_variants.py (exact fractions and
   800-bit arb balls, one element at a time, the conventions written out from their
   sources), on random small cases per variant, in fp64, fp32, fp16, bf16 and the two
   fp8 formats: number of elements that differ (target 0).
2. **No false alarms** on real implementations: torch SDPA with an explicit window or
   ALiBi float mask, FlexAttention on CPU (mask_mod, BlockMask, the certified
   score_mods), jax.nn.dot_product_attention(local_window_size=…), gpt-oss-style sinks
   and softcap (tests/kernels/variant_kernels.py), an FA3-style FP8 kernel (weights in fp8),
   varlen per-sequence SDPA; per family and dtype: cases, false alarms, worst
   error ÷ tolerance (tightness).
3. **Mutants**: every bug class of tests/kernels/variant_kernels.py on random cases: how many
   are above the model tolerance (visible), caught, and caught with the right
   diagnosis (target: all visible ones).
4. **Speed** at (2, 8, 256, 64), fp32 inputs, ``.rounded("float32")``: CPU time of
   each variant ÷ plain attention's oracle time, same process, one BLAS thread,
   min and median of several runs, with the load average.
"""

from __future__ import annotations

import argparse
import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

from mha_symbolic import (  # noqa: E402
    alibi_score_mod,
    compare_attention,
    compare_attention_varlen,
    reference_attention,
    relative_bias_score_mod,
    softcap_score_mod,
)

warnings.filterwarnings("ignore")


# --------------------------------------------------------------------------------------
# 1. rounding against the independent reference

def bench_rounding(n_cases: int) -> None:
    from variant_reference import ref_attention, ref_rounded

    print("\n1. Rounding vs the independent Arb-loop reference (elements that differ)")
    print(f"{'variant':<22}{'cases':>6}{'elements':>10}  " + "  ".join(
        f"{n:>13}" for n in ("float64", "float32", "float16", "bfloat16", "e4m3fn", "e5m2")))
    names = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
    rng = np.random.default_rng(0)

    def case(kind: str) -> tuple[dict[str, Any], dict[str, Any], tuple[Any, ...]]:
        B, H = 1, 2
        L, S, E = int(rng.integers(2, 5)), int(rng.integers(2, 6)), int(rng.integers(2, 5))
        q = (rng.standard_normal((B, H, L, E)) * 1.5).astype(np.float32)
        k = (rng.standard_normal((B, H, S, E)) * 1.5).astype(np.float32)
        v = rng.standard_normal((B, H, S, E)).astype(np.float32)
        align = "bottom_right" if rng.random() < 0.5 else "top_left"
        if kind == "window":
            w = (int(rng.integers(0, 3)), int(rng.integers(-1, 3)))
            return ({"window": w, "causal_alignment": align},
                    {"window": w, "align": align}, (q, k, v))
        if kind == "softcap":
            c = float(rng.choice([0.5, 2.0, 30.0]))
            return {"softcap": c}, {"softcap": c}, (q, k, v)
        if kind == "alibi":
            sl = np.array([2.0**-1, 2.0**-3], dtype=np.float32)
            return ({"alibi_slopes": sl, "causal_alignment": align},
                    {"alibi": sl[None], "align": align}, (q, k, v))
        if kind == "alibi_f64_slopes":
            sl = rng.random(2)
            return ({"alibi_slopes": sl, "is_causal": True, "causal_alignment": align},
                    {"alibi": sl[None], "causal": True, "align": align}, (q, k, v))
        if kind == "sinks":
            sk = rng.standard_normal(2).astype(np.float32)
            return ({"sinks": sk, "is_causal": True},
                    {"sinks": sk, "causal": True}, (q, k, v))
        if kind == "mask_mod":
            return ({"mask_mod": lambda b, h, i, j: (i + j) % 3 != 1},
                    {"keep": lambda b, h, i, j: (i + j) % 3 != 1}, (q, k, v))
        if kind == "relative_bias":
            tab = rng.standard_normal((2, 5))
            return ({"score_mod": relative_bias_score_mod(tab)}, {"rel_table": tab}, (q, k, v))
        if kind == "fp8_descale":
            q8, k8, v8 = (x.astype(ml_dtypes.float8_e4m3fn) for x in (q, k, v))
            d = [rng.uniform(0.1, 2.0, (1, 2)).astype(np.float32) for _ in range(3)]
            return ({"q_descale": d[0], "k_descale": d[1], "v_descale": d[2]},
                    {"dq": d[0], "dk": d[1], "dv": d[2]}, (q8, k8, v8))
        assert kind == "combined"
        sk = rng.standard_normal(2).astype(np.float32)
        return ({"softcap": 2.0, "sinks": sk, "window": (2, 0),
                 "alibi_slopes": np.array([0.5, 0.25], np.float32)},
                {"softcap": 2.0, "sinks": sk, "window": (2, 0),
                 "alibi": np.array([[0.5, 0.25]])}, (q, k, v))

    kinds = ("window", "softcap", "alibi", "alibi_f64_slopes", "sinks", "mask_mod",
             "relative_bias", "fp8_descale", "combined")
    total_diff = 0
    for kind in kinds:
        diffs = dict.fromkeys(names, 0)
        n_el = 0
        for _ in range(n_cases):
            opts, ref_opts, (q, k, v) = case(kind)
            r = reference_attention(q, k, v, **opts)
            balls = ref_attention(q, k, v, **ref_opts)
            n_el += int(np.prod(r.shape))
            for name in names:
                got = np.asarray(r.rounded(name), dtype=np.float64)
                want = ref_rounded(balls, name)
                diffs[name] += int(np.sum(~((got == want) | (np.isnan(got) & np.isnan(want)))))
        total_diff += sum(diffs.values())
        print(f"{kind:<22}{n_cases:>6}{n_el:>10}  " + "  ".join(f"{diffs[n]:>13}" for n in names))
    print(f"total elements that differ: {total_diff}")


# --------------------------------------------------------------------------------------
# 2. no false alarms on real implementations

def bench_false_alarms(n_cases: int) -> None:
    import torch
    import variant_kernels as vk

    print("\n2. Real implementations: false alarms and tightness (worst error / tolerance)")
    print(f"{'implementation':<34}{'dtype':<10}{'cases':>6}{'false alarms':>14}{'worst':>9}")
    g = torch.Generator().manual_seed(1)
    rows: list[tuple[str, str, int, int, float]] = []

    def qkv(B: int, H: int, L: int, S: int, E: int, dt: Any) -> tuple[Any, Any, Any]:
        return tuple(torch.randn(B, H, n, E, generator=g).to(dt) * (1.5 if i == 0 else 1)
                     for i, n in enumerate((L, S, S)))  # type: ignore[return-value]

    def record(name: str, dtype: str, comps: list[Any]) -> None:
        fa = sum(not c.passed for c in comps)
        worst = max((c.worst.ratio for c in comps if c.worst is not None), default=0.0)
        rows.append((name, dtype, len(comps), fa, worst))
        print(f"{name:<34}{dtype:<10}{len(comps):>6}{fa:>14}{worst:>9.3f}")

    def shapes() -> tuple[int, int, int]:
        L = int(torch.randint(8, 200, (1,), generator=g))
        S = int(torch.randint(8, 260, (1,), generator=g))
        return L, S, int(torch.randint(1, 3, (1,), generator=g)) * 32

    for dname in ("float32", "float16", "bfloat16"):
        dt = getattr(torch, dname)
        comps = []
        for _ in range(n_cases):
            L, S, E = shapes()
            q, k, v = qkv(1, 2, L, S, E, dt)
            w = (int(torch.randint(0, 64, (1,), generator=g)), int(torch.randint(-1, 8, (1,),
                                                                                  generator=g)))
            keep = vk.window_mask(L, S, w, causal=True, align="bottom_right")
            if not bool(keep.any(-1).all()):
                keep = keep  # fully masked rows: torch SDPA gives 0 (masked_rows="zero")
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            comps.append(compare_attention(out, q, k, v, window=w, is_causal=True,
                                           causal_alignment="bottom_right"))
        record("torch SDPA + window bool mask", dname, comps)
        comps = []
        for _ in range(n_cases):
            L, S, E = shapes()
            q, k, v = qkv(1, 4, L, S, E, dt)
            slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)])
            bias = vk.alibi_bias(slopes, L, S, "bottom_right").to(dt)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            comps.append(compare_attention(out, q, k, v, alibi_slopes=slopes,
                                           causal_alignment="bottom_right"))
        record("torch SDPA + ALiBi float mask", dname, comps)
        comps = []
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        for c in range(n_cases):
            L = S = int(torch.randint(16, 128, (1,), generator=g))
            q, k, v = qkv(1, 2, L, S, 32, dt)
            width = int(torch.randint(1, 32, (1,), generator=g))

            def sliding(b: Any, h: Any, qi: Any, ki: Any, width: int = width) -> Any:
                return (qi >= ki) & (qi - ki <= width)

            mod = [softcap_score_mod(20.0), alibi_score_mod(torch.tensor([0.25, 0.0625])),
                   relative_bias_score_mod(torch.randn(2, 9, generator=g))][c % 3]
            bm = create_block_mask(sliding, None, None, L, S, device="cpu", BLOCK_SIZE=16)
            out = flex_attention(q, k, v, score_mod=mod, block_mask=bm)
            comps.append(compare_attention(out, q, k, v, mask_mod=bm, score_mod=mod))
        record("FlexAttention (CPU) BlockMask+mod", dname, comps)
        comps = []
        for _ in range(n_cases):
            L, S, E = shapes()
            S = L
            q, k, v = qkv(2, 2, L, S, E, dt)
            sinks = torch.randn(2, generator=g)
            cap = float([5.0, 30.0, 50.0][int(torch.randint(0, 3, (1,), generator=g))])
            out = vk.reference_like(q, k, v, out_dtype=dt, softcap=cap, sinks=sinks,
                                    causal=True)
            comps.append(compare_attention(out, q, k, v, softcap=cap, sinks=sinks,
                                           is_causal=True))
        record("softcap + sinks (torch, fp32 math)", dname, comps)

    try:
        import jax

        for dname in ("float32", "float16", "bfloat16"):
            dt = np.dtype(ml_dtypes.bfloat16) if dname == "bfloat16" else np.dtype(dname)
            rng = np.random.default_rng(3)
            comps = []
            for _ in range(n_cases):
                L = int(rng.integers(8, 200))
                q, k, v = (rng.standard_normal((1, L, 2, 32)).astype(dt) for _ in range(3))
                w = (int(rng.integers(0, 40)), int(rng.integers(0, 5)))
                out = np.asarray(jax.nn.dot_product_attention(q, k, v, local_window_size=w))
                comps.append(compare_attention(*(np.swapaxes(x, 1, 2) for x in (out, q, k, v)),
                                               window=w))
            record("jax local_window_size", dname, comps)
    except ImportError:
        print("jax not installed: skipped")

    for fp8 in ("float8_e4m3fn", "float8_e5m2"):
        comps = []
        for _ in range(n_cases):
            L, S, E = shapes()
            q, k, v = qkv(1, 2, L, S, E, torch.float32)
            dt8 = getattr(torch, fp8)
            q8, k8, v8 = (x.to(dt8) for x in (q, k, v))
            d = [torch.rand(1, 2, generator=g) + 0.25 for _ in range(3)]
            out = vk.reference_like(q8, k8, v8, out_dtype=torch.bfloat16, descale=tuple(d),
                                    p_dtype=torch.float8_e4m3fn, causal=True,
                                    align="bottom_right")
            comps.append(compare_attention(out, q8, k8, v8, q_descale=d[0], k_descale=d[1],
                                           v_descale=d[2], is_causal=True,
                                           causal_alignment="bottom_right",
                                           weights_dtype="float8_e4m3fn"))
        record(f"FA3-style FP8 ({fp8} in, bf16 out)", fp8[7:], comps)

    comps = []
    for _ in range(n_cases):
        lens = [int(x) for x in torch.randint(0, 60, (4,), generator=g)]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        q, k, v = (torch.randn(cu[-1], 2, 32, generator=g) for _ in range(3))
        parts = [torch.nn.functional.scaled_dot_product_attention(
            q[cu[b]:cu[b + 1]].transpose(0, 1), k[cu[b]:cu[b + 1]].transpose(0, 1),
            v[cu[b]:cu[b + 1]].transpose(0, 1), is_causal=True).transpose(0, 1)
            for b in range(4) if cu[b + 1] > cu[b]]
        out = torch.cat(parts) if parts else torch.zeros(0, 2, 32)
        comps.append(compare_attention_varlen(out, q, k, v, cu, cu, is_causal=True))
    record("varlen: per-sequence torch SDPA", "float32", comps)
    print(f"total false alarms: {sum(r[3] for r in rows)} in {sum(r[2] for r in rows)} cases")


# --------------------------------------------------------------------------------------
# 3. mutants

def bench_mutants(n_cases: int) -> None:
    import torch
    import variant_kernels as vk

    print("\n3. Mutants: visible (above the model tolerance), caught, right diagnosis")
    print(f"{'bug class':<32}{'dtype':<10}{'cases':>6}{'visible':>8}{'caught':>8}{'diagnosed':>10}")
    g = torch.Generator().manual_seed(2)
    tot = [0, 0, 0, 0]
    for bug in vk.BUGS:
        for dname in ("float32", "bfloat16"):
            dt = getattr(torch, dname)
            n = visible = caught = right = 0
            for _ in range(n_cases):
                L = int(torch.randint(8, 64, (1,), generator=g))
                S = int(torch.randint(8, 80, (1,), generator=g))
                H, E = 4, 32
                q = (torch.randn(1, H, L, E, generator=g) * 2).to(dt)
                k = torch.randn(1, H, S, E, generator=g).to(dt)
                v = torch.randn(1, H, S, E, generator=g).to(dt)
                cfg: dict[str, Any] = {}
                opts: dict[str, Any] = {"causal_alignment": "bottom_right"}
                if bug.startswith("window"):
                    w = (int(torch.randint(1, 16, (1,), generator=g)),
                         int(torch.randint(1, 8, (1,), generator=g)))
                    cfg["window"] = opts["window"] = w
                elif bug.startswith("softcap"):
                    cfg["softcap"] = opts["softcap"] = 2.0
                    cfg["causal"] = opts["is_causal"] = True
                elif bug.startswith("alibi"):
                    sl = torch.tensor([1.0, 0.25, 0.0625, 0.5])
                    cfg["alibi"] = opts["alibi_slopes"] = sl
                elif "sink" in bug:
                    cfg["sinks"] = opts["sinks"] = torch.randn(H, generator=g) + 1
                else:
                    d = tuple(torch.rand(1, H, generator=g) * 2 + 0.25 for _ in range(3))
                    cfg["descale"] = d
                    opts.update(q_descale=d[0], k_descale=d[1], v_descale=d[2])
                out = vk.reference_like(q, k, v, out_dtype=dt, align="bottom_right", bug=bug,
                                        **cfg)
                comp = compare_attention(out, q, k, v, **opts)
                n += 1
                if not comp.passed:
                    visible += 1
                    caught += 1
                    right += bug in [dd.bug for dd in comp.diagnoses]
            tot = [tot[0] + n, tot[1] + visible, tot[2] + caught, tot[3] + right]
            print(f"{bug:<32}{dname:<10}{n:>6}{visible:>8}{caught:>8}{right:>10}")
    print(f"total: {tot[0]} mutants, {tot[1]} visible, {tot[2]} caught, {tot[3]} with the "
          "right diagnosis")


# --------------------------------------------------------------------------------------
# 4. speed

def _speed_cases(rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    """The variants timed at (2, 8, 256, 64), forward and backward alike (the sinks and
    the bias table drawn from ``rng`` after the inputs)."""
    slopes = (2.0 ** (-np.arange(1, 9))).astype(np.float32)
    return {
        "plain (baseline)": {},
        "window (64, 0)": {"window": (64, 0)},
        "window + causal": {"window": (64, 0), "is_causal": True},
        "softcap 30": {"softcap": 30.0},
        "alibi (H,)": {"alibi_slopes": slopes},
        "sinks": {"sinks": rng.standard_normal(8).astype(np.float32)},
        "mask_mod (document)": {"mask_mod": lambda b, h, i, j: (i // 64) == (j // 64)},
        "relative bias table": {"score_mod": relative_bias_score_mod(rng.standard_normal((8, 33)))},
        "fp8 e4m3 + descale": {"_fp8": True},
    }


def bench_speed(repeats: int) -> None:
    print("\n4. Speed at (2, 8, 256, 64), fp32 inputs, .rounded('float32'); CPU seconds, "
          "one BLAS thread")
    print(f"load average: {Path('/proc/loadavg').read_text().strip()}")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 8, 256, 64)).astype(np.float32) for _ in range(3))
    cases = _speed_cases(rng)
    q8, k8, v8 = (x.astype(ml_dtypes.float8_e4m3fn) for x in (q, k, v))
    d = np.full((2, 8), 0.5, dtype=np.float32)
    times: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, kw in cases.items():
            t0, w0 = time.process_time(), time.perf_counter()
            if kw.get("_fp8"):
                r = reference_attention(q8, k8, v8, q_descale=d, k_descale=d, v_descale=d)
            else:
                r = reference_attention(q, k, v, **kw)
            r.rounded("float32")
            times.setdefault(name, []).append(time.process_time() - t0)
            walls.setdefault(name, []).append(time.perf_counter() - w0)
    base = min(times["plain (baseline)"])
    base_med = statistics.median(times["plain (baseline)"])
    print(f"{'variant':<24}{'cpu min':>9}{'cpu med':>9}{'wall min':>9}{'ratio min':>10}"
          f"{'ratio med':>10}")
    for name in cases:
        t = times[name]
        print(f"{name:<24}{min(t):>9.3f}{statistics.median(t):>9.3f}{min(walls[name]):>9.3f}"
              f"{min(t) / base:>10.2f}{statistics.median(t) / base_med:>10.2f}")
    print(f"load average: {Path('/proc/loadavg').read_text().strip()}")


# --------------------------------------------------------------------------------------
# 5. gradients: rounding against forward-mode Arb, speed against the plain backward

def _grad_case(kind: str, rng: Any) -> tuple[dict[str, Any], dict[str, Any], tuple[Any, ...],
                                              tuple[str, ...], int]:
    """(options, reference options, (q, k, v, do), parameters, GQA group) of one case."""
    from variant_backward_reference import window_keep

    H, Hk = 2, 2
    L, S, E = int(rng.integers(2, 5)), int(rng.integers(2, 6)), int(rng.integers(2, 5))
    if kind == "softcap_gqa":
        H = 4
    q = (rng.standard_normal((1, H, L, E)) * 1.5).astype(np.float32)
    k = (rng.standard_normal((1, Hk, S, E)) * 1.5).astype(np.float32)
    v = rng.standard_normal((1, Hk, S, E)).astype(np.float32)
    do = rng.standard_normal((1, H, L, E)).astype(np.float32)
    off = S - L  # bottom-right: every row keeps a key
    if kind == "window":
        w = (int(rng.integers(1, 3)), int(rng.integers(0, 3)))
        return ({"window": w, "causal_alignment": "bottom_right"},
                {"keep": window_keep(L, S, w, False, off)}, (q, k, v, do), (), 1)
    if kind in ("softcap", "softcap_gqa"):
        c = float(rng.choice([0.5, 2.0, 30.0]))
        return ({"softcap": c, "enable_gqa": Hk != H}, {"cap": c}, (q, k, v, do), (),
                H // Hk)
    if kind in ("alibi", "alibi_f64_slopes"):
        sl = (np.array([0.5, 0.125], np.float32) if kind == "alibi" else rng.random(2))
        return ({"alibi_slopes": sl, "is_causal": True, "causal_alignment": "bottom_right"},
                {"keep": window_keep(L, S, None, True, off), "slope_offset": off,
                 "slope": lambda b, h: float(sl[h])}, (q, k, v, do), ("slope",), 1)
    if kind == "sinks":
        sk = rng.standard_normal(2).astype(np.float32)
        return ({"sinks": sk, "is_causal": True},
                {"keep": window_keep(L, S, None, True, 0), "sink": lambda b, h: float(sk[h])},
                (q, k, v, do), ("sink",), 1)
    if kind == "mask_mod":
        keep = np.array([[(i + j) % 3 != 1 or j == 0 for j in range(S)] for i in range(L)])
        return ({"mask_mod": lambda b, h, i, j: ((i + j) % 3 != 1) | (j == 0)},
                {"keep": keep}, (q, k, v, do), (), 1)
    if kind == "table_softcap":
        tab = rng.standard_normal((2, 5)).astype(np.float32)
        return ({"score_mod": (softcap_score_mod(2.0), relative_bias_score_mod(tab))},
                {"cap": 2.0, "table": lambda b, h: tab[h]}, (q, k, v, do), ("table",), 1)
    if kind == "float_mask_sinks":
        m = rng.standard_normal((L, S)).astype(np.float32)
        sk = rng.standard_normal(2).astype(np.float32)
        return ({"attn_mask": m, "sinks": sk}, {"madd": m.astype(np.float64),
                                              "sink": lambda b, h: float(sk[h])},
                (q, k, v, do), ("m", "sink"), 1)
    assert kind == "fp8_descale"
    q8, k8, v8 = (x.astype(ml_dtypes.float8_e4m3fn) for x in (q, k, v))
    d = [rng.uniform(0.1, 2.0, (1, 2)).astype(np.float32) for _ in range(3)]
    return ({"q_descale": d[0], "k_descale": d[1], "v_descale": d[2], "softcap": 4.0},
            {"cap": 4.0, "descale": lambda b, h: (float(d[0][b, h]), float(d[1][b, h]),
                                                   float(d[2][b, h]))},
            (q8, k8, v8, do), (), 1)


def bench_grad_rounding(n_cases: int) -> None:
    from variant_backward_reference import reference_gradients
    from variant_reference import ref_rounded

    from mha_symbolic import reference_attention_backward

    print("\n5. Gradients: rounding vs forward-mode Arb (tests/kernels/variant_backward_reference.py), "
          "elements that differ")
    names = ("float64", "float32", "float16", "bfloat16")
    print(f"{'variant':<20}{'cases':>6}{'elements':>10}  " + "  ".join(f"{n:>9}" for n in names))
    rng = np.random.default_rng(5)
    kinds = ("window", "softcap", "softcap_gqa", "alibi", "alibi_f64_slopes", "sinks",
             "mask_mod", "table_softcap", "float_mask_sinks", "fp8_descale")
    total = 0
    n_zero = 0
    for kind in kinds:
        diffs = dict.fromkeys(names, 0)
        zeros = dict.fromkeys(names, 0)
        n_el = 0
        for _ in range(n_cases):
            opts, ref_opts, (q, k, v, do), params, group = _grad_case(kind, rng)
            g = reference_attention_backward(q, k, v, do, **opts)
            qq, kk, vv = (np.asarray(x, np.float64) for x in (q, k, v))
            want = reference_gradients(qq, kk, vv, do, group, params, **ref_opts)
            pairs = [(g.dq, want["q"]), (g.dk, want["k"]), (g.dv, want["v"])]
            if "sink" in params:
                pairs.append((g.d_sinks, _summed(want["sink"], lambda x: x[0])))
            if "slope" in params:
                pairs.append((g.d_alibi_slopes, _summed(want["slope"], lambda x: x[0])))
            if "table" in params:
                pairs.append((g.d_score_mod[1], np.array([list(want["table"][0, h])
                                                          for h in range(2)], dtype=object)))
            if "m" in params:
                pairs.append((g.d_attn_mask, _summed(want["m"], lambda x: x, heads=True)))
            for enc, balls in pairs:
                n_el += int(np.prod(enc.shape))
                for name in names:
                    got = np.asarray(enc.rounded(name), dtype=np.float64)
                    for idx in np.ndindex(*balls.shape):
                        x = balls[idx]
                        if x.contains(0) and x.rad() < 2.0**-200:
                            # the reference cannot tell an exact 0 (a row with one key,
                            # an unseen key) from a tiny value: such elements must
                            # round to a zero
                            zeros[name] += 1
                            diffs[name] += int(got[idx] != 0)
                        else:
                            ref = ref_rounded([x], name)[0]
                            diffs[name] += int(got[idx] != ref)
        total += sum(diffs.values())
        n_zero += zeros["float64"]
        print(f"{kind:<20}{n_cases:>6}{n_el:>10}  " + "  ".join(f"{diffs[n]:>9}" for n in names))
    print(f"total elements that differ: {total} (of which the reference showed {n_zero} "
          "exact-zero candidates per format, checked to round to a zero)")


def _summed(per_bh: Any, pick: Any, heads: bool = False) -> Any:
    """Parameters shared over the batch: the per-(batch, head) derivatives summed (over
    the heads too for a mask broadcast over them), at 300 bits."""
    from flint import arb, ctx

    old = ctx.prec
    ctx.prec = 300
    try:
        B, H = per_bh.shape
        if heads:
            tot = None
            for b in range(B):
                for h in range(H):
                    tot = pick(per_bh[b, h]) if tot is None else tot + pick(per_bh[b, h])
            return tot
        return np.array([sum((pick(per_bh[b, h]) for b in range(B)), arb(0))
                         for h in range(H)], dtype=object)
    finally:
        ctx.prec = old


def bench_grad_speed(repeats: int) -> None:
    import torch

    from mha_symbolic import reference_attention_backward

    torch.set_num_threads(1)
    print("\n6. Gradients' speed at (2, 8, 256, 64), fp32 inputs: reference_attention_backward"
          " + .rounded('float32') of dq, dk, dv and every parameter's gradient; CPU seconds,"
          " one BLAS thread")
    print(f"load average: {Path('/proc/loadavg').read_text().strip()}")
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((2, 8, 256, 64)).astype(np.float32) for _ in range(4))
    cases = _speed_cases(rng)
    q8, k8, v8 = (x.astype(ml_dtypes.float8_e4m3fn) for x in (q, k, v))
    d = np.full((2, 8), 0.5, dtype=np.float32)
    times: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, kw in cases.items():
            t0, w0 = time.process_time(), time.perf_counter()
            if kw.get("_fp8"):
                g = reference_attention_backward(q8, k8, v8, do, q_descale=d, k_descale=d,
                                                 v_descale=d)
            else:
                g = reference_attention_backward(q, k, v, do, **kw)
            encs = [g.dq, g.dk, g.dv, g.d_sinks, g.d_alibi_slopes, *(g.d_score_mod or ())]
            for enc in encs:
                if enc is not None:
                    enc.rounded("float32")
            times.setdefault(name, []).append(time.process_time() - t0)
            walls.setdefault(name, []).append(time.perf_counter() - w0)
    base = min(times["plain (baseline)"])
    base_med = statistics.median(times["plain (baseline)"])
    print(f"{'variant':<24}{'cpu min':>9}{'cpu med':>9}{'wall min':>9}{'ratio min':>10}"
          f"{'ratio med':>10}")
    for name in cases:
        t = times[name]
        print(f"{name:<24}{min(t):>9.3f}{statistics.median(t):>9.3f}{min(walls[name]):>9.3f}"
              f"{min(t) / base:>10.2f}{statistics.median(t) / base_med:>10.2f}")
    print(f"load average: {Path('/proc/loadavg').read_text().strip()}")


# --------------------------------------------------------------------------------------
# 7. gradients judged: real implementations' autograd, and backward mutants

def _judge(comp_fn: Any) -> tuple[str, float]:
    """("pass" | "fail" | "refused", worst error / tolerance over the gradients)."""
    from mha_symbolic.errors import ToleranceError

    try:
        comp = comp_fn()
    except ToleranceError:
        return "refused", float("nan")
    worst = max((c.worst.ratio for c in comp.gradients.values() if c.worst is not None),
                default=0.0)
    return ("pass" if comp.passed else "fail"), worst


def _flex_score_mod(torch: Any, cap: float, sl: Any) -> Any:
    """Gemma-2's softcap then ALiBi as a FlexAttention score_mod (a closure: FlexAttention
    traces default arguments as inputs)."""
    def score_mod(sc: Any, b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return cap * torch.tanh(sc / cap) - sl[h] * (ki - qi).abs()
    return score_mod


def bench_grad_alarms(n_cases: int) -> None:
    import torch

    from mha_symbolic import compare_attention_backward

    torch.set_num_threads(1)
    print("\n7. Gradients of real implementations (autograd / vjp) judged by "
          "compare_attention_backward: false alarms, refusals, worst error / tolerance")
    print(f"{'implementation':<52}{'dtype':<10}{'cases':>6}{'false alarms':>14}"
          f"{'refused':>9}{'worst':>8}")
    g = torch.Generator().manual_seed(7)
    rng = np.random.default_rng(7)

    def rint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi, (1,), generator=g))

    def inputs(H: int, L: int, S: int, E: int, dt: Any) -> list[Any]:
        return [(torch.randn(1, H, n, E, generator=g) * sc).to(dt)
                for n, sc in ((L, 1.5), (S, 1.0), (S, 1.0), (L, 1.0))]

    def grads(fn: Any, q: Any, k: Any, v: Any, do: Any, params: tuple[Any, ...] = ()
              ) -> list[Any]:
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        return list(torch.autograd.grad(fn(*leaves), leaves + list(params), do))

    def row(name: str, dname: str, results: list[tuple[str, float]]) -> None:
        fa = sum(r == "fail" for r, _ in results)
        ref = sum(r == "refused" for r, _ in results)
        worst = max((w for r, w in results if r != "refused"), default=0.0)
        print(f"{name:<52}{dname:<10}{len(results):>6}{fa:>14}{ref:>9}{worst:>8.3f}")

    import torch.nn.attention.flex_attention as fa_mod

    fa_mod._validate_device = lambda *a, **k: None   # the eager dense backward on CPU
    for dname in ("float32", "bfloat16"):
        dt = getattr(torch, dname)
        res = []
        for _ in range(n_cases):
            L, S, E = rint(8, 96), rint(8, 128), 32 * rint(1, 3)
            q, k, v, do = inputs(2, L, S, E, dt)
            w = (rint(0, 48), rint(0, 8))
            sl = np.array([0.5, 0.0625], np.float32)
            sl_t = torch.from_numpy(sl).requires_grad_()
            i = torch.arange(L)[:, None] + (S - L)
            j = torch.arange(S)[None, :]
            keep = (j <= i) & (j >= i - w[0])

            def sdpa(a: Any, b: Any, c: Any, keep: Any = keep, i: Any = i, j: Any = j,
                     sl_t: Any = sl_t) -> Any:
                bias = -sl_t[:, None, None] * (i - j).abs()
                m = torch.where(keep, bias, torch.tensor(-float("inf"))).to(a.dtype)
                return torch.nn.functional.scaled_dot_product_attention(a, b, c, attn_mask=m)
            gr = grads(sdpa, q, k, v, do, (sl_t,))
            res.append(_judge(lambda gr=gr, q=q, k=k, v=v, do=do, w=w, sl=sl:
                              compare_attention_backward(
                                  *gr[:3], q, k, v, do, window=(w[0], 0), is_causal=True,
                                  causal_alignment="bottom_right", alibi_slopes=sl,
                                  d_alibi_slopes=gr[3].numpy())))
        row("torch SDPA, window + ALiBi float mask (+ d_slopes)", dname, res)

        res = []
        for _ in range(n_cases):
            L, E = rint(8, 96), 32 * rint(1, 3)
            q, k, v, do = inputs(2, L, L, E, dt)
            cap = float(rng.choice([5.0, 30.0, 50.0]))
            sl = torch.tensor([0.5, 0.125])

            score_mod = _flex_score_mod(torch, cap, sl)

            def causal(b: Any, h: Any, qi: Any, ki: Any) -> Any:
                return ki <= qi

            bm = fa_mod.create_block_mask(causal, None, None, L, L, device="cpu")

            def flex(a: Any, b: Any, c: Any, bm: Any = bm, score_mod: Any = score_mod) -> Any:
                return fa_mod.flex_attention(a, b, c, score_mod=score_mod, block_mask=bm)
            torch._dynamo.reset()   # a new cap: FlexAttention's trace specialises on it
            gr = grads(flex, q, k, v, do)
            mods = (softcap_score_mod(cap), alibi_score_mod(sl.numpy()))
            res.append(_judge(lambda gr=gr, q=q, k=k, v=v, do=do, mods=mods:
                              compare_attention_backward(*gr, q, k, v, do, score_mod=mods,
                                                         mask_mod=causal)))
        row("FlexAttention eager, softcap + ALiBi mods", dname, res)

        res = []
        for _ in range(n_cases):
            L, E = rint(8, 96), 32 * rint(1, 3)
            q, k, v, do = inputs(2, L, L, E, dt)
            sinks = torch.randn(2, generator=g).to(dt).requires_grad_()
            w = rint(1, 32)

            def gpt_oss(a: Any, b: Any, c: Any, sinks: Any = sinks, w: int = w) -> Any:
                n = a.shape[-2]
                sc = (a @ b.transpose(-1, -2)) / float(np.sqrt(a.shape[-1]))
                i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
                sc = sc.masked_fill((j > i) | (j < i - w), -float("inf"))
                sc = torch.cat([sc, sinks.view(1, -1, 1, 1).expand(*sc.shape[:-1], 1)], -1)
                return torch.softmax(sc, dim=-1)[..., :-1] @ c
            gr = grads(gpt_oss, q, k, v, do, (sinks,))
            res.append(_judge(lambda gr=gr, q=q, k=k, v=v, do=do, sinks=sinks, w=w:
                              compare_attention_backward(
                                  *gr[:3], q, k, v, do, sinks=sinks.detach().float().numpy(),
                                  is_causal=True, window=(w, 0), d_sinks=gr[3])))
        row("gpt-oss sinks + sliding window (+ d_sinks)", dname, res)

        res = []
        for _ in range(n_cases):
            L, E = rint(8, 96), 32 * rint(1, 3)
            q, k, v, do = inputs(2, L, L, E, dt)
            cap = float(rng.choice([5.0, 30.0, 50.0]))

            def gemma(a: Any, b: Any, c: Any, cap: float = cap) -> Any:
                n = a.shape[-2]
                sc = (a @ b.transpose(-1, -2)) / float(np.sqrt(a.shape[-1]))
                sc = torch.tanh(sc / cap) * cap
                sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1),
                                    -float("inf"))
                w_ = torch.softmax(sc, dim=-1, dtype=torch.float32).to(a.dtype)
                return w_ @ c
            gr = grads(gemma, q, k, v, do)
            res.append(_judge(lambda gr=gr, q=q, k=k, v=v, do=do, cap=cap:
                              compare_attention_backward(*gr, q, k, v, do, softcap=cap,
                                                         is_causal=True)))
        row("Gemma-2 eager softcap (HF style)", dname, res)

    import jax
    import jax.numpy as jnp

    for dname in ("float32", "bfloat16"):
        jdt = getattr(jnp, dname)
        res = []
        for _ in range(n_cases):
            L, E = int(rng.integers(8, 96)), 32 * int(rng.integers(1, 3))
            x = [rng.standard_normal((1, L, 2, E)).astype(np.float32) for _ in range(4)]
            x[0] *= 1.5
            q, k, v, do = (jnp.asarray(a).astype(jdt) for a in x)
            w = (int(rng.integers(0, 32)), int(rng.integers(0, 8)))

            def f(a: Any, b: Any, c: Any, w: Any = w) -> Any:
                return jax.nn.dot_product_attention(a, b, c, local_window_size=w)
            _, vjp = jax.vjp(f, q, k, v)
            gq, gk, gv = vjp(do)

            def t(a: Any) -> Any:        # (B, T, N, H) -> (B, N, T, H)
                return np.swapaxes(np.asarray(a), 1, 2)
            res.append(_judge(lambda gq=gq, gk=gk, gv=gv, q=q, k=k, v=v, do=do, w=w:
                              compare_attention_backward(t(gq), t(gk), t(gv), t(q), t(k),
                                                         t(v), t(do), window=w)))
        row("jax dot_product_attention(local_window)", dname, res)


def bench_grad_mutants(n_cases: int) -> None:
    import variant_backward_kernels as vbk

    from mha_symbolic import compare_attention_backward

    print("\n8. Backward mutants (tests/kernels/variant_backward_kernels.py) judged by "
          "compare_attention_backward: caught, refused, diagnoses")
    print(f"{'kernel':<40}{'dtype':<10}{'cases':>6}{'caught':>8}{'refused':>9}  diagnoses")
    rng = np.random.default_rng(8)
    judged = (None, "+d_sinks", "softcap_derivative_missing", "window_missing_in_backward",
              "alibi_slopes_reversed_in_backward", "sink_gradient_sign_flipped",
              "sink_gradient_missing")
    for label_bug in judged:
        # "+d_sinks": the correct kernel with its sink gradient judged too
        bug = None if label_bug == "+d_sinks" else label_bug
        for dname in ("float32", "bfloat16"):
            dt = np.dtype(ml_dtypes.bfloat16) if dname == "bfloat16" else np.dtype(dname)
            caught = refused = 0
            names: dict[str, int] = {}
            for _ in range(n_cases):
                H, E = 4, 32
                L, S = int(rng.integers(8, 64)), int(rng.integers(8, 80))
                if bug == "softcap_derivative_missing":
                    S = L
                q = (rng.standard_normal((1, H, L, E)) * 2).astype(dt)
                k, v, do = (rng.standard_normal((1, H, n, E)).astype(dt) for n in (S, S, L))
                kw: dict[str, Any] = {}
                opts: dict[str, Any] = {"causal_alignment": "bottom_right"}
                if bug in (None, "window_missing_in_backward"):
                    w = (int(rng.integers(1, 16)), int(rng.integers(1, 8)))
                    kw["window"] = opts["window"] = w
                    kw["align"] = "bottom_right"
                if bug in (None, "softcap_derivative_missing"):
                    kw["softcap"] = opts["softcap"] = 2.0
                    kw["causal"] = opts["is_causal"] = True
                    kw["align"] = "bottom_right"
                if bug in (None, "alibi_slopes_reversed_in_backward"):
                    sl = np.array([1.0, 0.25, 0.0625, 0.5])
                    kw["alibi"] = sl
                    opts["alibi_slopes"] = sl.astype(np.float32)
                    kw["align"] = "bottom_right"
                if bug is None or "sink" in bug:
                    sk = (rng.standard_normal(H) + 1).astype(np.float32)
                    kw["sinks"] = sk.astype(np.float64)
                    opts["sinks"] = sk
                out = vbk.variant_backward(q, k, v, do, dtype=dt, bug=bug, **kw)
                got = [out[n].astype(dt) for n in ("dq", "dk", "dv")]
                if label_bug == "+d_sinks" or (bug is not None and "sink" in bug):
                    opts["d_sinks"] = out["d_sinks"].astype(np.float32)
                verdict, _ = _judge(lambda got=got, q=q, k=k, v=v, do=do, opts=opts:
                                    compare_attention_backward(*got, q, k, v, do, **opts))
                if verdict == "refused":
                    refused += 1
                    continue
                if verdict == "fail":
                    caught += 1
                    comp = compare_attention_backward(*got, q, k, v, do, **opts)
                    first = comp.diagnoses[0].bug if comp.diagnoses else "(none named)"
                    names[first] = names.get(first, 0) + 1
            label = ("correct (softcap+window+ALiBi+sinks)" if label_bug is None else
                     "correct, d_sinks judged too" if label_bug == "+d_sinks" else label_bug)
            diag = ", ".join(f"{k_} {v_}" for k_, v_ in sorted(names.items())) or "-"
            print(f"{label:<40}{dname:<10}{n_cases:>6}{caught:>8}{refused:>9}  {diag}")
    print("not judged by compare_attention_backward (no FP8 backward model): "
          + ", ".join(b for b in vbk.BUGS if b not in judged))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases and repeats")
    ap.add_argument("--only", choices=("rounding", "alarms", "mutants", "speed",
                                       "grad_rounding", "grad_speed", "grad_alarms",
                                       "grad_mutants"))
    args = ap.parse_args()
    n = 3 if args.quick else 12
    if args.only in (None, "rounding"):
        bench_rounding(n)
    if args.only in (None, "alarms"):
        bench_false_alarms(n)
    if args.only in (None, "mutants"):
        bench_mutants(n)
    if args.only in (None, "speed"):
        bench_speed(3 if args.quick else 7)
    if args.only in (None, "grad_rounding"):
        bench_grad_rounding(n)
    if args.only in (None, "grad_speed"):
        bench_grad_speed(3 if args.quick else 5)
    if args.only in (None, "grad_alarms"):
        bench_grad_alarms(n)
    if args.only in (None, "grad_mutants"):
        bench_grad_mutants(n)


if __name__ == "__main__":
    main()
