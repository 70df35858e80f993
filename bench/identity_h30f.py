# ruff: noqa  (a probe script)
"""Identity of the forward bounds on ordinary inputs old vs new tree (h30f; RESULTS.md):
PYTHONPATH=TREE python bench/identity_h30f.py OUT.pkl, then compare the pickles."""
import sys, pickle, numpy as np, torch
import mha_symbolic as ms
from mha_symbolic.testing.forward.model import attention_error_bound
from mha_symbolic.testing.tolerance import error_model
out = []
for seed in range(6):
    for qs in (1.0, 1e3, 30.0):
        for kind in ("probabilistic", "worst_case"):
            for dt in ("float64", "float32"):
                rng = np.random.default_rng(seed)
                q = rng.standard_normal((6, 8)) * qs; k = rng.standard_normal((9, 8)); v = rng.standard_normal((9, 5))
                allowed = rng.random((6, 9)) > 0.2; allowed[:, 0] = True
                b = attention_error_bound(q, k, v, scale=0.3, allowed=allowed, model=error_model(dt, kind=kind))
                out.append((b.tol, b.vacuous))
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, 3, 7, 8)).astype(np.float32) for _ in range(3))
    o = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v))).numpy()
    r = ms.compare_attention(o, q, k, v); out.append((r.passed, r.worst.ratio))
pickle.dump(out, open(sys.argv[1], "wb"))
