"""Backward verdicts at the float limits (issue 30, item 3): V and dO scaled by
1 .. 2^1000 and queries by 1 .. 1e300, float64 and float32 torch autograd gradients,
correct and with a planted dV bug (one key's gradient changed).  Counts PASS, FAIL,
NOVERDICT (split: "float64 range" and other) and errors; a correct gradient that
FAILs is a false alarm.  One line per case with --verbose.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/probe_limits_backward.py [--verbose]
"""
# ruff: noqa  (a probe script: one-line cases, long print lines)
import collections
import sys
import time

import numpy as np
import torch

import mha_symbolic as ms
from mha_symbolic.errors import ToleranceError

VD = (1.0, 1e120, 1e200, 1e300, 2.0 ** 1000)
QS = (1.0, 1e100, 1e200, 1e300)


def grads(q, k, v, do, dt, mask=None):
    t = [torch.tensor(a, dtype=dt, requires_grad=True) for a in (q, k, v)]
    o = torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=mask)
    o.backward(torch.tensor(do, dtype=dt))
    return [x.grad.numpy() for x in t]


def inputs(sv, sd, sq, dtn, seed, shape=(1, 2, 6, 8)):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal(shape) for _ in range(4))
    q = q * min(sq, np.finfo(dtn).max / 8)
    v = v / 4 * min(sv, np.finfo(dtn).max)
    do = do / 4 * min(sd, np.finfo(dtn).max)
    return [a.astype(dtn) for a in (q, k, v, do)]


def one(sv, sd, sq, dt, bug, seed):
    dtn = {torch.float32: np.float32, torch.float64: np.float64}[dt]
    q, k, v, do = inputs(sv, sd, sq, dtn, seed)
    dq, dk, dv = grads(q, k, v, do, dt)
    if bug:  # dV changed at one key: 1/8 of that key's gradient (rounded) added
        dv = dv.copy()
        dv[..., 2, :] = (dv[..., 2, :] * dtn(1.125)).astype(dtn)
        if np.array_equal(dv, grads(q, k, v, do, dt)[2]):
            return "SKIP"
    try:
        r = ms.compare_attention_backward(dq, dk, dv, q, k, v, do)
    except ToleranceError as e:
        s = str(e)
        return "NOVERDICT-range" if "float64 range" in s else "NOVERDICT"
    except Exception as e:  # noqa: BLE001
        return "ERR " + repr(e)[:100]
    return "PASS" if r.passed else "FAIL"


def main() -> None:
    verbose = "--verbose" in sys.argv
    counts = collections.Counter()
    t0 = time.process_time()
    for dt in (torch.float64, torch.float32):
        for sv in VD:
            for sd in VD:
                for sq in QS:
                    for bug in (False, True):
                        for seed in (0, 1):
                            res = one(sv, sd, sq, dt, bug, seed)
                            counts[("bug" if bug else "correct", res.split()[0])] += 1
                            if verbose or res.startswith("ERR") or (not bug and res == "FAIL"):
                                print(str(dt)[6:], f"v={sv:g} do={sd:g} q={sq:g}",
                                      "bug" if bug else "ok", seed, res, flush=True)
    for k in sorted(counts):
        print(*k, counts[k])
    print(f"cpu {time.process_time() - t0:.1f}s")


if __name__ == "__main__":
    main()
