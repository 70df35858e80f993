"""Backward verdicts at queries scaled by 1e100-1e300 (float64) and 1e20-1e30 (float32,
bfloat16): torch SDPA autograd and the FA2-style kernel of tests/kernels, correct and
with planted bugs (issue 30, item 3; bench/RESULTS.md).  Prints one line per case:
PASS/FAIL/NOVERDICT and each gradient's worst error / tolerance.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/probe_huge_scores.py
"""
# ruff: noqa  (a probe script: one-line cases, long print lines)
import ml_dtypes
import time
import numpy as np, torch
import mha_symbolic as ms
from mha_symbolic.errors import ToleranceError

def grads(q, k, v, do, dt):
    t = [torch.tensor(a, dtype=dt, requires_grad=True) for a in (q, k, v)]
    o = torch.nn.functional.scaled_dot_product_attention(*t)
    o.backward(torch.tensor(do, dtype=dt))
    return [x.grad.numpy() for x in t]

def case(s, dt, seed=0, mixed=False, shape=(1, 2, 8, 16)):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape)
    if mixed: q[..., ::2, :] *= s
    else: q *= s
    k, v, do = (rng.standard_normal(shape) for _ in range(3))
    dtn = {torch.float32: np.float32, torch.float64: np.float64}[dt]
    return [a.astype(dtn) for a in (q, k, v, do)]

BUGS = {
 None: lambda g: g,
 "dq*1.01": lambda g: (g[0]*1.01, g[1], g[2]),
 "dk*1.01": lambda g: (g[0], g[1]*1.01, g[2]),
 "dv*1.01": lambda g: (g[0], g[1], g[2]*1.01),
 "dv_row": lambda g: (g[0], g[1], np.roll(g[2], 1, axis=-2)),
}
def judge(s, dt, mixed, bug, em, seed=0):
    q, k, v, do = case(s, dt, seed, mixed)
    dq, dk, dv = BUGS[bug](grads(q, k, v, do, dt))
    t0 = time.process_time()
    try:
        r = ms.compare_attention_backward(dq, dk, dv, q, k, v, do, error_model=em)
        ratios = " ".join(f"{n}:{c.worst.ratio:.2g}" for n, c in r.gradients.items() if c.worst is not None)
        res = ("PASS" if r.passed else "FAIL") + " " + ratios
    except ToleranceError as e:
        res = "NOVERDICT " + str(e)[:120]
    return f"{time.process_time()-t0:.2f}s {res}"

from tests.kernels.fa2_backward_kernel import fa2_backward

def go(s, dt, bug=None, mixed=False, em="probabilistic", seed=0, L=8, E=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, L, E))
    if mixed: q[:, ::2] *= s
    else: q *= s
    k, v, do = (rng.standard_normal((2, L, E)) for _ in range(3))
    q, k, v, do = (a.astype(dt) for a in (q, k, v, do))
    dq, dk, dv = fa2_backward(q, k, v, do, dtype=dt, block=4, bug=bug)
    dq, dk, dv = (a.astype(dt) for a in (dq, dk, dv))
    try:
        r = ms.compare_attention_backward(dq, dk, dv, q, k, v, do, error_model=em)
        return ("PASS " if r.passed else "FAIL ") + " ".join(f"{n}:{c.worst.ratio:.2g}" for n, c in r.gradients.items() if c.worst is not None)
    except ToleranceError as e:
        return "NOVERDICT " + str(e)[:100]
    except Exception as e:
        return "ERR " + repr(e)[:200]

def main() -> None:
    for dt, scales in ((torch.float64, [1e100, 1e200, 1e300]), (torch.float32, [1e20, 1e30])):
        for s in scales:
            for mixed in (False, True):
                for em in ("probabilistic", "worst_case"):
                    for bug in BUGS:
                        print(f"torch {str(dt)[6:]} s={s:g} mixed={mixed} {em} bug={bug}: {judge(s, dt, mixed, bug, em)}", flush=True)
    for dt, scales in ((np.float64, [1e100, 1e200, 1e300]), (np.float32, [1e30]), (ml_dtypes.bfloat16, [1e30])):
        for s in scales:
            for mixed in (False, True):
                for bug in (None, "d_term_missing", "scale_missing_in_dq", "dv_p_not_transposed", "ds_transposed"):
                    print("fa2", np.dtype(dt).name, f"{s:g}", "mixed" if mixed else "onehot", bug, go(s, dt, bug, mixed), flush=True)


if __name__ == "__main__":
    main()
