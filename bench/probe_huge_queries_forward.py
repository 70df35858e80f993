"""torch SDPA forward at queries ×1e100–1e300 (float64) and ×1e20–1e30 (float32), values
ordinary and huge: compare_attention's verdicts on its output and on output × (1 + 2^-8)
(issue 30 item 3, h30f; bench/RESULTS.md).  OMP_NUM_THREADS=1 PYTHONPATH=. python bench/probe_huge_queries_forward.py
"""
# ruff: noqa  (a probe script: one-line cases, long print lines)
import warnings, numpy as np, torch
import mha_symbolic as ms
from mha_symbolic.errors import ToleranceError
warnings.simplefilter("error")
torch.set_num_threads(1)
def one(dt, s, seed, mixed, vs=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 2, 8, 16))
    if mixed: q[..., ::2, :] *= s
    else: q *= s
    k, v = rng.standard_normal((1, 2, 8, 16)), rng.standard_normal((1, 2, 8, 16)) * vs
    npdt = {torch.float64: np.float64, torch.float32: np.float32}[dt]
    q, k, v = (a.astype(npdt) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v))).numpy()
    res = []
    for name, o in (("sdpa", out), ("sdpa*(1+2^-8)", out * (1 + 2.0**-8))):
        try:
            r = ms.compare_attention(o, q, k, v)
            res.append(f"{name}: {'PASS' if r.passed else 'FAIL'} ratio {r.worst.ratio:.2g}" if r.worst else f"{name}: {'PASS' if r.passed else 'FAIL'}")
        except ToleranceError as e:
            res.append(f"{name}: NOVERDICT {str(e)[:80]}")
    return "; ".join(res)
for dt, scales in ((torch.float64, [1e100, 1e200, 1e300]), (torch.float32, [1e20, 1e25, 1e30])):
    for s in scales:
        for mixed in (False, True):
            for vs in ((1.0, 2.0**600) if dt == torch.float64 else (1.0, 1e30)):
                print(f"{str(dt)[6:]} q*{s:g} {'mixed' if mixed else 'all'} v*{vs:.3g}: {one(dt, s, 0, mixed, vs)}", flush=True)
