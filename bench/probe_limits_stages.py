"""Stage by stage, the huge-query inputs of the long harness's `limits` kind (issue 30 item 3,
h30f): forward exact passes / perturbed fails, the gradients' rounding, the backward verdict
on the exact gradients (no finiteness guard: an exact gradient beyond the float max rounds
to inf and fails).  OMP_NUM_THREADS=1 PYTHONPATH=. python bench/probe_limits_stages.py 73 3000 TAG
"""
# ruff: noqa  (a probe script)
import sys, time, warnings, collections, pickle
import numpy as np
import mha_symbolic as ms
from tests.fuzz import long as L_, ring3
from tests.fuzz.ring3 import _BIG
L_.ONLY = ("limits",)
seed, n = int(sys.argv[1]), int(sys.argv[2])
cnt = collections.Counter(); rows = []
for i in range(n):
    kind, p = L_.make_input(seed, i)
    s, iv, ido, iq, L, S, equal = p
    if iq == 0: continue
    rng = np.random.default_rng(s)
    q = rng.standard_normal((1, L, 3)) * [1.0, 1e100, 1e200, 1e300][iq]
    k = rng.standard_normal((1, S, 3))
    v = rng.uniform(-1, 1, (1, S, 2)) * _BIG[iv]
    if equal: v[:] = v[:, :1]
    do = rng.uniform(-1, 1, (1, L, 2)) * _BIG[ido]
    res = {}
    t0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for stage in ("fwd", "fbad", "bwd", "bcmp"):
            try:
                if stage == "fwd":
                    out = ms.reference_attention(q, k, v).rounded("float64")
                    res[stage] = "pass" if ms.compare_attention(out, q, k, v).passed else "FAIL"
                elif stage == "fbad":
                    bad = out.copy(); bad[0,0,0] = bad[0,0,0]*(1-2.0**-8) if bad[0,0,0] else 1e-3
                    res[stage] = "PASS" if ms.compare_attention(bad, q, k, v).passed else "fail"
                elif stage == "bwd":
                    g = ms.reference_attention_backward(q, k, v, do)
                    grads = [e.rounded("float64") for e in g]
                    res[stage] = "ok"
                else:
                    res[stage] = "pass" if ms.compare_attention_backward(*grads, q, k, v, do).passed else "FAIL"
            except Exception as e:
                res[stage] = type(e).__name__
                if stage == "fbad": pass
                if stage == "bwd": break
    dt = time.process_time() - t0
    key = tuple(sorted(res.items()))
    cnt[key] += 1
    rows.append((i, p, res, dt))
    print(i, p, res, f"{dt:.2f}s", flush=True)
for k_, c in cnt.most_common(): print(c, k_)
pickle.dump(rows, open(f"/tmp/limits_stages_{seed}_{n}_{sys.argv[3] if len(sys.argv)>3 else 'x'}.pkl", "wb"))
