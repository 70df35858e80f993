"""compare_attention_backward at the float limits (issue 30 item 3, backward): a grid of
queries ×{1, 1e100, 1e200, 1e300}, values and output gradients up to 2^1000 (float64)
and 1e30 (float32), no mask / causal / a bool mask; torch SDPA autograd gradients,
correct and with a planted dV bug (dV at one key moved by max|dO|, a wrong weight of
one: at key 0, the middle key and the last).  Counts passes, fails, refusals by reason
("float64 range", vacuous, other), false alarms (a correct gradient failed), missed bugs
(a planted bug passed) and answers that must never appear ("please report", a NaN or
infinite tolerance, a warning, an exception).  bench/RESULTS.md has the numbers.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/probe_limits_backward.py [--verbose]
"""
# ruff: noqa  (a probe script: one-line cases, long print lines)
import collections
import sys
import time
import warnings

import numpy as np
import torch

import mha_symbolic as ms
from mha_symbolic.errors import ToleranceError

F64 = ([1.0, 1e100, 1e200, 1e300],
       [(1.0, 1.0), (1e120, 1.0), (1e200, 1.0), (1e300, 1.0), (2.0 ** 1000, 1.0),
        (1.0, 1e120), (1.0, 1e200), (1.0, 1e300), (1.0, 2.0 ** 1000), (1e120, 1e120),
        (2.0 ** 1000, 2.0 ** -900)])
F32 = ([1.0, 1e20], [(1.0, 1.0), (1e30, 1.0), (1.0, 1e30)])
MASKS = ("none", "causal", "bool")
SHAPE = (1, 2, 6, 8)


def inputs(qs, vs, dos, dt, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(SHAPE) * qs
    k = rng.standard_normal(SHAPE)
    v = rng.uniform(-1, 1, SHAPE) * vs
    do = rng.uniform(-1, 1, SHAPE) * dos
    bm = rng.random((SHAPE[-2], SHAPE[-2])) < 0.7
    bm[:, 0] = True
    return [a.astype(dt) for a in (q, k, v, do)], bm


def grads(x, kw):
    t = [torch.tensor(a, requires_grad=True) for a in x[:3]]
    am = kw.get("attn_mask")
    o = torch.nn.functional.scaled_dot_product_attention(
        *t, attn_mask=None if am is None else torch.tensor(am), is_causal=kw.get("is_causal", False))
    o.backward(torch.tensor(x[3]))
    return [a.grad.numpy() for a in t]


def judge(g, x, kw):
    """(outcome, reason): pass / fail / refused (reason) / never (what)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = ms.compare_attention_backward(*g, *x, **kw)
    except ToleranceError as e:
        s = str(e)
        if "please report" in s or "tolerance is nan" in s or "tolerance is inf" in s:
            return "never", s[:100]
        return "refused", ("float64 range" if "float64 range" in s else
                           "vacuous" if "would pass" in s else s[:60])
    except Exception as e:  # a warning or a foreign exception
        return "never", repr(e)[:100]
    return ("pass" if r.passed else "fail"), ""


def main() -> None:
    verbose = "--verbose" in sys.argv
    t0, c0 = time.perf_counter(), time.process_time()
    count = collections.Counter()
    reasons = collections.Counter()
    for dt, (qss, vds) in ((np.float64, F64), (np.float32, F32)):
        for qs in qss:
            for vs, dos in vds:
                for mask in MASKS:
                    x, bm = inputs(qs, vs, dos, dt)
                    kw = {"is_causal": True} if mask == "causal" else (
                        {"attn_mask": bm} if mask == "bool" else {})
                    with np.errstate(all="ignore"):
                        g = grads(x, kw)
                    if not all(np.all(np.isfinite(a)) for a in g):
                        count["kernel overflowed (skipped)"] += 1
                        continue
                    cases = [("correct", g)]
                    top = float(np.max(np.abs(x[3])))
                    for j in (0, SHAPE[-2] // 2, SHAPE[-2] - 1):
                        bad = g[2].copy()
                        bad[0, 0, j, 0] += dt(top)
                        cases.append((f"dv@{j}", [g[0], g[1], bad]))
                    for name, gg in cases:
                        out, why = judge(gg, x, kw)
                        kind = "correct" if name == "correct" else "planted"
                        count[(kind, out)] += 1
                        if out == "refused":
                            reasons[(kind, why)] += 1
                        if out == "never" or (kind, out) in (("correct", "fail"), ("planted", "pass")):
                            print("!!", np.dtype(dt).name, qs, vs, dos, mask, name, out, why, flush=True)
                        elif verbose:
                            print(np.dtype(dt).name, f"q×{qs:g} v×{vs:g} dO×{dos:g}", mask, name, out, why, flush=True)
    print(f"load {open('/proc/loadavg').read().split()[0]}; wall {time.perf_counter() - t0:.0f} s, "
          f"CPU {time.process_time() - c0:.0f} s")
    for key in sorted(count, key=str):
        print(f"{key}: {count[key]}")
    for key in sorted(reasons, key=str):
        print(f"refused {key}: {reasons[key]}")
    fa = count[("correct", "fail")]
    missed = count[("planted", "pass")]
    never = count[("correct", "never")] + count[("planted", "never")]
    print(f"false alarms {fa}, missed bugs {missed}, never-answers {never}")


if __name__ == "__main__":
    main()
