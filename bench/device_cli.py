"""The device bench's reports and command line (bench/device_sdpa.py runs the cases):
the table per backend, dtype and direction, the JSON, the options and ``main``.

    python bench/bench_verdicts.py --device cuda ...    # forward
    python bench/bench_backward.py --device cuda ...    # backward
    bench/gpu_check.sh                                  # both, the prepared GPU run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

from device_sdpa import (  # noqa: E402
    ALL_BACKENDS,
    BACKENDS,
    KINDS,
    PLANS,
    Run,
    Spec,
    estimate,
    flex_available,
    judged_in,
    make_plan,
    run,
)

# --------------------------------------------------------------------------------------
# Reports


HEAD = ("backend", "dtype", "direction", "cases", "not supported", "judged",
        "ours: false alarms", "ours: refused/errors", "torch5 alarms", "flash2 alarms",
        "worst err/tol (ours)", "not judged (time)")


def table(res: Run) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    order = {b: i for i, b in enumerate((*ALL_BACKENDS, "FLEX (compiled)", "FLEX (eager)"))}
    for key in sorted(res.rows, key=lambda k: (k[2] != "fwd", order.get(k[0], 99), k[1])):
        r = res.rows[key]
        judged_ext = r.external
        cells = [*key, r.cases, r.not_supported, r.judged, r.ours,
                 f"{r.refused}/{r.errors}", f"{r.torch5} of {judged_ext}",
                 f"{r.flash2} of {judged_ext}", f"{r.worst:.3f}", r.not_judged_time]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def to_json(res: Run) -> dict[str, Any]:
    return dict(meta=res.meta, rows=[dict(backend=k[0], dtype=k[1], direction=k[2], **asdict(r))
                                     for k, r in sorted(res.rows.items())],
                failures=res.failures)


def _load() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "unknown"


def _fail(msg: str) -> NoReturn:
    """A bad option: one line on stderr, exit status 2."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _ints(s: str, name: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(p) for p in s.split(",") if p.strip())
    except ValueError:
        _fail(f"{name}={s!r}: expected comma-separated integers")
    if not vals or any(v < 1 or v > 65536 for v in vals):
        _fail(f"{name}={s!r}: expected integers from 1 to 65536")
    return vals


def parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="Real SDPA backends and "
                                 "FlexAttention on a device, judged by the oracle (issue 17)")
    ap.add_argument("--device", choices=("cpu", "cuda"), required=True)
    ap.add_argument("--quick", action="store_true", help="the small plan")
    ap.add_argument("--sizes", help="sequence lengths n (L = S = n and L = 1, S = n), "
                    "comma-separated")
    ap.add_argument("--dims", help="head dims, comma-separated (default 64,128)")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"mask kinds of {KINDS}")
    ap.add_argument("--flex-sizes", help="FlexAttention lengths (L = S), comma-separated")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--backends", help=f"comma-separated of {ALL_BACKENDS} (default: "
                    "all four on cuda, FLASH_ATTENTION,MATH on cpu)")
    ap.add_argument("--jobs", type=int, default=1, help="oracle worker processes")
    ap.add_argument("--budget-s", type=float, help="wall-time budget; cases not judged "
                    "by then are reported as such")
    ap.add_argument("--flex-budget-s", type=float, help="wall-time budget of running "
                    "(compiling) FlexAttention on the device")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--json", help="write the results as JSON to this path")
    ap.add_argument("--estimate-only", action="store_true",
                    help="print the plan's size and estimated oracle CPU time, run nothing")
    return ap


def configure(a: argparse.Namespace) -> tuple[list[Spec], tuple[str, ...], float, bool]:
    """(the plan, the backends, the budget, whether FlexAttention runs) of the options;
    a bad option exits 2 with one line."""
    plan = PLANS[a.device + ("-quick" if a.quick else "")]
    sizes = _ints(a.sizes, "--sizes") if a.sizes else plan["sizes"]
    dims = _ints(a.dims, "--dims") if a.dims else plan["dims"]
    dtypes = tuple(d for d in a.dtypes.split(",") if d)
    for d in dtypes:
        if d not in ("float16", "bfloat16", "float32"):
            _fail(f"--dtypes: {d!r} is not one of float16, bfloat16, float32")
    kinds = tuple(k for k in a.kinds.split(",") if k)
    for k in kinds:
        if k not in KINDS:
            _fail(f"--kinds: {k!r} is not one of {', '.join(KINDS)}")
    backends = BACKENDS[a.device] if not a.backends else tuple(
        b for b in a.backends.split(",") if b)
    for b in backends:
        if b not in ALL_BACKENDS:
            _fail(f"--backends: {b!r} is not one of {', '.join(ALL_BACKENDS)}")
    flex = not a.no_flex and flex_available()
    flex_sizes = (_ints(a.flex_sizes, "--flex-sizes") if a.flex_sizes
                  else plan["flex_sizes"]) if flex else ()
    budget = a.budget_s if a.budget_s is not None else plan["budget_s"]
    if not (budget > 0 and math.isfinite(budget)):
        _fail(f"--budget-s={a.budget_s!r}: expected a positive number")
    fb = a.flex_budget_s if a.flex_budget_s is not None else plan["flex_budget_s"]
    if not (fb > 0):
        _fail(f"--flex-budget-s={a.flex_budget_s!r}: expected a positive number")
    a.flex_budget_s = fb
    if a.jobs < 1 or a.jobs > 256:
        _fail(f"--jobs={a.jobs}: expected 1 ... 256")
    return make_plan(sizes, dims, dtypes, flex_sizes, kinds), backends, budget, flex


def plan_estimate(specs: list[Spec], backends: tuple[str, ...],
                  directions: tuple[str, ...]) -> tuple[int, float, float]:
    """(outputs to judge, their total estimated oracle CPU s, the largest single one)."""
    n, total, big = 0, 0.0, 0.0
    for s in specs:
        per = 1 if s.flex else len(backends)
        for d in [d for d in directions if judged_in(s, d)]:
            e = estimate(s, d)
            n += per
            total += per * e
            big = max(big, e)
    return n, total, big


def main(argv: list[str], directions: tuple[str, ...], prog: str) -> Run | None:
    a = parser(prog).parse_args(argv)
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(v, "1")          # inherited by the worker processes
    specs, backends, budget, flex = configure(a)
    n, total, big = plan_estimate(specs, backends, directions)
    print(f"# {prog} {' '.join(argv)}")
    print(f"plan: {len(specs)} cases, {n} outputs to judge ({', '.join(directions)}); "
          f"estimated oracle CPU {total:.0f} s (largest {big:.0f} s), i.e. about "
          f"{max(total / a.jobs, big):.0f} s wall on {a.jobs} worker(s) at this project's "
          f"measured rate; budget {budget:.0f} s; load {_load()}", flush=True)
    if a.estimate_only:
        return None
    try:
        import torch
    except ImportError:
        _fail("torch is not installed: the device bench runs torch's kernels")
    if a.device == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda: torch.cuda.is_available() is False "
              f"(torch {torch.__version__})")
    torch.manual_seed(a.seed)
    warnings.simplefilter("ignore")
    flags: dict[str, Any] = {}
    if a.device == "cuda":
        # the references of torch5/flash2 run in fp32: no TF32 in them (torch's default
        # too); the reduced-precision fp16/bf16 GEMM reductions stay as users get them
        # (recorded: a MATH-backend alarm would be read against them)
        torch.backends.cuda.matmul.allow_tf32 = False
        m = torch.backends.cuda.matmul
        flags = {n: getattr(m, n, None) for n in (
            "allow_tf32", "allow_fp16_reduced_precision_reduction",
            "allow_bf16_reduced_precision_reduction")}
        print(f"cuda matmul flags: {flags}", flush=True)
    res = run(specs, a.device, backends, directions, jobs=a.jobs, budget_s=budget,
              seed=a.seed, flex=flex, flex_budget_s=a.flex_budget_s)
    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    res.meta.update(argv=[prog, *argv], torch=torch.__version__, device_name=gpu,
                    cuda_matmul_flags=flags,
                    load=_load(), jobs=a.jobs, budget_s=budget, estimate_cpu_s=total,
                    flex=("compiled" if a.device == "cuda" else "eager") if flex
                    else "not offered by this torch")
    print()
    print(table(res))
    print(f"\nwall {res.meta['wall_s']:.0f} s (device side {res.meta['device_s']:.0f} s); "
          f"load {_load()}; torch {torch.__version__}; {gpu}; "
          f"FlexAttention: {res.meta['flex']}")
    falarms = [f for f in res.failures if f["verdict"] == "fail"]
    for f in falarms[:10]:
        print(f"- FALSE ALARM of ours: {f['backend']} {f['direction']} {f['case']}: "
              f"ratio {f['ratio']:.3g}, diagnoses {f.get('diagnoses')}")
    for f in [f for f in res.failures if f["verdict"] != "fail"][:10]:
        print(f"- {f['verdict'].upper()}: {f['backend']} {f['direction']} {f['case']}: "
              f"{f.get('message', '')[:200]}")
    if a.json:
        Path(a.json).write_text(json.dumps(to_json(res), indent=1, default=str))
        print(f"JSON: {a.json}")
    return res
