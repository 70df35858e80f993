"""The fused loops of issue 29 (testing/forward/model_jit.py) against the numpy steps they
replace, in one process, interleaved (the same tree, ``MHA_SYMBOLIC_NUMBA`` 1 / 0).

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/bench_model_jit.py [--runs 3]

Prints, for (4, 8, 512, 512, 64) bf16 plain and causal, the CPU time (min / median) of
``Plain.bound`` (the tolerance model), of the dtype level's ``_tolerance`` and of the
verdict's element pass (``verdict._elements`` vs ``_elements_fused``) with both paths,
and the load.  The values of both paths are bit-identical
(tests/testing/forward/test_model_jit.py); this measures only the time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _times(fn, runs: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(runs):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import ml_dtypes
    import numpy as np

    from mha_symbolic.testing.call import AttentionCall
    from mha_symbolic.testing.forward.emulated import dtype_level
    from mha_symbolic.testing.forward.plain import Plain
    from mha_symbolic.testing.tolerance import error_model
    from mha_symbolic.testing.verdict import _elements, _elements_fused, mid_of

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 8, 512, 64)).astype(ml_dtypes.bfloat16)
               .astype(np.float64) for _ in range(3))
    for causal in (False, True):
        x = AttentionCall(q, k, v, is_causal=causal)
        pl = Plain(x)
        model = error_model("bfloat16").with_events(*pl.events())
        lev = dtype_level(x, model)
        assert lev is not None
        mid = pl.out
        res: dict[str, dict[str, list[float]]] = {"bound": {}, "level": {}}
        for flag in ("1", "0") * args.runs:
            os.environ["MHA_SYMBOLIC_NUMBA"] = flag
            pl.bound(model)                                   # warm (compilation, caches)
            res["bound"].setdefault(flag, []).extend(
                _times(lambda: pl.bound(model), 1))  # noqa: B023
            res["level"].setdefault(flag, []).extend(
                _times(lambda: lev._tolerance(mid, 4.0), 1))  # noqa: B023
        for what, r in res.items():
            print(f"{'causal' if causal else 'plain'} {what}: fused {min(r['1']):.3f} / "
                  f"{statistics.median(r['1']):.3f} s, numpy {min(r['0']):.3f} / "
                  f"{statistics.median(r['0']):.3f} s (CPU min / median)")
    os.environ["MHA_SYMBOLIC_NUMBA"] = "1"     # _elements is the numpy path itself
    a = mid + rng.standard_normal(mid.shape) * 1e-3
    tol, vac = np.full(mid.shape, 1e-2), np.zeros(mid.shape, bool)
    lo, hi = mid - 1e-12, mid + 1e-12
    m2 = mid_of(lo, hi)
    fmt = model.fmt
    for name, fn in (("fused", _elements_fused), ("numpy", _elements)):
        fn(a, lo, hi, tol, vac, None, m2, fmt)
        t = _times(lambda: fn(a, lo, hi, tol, vac, None, m2, fmt), args.runs)  # noqa: B023
        print(f"verdict element pass ({a.size} elements), {name}: {min(t) * 1e3:.1f} ms")
    with open("/proc/loadavg") as fh:
        print("load", " ".join(fh.read().split()[:3]))


if __name__ == "__main__":
    main()
