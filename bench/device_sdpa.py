"""Real attention kernels on a device (CUDA or CPU) judged by the oracle (issue 17).

    python bench/bench_verdicts.py --device cuda [--quick | --sizes 1,128,1024] ...  # forward
    python bench/bench_backward.py --device cuda ...                                # backward
    bench/gpu_check.sh                                    # both, the prepared GPU run

Inputs are drawn on the device (``torch.randn(..., device=...)``); each torch SDPA
backend is forced in turn with ``torch.nn.attention.sdpa_kernel`` (FLASH_ATTENTION,
EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH on CUDA; FLASH_ATTENTION, i.e. the CPU
flash kernel, and MATH on CPU; ``--backends`` to choose), plus FlexAttention
(``torch.compile(flex_attention)`` on CUDA, eager on CPU) with a causal and a
sliding-window ``mask_mod`` (window S/4).  A backend that refuses a case ("No viable backend",
or any other exception at the call) is counted as *not supported*, never as a pass.

The oracle reads the device tensors itself (``mha_symbolic.oracle.inputs``:
``.detach().cpu()`` before numpy, bf16 exactly); the reference runs on the CPU, in
worker processes (``--jobs``) while the device produces the next cases.  Each output
and each gradient set is judged by

ours     compare_attention / compare_attention_backward, default rule (fp32
         accumulation, fused kernel, probabilistic model) — a failure is a false alarm
         (these kernels are taken as correct; a failure's diagnosis is kept in the JSON)
torch5   PyTorch's test_transformers rule (external_rules.torch5), ref = MATH on the
         device on fp32-upcast inputs, lp = the same-dtype MATH run; per gradient for
         the backward direction
flash2   FlashAttention's rule (external_rules.flash2) on the same ref and lp

and the worst error ÷ tolerance of ours is kept (the table, JSON and command line:
bench/device_cli.py).  ``--budget-s`` bounds the wall time:
cases not judged by then are reported as "not judged (time)", never as passes.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

from external_rules import flash2, torch5  # noqa: E402

BACKENDS = {"cuda": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"),
            "cpu": ("FLASH_ATTENTION", "MATH")}
ALL_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
KINDS = ("none", "causal", "bool", "float", "gqa")
FLEX_MASKS = ("causal", "sliding")
# Plans: sequence lengths n give square (L = S = n) and decode (L = 1, S = n) shapes.
# Lengths >= LONG are run for head dim 128 only, one head, causal (square) — the
# oracle's CPU time grows as L·S·E; shorter ones in every mask kind.
LONG = 4096
PLANS: dict[str, dict[str, Any]] = {
    "cuda": dict(sizes=(1, 128, 1024, 2048, 4096, 8192), dims=(64, 128),
                 flex_sizes=(1024, 2048), budget_s=420.0, flex_budget_s=150.0),
    "cuda-quick": dict(sizes=(1, 128, 1024), dims=(64, 128), flex_sizes=(1024,),
                       budget_s=240.0, flex_budget_s=90.0),
    "cpu": dict(sizes=(1, 128, 512, 1024), dims=(64, 128), flex_sizes=(256,),
                budget_s=3600.0, flex_budget_s=600.0),
    "cpu-quick": dict(sizes=(1, 64, 256), dims=(64, 128), flex_sizes=(128,),
                      budget_s=1800.0, flex_budget_s=300.0),
}
# CPU seconds of the oracle per multiply-add of L·S·E·heads, measured on this project's
# 2-core development machine under load (compare_attention at L = S = 2048, E = 128,
# fp16: 5.9 s per head; compare_attention_backward: 2.2e-8 per MAC), rounded up.
SEC_PER_MAC = {"fwd": 1.4e-8, "bwd": 2.6e-8}
SEC_FIXED = {"fwd": 0.15, "bwd": 0.4}
# Peak memory of one verdict (bytes): the forward oracle works in row blocks (about
# 0.3 GB at L = S = 1024 ... 2048, E = 128); the backward one holds O(L·S) arrays per
# head — measured 1.64 GB above the process's base at L = S = 2048, one head, fp16
# (0.53 GB at 1024), i.e. about 400 bytes per score; rounded up.
MEM_FIXED = {"fwd": 0.6e9, "bwd": 0.6e9}
MEM_PER_SCORE = {"fwd": 0.0, "bwd": 450.0}
# Square backward cases beyond this many scores per head are not in the plans
# (L = S = 8192 would need ~30 GB per verdict; 4096 ~8 GB is kept).
MAX_BWD_SCORES = 4096 * 4096


# --------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class Spec:
    """One case: shapes, dtype, mask kind ("none", "causal", "bool", "float", "gqa" =
    grouped heads and causal) or a FlexAttention mask_mod ("causal", "sliding")."""

    dtype: str
    L: int
    S: int
    E: int
    kind: str
    hq: int
    hk: int
    flex: str | None = None
    batch: int = 1

    @property
    def causal(self) -> bool:
        return self.flex is None and self.kind in ("causal", "gqa")

    @property
    def gqa(self) -> bool:
        return self.hq != self.hk

    @property
    def macs(self) -> int:
        return self.batch * self.hq * self.L * self.S * self.E

    def label(self) -> str:
        shape = f"L=S={self.L}" if self.L == self.S else f"L={self.L} S={self.S}"
        what = f"flex {self.flex}" if self.flex else self.kind
        return f"{self.dtype} E={self.E} {shape} H={self.hq}/{self.hk} {what}"


def estimate(spec: Spec, direction: str) -> float:
    """Estimated CPU seconds of the oracle's verdict on one output of ``spec``."""
    return SEC_FIXED[direction] + SEC_PER_MAC[direction] * spec.macs


def memory(spec: Spec, direction: str) -> float:
    """Estimated peak bytes of the oracle's verdict on one output of ``spec``."""
    return MEM_FIXED[direction] + MEM_PER_SCORE[direction] * spec.batch * spec.hq \
        * spec.L * spec.S


def judged_in(spec: Spec, direction: str) -> bool:
    """Whether the plan judges ``spec`` in ``direction`` (see MAX_BWD_SCORES)."""
    return direction == "fwd" or spec.L * spec.S <= MAX_BWD_SCORES


def make_plan(sizes: tuple[int, ...], dims: tuple[int, ...], dtypes: tuple[str, ...],
              flex_sizes: tuple[int, ...], kinds: tuple[str, ...] = KINDS) -> list[Spec]:
    """Every case of a run, the most expensive first (they start first on the pool);
    FlexAttention's last (its compilation must not starve the SDPA backends)."""
    specs: list[Spec] = []
    flex: list[Spec] = []
    for dtype in dtypes:
        for n in sizes:
            long = n >= LONG
            for E in dims:
                if long and max(dims) != E:
                    continue
                heads = 1 if n >= 1024 else 2
                pairs = [(n, n)] + ([(1, n)] if n > 1 else [])
                for L, S in pairs:
                    for kind in kinds:
                        if long and L == S and kind not in ("causal",):
                            continue
                        hq, hk = (2 * heads, heads) if kind == "gqa" else (heads, heads)
                        specs.append(Spec(dtype, L, S, E, kind, hq, hk))
        for i, n in enumerate(flex_sizes):
            E = dims[min(i, len(dims) - 1)]
            for mm in FLEX_MASKS:
                flex.append(Spec(dtype, n, n, E, mm, 2, 1, flex=mm))
    specs.sort(key=lambda s: -s.macs)
    flex.sort(key=lambda s: -s.macs)
    return specs + flex


class CausalMask:
    """FlexAttention mask_mod: key j is kept for query i when j <= i (top-left)."""

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return q_idx >= kv_idx

    def __repr__(self) -> str:
        return "CausalMask()"


class SlidingWindowMask:
    """FlexAttention mask_mod: causal and within ``window`` keys: 0 <= i - j < window."""

    def __init__(self, window: int) -> None:
        self.window = window

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < self.window)

    def __repr__(self) -> str:
        return f"SlidingWindowMask({self.window})"


# one object per mask and window: torch.compile guards on the mask_mod's identity, so
# a fresh object per case would recompile every time
_MASK_MODS: dict[tuple[str, int], Any] = {}


def sliding_window(spec: Spec) -> int:
    """The sliding window of a flex case: a quarter of its keys (so that it differs
    from the causal mask), at least 1."""
    return max(1, spec.S // 4)


def mask_mod_of(spec: Spec) -> Any:
    key = (spec.flex or "", sliding_window(spec) if spec.flex == "sliding" else 0)
    if key not in _MASK_MODS:
        _MASK_MODS[key] = (CausalMask() if spec.flex == "causal"
                           else SlidingWindowMask(key[1]))
    return _MASK_MODS[key]


def make_inputs(spec: Spec, device: str, seed: int) -> dict[str, Any]:
    """q, k, v, grad_output (and a mask) drawn on ``device`` in ``spec.dtype``."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    dt = getattr(torch, spec.dtype)

    def randn(*shape: int) -> Any:
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dt)

    B, L, S, E = spec.batch, spec.L, spec.S, spec.E
    x: dict[str, Any] = dict(q=randn(B, spec.hq, L, E), k=randn(B, spec.hk, S, E),
                             v=randn(B, spec.hk, S, E), do=randn(B, spec.hq, L, E), mask=None)
    if spec.kind == "bool":
        m = torch.rand((L, S), generator=g, device=device) < 0.9
        m[:, 0] = True                         # no fully masked row
        x["mask"] = m
    elif spec.kind == "float":
        m = 2 * torch.randn((L, S), generator=g, device=device)
        m = torch.where(torch.rand((L, S), generator=g, device=device) < 0.05,
                        -math.inf, m)
        m[:, 0] = 0.0
        x["mask"] = m.to(dt)
    return x


# --------------------------------------------------------------------------------------
# Kernels


def mem_budget_bytes() -> float:
    """60 % of this machine's memory for the oracle's workers together."""
    try:
        return 0.6 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8e9


class NotSupported(Exception):
    """The backend refused the case."""


def _sdpa_call(x: dict[str, Any], spec: Spec, backend: str | None, direction: str,
               dtype: Any = None) -> tuple[Any, tuple[Any, ...] | None]:
    """(output, gradients or None) of SDPA forced to ``backend`` (None: no forcing);
    ``dtype`` upcasts the inputs first (the reference runs of torch5/flash2)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def prep(t: Any) -> Any:
        t = t if dtype is None else t.to(dtype)
        return t.detach().requires_grad_(direction == "bwd")

    q, k, v = (prep(x[n]) for n in "qkv")
    m = x["mask"]
    if m is not None and dtype is not None and m.dtype != torch.bool:
        m = m.to(dtype)
    kw = dict(attn_mask=m, is_causal=spec.causal, enable_gqa=spec.gqa)
    if spec.flex is not None:                  # the reference runs of a flex case
        L, S = spec.L, spec.S
        keep = mask_mod_of(spec)(0, 0, torch.arange(L, device=q.device)[:, None],
                                 torch.arange(S, device=q.device)[None, :])
        kw = dict(attn_mask=keep, is_causal=False, enable_gqa=spec.gqa)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx = sdpa_kernel(getattr(SDPBackend, backend)) if backend else contextlib.nullcontext()
        with ctx, torch.set_grad_enabled(direction == "bwd"):
            out = F.scaled_dot_product_attention(q, k, v, **kw)
            grads = None
            if direction == "bwd":
                do = x["do"] if dtype is None else x["do"].to(dtype)
                grads = torch.autograd.grad(out, (q, k, v), do)
    return out.detach(), grads


_FLEX_CACHE: dict[str, Any] = {}


def _flex_call(x: dict[str, Any], spec: Spec, device: str, direction: str
               ) -> tuple[Any, tuple[Any, ...] | None]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if device == "cuda":
        fn = _FLEX_CACHE.get("fn")
        if fn is None:
            import torch._dynamo

            # one compiled graph per shape, dtype, mask and direction: past dynamo's
            # default limit (8) it would fall back to eager without a word
            for name in ("cache_size_limit", "recompile_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, 256)
            fn = _FLEX_CACHE["fn"] = torch.compile(flex_attention, dynamic=False)
    else:
        fn = flex_attention
    bm = create_block_mask(mask_mod_of(spec), None, None, spec.L, spec.S, device=device)
    q, k, v = (x[n].detach().requires_grad_(direction == "bwd") for n in "qkv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.set_grad_enabled(direction == "bwd"):
            out = fn(q, k, v, block_mask=bm, enable_gqa=spec.gqa)
            grads = torch.autograd.grad(out, (q, k, v), x["do"]) if direction == "bwd" else None
    return out.detach(), grads


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def run_kernel(x: dict[str, Any], spec: Spec, backend: str, device: str, direction: str
               ) -> tuple[Any, tuple[Any, ...] | None]:
    """The kernel's output (and gradients); NotSupported when it refuses the case."""
    import torch

    try:
        if backend.startswith("FLEX"):
            res = _flex_call(x, spec, device, direction)
        else:
            res = _sdpa_call(x, spec, backend, direction)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:
        raise NotSupported(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                           if str(exc) else type(exc).__name__) from None
    return res


# --------------------------------------------------------------------------------------
# Judging (in worker processes: numpy arrays in, a small dict out)


def _np(t: Any, name: str) -> np.ndarray:
    """The oracle's own reading of a (device) tensor."""
    from mha_symbolic.oracle.inputs import as_exact_array

    return as_exact_array(t, name)


def judge_task(task: dict[str, Any]) -> dict[str, Any]:
    """Our default rule on one output (direction "fwd") or one gradient set ("bwd")."""
    from mha_symbolic import ToleranceError, compare_attention
    from mha_symbolic.testing.backward.compare import compare_attention_backward

    a, opts = task["arrays"], task["options"]
    t0 = time.process_time()
    r: Any
    try:
        if task["direction"] == "fwd":
            r = compare_attention(a["out"], a["q"], a["k"], a["v"], **opts)
            ratio = r.worst.ratio if r.worst is not None else 0.0
        else:
            r = compare_attention_backward(a["dq"], a["dk"], a["dv"], a["q"], a["k"], a["v"],
                                           a["do"], **opts)
            ratio = max((g.worst.ratio for g in r.gradients.values() if g.worst is not None),
                        default=0.0)
    except ToleranceError as exc:
        return dict(verdict="refused", message=str(exc)[:300],
                    cpu_s=time.process_time() - t0)
    except Exception as exc:
        return dict(verdict="error", message=f"{type(exc).__name__}: {str(exc)[:300]}",
                    cpu_s=time.process_time() - t0)
    ratio = float(ratio)
    if not math.isfinite(ratio):
        return dict(verdict="error", message=f"worst error/tolerance {ratio}",
                    cpu_s=time.process_time() - t0)
    out: dict[str, Any] = dict(verdict="pass" if r.passed else "fail", ratio=ratio,
                               cpu_s=time.process_time() - t0)
    if not r.passed:
        out["diagnoses"] = [d.bug for d in r.diagnoses][:3]
        out["report"] = r.report()[:1500]
    return out


def _worker_init() -> None:
    warnings.simplefilter("ignore")


# --------------------------------------------------------------------------------------
# The run


@dataclass
class Row:
    """Counts of one (backend, dtype, direction): cases = not supported + judged +
    refused + errors + not judged (time)."""

    cases: int = 0
    not_supported: int = 0
    judged: int = 0
    ours: int = 0
    refused: int = 0
    errors: int = 0
    external: int = 0          # outputs judged by torch5 and flash2
    torch5: int = 0
    flash2: int = 0
    worst: float = 0.0
    not_judged_time: int = 0
    oracle_cpu_s: float = 0.0
    refusals: dict[str, int] = field(default_factory=dict)


@dataclass
class Run:
    device: str
    directions: tuple[str, ...]
    rows: dict[tuple[str, str, str], Row] = field(default_factory=lambda: defaultdict(Row))
    failures: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def _external(direction: str, got: Any, ref: Any, lp: Any, dtype: str) -> tuple[bool, bool]:
    """(torch5 passes, flash2 passes) on float64 copies; for gradients every one must."""
    if direction == "fwd":
        got, ref, lp = [got], [ref], [lp]
    t5 = all(torch5(g, r, p, dtype) for g, r, p in zip(got, ref, lp, strict=True))
    f2 = all(flash2(g, r, p) for g, r, p in zip(got, ref, lp, strict=True))
    return t5, f2


def _f64(t: Any, name: str) -> np.ndarray:
    return np.asarray(_np(t, name), dtype=np.float64)


def device_read_check(device: str, seed: int) -> dict[str, Any]:
    """The oracle's reading of device tensors: bitwise equal to a host copy, and
    compare_attention on the device tensors gives the numpy path's verdict and ratio."""
    import torch

    from mha_symbolic import compare_attention

    spec = Spec("bfloat16", 33, 47, 64, "float", 2, 2)
    x = make_inputs(spec, device, seed)
    out, _ = _sdpa_call(x, spec, None, "fwd")
    bitwise = True
    for name, t in (("q", x["q"]), ("mask", x["mask"]), ("out", out)):
        a = _np(t, name)
        host = t.detach().to("cpu")
        b = host.view(torch.int16).numpy().view(a.dtype) if host.dtype == torch.bfloat16 \
            else host.numpy()
        bitwise &= a.dtype == b.dtype and a.tobytes() == b.tobytes()
    r_dev = compare_attention(out, x["q"], x["k"], x["v"], attn_mask=x["mask"])
    r_np = compare_attention(_np(out, "out"), _np(x["q"], "q"), _np(x["k"], "k"),
                             _np(x["v"], "v"), attn_mask=_np(x["mask"], "mask"))
    same = (r_dev.passed == r_np.passed and r_dev.worst is not None and r_np.worst is not None
            and r_dev.worst.ratio == r_np.worst.ratio)
    return dict(device=str(out.device), bitwise=bool(bitwise), same_verdict=bool(same),
                passed=bool(r_dev.passed))


def run(specs: list[Spec], device: str, backends: tuple[str, ...], directions: tuple[str, ...],
        *, jobs: int, budget_s: float, seed: int, flex: bool, progress: bool = True,
        flex_budget_s: float = math.inf) -> Run:
    """Run every case on the device, judge every output; at most ``budget_s`` wall,
    of which at most ``flex_budget_s`` for running (compiling) FlexAttention."""
    import torch

    t_start = time.perf_counter()
    deadline = t_start + budget_s
    res = Run(device, directions)
    res.meta["device_read_check"] = device_read_check(device, seed)
    if progress:
        print(f"device read check: {res.meta['device_read_check']}", flush=True)
    pool = None
    if jobs > 1:
        import multiprocessing as mp

        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"),
                                   initializer=_worker_init)
    pending: dict[Future[dict[str, Any]], tuple[tuple[str, str, str], dict[str, Any],
                                                float]] = {}
    # verdicts wait here while the running ones' estimated memory leaves no room
    held: list[tuple[dict[str, Any], tuple[str, str, str], dict[str, Any], float]] = []
    mem_budget = mem_budget_bytes()
    n_done = [0]

    def record(key: tuple[str, str, str], info: dict[str, Any], r: dict[str, Any]) -> None:
        row = res.rows[key]
        n_done[0] += 1
        row.oracle_cpu_s += float(r.get("cpu_s", 0.0))
        if r["verdict"] in ("pass", "fail"):
            row.judged += 1
            row.worst = max(row.worst, r["ratio"])
            if r["verdict"] == "fail":
                row.ours += 1
                res.failures.append({**info, **r})
        elif r["verdict"] == "refused":
            row.refused += 1
            res.failures.append({**info, **r})
        else:
            row.errors += 1
            res.failures.append({**info, **r})

    def release() -> None:
        """Submit held verdicts, in order, while their memory fits (one always may)."""
        assert pool is not None
        while held:
            busy = sum(m for _k, _i, m in pending.values())
            if pending and busy + held[0][3] > mem_budget:
                return
            task, key, info, mem = held.pop(0)
            pending[pool.submit(judge_task, task)] = (key, info, mem)

    def collect(timeout: float | None) -> int:
        if not pending:
            return 0
        done, _ = wait(list(pending), timeout=timeout, return_when=FIRST_COMPLETED)
        for f in done:
            key, info, _mem = pending.pop(f)
            try:
                r = f.result()
            except Exception as exc:  # a worker died (memory?): an error, never a pass
                r = dict(verdict="error", message=f"worker: {type(exc).__name__}: {exc}")
            record(key, info, r)
        release()
        return len(done)

    flex_name = "FLEX (compiled)" if device == "cuda" else "FLEX (eager)"
    t_dev = t_flex = 0.0
    for i, spec in enumerate(specs):
        if time.perf_counter() > deadline or (spec.flex and t_flex > flex_budget_s):
            for direction in [d for d in directions if judged_in(spec, d)]:
                for b in ([flex_name] if spec.flex else backends):
                    res.rows[(b, spec.dtype, direction)].cases += 1
                    res.rows[(b, spec.dtype, direction)].not_judged_time += 1
            continue
        t0 = time.perf_counter()
        x = make_inputs(spec, device, seed + i)
        arrays = {n: _np(x[n], n) for n in ("q", "k", "v", "do")}
        mask = None if x["mask"] is None else _np(x["mask"], "attn_mask")
        status: list[str] = []
        for direction in [d for d in directions if judged_in(spec, d)]:
            up = torch.float64 if spec.dtype == "float32" else torch.float32
            ref_out, ref_g = _sdpa_call(x, spec, "MATH", direction, dtype=up)
            lp_out, lp_g = _sdpa_call(x, spec, "MATH", direction)
            ref: Any = _f64(ref_out, "ref")
            lp: Any = _f64(lp_out, "lp")
            if direction == "bwd":
                assert ref_g is not None and lp_g is not None
                ref = [_f64(g, "ref") for g in ref_g]
                lp = [_f64(g, "lp") for g in lp_g]
            for backend in ([flex_name] if spec.flex else backends):
                key = (backend, spec.dtype, direction)
                row = res.rows[key]
                row.cases += 1
                try:
                    out, grads = run_kernel(x, spec, backend, device, direction)
                except NotSupported as exc:
                    row.not_supported += 1
                    why = str(exc)
                    row.refusals[why[:80]] = row.refusals.get(why[:80], 0) + 1
                    status.append(f"{direction}:{backend[:5]}-")
                    continue
                if direction == "fwd":
                    got: Any = _f64(out, "out")
                    a = {**arrays, "out": _np(out, "actual")}
                else:
                    assert grads is not None
                    got = [_f64(g, n) for g, n in zip(grads, ("dq", "dk", "dv"), strict=True)]
                    a = {**arrays, **{n: _np(g, n) for g, n in
                                      zip(grads, ("dq", "dk", "dv"), strict=True)}}
                t5, f2 = _external(direction, got, ref, lp, spec.dtype)
                row.external += 1
                row.torch5 += not t5
                row.flash2 += not f2
                opts: dict[str, Any] = dict(is_causal=spec.causal, enable_gqa=spec.gqa)
                if mask is not None:
                    opts["attn_mask"] = mask
                if spec.flex:
                    opts["mask_mod"] = mask_mod_of(spec)
                task = dict(direction=direction, arrays=a, options=opts)
                info = dict(case=spec.label(), backend=backend, direction=direction,
                            spec=asdict(spec), torch5=t5, flash2=f2)
                if pool is None and time.perf_counter() >= deadline:
                    row.not_judged_time += 1
                elif pool is None:
                    record(key, info, judge_task(task))
                else:
                    held.append((task, key, info, memory(spec, direction)))
                    release()
                status.append(f"{direction}:{backend[:5]}")
        t_dev += time.perf_counter() - t0
        if spec.flex:
            t_flex += time.perf_counter() - t0
        if pool is not None:
            collect(0)
        if progress:
            el = time.perf_counter() - t_start
            print(f"[{el:6.0f} s] case {i + 1}/{len(specs)} {spec.label()}: "
                  f"{' '.join(status)}; judged {n_done[0]}, queued "
                  f"{len(pending) + len(held)}", flush=True)
    # the remaining verdicts, until the deadline
    while pending and time.perf_counter() < deadline:
        if collect(max(0.0, deadline - time.perf_counter())) and progress:
            print(f"[{time.perf_counter() - t_start:6.0f} s] judged {n_done[0]}, "
                  f"left {len(pending) + len(held)}", flush=True)
    for key, _info, _mem in pending.values():
        res.rows[key].not_judged_time += 1
    for _task, key, _info, _mem in held:
        res.rows[key].not_judged_time += 1
    if pool is not None:
        procs = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:                        # workers still judging past the deadline
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
    res.meta.update(wall_s=time.perf_counter() - t_start, device_s=t_dev, flex_s=t_flex)
    return res
