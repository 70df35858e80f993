"""Rotary gradients (issue 24 item 3): false alarms of compare_attention_backward on
torch autograd through plain-torch GPT-NeoX / GPT-J RoPE + SDPA (the kernels of
tests/testing/backward/test_compare_rotary_backward.py), in float32 and float64,
tightness (worst observed error / tolerance), the two rotary backward bug classes
(caught, named, and by how much they fail), and the certified reference's time
against plain attention's gradients (one BLAS thread).

    OMP_NUM_THREADS=1 python bench/bench_rotary_backward.py [--seeds N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "testing" / "backward"))

import torch  # noqa: E402
from test_compare_rotary_backward import CASES, _grads  # noqa: E402

import mha_symbolic as ms  # noqa: E402

LONG = {  # name: (L, S, E, kernel keywords, check keywords)
    "neox_S512": (8, 512, 64, {"r": 64}, {"rotary_base": 10000.0}),
    "gptj_S1024_r16": (4, 1024, 32, {"r": 16, "interleaved": True},
                       {"rotary_base": 10000.0, "rotary_dim": 16, "rotary_interleaved": True}),
    "neox_base5e5_r32": (16, 256, 64, {"r": 32, "base": 500000.0},
                         {"rotary_base": 500000.0, "rotary_dim": 32}),
}
BUGS = ("rotation_not_transposed", "rotation_missing")


def _worst(res: object) -> float:
    return max(c.worst.ratio for c in res.gradients.values() if c.worst)  # type: ignore[attr-defined]


def sweep(seeds: int) -> None:
    cases = {n: (L, S, E, H, Hkv, kern, ours) for n, (L, S, E, H, Hkv, kern, ours)
             in CASES.items()}
    cases.update({n: (L, S, E, 2, 2, kern, ours) for n, (L, S, E, kern, ours) in LONG.items()})
    for dtype in (torch.float32, torch.float64):
        t0 = time.perf_counter()
        n = alarms = 0
        worst = 0.0
        bug_min = {b: np.inf for b in BUGS}
        named = {b: 0 for b in BUGS}
        for name, (L, S, E, H, Hkv, kern, ours) in cases.items():
            for seed in range(seeds):
                g, (q, k, v, do) = _grads(dtype, seed, L, S, E, H, Hkv, **kern)
                res = ms.compare_attention_backward(*g, q, k, v, do, **ours)
                n += 1
                alarms += not res.passed
                worst = max(worst, _worst(res))
                for bug in BUGS:
                    gb, _ = _grads(dtype, seed, L, S, E, H, Hkv, bug=bug, **kern)
                    rb = ms.compare_attention_backward(*gb, q, k, v, do, **ours)
                    assert not rb.passed, (name, seed, bug)
                    named[bug] += bool(rb.diagnoses and rb.diagnoses[0].bug == bug)
                    bug_min[bug] = min(bug_min[bug], _worst(rb))
        print(f"{dtype!s:14s} correct calls {n}, false alarms {alarms}, worst error / "
              f"tolerance {worst:.3g}; " + "; ".join(
                  f"{b}: failed {n}/{n}, named {named[b]}/{n}, smallest worst ratio "
                  f"{bug_min[b]:.3g}" for b in BUGS)
              + f" ({time.perf_counter() - t0:.1f} s)")


SIXTEEN = {  # name: (L, S, E, H, hf_attention keywords, check keywords)
    "neox_E16": (4, 9, 16, 2, {}, {}),
    "neox_S128_E64": (8, 128, 64, 2, {}, {}),
    "neox_decode_S512_E64": (8, 512, 64, 2, {}, {}),
    "gptj_r16_E32": (4, 64, 32, 2, {"rotary_dim": 16, "interleaved": True},
                     {"rotary_dim": 16, "rotary_interleaved": True}),
    "neox_causal_E32": (6, 33, 32, 2, {"causal": True}, {"is_causal": True}),
    "gemma2_softcap_E32": (6, 33, 32, 2, {"softcap": 5.0}, {"softcap": 5.0}),
    "gpt_oss_sinks_causal_E32": (6, 33, 32, 2, {"sink": 0.5, "causal": True},
                                 {"sinks": np.array([0.5, 0.5]), "is_causal": True}),
}
BUGS16 = ("rotation_not_transposed", "rotation_missing", "rotation_applied_twice",
          "rotary_interleaved_swapped", "rotary_positions_not_offset", "rotary_dim_ignored",
          "dq_times_1.01")


def _attend(qr, kr, v, *, causal, softcap=None, sink=None):
    """SDPA (top-left causal), or with a softcap / gpt-oss sink column in plain torch."""
    import torch.nn.functional as F

    if softcap is None and sink is None:
        return F.scaled_dot_product_attention(qr, kr, v, is_causal=causal)
    L, S = qr.shape[-2], kr.shape[-2]
    s = qr @ kr.transpose(-1, -2) / qr.shape[-1] ** 0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if sink is not None:
        s = torch.cat([s, torch.full((*s.shape[:-1], 1), sink, dtype=s.dtype)], dim=-1)
    p = torch.softmax(s, dim=-1)
    return (p[..., :S] if sink is not None else p) @ v


def _hf16(q, k, v, do, *, bug=None, fp32_rotation=False, rotary_dim=None,
          interleaved=False, causal=False, softcap=None, sink=None):
    """HF's RoPE (tests/kernels/rotary_kernels: fp32 angles, the rotation in the input
    dtype, or in fp32 and stored, FlashAttention's) then SDPA, its autograd gradients;
    ``bug`` a planted one (the forward's rotary classes, or the backward's)."""
    from rotary_kernels import apply, hf_cos_sin

    L, D = q.shape[-2:]
    S = k.shape[-2]
    r = D if rotary_dim is None or bug == "rotary_dim_ignored" else rotary_dim
    off = 0 if bug == "rotary_positions_not_offset" else S - L
    inter = interleaved != (bug == "rotary_interleaved_swapped")
    dt = torch.float32 if fp32_rotation else q.dtype
    cq, sq = hf_cos_sin(torch.arange(off, off + L), r, 10000.0, 1.0, dt)
    ck, sk = hf_cos_sin(torch.arange(S), r, 10000.0, 1.0, dt)
    comp = torch.float32 if fp32_rotation else None
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    if bug == "rotation_missing":
        qr, kr = q * 1, k * 1
    else:
        qr, kr = apply(q, cq, sq, r, inter, comp), apply(k, ck, sk, r, inter, comp)
    qr.retain_grad()
    kr.retain_grad()
    o = _attend(qr, kr, v, causal=causal, softcap=softcap, sink=sink)
    o.backward(do)
    dq, dk = q.grad, k.grad
    if bug == "rotation_not_transposed":
        dq, dk = qr.grad, kr.grad
    elif bug == "rotation_applied_twice":   # R dQ' (the sign of sin flipped) for Rᵀ dQ'
        dq = apply(qr.grad, cq, sq, r, inter, comp)
        dk = apply(kr.grad, ck, sk, r, inter, comp)
    elif bug == "dq_times_1.01":
        dq = (dq.double() * 1.01).to(dq.dtype)
    return dq, dk, v.grad


def sixteen_bit(seeds: int = 3) -> None:
    """bf16 and fp16: correct kernels (HF's rotation in the input dtype, the rotation in
    fp32 stored) — false alarms and no-verdicts; the planted bugs — failed or not."""
    sys.path.insert(0, str(ROOT / "tests" / "kernels"))
    from mha_symbolic.errors import ToleranceError

    for dt in (torch.bfloat16, torch.float16):
        t0 = time.perf_counter()
        n = alarms = undecided = 0
        worst = 0.0
        failed = {b: 0 for b in BUGS16}
        tried = {b: 0 for b in BUGS16}
        undecided_at: list[str] = []
        for name, (L, S, E, H, kern, ours) in SIXTEEN.items():
            for seed in range(seeds):
                g = torch.Generator().manual_seed(seed)
                q, k, v = (torch.randn(1, H, m, E, generator=g).to(dt) for m in (L, S, S))
                do = torch.randn(1, H, L, E, generator=g).to(dt)
                args = (q, k, v, do)
                kw = {"rotary_base": 10000.0, **ours}
                for fp32 in (False, True):
                    try:
                        r = ms.compare_attention_backward(*_hf16(*args, fp32_rotation=fp32,
                                                                 **kern), q, k, v, do, **kw)
                        n += 1
                        alarms += not r.passed
                        worst = max(worst, _worst(r))
                    except ToleranceError:
                        n += 1
                        undecided += 1
                        undecided_at.append(f"{name}/{seed}/{'fp32' if fp32 else 'HF'}")
                for bug in BUGS16:
                    if bug == "rotary_dim_ignored" and "rotary_dim" not in ours:
                        continue
                    if bug == "rotary_positions_not_offset" and L == S:
                        continue
                    tried[bug] += 1
                    try:
                        rb = ms.compare_attention_backward(*_hf16(*args, bug=bug, **kern), q, k,
                                                           v, do, **kw)
                        failed[bug] += not rb.passed
                    except ToleranceError:
                        pass
        print(f"{dt!s:15s} correct calls {n}: false alarms {alarms}, no verdict {undecided}, "
              f"worst error / tolerance {worst:.3g}; bugs failed: " + ", ".join(
                  f"{b} {failed[b]}/{tried[b]}" for b in BUGS16)
              + f" ({time.perf_counter() - t0:.1f} s)"
              + (f"; no verdict at {', '.join(undecided_at)}" if undecided_at else ""))


def timing(L: int, E: int = 64, reps: int = 3) -> None:
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, 2, L, E)).astype(np.float32) for _ in range(4))
    for fmt in ("float32", "float64"):
        row = []
        for name, kw in (("plain", {}), ("rotary", {"rotary_base": 10000.0})):
            cpu, wall = [], []
            for _ in range(reps):
                c0, w0 = time.process_time(), time.perf_counter()
                g = ms.reference_attention_backward(q, k, v, do, **kw)
                for enc in g:
                    enc.rounded(fmt)
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
            row.append(f"{name} CPU min {min(cpu):.3f} s median {float(np.median(cpu)):.3f} s "
                       f"(wall min {min(wall):.3f} s)")
        print(f"(1, 2, {L}, {E}) gradients rounded to {fmt}: " + "; ".join(row))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--part", choices=("all", "sweep", "16bit", "timing"), default="all")
    args = ap.parse_args()
    print("load", Path("/proc/loadavg").read_text().split()[:3],
          "OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
    if args.part in ("all", "sweep"):
        sweep(args.seeds)
    if args.part in ("all", "16bit"):
        sixteen_bit()
    if args.part not in ("all", "timing"):
        return
    ms.reference_attention_backward(*(np.ones((1, 2, 2)) for _ in range(4)),
                                    rotary_base=10.0)   # imports and tables warm
    for L in (32, 128):
        timing(L)


if __name__ == "__main__":
    main()
