"""Evaluation of the testing tool's verdicts: false alarms on correct kernels, catch
rates of visible bugs, tightness, and the same outputs judged by PyTorch's,
FlashAttention's and ROCm hipDNN's rules.

    python bench/bench_verdicts.py            # a few minutes
    python bench/bench_verdicts.py --full     # the recorded run (bench/RESULTS.md)
    python bench/bench_verdicts.py --device {cpu,cuda} [--quick] [--sizes ...] [--jobs N]
                                              # issue 17: each SDPA backend forced in
                                              # turn and FlexAttention, on the device
                                              # (bench/device_sdpa.py; --help there)

Sections:

small       random small cases (tests/kernels/bugs_catalog.py's generator: masks, causal in both
            alignments, GQA, scales, long rows, large ranges, near ties, cancelling
            values, fully masked rows), every dtype
production  production-like shapes: S = 256 ... 4096 keys, L = 64 queries, E = 128 (or
            64), fp32/fp16/bf16; plain, bottom-right causal, key padding, GQA
strategy    cases drawn from mha_symbolic.strategies.attention_inputs (adversarial)
multi-head  nn.MultiheadAttention and a numpy block (compare_mha)

Correct kernels: numpy (tests/kernels/bugs_catalog.py, independent of the library: "fused"
FlashAttention-like with fp32 work, online-softmax blocks, and the eager variants that
round q·c and the scores to the dtype, judged with kernel="eager_scaled_query"), torch
SDPA (default and MATH backends), jax.nn.dot_product_attention (judged with
subnormals="flush": XLA on CPU flushes subnormal results), torch nn.MultiheadAttention.
Buggy kernels: the fused numpy kernel with one bug class.

Rules on the same outputs:

ours      compare_attention, default (probabilistic model, fp32 accumulation, fused)
worst     the same with error_model="worst_case"
flash     compare_attention(rule="flash"): 2 × a simulated plain same-dtype kernel's
          error, never below the model
torch5    PyTorch test_transformers: reference = MATH on inputs upcast (fp32->fp64,
          fp16/bf16->fp32), atol = 5·max(max|ref - lp|, default_atol), rtol likewise,
          lp = same-dtype MATH run
flash2    FlashAttention tests: max|out - ref| <= 2·max|lp - ref|, same ref and lp
rocm      ROCm hipDNN's dynamic SDPA tolerance (rocm-libraries PR #7032, as described
          there): |out - exact| <= M_V [|α| D M_Q M_K (γ_D + u) + 2 γ_S + (S + 1) u],
          γ_n = nu/(1 - nu) if nu < 0.01 else 6 sqrt(2n) u, u of the data type, M the
          largest magnitudes of Q, K, V

"Visible" bug: its effect in exact arithmetic, max|buggy64 - exact|, is at least 10 ×
the error of the correct fused numpy kernel in the same dtype on the same inputs
(floored at 2u·max|exact| + 1e-12·max|v|, the float64 noise of the buggy variant).
Tightness: the largest error/tolerance of a correct kernel under "ours" (1 would be a
false alarm).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

import bugs_catalog as bc  # noqa: E402
from external_rules import flash2, torch5  # noqa: E402

from mha_symbolic import ToleranceError, compare_attention, reference_attention  # noqa: E402
from mha_symbolic.testing.tolerance import format_of, unit_roundoff  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover
    torch = None
try:
    import jax
    import jax.numpy as jnp
except ImportError:  # pragma: no cover
    jax = None

RULES = ("ours", "worst", "flash", "torch5", "flash2", "rocm")


# --------------------------------------------------------------------------------------
# Kernels


def _tt(a: np.ndarray, dtype: str) -> Any:
    if a.dtype == np.bool_:
        return torch.from_numpy(np.ascontiguousarray(a))
    t = torch.from_numpy(np.ascontiguousarray(a.astype(np.float64)))
    return t.to(getattr(torch, dtype))


def _explicit_mask(case: bc.Case) -> np.ndarray | None:
    """The case's mask with a bottom-right causal mask folded in (torch and JAX take
    is_causal top-left only)."""
    m = case.attn_mask
    if case.is_causal and case.causal_alignment == "bottom_right":
        L, S = case.q.shape[-2], case.k.shape[-2]
        keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + (S - L)
        m = keep if m is None else (m & keep if m.dtype == np.bool_
                                    else np.where(keep, m, -np.inf).astype(m.dtype))
    return m


def torch_sdpa(case: bc.Case, dtype: str, backend: str) -> np.ndarray:
    q, k, v = (_tt(x, dtype) for x in (case.q, case.k, case.v))
    m = _explicit_mask(case)
    causal = case.is_causal and case.causal_alignment == "top_left"
    mt = None if m is None else _tt(m, dtype if m.dtype != np.bool_ else "bool")
    kw = dict(attn_mask=mt, is_causal=causal, scale=case.scale, enable_gqa=case.enable_gqa)
    with torch.no_grad():
        if backend == "math":
            with sdpa_kernel(SDPBackend.MATH):
                out = F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            out = F.scaled_dot_product_attention(q, k, v, **kw)
    return out.to(torch.float64).numpy()


def jax_sdpa(case: bc.Case) -> np.ndarray | None:
    """jax.nn.dot_product_attention (layout B, T, N, H); None where it does not apply
    (float64 without x64, E_v != E, fully masked rows: JAX returns the mean of the
    values there, the masked_rows='uniform' policy)."""
    if jax is None or case.dtype == "float64" or case.v.shape[-1] != case.q.shape[-1]:
        return None
    m = _explicit_mask(case)
    L, S = case.q.shape[-2], case.k.shape[-2]
    keep = np.ones((L, S), bool)
    if case.is_causal and case.causal_alignment == "top_left":
        keep = np.arange(S)[None, :] <= np.arange(L)[:, None]
    if m is not None and m.dtype == np.bool_:
        keep = keep & m
    elif m is not None:
        keep = keep & (np.asarray(m, np.float64) != -np.inf)
    if not np.all(np.any(keep, axis=-1)):
        return None
    dt = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}[case.dtype]

    def j(a: np.ndarray) -> Any:
        return jnp.asarray(np.swapaxes(a.astype(np.float32), 1, 2)).astype(dt)

    kw: dict[str, Any] = dict(scale=case.scale, is_causal=case.is_causal
                              and case.causal_alignment == "top_left")
    if m is not None and m.dtype == np.bool_:
        B, H = case.q.shape[0], case.q.shape[1]
        kw["mask"] = jnp.asarray(np.broadcast_to(m, (B, H, L, S)))
    elif m is not None:
        B, H = case.q.shape[0], case.q.shape[1]
        kw["bias"] = jnp.asarray(np.broadcast_to(np.asarray(m, np.float32), (B, H, L, S))).astype(dt)
    out = jax.nn.dot_product_attention(j(case.q), j(case.k), j(case.v), **kw)
    return np.swapaxes(np.asarray(out.astype(jnp.float32), dtype=np.float64), 1, 2)


def upcast_refs(case: bc.Case) -> tuple[np.ndarray, np.ndarray] | None:
    """torch MATH on upcast inputs (the reference of torch5 and flash2) and in the
    same dtype (their lp)."""
    if torch is None or case.dtype == "float64":
        return None
    up = "float64" if case.dtype == "float32" else "float32"
    return torch_sdpa(case, up, "math"), torch_sdpa(case, case.dtype, "math")


# --------------------------------------------------------------------------------------
# The external rules


def _rocm_gamma(n: int, u: float) -> float:
    nu = n * u
    return nu / (1 - nu) if nu < 0.01 else 6.0 * math.sqrt(2 * n) * u


def rocm_tolerance(case: bc.Case) -> float:
    """ROCm hipDNN's dynamic SDPA tolerance (rocm-libraries PR #7032's description):
    M_V [|α| D M_Q M_K (γ_D + u) + γ_S + (S + 1) u + γ_S]."""
    u = unit_roundoff(format_of(case.dtype))
    D, S = case.q.shape[-1], case.k.shape[-2]
    alpha = 1 / math.sqrt(D) if case.scale is None else case.scale
    mq, mk, mv = (float(np.max(np.abs(a.astype(np.float64)), initial=0.0))
                  for a in (case.q, case.k, case.v))
    g_d, g_s = _rocm_gamma(D, u), _rocm_gamma(S, u)
    return mv * (abs(alpha) * D * mq * mk * (g_d + u) + g_s + (S + 1) * u + g_s)


def rocm(out: np.ndarray, exact: np.ndarray, case: bc.Case) -> bool:
    with np.errstate(invalid="ignore"):
        both = np.isnan(out) & np.isnan(exact)
        ok = np.abs(out - exact) <= rocm_tolerance(case)
    return bool(np.all(ok | both))


# --------------------------------------------------------------------------------------
# Judging one output by every rule


def _ours(out: np.ndarray, case: bc.Case, **opts: Any) -> tuple[bool | None, float]:
    """(passed, worst error/tol); passed None when the tool refused a verdict."""
    try:
        r = compare_attention(out, case.q, case.k, case.v, **case.kwargs(),
                              diagnose_bugs=False, **opts)
    except ToleranceError:
        return None, math.nan
    return r.passed, (r.worst.ratio if r.worst else 0.0)


def judge(out: np.ndarray, case: bc.Case, exact: np.ndarray, refs: Any,
          opts: dict[str, Any]) -> tuple[dict[str, bool | None], float]:
    """Every rule's verdict (None: refused), and the worst error/tolerance of ours."""
    a = np.asarray(out).astype(bc.DTYPES[case.dtype])
    a64 = a.astype(np.float64)
    res: dict[str, bool | None] = {}
    res["ours"], ratio = _ours(a, case, **opts)
    res["worst"], _ = _ours(a, case, error_model="worst_case", **opts)
    res["flash"], _ = _ours(a, case, rule="flash")
    if refs is not None:
        res["torch5"] = torch5(a64, refs[0], refs[1], case.dtype)
        res["flash2"] = flash2(a64, refs[0], refs[1])
    res["rocm"] = rocm(a64, exact, case)
    return res, ratio


class Tally:
    """Counts per key: runs, and per rule: failures (alarms / catches) and refusals."""

    def __init__(self) -> None:
        self.runs: dict[Any, int] = defaultdict(int)
        self.fail: dict[Any, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.refused: dict[Any, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.tight: dict[Any, float] = defaultdict(float)
        self.examples: list[str] = []

    def add(self, key: Any, res: dict[str, bool | None]) -> None:
        self.runs[key] += 1
        for rule, ok in res.items():
            if ok is None:
                self.refused[key][rule] += 1
            elif not ok:
                self.fail[key][rule] += 1


# --------------------------------------------------------------------------------------
# Sections


def _exact(case: bc.Case) -> np.ndarray:
    return np.asarray(reference_attention(case.q, case.k, case.v, **case.kwargs()).midpoint)


def _as64(case: bc.Case) -> bc.Case:
    c = bc.Case("float64", *(x.astype(np.float64) for x in (case.q, case.k, case.v)),
                **case.kwargs())
    if c.attn_mask is not None and c.attn_mask.dtype != np.bool_:
        c.attn_mask = c.attn_mask.astype(np.float64)
    return c


def correct_kernels(case: bc.Case) -> dict[str, tuple[np.ndarray, dict[str, Any]]]:
    """name -> (output, the model options that describe the kernel)."""
    outs: dict[str, tuple[np.ndarray, dict[str, Any]]] = {}
    for v in ("numpy_fused", "numpy_fused_online", "numpy_plain"):
        outs[v] = (bc.numpy_attention(case, variant=v), bc.KERNEL_OPTIONS[v])
    if torch is not None:
        outs["torch_sdpa_default"] = (torch_sdpa(case, case.dtype, "default"), {})
        outs["torch_sdpa_math"] = (torch_sdpa(case, case.dtype, "math"), {})
    j = jax_sdpa(case)
    if j is not None:      # XLA on CPU flushes subnormal results to zero: say so
        outs["jax_dot_product_attention"] = (j, {"subnormals": "flush"})
    return outs


def run_cases(cases: list[bc.Case], good: Tally, bad: Tally, key_of: Any) -> None:
    for case in cases:
        exact = _exact(case)
        refs = upcast_refs(case)
        for name, (out, opts) in correct_kernels(case).items():
            res, ratio = judge(out, case, exact, refs, opts)
            key = (*key_of(case), name)
            good.add(key, res)
            if not math.isnan(ratio):
                good.tight[key] = max(good.tight[key], ratio)
            if res["ours"] is False and len(good.examples) < 4:
                good.examples.append(f"{key} {case.kind} L={case.q.shape[-2]} "
                                     f"S={case.k.shape[-2]}")
        if case.dtype == "float64":
            continue
        good_err = float(np.max(np.abs(bc.numpy_attention(case, variant="numpy_fused")
                                       .astype(np.float64) - exact), initial=0.0))
        # floored at two roundings of the output and at the float64 evaluation noise of
        # the buggy variant itself (a "bug" moving an exact 0 to 1e-16 is not visible)
        vmax = float(np.max(np.abs(case.v.astype(np.float64)), initial=0.0))
        floor = 2 * unit_roundoff(format_of(case.dtype)) * float(np.max(np.abs(exact),
                                                                       initial=0.0)) \
            + 1e-12 * vmax
        c64 = _as64(case)
        for bug in bc.SDPA_BUGS:
            if not bc.bug_applies(bug, case):
                continue
            b64 = bc.numpy_attention(c64, bug=bug, variant="numpy_fused").astype(np.float64)
            with np.errstate(invalid="ignore"):
                effect = float(np.nanmax(np.abs(b64 - exact), initial=0.0))
            key = (*key_of(case), bug)
            bad.runs[("all", *key)] += 1
            if not effect >= 10 * max(good_err, floor) or effect == 0:
                continue
            out = bc.numpy_attention(case, bug=bug, variant="numpy_fused")
            res = judge(out, case, exact, refs, {})[0]
            bad.add(key, res)
            if res["ours"] is not False and len(bad.examples) < 10:
                bad.examples.append(f"{key} {case.kind}: effect {effect:.3g}, correct "
                                    f"kernel's error {good_err:.3g}, verdict {res['ours']}")


def small_cases(n: int, rng: np.random.Generator) -> list[bc.Case]:
    return [bc.random_case(rng, dtype) for dtype in ("float64", "float32", "float16",
                                                     "bfloat16") for _ in range(n)]


def production_cases(sizes: tuple[int, ...], per: int, rng: np.random.Generator,
                     dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
                     ) -> list[bc.Case]:
    kinds = ("plain", "causal_bottom_right", "key_padding", "gqa")
    cases = []
    for dtype in dtypes:
        for S in sizes:
            for i in range(per):
                kind = kinds[i % len(kinds)]
                E = 128 if i % 2 == 0 else 64
                hk, hq = (2, 4) if kind == "gqa" else (2, 2)
                L = 64
                g = 1.0 if i % 3 else 2.0                     # a wider score range
                dt = bc.DTYPES[dtype]
                q = (g * rng.standard_normal((1, hq, L, E))).astype(dt)
                k = (g * rng.standard_normal((1, hk, S, E))).astype(dt)
                v = rng.standard_normal((1, hk, S, E)).astype(dt)
                c = bc.Case(dtype, q, k, v, enable_gqa=hq != hk, kind=f"prod_{kind}")
                if kind == "causal_bottom_right":
                    c.is_causal, c.causal_alignment = True, "bottom_right"
                elif kind == "key_padding":
                    m = np.ones((1, 1, 1, S), dtype=bool)
                    m[..., int(S * rng.uniform(0.6, 0.95)):] = False
                    c.attn_mask = m
                cases.append(c)
    return cases


def strategy_cases(n: int) -> list[bc.Case]:
    """``n`` cases per dtype drawn from mha_symbolic.strategies.attention_inputs
    (derandomized: the same cases every run)."""
    from hypothesis import HealthCheck, Phase, given, settings

    from mha_symbolic.strategies import attention_inputs

    cases: list[bc.Case] = []

    def collector(dtype: str) -> Any:
        @settings(max_examples=n, deadline=None, database=None, derandomize=True,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(attention_inputs(dtype=dtype, max_keys=2048, max_dim=64))
        def collect(case: Any) -> None:
            cases.append(bc.Case(dtype, case.query, case.key, case.value,
                                 attn_mask=case.attn_mask, is_causal=case.is_causal,
                                 scale=case.scale, enable_gqa=case.enable_gqa,
                                 causal_alignment=case.causal_alignment,
                                 kind=f"strategy_{case.family}"))

        return collect

    for dtype in ("float32", "float16", "bfloat16"):
        collector(dtype)()
    return cases


# --------------------------------------------------------------------------------------
# Multi-head blocks


def _torch_mha(case: bc.MhaCase) -> np.ndarray:
    E = case.query.shape[-1]
    dt = getattr(torch, case.dtype)
    mod = torch.nn.MultiheadAttention(E, case.num_heads, bias=case.in_proj_bias is not None,
                                      batch_first=True).to(dt).eval()
    with torch.no_grad():
        mod.in_proj_weight.copy_(_tt(case.in_proj_weight, case.dtype))
        mod.out_proj.weight.copy_(_tt(case.out_proj_weight, case.dtype))
        if case.in_proj_bias is not None:
            mod.in_proj_bias.copy_(_tt(case.in_proj_bias, case.dtype))
            mod.out_proj.bias.copy_(_tt(case.out_proj_bias, case.dtype))
        kpm = None if case.key_padding_mask is None else torch.from_numpy(case.key_padding_mask)
        out, _ = mod(*(_tt(x, case.dtype) for x in (case.query, case.key, case.value)),
                     key_padding_mask=kpm, need_weights=False)
    return out.to(torch.float64).numpy()


def mha_runs(n: int, rng: np.random.Generator) -> dict[str, Any]:
    from mha_symbolic.testing.forward.mha import compare_mha

    good: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    bad: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        for _ in range(n):
            case = bc.random_mha_case(rng, dtype, bias=bool(rng.random() < 0.8))
            kw = case.kwargs()
            outs = {"numpy_mha": bc.numpy_mha(case)}
            if torch is not None:
                outs["torch_MultiheadAttention"] = _torch_mha(case)
            for impl, out in outs.items():
                row = good[(dtype, impl)]
                row[0] += 1
                try:
                    r = compare_mha(np.asarray(out).astype(bc.DTYPES[dtype]), case.query,
                                    case.key, case.value, diagnose_bugs=False, **kw)
                except ToleranceError:
                    row[2] += 1
                    continue
                row[1] += not r.passed
                row[3] = max(row[3], r.worst.ratio if r.worst else 0.0)
            if dtype == "float64":
                continue
            for bug in bc.MHA_BUGS:
                if bug == "missing_bias" and case.in_proj_bias is None:
                    continue
                if bug == "heads_concat_wrong_order" and case.num_heads == 1:
                    continue
                r = compare_mha(bc.numpy_mha(case, bug=bug), case.query, case.key,
                                case.value, **kw)
                st = bad[(dtype, bug)]
                st[0] += 1
                st[1] += not r.passed
                st[2] += bug in [d.bug for d in r.diagnoses]
    return {"good": dict(good), "bad": dict(bad)}


# --------------------------------------------------------------------------------------
# Report


def _cell(t: Tally, key: Any, rule: str) -> str:
    if rule in ("torch5", "flash2") and key[0] == "float64":
        return "–"
    f = t.fail[key].get(rule, 0)
    r = t.refused[key].get(rule, 0)
    return f"{f}" + (f" (+{r} refused)" if r else "")


def print_good(title: str, t: Tally, group: int) -> None:
    print(f"\n### {title}: correct kernels (false alarms; tightness = worst error/tol "
          "under ours)\n")
    head = [*["dtype", "S"][:group], "kernel", "runs", *RULES, "tightness"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in sorted(t.runs):
        cells = [str(x) for x in key[:group]] + [key[group], str(t.runs[key])]
        cells += [_cell(t, key, r) for r in RULES]
        cells.append(f"{t.tight.get(key, 0.0):.3f}")
        print("| " + " | ".join(cells) + " |")
    for ex in t.examples:
        print(f"- false alarm: {ex}")


def print_bad(title: str, t: Tally, group: int) -> None:
    print(f"\n### {title}: visible bugs caught (of visible; 'refused' = ToleranceError)\n")
    agg: dict[Any, list[int]] = defaultdict(lambda: [0, 0] + [0] * len(RULES))
    for key, n in t.runs.items():
        if key[0] == "all":
            agg[key[1:1 + group]][0] += n
            continue
        a = agg[key[:group]]
        a[1] += n
        for i, rule in enumerate(RULES):
            a[2 + i] += n - t.fail[key].get(rule, 0)     # runs that passed = misses
    head = [*["dtype", "S"][:group], "bug runs", "visible", *[f"{r} caught" for r in RULES]]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for g in sorted(agg):
        a = agg[g]
        vis = a[1]
        cells = [str(x) for x in g] + [str(a[0]), str(vis)]
        for i in range(len(RULES)):
            caught = vis - a[2 + i]
            cells.append(f"{caught} ({100 * caught / vis:.1f}%)" if vis else "–")
        print("| " + " | ".join(cells) + " |")
    for ex in t.examples:
        print(f"- visible bug not caught by ours: {ex}")


def _load() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def main() -> None:
    if any(a == "--device" or a.startswith("--device=") for a in sys.argv[1:]):
        import device_cli  # issue 17: real kernels on a device, forward

        device_cli.main(sys.argv[1:], ("fwd",), "bench_verdicts.py")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="the recorded run (longer)")
    ap.add_argument("--quick", action="store_true", help="the default: a few minutes")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    full = args.full and not args.quick
    n_small, sizes, per, n_strat, n_mha = (
        (120, (256, 512, 1024, 2048, 4096), 4, 40, 40) if full
        else (25, (256, 1024, 4096), 1, 10, 8))
    rng = np.random.default_rng(args.seed)
    print(f"# bench_verdicts: {'--full' if full else 'default'} --seed {args.seed}; "
          f"torch {torch.__version__ if torch else 'absent'}, "
          f"jax {jax.__version__ if jax else 'absent'}; load {_load()}")
    times = {}
    t0 = time.perf_counter()
    g, b = Tally(), Tally()
    run_cases(small_cases(n_small, rng), g, b, lambda c: (c.dtype,))
    times["small"] = time.perf_counter() - t0
    print_good(f"Small cases ({n_small} per dtype)", g, 1)
    print_bad("Small cases", b, 1)
    t0 = time.perf_counter()
    g, b = Tally(), Tally()
    run_cases(production_cases(sizes, per, rng), g, b, lambda c: (c.dtype, c.k.shape[-2]))
    times["production"] = time.perf_counter() - t0
    print_good(f"Production shapes (L = 64, E = 128/64, {per} case(s) per dtype and S)", g, 2)
    print_bad("Production shapes", b, 2)
    t0 = time.perf_counter()
    g, b = Tally(), Tally()
    run_cases(strategy_cases(n_strat), g, b, lambda c: (c.dtype,))
    times["strategy"] = time.perf_counter() - t0
    print_good(f"Strategy cases (attention_inputs, {n_strat} per dtype)", g, 1)
    print_bad("Strategy cases", b, 1)
    t0 = time.perf_counter()
    mha = mha_runs(n_mha, rng)
    times["multi-head"] = time.perf_counter() - t0
    print("\n### Multi-head blocks (compare_mha)\n")
    print("| dtype | implementation | runs | false alarms | refused | tightness |")
    print("|---|---|---:|---:|---:|---:|")
    for (dtype, impl), row in sorted(mha["good"].items()):
        print(f"| {dtype} | {impl} | {row[0]} | {row[1]} | {row[2]} | {row[3]:.3f} |")
    print("\n| dtype | bug | runs | caught | diagnosed correctly |")
    print("|---|---|---:|---:|---:|")
    for (dtype, bug), st in sorted(mha["bad"].items()):
        print(f"| {dtype} | {bug} | {st[0]} | {st[1]} | {st[2]} |")
    print("\nwall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))


if __name__ == "__main__":
    main()
