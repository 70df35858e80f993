"""The gradient oracle and the backward testing tool, measured (issue 12).

    python bench/bench_backward.py [--cases N] [--seed S] [--skip-speed] [--only SECTION]
                                   [--speed-repeats N] [--no-growth]
    python bench/bench_backward.py --device {cpu,cuda} [--quick] [--sizes ...] [--jobs N]
        (issue 17: each SDPA backend forced in turn and FlexAttention on the device,
        gradients judged; bench/device_sdpa.py)

Sections (bench/RESULTS.md, "Issue 12"):

false-alarms  correct kernels must pass compare_attention_backward's default rule:
              torch SDPA backward (default and MATH backends, CPU) and an independent
              FlashAttention-2-style numpy kernel (tests/kernels/fa2_backward_kernel.py) in 4
              dtypes, jax.vjp of jax.nn.dot_product_attention, nn.MultiheadAttention
              (compare_mha_backward).  FlashAttention's own rules judge the same outputs:
              flash2  max|g − ref| <= 2·max|g_pt − ref| (ref: torch MATH on inputs upcast,
                      fp32 -> fp64 and fp16/bf16 -> fp32; g_pt: the same-dtype MATH run)
              atol    |g − ref| <= 0.0625 (dQ), 0.125 (dK), 0.03125 (dV) (CuTe-DSL tests, bf16)
bugs          each backward bug class injected into the FA2-style kernel, in 4 dtypes.
              "above model": the bug's float64 gradients leave the model tolerance
              somewhere; "visible": the bug's effect max|bug64 − exact| is >= 10× the
              error of the correct same-dtype kernel.  Caught = the verdict fails; right
              diagnosis = the bug is the first class named.
speed         fp32- and fp64-rounded reference backward vs torch float64 autograd of
              SDPA (forward + backward) at (2, 8, 256, 64), one thread on both sides,
              CPU and wall, min and median, numba and the numpy twins; growth with L
              at (1, 8, L, 64), L = 256 ... 2048 (--no-growth to skip).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

from fa2_backward_kernel import fa2_backward  # noqa: E402

from mha_symbolic import reference_attention_backward  # noqa: E402
from mha_symbolic.testing.backward.bugs import BACKWARD_BUG_CLASSES  # noqa: E402
from mha_symbolic.testing.backward.compare import compare_attention_backward  # noqa: E402
from mha_symbolic.testing.call import AttentionCall  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    torch = None

NP = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
      "bfloat16": ml_dtypes.bfloat16}
FA_ATOL = {"dq": 0.0625, "dk": 0.125, "dv": 0.03125}
GRADS = ("dq", "dk", "dv")


def _case(rng: np.random.Generator, dt: str) -> dict[str, Any]:
    L = int(rng.integers(1, 160))
    S = int(rng.integers(1, 300)) if rng.random() < 0.7 else L
    E = int(rng.choice([16, 32, 64]))
    hq = int(rng.choice([1, 2, 4]))
    hk = hq if rng.random() < 0.6 else int(rng.choice([d for d in (1, 2) if hq % d == 0]))
    kind = rng.choice(["none", "causal", "bool", "float"])
    q = rng.standard_normal((1, hq, L, E)).astype(NP[dt])
    k = rng.standard_normal((1, hk, S, E)).astype(NP[dt])
    v = rng.standard_normal((1, hk, S, E)).astype(NP[dt])
    do = rng.standard_normal((1, hq, L, E)).astype(NP[dt])
    mask = None
    if kind == "bool":
        mask = rng.random((L, S)) < 0.8
        mask[:, 0] = True
    elif kind == "float":
        mask = (rng.standard_normal((L, S)) * 2).astype(NP[dt])
    return dict(q=q, k=k, v=v, do=do, mask=mask, causal=kind == "causal", gqa=hk != hq, dt=dt)


def _t(a: np.ndarray, dt: str) -> Any:
    if a.dtype == np.bool_:
        return torch.from_numpy(a)
    return torch.from_numpy(np.ascontiguousarray(a.astype(np.float64))).to(getattr(torch, dt))


def _torch_grads(c: dict[str, Any], dt: str, backend: str) -> list[np.ndarray]:
    q, k, v = (_t(c[n], dt).requires_grad_(True) for n in "qkv")
    do = _t(c["do"], dt)
    m = None if c["mask"] is None else _t(c["mask"], "bool" if c["mask"].dtype == np.bool_ else dt)
    kw = dict(attn_mask=m, is_causal=c["causal"], enable_gqa=c["gqa"])
    if backend == "math":
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, k, v, **kw)
    else:
        out = F.scaled_dot_product_attention(q, k, v, **kw)
    return [g.to(torch.float64).numpy() for g in torch.autograd.grad(out, (q, k, v), do)]


def _flash_rules(g: list[np.ndarray], ref: list[np.ndarray], pt: list[np.ndarray],
                 dt: str) -> tuple[bool, bool | None]:
    """(FlashAttention's 2× rule passes, the fixed-atol rule passes or None off bf16)."""
    two = all(np.nanmax(np.abs(a - r), initial=0) <= 2 * np.nanmax(np.abs(p - r), initial=0)
              for a, r, p in zip(g, ref, pt, strict=True))
    atol = None
    if dt == "bfloat16":
        atol = all(bool(np.all(np.abs(a - r) <= FA_ATOL[n]))
                   for a, r, n in zip(g, ref, GRADS, strict=True))
    return two, atol


def _ours(g: list[np.ndarray], c: dict[str, Any]) -> Any:
    dt = NP[c["dt"]]
    return compare_attention_backward(*(x.astype(dt) for x in g), c["q"], c["k"], c["v"],
                                      c["do"], attn_mask=c["mask"], is_causal=c["causal"],
                                      enable_gqa=c["gqa"])


def false_alarms(n_cases: int, seed: int) -> None:
    print("## False alarms on correct kernels (compare_attention_backward, default rule)")
    print("kernel | dtype | cases | ours: false alarms | worst error/tolerance | "
          "flash2 false alarms | atol (bf16) false alarms")
    rng = np.random.default_rng(seed)
    for dt in NP:
        stats: dict[str, list[Any]] = defaultdict(lambda: [0, 0, 0.0, 0, 0])
        for _ in range(n_cases):
            c = _case(rng, dt)
            kernels: dict[str, list[np.ndarray]] = {}
            up = "float64" if dt in ("float32", "float64") else "float32"
            ref = pt = None
            if torch is not None and dt == "float64":
                kernels["torch SDPA default"] = _torch_grads(c, dt, "default")
                kernels["torch SDPA MATH"] = _torch_grads(c, dt, "math")
            elif torch is not None:
                kernels["torch SDPA default"] = _torch_grads(c, dt, "default")
                kernels["torch SDPA MATH"] = _torch_grads(c, dt, "math")
                ref = _torch_grads(c, up, "math")
                pt = kernels["torch SDPA MATH"]
            m = c["mask"]
            fa_mask = None if m is None or m.dtype != np.bool_ else m
            if m is None or m.dtype == np.bool_:
                kernels["FA2-style numpy"] = list(fa2_backward(
                    c["q"][0], c["k"][0], c["v"][0], c["do"][0], dtype=NP[dt],
                    causal=c["causal"], mask=fa_mask))
                kernels["FA2-style numpy"] = [x[None] for x in kernels["FA2-style numpy"]]
            for name, g in kernels.items():
                comp = _ours(g, c)
                st = stats[name]
                st[0] += 1
                st[1] += 0 if comp.passed else 1
                st[2] = max(st[2], max(x.worst.ratio for x in comp.gradients.values()
                                       if x.worst is not None))
                if ref is not None and pt is not None:
                    two, atol = _flash_rules(g, ref, pt, dt)
                    st[3] += 0 if two else 1
                    st[4] += 0 if atol in (True, None) else 1
                if not comp.passed:
                    print(f"  FALSE ALARM {name} {dt}: L={c['q'].shape[-2]} S={c['k'].shape[-2]}")
        for name, st in stats.items():
            atol = str(st[4]) if dt == "bfloat16" else "—"
            two = "— (no wider reference)" if dt == "float64" else str(st[3])
            print(f"{name} | {dt} | {st[0]} | {st[1]} | {st[2]:.3f} | {two} | {atol}")


def jax_false_alarms(n_cases: int, seed: int) -> None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("jax not installed: skipped")
        return
    print("## JAX: jax.vjp of jax.nn.dot_product_attention")
    print("dtype | cases | false alarms | worst error/tolerance")
    rng = np.random.default_rng(seed + 1)
    for dt in ("float32", "float16", "bfloat16"):
        fa, worst = 0, 0.0
        for _ in range(n_cases):
            L, S, E, H = (int(rng.integers(1, 100)), int(rng.integers(1, 200)),
                          int(rng.choice([16, 32])), int(rng.choice([1, 2])))
            causal = bool(rng.random() < 0.5) and L == S
            arrs = [rng.standard_normal((1, n, H, E)).astype(NP[dt]) for n in (L, S, S, L)]
            _, vjp = jax.vjp(lambda a, b, c_, causal=causal: jax.nn.dot_product_attention(
                a, b, c_, is_causal=causal), *(jnp.asarray(a) for a in arrs[:3]))
            g = [np.asarray(x) for x in vjp(jnp.asarray(arrs[3]))]
            sw = [np.swapaxes(a, 1, 2) for a in arrs]
            comp = compare_attention_backward(*(np.swapaxes(x, 1, 2) for x in g), *sw,
                                              is_causal=causal)
            fa += 0 if comp.passed else 1
            worst = max(worst, max(x.worst.ratio for x in comp.gradients.values() if x.worst))
        print(f"{dt} | {n_cases} | {fa} | {worst:.3f}")


def mha_false_alarms(n_cases: int, seed: int) -> None:
    if torch is None:
        return
    from mha_symbolic.testing.backward.mha import compare_mha_backward

    print("## nn.MultiheadAttention backward (compare_mha_backward, inputs and every parameter)")
    print("dtype | cases | false alarms | worst error/tolerance")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed + 2)
    for dt in ("float32", "float16", "bfloat16", "float64"):
        tdt = getattr(torch, dt)
        fa, worst, n = 0, 0.0, n_cases if dt != "float64" else max(1, n_cases // 4)
        for trial in range(n):
            E, H = [(16, 2), (32, 4), (64, 4)][trial % 3]
            m = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=tdt)
            L, S = int(rng.integers(2, 48)), int(rng.integers(2, 48))
            x = torch.randn(2, L, E, dtype=tdt, requires_grad=True)
            kv = torch.randn(2, S, E, dtype=tdt, requires_grad=True)
            out, _ = m(x, kv, kv, need_weights=False)
            gout = torch.randn_like(out)
            params = dict(m.named_parameters())
            grads = torch.autograd.grad(out, [x, *params.values()], gout)
            d = dict(zip(params, grads[1:], strict=True))
            d["query"] = grads[0]
            comp = compare_mha_backward(d, x, kv, kv, gout, module=m)
            fa += 0 if comp.passed else 1
            worst = max(worst, max(c.worst.ratio for c in comp.gradients.values() if c.worst))
        print(f"{dt} | {n} | {fa} | {worst:.3f}")


def bugs(n_cases: int, seed: int) -> None:
    print("## Backward bugs injected into the FA2-style kernel")
    print("dtype | bug | cases | above model: caught / right first diagnosis | visible: caught / "
          "right | flash2 misses (visible) | atol misses (visible, bf16)")
    rng = np.random.default_rng(seed + 3)
    for dt in NP:
        rows: dict[str, list[int]] = defaultdict(lambda: [0] * 7)
        for _ in range(n_cases):
            L = S = int(rng.integers(4, 80))
            E, hq, hk = 16, 4, 2
            q, k, v, do = (rng.standard_normal(s).astype(NP[dt]) for s in
                           ((hq, L, E), (hk, S, E), (hk, S, E), (hq, L, E)))
            mask = rng.random((L, S)) < 0.85
            mask[:, 0] = True
            keep = rng.random((hq, L, S)) < 0.9
            opts = dict(attn_mask=mask, is_causal=True, enable_gqa=True, dropout_p=0.25,
                        dropout_mask=keep)
            ref = reference_attention_backward(q, k, v, do, **opts)
            exact = [e.midpoint for e in ref]
            good = fa2_backward(q, k, v, do, dtype=NP[dt], causal=True, mask=mask, keep=keep,
                                p_drop=0.25)
            noise = max(float(np.max(np.abs(g - e))) for g, e in zip(good, exact, strict=True))
            x = AttentionCall(*(a.astype(np.float64) for a in (q, k, v)),
                              do=do.astype(np.float64), attn_mask=mask,
                               is_causal=True, enable_gqa=True, dropout_p=0.25, dropout_mask=keep)
            base = compare_attention_backward(*(g.astype(NP[dt]) for g in good), q, k, v, do, **opts)
            for bug in BACKWARD_BUG_CLASSES:
                if not bug.applies(x):
                    continue
                v64 = bug.variant(x)
                effect = max(float(np.max(np.abs(getattr(v64, n) - e)))
                             for n, e in zip(GRADS, exact, strict=True))
                above = any(bool(np.any(np.abs(getattr(v64, n) - e) > base.bounds[n]))
                            for n, e in zip(GRADS, exact, strict=True))
                visible = effect >= 10 * noise
                if not (above or visible):
                    continue
                g = fa2_backward(q, k, v, do, dtype=NP[dt], causal=True, mask=mask, keep=keep,
                                 p_drop=0.25, bug=bug.name)
                comp = compare_attention_backward(*(a.astype(NP[dt]) for a in g), q, k, v, do,
                                                  **opts)
                caught = not comp.passed
                right = caught and comp.diagnoses and comp.diagnoses[0].bug == bug.name
                r = rows[bug.name]
                r[0] += 1
                if above:
                    r[1] += caught
                    r[2] += bool(right)
                    r[5] += 1
                if visible:
                    r[3] += caught
                    r[4] += bool(right)
                    r[6] += 1
                    # FlashAttention's rules on the same output, against exact gradients
                    # and the correct same-dtype kernel as g_pt
                    two = all(np.max(np.abs(a - e)) <= 2 * np.max(np.abs(p - e))
                              for a, e, p in zip(g, exact, good, strict=True))
                    rows["_flash2_" + bug.name][0] += two
                    if dt == "bfloat16":
                        atol = all(bool(np.all(np.abs(a - e) <= FA_ATOL[n]))
                                   for a, e, n in zip(g, exact, GRADS, strict=True))
                        rows["_atol_" + bug.name][0] += atol
        for name in [b.name for b in BACKWARD_BUG_CLASSES]:
            r = rows.get(name)
            if r is None:
                continue
            f2 = rows["_flash2_" + name][0]
            at = rows["_atol_" + name][0] if dt == "bfloat16" else None
            print(f"{dt} | {name} | {r[0]} | {r[1]}/{r[5]} caught, {r[2]} right | "
                  f"{r[3]}/{r[6]} caught, {r[4]} right | {f2}/{r[6]} | "
                  + (f"{at}/{r[6]}" if at is not None else "—"))


def _timed(fn: Any, repeats: int) -> tuple[list[float], list[float]]:
    cpu, wall = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return cpu, wall


def _med(x: list[float]) -> float:
    return sorted(x)[len(x) // 2]


def _numba(on: bool) -> None:
    """Switch the compiled kernels on or off in this process (both tiers' twins)."""
    from mha_symbolic.oracle.arith import jit
    from mha_symbolic.oracle.backward import fast as bfast

    os.environ["MHA_SYMBOLIC_NUMBA"] = "1" if on else "0"
    jit._kernels.cache_clear()
    bfast._compiled.cache_clear()


def speed(repeats: int = 5, growth: bool = True) -> None:
    """Issue 12's target: the fp32-rounded reference backward <= 10x torch float64
    autograd (forward + backward) of SDPA at (2, 8, 256, 64), both sides one thread,
    CPU and wall time, min and median; fp64-rounded beside it; numba and the numpy
    twins; the growth with L at (1, 8, L, 64)."""
    if torch is None:
        return
    print("## Speed: reference backward (construction + .rounded() of dq, dk, dv) vs torch "
          "float64 autograd of SDPA (forward + backward), float32 inputs, one thread each")

    def case(shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
        rng = np.random.default_rng(0)
        return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(4))

    def torch_run(x: tuple[np.ndarray, ...]) -> None:
        q, k, v, do = x
        tq, tk, tv = (torch.from_numpy(a).double().requires_grad_(True) for a in (q, k, v))
        out = F.scaled_dot_product_attention(tq, tk, tv)
        torch.autograd.grad(out, (tq, tk, tv), torch.from_numpy(do).double())

    split: dict[str, list[float]] = defaultdict(list)

    def ours(x: tuple[np.ndarray, ...], fmt: str) -> None:
        c0 = time.process_time()
        g = reference_attention_backward(*x)
        c1 = time.process_time()
        for e in g:
            e.rounded(fmt)
        split["tier 1 (construction)"].append(c1 - c0)
        split["rounding (tiers 2-3)"].append(time.process_time() - c1)

    def report(name: str, cpu: list[float], wall: list[float], base: list[float] | None) -> str:
        line = (f"{name}: CPU min {min(cpu):.3f} s, median {_med(cpu):.3f} s; "
                f"wall min {min(wall):.3f} s, median {_med(wall):.3f} s")
        if base is not None:
            line += (f"; ratio (CPU) min/min {min(cpu) / min(base):.1f}x, "
                     f"median/median {_med(cpu) / _med(base):.1f}x")
        return line

    x = case((2, 8, 256, 64))
    torch_run(x)
    for use_numba in (True, False):
        _numba(use_numba)
        ours(x, "float32")   # warm: compiled kernels loaded, tables built
        label = "numba" if use_numba else "numpy twins (MHA_SYMBOLIC_NUMBA=0)"
        t_cpu, t_wall = _timed(lambda: torch_run(x), 3 * repeats)
        print(report("torch float64 autograd", t_cpu, t_wall, None))
        for fmt in ("float32", "float64"):
            split.clear()
            cpu, wall = _timed(lambda fmt=fmt: ours(x, fmt), repeats)
            print(report(f"reference, {fmt}-rounded, {label}", cpu, wall, t_cpu))
            print("   of which (CPU, median): " + ", ".join(
                f"{k} {_med(v):.3f} s" for k, v in split.items()))
    _numba(True)
    print("threads: OMP/OPENBLAS/MKL =", os.environ.get("OMP_NUM_THREADS"),
          "torch =", torch.get_num_threads(), "; load:", _load())
    if not growth:
        return
    print()
    print("## Growth with L: (1, 8, L, 64), float32 inputs, numba; CPU min/median of 3")
    print("L | torch fp64 autograd (s) | fp32-rounded (s) | ratio | fp64-rounded (s) | ratio")
    for L in (256, 512, 1024, 2048):
        x = case((1, 8, L, 64))
        t_cpu, _ = _timed(lambda x=x: torch_run(x), 3)
        cpu32, _ = _timed(lambda x=x: ours(x, "float32"), 3)
        row = (f"{L} | {min(t_cpu):.3f}/{_med(t_cpu):.3f} | {min(cpu32):.3f}/{_med(cpu32):.3f} "
               f"| {min(cpu32) / min(t_cpu):.1f}x/{_med(cpu32) / _med(t_cpu):.1f}x")
        if L <= 1024:
            cpu64, _ = _timed(lambda x=x: ours(x, "float64"), 3)
            row += (f" | {min(cpu64):.3f}/{_med(cpu64):.3f} | "
                    f"{min(cpu64) / min(t_cpu):.1f}x/{_med(cpu64) / _med(t_cpu):.1f}x")
        else:
            row += " | — | —"
        print(row, flush=True)
    print("load:", _load())


def _load() -> str:
    with open("/proc/loadavg") as fh:
        return fh.read().strip()


def main() -> None:
    if any(a == "--device" or a.startswith("--device=") for a in sys.argv[1:]):
        sys.path.insert(0, str(ROOT / "bench"))
        import device_cli  # issue 17: real kernels on a device, backward

        device_cli.main(sys.argv[1:], ("bwd",), "bench_backward.py")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--speed-repeats", type=int, default=5)
    ap.add_argument("--no-growth", action="store_true")
    ap.add_argument("--only", choices=["false-alarms", "jax", "mha", "bugs", "speed"])
    a = ap.parse_args()
    t0 = time.time()
    sections = {"false-alarms": lambda: false_alarms(a.cases, a.seed),
                "jax": lambda: jax_false_alarms(a.cases, a.seed),
                "mha": lambda: mha_false_alarms(max(2, a.cases // 2), a.seed),
                "bugs": lambda: bugs(max(2, a.cases // 2), a.seed),
                "speed": lambda: speed(a.speed_repeats, not a.no_growth)}
    for name, fn in sections.items():
        if a.only not in (None, name) or (name == "speed" and a.skip_speed):
            continue
        fn()
        print()
    print(f"(total {time.time() - t0:.0f} s; load {_load()})")


if __name__ == "__main__":
    main()
