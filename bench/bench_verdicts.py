"""Evaluation of the testing tool: false alarms, misses, diagnoses, and the same
catalogue judged by PyTorch's and FlashAttention's rules.

    python bench/bench_verdicts.py [--cases N] [--seed S]

Correct implementations (tests/bugs_catalog.py numpy kernels in each dtype,
torch scaled_dot_product_attention default and MATH backends on CPU, torch
nn.MultiheadAttention) must pass; buggy implementations (one per bug class) must
fail where the bug's effect is above the dtype's rounding.  Four rules judge the
same outputs:

ours        compare_attention with the default model tolerance (accumulation in the
            output dtype: the loosest legitimate assumption)
ours+acc32  the same with accumulation_dtype="float32" stated (kernels that
            accumulate in float32; only applied to those)
torch5      PyTorch test_transformers: reference = MATH on inputs upcast (fp32->fp64,
            fp16/bf16->fp32), atol = 5·max(max|ref - lp|, default_atol),
            rtol = 5·max(max|ref - lp|/|ref|, default_rtol), lp = same-dtype MATH run
flash2      FlashAttention tests: max|out - ref| <= 2·max|lp - ref|, same ref and lp

"Above rounding" (must be caught): the bug's effect in exact arithmetic, |buggy64 -
exact|, exceeds the model tolerance somewhere ("model"), or exceeds 10× the error of
the correct same-dtype numpy kernel on the same inputs ("visible").
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import bugs_catalog as bc  # noqa: E402

from mha_symbolic import compare_attention, reference_attention  # noqa: E402
from mha_symbolic.testing.bugs import AttentionInputs, plain_attention  # noqa: E402
from mha_symbolic.testing.tolerance import format_of  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover
    torch = None

DEFAULT_ATOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-3}
DEFAULT_RTOL = {"float32": 1.3e-6, "float16": 1e-3, "bfloat16": 1.6e-2}
LOW = ("float16", "bfloat16")
# kernels that do not accumulate in float32: "ours+acc32" does not apply to them
_LOW_ACC = ("numpy_same_dtype_accumulation", "numpy_sequential_accumulation")


def _tt(a: np.ndarray, dtype: str) -> Any:
    if a.dtype == np.bool_:
        return torch.from_numpy(a)
    t = torch.from_numpy(np.ascontiguousarray(a.astype(np.float64)))
    return t.to(getattr(torch, dtype))


def _torch_sdpa(case: bc.Case, dtype: str, backend: str) -> np.ndarray:
    q, k, v = (_tt(x, dtype) for x in (case.q, case.k, case.v))
    m = case.attn_mask
    causal = case.is_causal
    if causal and case.causal_alignment == "bottom_right":
        # torch's is_causal is top-left: pass bottom-right as an explicit mask
        L, S = case.q.shape[-2], case.k.shape[-2]
        keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + (S - L)
        m = keep if m is None else (m & keep if m.dtype == np.bool_
                                    else np.where(keep, m, -np.inf).astype(m.dtype))
        causal = False
    mt = None if m is None else _tt(m, dtype if m.dtype != np.bool_ else "bool")
    kw = dict(attn_mask=mt, is_causal=causal, scale=case.scale,
              enable_gqa=case.enable_gqa)
    if backend == "math":
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, k, v, **kw)
    else:
        out = F.scaled_dot_product_attention(q, k, v, **kw)
    return out.to(torch.float64).numpy()


def _ref_and_lp(case: bc.Case) -> tuple[np.ndarray, np.ndarray]:
    """torch MATH on upcast inputs (the reference of both rules) and in the same dtype."""
    up = "float64" if case.dtype == "float32" else "float32"
    return _torch_sdpa(case, up, "math"), _torch_sdpa(case, case.dtype, "math")


def torch5(out: np.ndarray, ref: np.ndarray, lp: np.ndarray, dtype: str) -> bool:
    with np.errstate(invalid="ignore", divide="ignore"):
        atol = float(np.max(np.abs(ref - lp), initial=0.0))
        rel = np.abs((ref - lp) / ref)
        rel = np.where(np.isnan(rel), DEFAULT_RTOL[dtype], rel)
        rtol = float(np.max(rel, initial=0.0))
    atol = 5 * max(atol, DEFAULT_ATOL[dtype])
    rtol = 5 * max(rtol, DEFAULT_RTOL[dtype])
    if rtol > 1e30:
        rtol = DEFAULT_RTOL[dtype]
    with np.errstate(invalid="ignore"):
        ok = np.abs(out - ref) <= atol + rtol * np.abs(ref)
    return bool(np.all(ok | (np.isnan(out) & np.isnan(ref))))


def flash2(out: np.ndarray, ref: np.ndarray, lp: np.ndarray) -> bool:
    if np.any(np.isnan(out) != np.isnan(ref)):
        return False
    with np.errstate(invalid="ignore"):
        a = float(np.nanmax(np.abs(out - ref), initial=0.0))
        b = float(np.nanmax(np.abs(lp - ref), initial=0.0))
    return a <= 2 * b


def _as64(case: bc.Case) -> bc.Case:
    c = bc.Case("float64", *(x.astype(np.float64) for x in (case.q, case.k, case.v)),
                **case.kwargs())
    if c.attn_mask is not None and c.attn_mask.dtype != np.bool_:
        c.attn_mask = c.attn_mask.astype(np.float64)
    return c


def _model_tol(case: bc.Case, fmt_name: str) -> np.ndarray:
    fmt = format_of(fmt_name)
    x = AttentionInputs(*(np.asarray(a, np.float64) for a in (case.q, case.k, case.v)),
                        attn_mask=None if case.attn_mask is None else (
                            case.attn_mask if case.attn_mask.dtype == np.bool_
                            else case.attn_mask.astype(np.float64)),
                        is_causal=case.is_causal, scale=case.scale,
                        enable_gqa=case.enable_gqa, causal_alignment=case.causal_alignment)
    return plain_attention(x).bound(fmt, fmt)


def _torch_ok(case: bc.Case) -> bool:
    return torch is not None


def correct_runs(n: int, rng: np.random.Generator) -> dict[str, Any]:
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    worst: dict[tuple[str, str], float] = defaultdict(float)
    examples: list[str] = []
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        for _ in range(n):
            case = bc.random_case(rng, dtype)
            outs = {v: bc.numpy_attention(case, variant=v) for v in bc.CORRECT_SDPA}
            if _torch_ok(case):
                outs["torch_sdpa_default"] = _torch_sdpa(case, dtype, "default")
                outs["torch_sdpa_math"] = _torch_sdpa(case, dtype, "math")
                ref, lp = _ref_and_lp(case) if dtype != "float64" else (None, None)
            else:
                ref = lp = None
            for impl, out in outs.items():
                actual = np.asarray(out).astype(bc.DTYPES[dtype])
                r = compare_attention(actual, case.q, case.k, case.v, **case.kwargs(),
                                      diagnose_bugs=False)
                row = rows[(dtype, impl)]
                row[0] += 1
                row[1] += not r.passed
                worst[(dtype, impl)] = max(worst[(dtype, impl)], r.worst.ratio if r.worst else 0)
                if not r.passed and len(examples) < 3:
                    examples.append(f"{dtype} {impl} {case.kind}\n{r.report()}")
                if dtype in LOW and impl not in _LOW_ACC:
                    r32 = compare_attention(actual, case.q, case.k, case.v, **case.kwargs(),
                                            accumulation_dtype="float32", diagnose_bugs=False)
                    row[2] += not r32.passed
                    worst[(dtype, impl + "+acc32")] = max(worst[(dtype, impl + "+acc32")],
                                                          r32.worst.ratio if r32.worst else 0)
                if ref is not None:
                    a64 = np.asarray(actual, np.float64)
                    row[3] += not torch5(a64, ref, lp, dtype)
                    row[4] += not flash2(a64, ref, lp)
    return {"rows": dict(rows), "worst": dict(worst), "examples": examples}


def bug_runs(n: int, rng: np.random.Generator) -> dict[str, Any]:
    # per (dtype, bug): applicable, above-model, above-visible, caught(ours | above-model),
    # caught(ours | visible), caught(acc32 | visible), torch5 caught | visible,
    # flash2 caught | visible, diagnosis claimed, diagnosis correct, caught(ours) overall
    stats: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * 11)
    misses: list[str] = []
    for dtype in ("float32", "float16", "bfloat16"):
        for _ in range(n):
            case = bc.random_case(rng, dtype)
            c64 = _as64(case)
            exact = reference_attention(case.q, case.k, case.v, **case.kwargs()).midpoint
            tol = _model_tol(case, dtype)
            good = bc.numpy_attention(case).astype(np.float64)
            good_err = float(np.max(np.abs(good - exact), initial=0.0))
            floor = float(np.max(np.abs(exact), initial=0.0)) * format_of(dtype).u * 2
            ref = lp = None
            if _torch_ok(case):
                ref, lp = _ref_and_lp(case)
            for bug in bc.SDPA_BUGS:
                if not bc.bug_applies(bug, case):
                    continue
                b64 = bc.numpy_attention(c64, bug=bug).astype(np.float64)
                eff = np.abs(b64 - exact)
                above_model = bool(np.any(eff > tol))
                visible = float(np.max(eff, initial=0.0)) > 10 * max(good_err, floor)
                out = bc.numpy_attention(case, bug=bug)
                r = compare_attention(out, case.q, case.k, case.v, **case.kwargs())
                r32 = compare_attention(out, case.q, case.k, case.v, **case.kwargs(),
                                        accumulation_dtype="float32", diagnose_bugs=False)
                st = stats[(dtype, bug)]
                st[0] += 1
                st[1] += above_model
                st[2] += visible
                st[3] += above_model and not r.passed
                st[4] += visible and not r.passed
                st[5] += visible and not r32.passed
                if ref is not None and visible:
                    a64 = np.asarray(out, np.float64)
                    st[6] += not torch5(a64, ref, lp, dtype)
                    st[7] += not flash2(a64, ref, lp)
                if r.diagnoses:
                    st[8] += 1
                    st[9] += bug in [d.bug for d in r.diagnoses]
                    if bug not in [d.bug for d in r.diagnoses] and len(misses) < 12:
                        misses.append(f"wrong diagnosis {dtype} {bug}: "
                                      f"{[d.bug for d in r.diagnoses]} ({case.kind})")
                st[10] += not r.passed
                if above_model and r.passed and len(misses) < 12:
                    misses.append(f"miss {dtype} {bug} ({case.kind}): effect/tol = "
                                  f"{float(np.max(eff / tol)):.3g}")
    return {"stats": dict(stats), "misses": misses}


def _torch_mha(case: bc.MhaCase) -> tuple[np.ndarray, Any]:
    """torch.nn.MultiheadAttention with the case's weights, in the case's dtype."""
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
    return out.to(torch.float64).numpy(), mod


def mha_runs(n: int, rng: np.random.Generator) -> dict[str, Any]:
    """Multi-head blocks: numpy and torch.nn.MultiheadAttention (must pass), and the
    three multi-head bug classes (must fail where above the model tolerance)."""
    from mha_symbolic import reference_mha
    from mha_symbolic.testing.bugs import plain_mha
    from mha_symbolic.testing.compare import _mha_inputs, compare_mha

    good: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    bad: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        for _ in range(n):
            case = bc.random_mha_case(rng, dtype, bias=bool(rng.random() < 0.8))
            kw = case.kwargs()
            outs = {"numpy_mha": bc.numpy_mha(case)}
            if torch is not None:
                outs["torch_MultiheadAttention"] = _torch_mha(case)[0]
            for impl, out in outs.items():
                r = compare_mha(np.asarray(out).astype(bc.DTYPES[dtype]), case.query,
                                case.key, case.value, diagnose_bugs=False, **kw)
                row = good[(dtype, impl)]
                row[0] += 1
                row[1] += not r.passed
                row[2] = max(row[2], r.worst.ratio if r.worst else 0.0)
            if dtype == "float64":
                continue
            exact = reference_mha(case.query, case.key, case.value, **kw).midpoint
            fmt = format_of(dtype)
            tol = plain_mha(_mha_inputs(case.query, case.key, case.value, kw)).bound_fn(fmt, fmt)
            c64 = bc.MhaCase("float64", *(None if a is None else np.asarray(a, np.float64)
                                          for a in (case.query, case.key, case.value)),
                             case.num_heads, *(None if a is None else np.asarray(a, np.float64)
                                               for a in (case.in_proj_weight, case.in_proj_bias,
                                                         case.out_proj_weight,
                                                         case.out_proj_bias)),
                             case.key_padding_mask)
            for bug in bc.MHA_BUGS:
                if bug == "missing_bias" and case.in_proj_bias is None:
                    continue
                if bug == "heads_concat_wrong_order" and case.num_heads == 1:
                    continue
                out = bc.numpy_mha(case, bug=bug)
                r = compare_mha(out, case.query, case.key, case.value, **kw)
                st = bad[(dtype, bug)]
                st[0] += 1
                st[1] += not r.passed
                st[2] += bool(r.diagnoses)
                st[3] += bug in [d.bug for d in r.diagnoses]
                above = bool(np.any(np.abs(bc.numpy_mha(c64, bug=bug) - exact) > tol))
                st[4] += above
                st[5] += above and not r.passed
    return {"good": dict(good), "bad": dict(bad)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300, help="random cases per dtype")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    good = correct_runs(args.cases, rng)
    t1 = time.perf_counter()
    bad = bug_runs(args.cases, rng)
    t2 = time.perf_counter()
    mha = mha_runs(max(args.cases // 3, 1), rng)
    t3 = time.perf_counter()
    print(f"# bench_verdicts: --cases {args.cases} --seed {args.seed}; torch "
          f"{torch.__version__ if torch else 'absent'}; correct {t1 - t0:.0f} s, "
          f"bugs {t2 - t1:.0f} s, multi-head {t3 - t2:.0f} s\n")
    print("## Correct implementations (false alarms)\n")
    print("| dtype | implementation | runs | ours | ours+acc32 | torch5 | flash2 | "
          "worst error/tol (ours) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    tot = [0, 0, 0, 0, 0]
    for (dtype, impl), row in good["rows"].items():
        tot = [a + b for a, b in zip(tot, row, strict=True)]
        acc = str(row[2]) if dtype in LOW and impl not in _LOW_ACC else "–"
        tr = (str(row[3]), str(row[4])) if dtype != "float64" and impl.startswith(
            ("numpy", "torch")) else ("–", "–")
        print(f"| {dtype} | {impl} | {row[0]} | {row[1]} | {acc} | {tr[0]} | {tr[1]} | "
              f"{good['worst'][(dtype, impl)]:.3f} |")
    print(f"| **all** | | **{tot[0]}** | **{tot[1]}** | **{tot[2]}** | **{tot[3]}** | "
          f"**{tot[4]}** | |")
    for key, val in good["worst"].items():
        if key[1].endswith("+acc32"):
            print(f"<!-- worst {key}: {val:.3f} -->")
    for ex in good["examples"]:
        print("\n```\n" + ex + "\n```")
    print("\n## Buggy implementations (misses)\n")
    print("| dtype | bug | runs | above model | ours caught | visible | ours | ours+acc32 | "
          "torch5 | flash2 | diagnosed (correct/claimed) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    T = [0] * 11
    for (dtype, bug), st in sorted(bad["stats"].items()):
        T = [a + b for a, b in zip(T, st, strict=True)]
        print(f"| {dtype} | {bug} | {st[0]} | {st[1]} | {st[3]} | {st[2]} | {st[4]} | "
              f"{st[5]} | {st[6]} | {st[7]} | {st[9]}/{st[8]} |")
    print(f"| **all** | | **{T[0]}** | **{T[1]}** | **{T[3]}** | **{T[2]}** | **{T[4]}** | "
          f"**{T[5]}** | **{T[6]}** | **{T[7]}** | **{T[9]}/{T[8]}** |")
    print(f"\ncaught overall (any effect size): ours {T[10]}/{T[0]}")
    for m in bad["misses"]:
        print("- " + m)
    print("\n## Multi-head blocks\n")
    print("| dtype | implementation | runs | false alarms (ours) | worst error/tol |")
    print("|---|---|---:|---:|---:|")
    for (dtype, impl), row in mha["good"].items():
        print(f"| {dtype} | {impl} | {row[0]} | {row[1]} | {row[2]:.3f} |")
    print("\n| dtype | bug | runs | above model | caught of those | caught (all) | "
          "diagnosed (correct/claimed) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (dtype, bug), st in sorted(mha["bad"].items()):
        print(f"| {dtype} | {bug} | {st[0]} | {st[4]} | {st[5]} | {st[1]} | {st[3]}/{st[2]} |")


if __name__ == "__main__":
    main()
