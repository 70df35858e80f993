"""Long consistency run of tier 2 by rows against the sliced tier 2 (issue 11).

Random problems (batch, heads, shapes, magnitudes 2**-140 … 2**60 for q and k and up
to 2**120 for v, float16/float32 inputs, causal alignments, float and bool masks,
masked-row policies, dropout, scales) are refined on every row by each tier; the two
enclosures must intersect and the float64, float32 and bfloat16 roundings must agree.
Prints each mismatch and exception, then the number of cases.  The README's test
command runs a dozen of these (tests/oracle/forward/test_oracle_dd_rows.py); this runs thousands:

    python bench/stress_tier2_rows.py [--seed N] [--seconds T]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mha_symbolic.oracle.forward.attention as fwd
from mha_symbolic.oracle import reference_attention


def problem(rng: Any) -> tuple[Any, Any, Any, dict[str, Any], dict[str, Any]]:
    B, H = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    L, S, E, Ev = (int(rng.integers(1, n)) for n in (40, 80, 33, 6))
    mag, vmag = float(2.0 ** rng.integers(-140, 60)), float(2.0 ** rng.integers(-140, 120))
    dt = (np.float32, np.float16)[int(rng.integers(0, 2))]
    with np.errstate(all="ignore"):
        q, k, v = ((rng.standard_normal(shape) * m).astype(np.float32).astype(dt)
                   for shape, m in (((B, H, L, E), mag), ((B, H, S, E), mag),
                                    ((B, H, S, Ev), vmag)))
    q, k, v = (np.where(np.isfinite(x), x, 1).astype(dt) for x in (q, k, v))
    kw: dict[str, Any] = {}
    case = int(rng.integers(0, 5))
    if case == 1:
        kw.update(is_causal=True,
                  causal_alignment=("top_left", "bottom_right")[int(rng.integers(0, 2))])
    elif case == 2:
        kw["attn_mask"] = np.where(rng.random((L, S)) < 0.3, -np.inf,
                                   rng.standard_normal((L, S)) * float(2.0 ** rng.integers(-5, 8)))
    elif case == 3:
        kw.update(attn_mask=rng.random((L, S)) < 0.7,
                  masked_rows=("zero", "uniform")[int(rng.integers(0, 2))])
    elif case == 4:
        kw.update(dropout_p=0.25, dropout_mask=rng.random((B, H, L, S)) > 0.25)
    if rng.random() < 0.3:
        kw["scale"] = float(rng.choice([0.3, 0.125, 1.0, 1.7]))
    about = dict(B=B, H=H, L=L, S=S, E=E, Ev=Ev, mag=mag, vmag=vmag, dtype=dt.__name__,
                 options=sorted(kw))
    return q, k, v, kw, about


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=120.0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t_end = time.time() + args.seconds
    orig = fwd.rows_path_pays
    n = problems = 0
    while time.time() < t_end:
        q, k, v, kw, about = problem(rng)
        got = []
        try:
            for on in (True, False):
                fwd.rows_path_pays = lambda m, on=on: on and m > 0  # type: ignore[misc]
                r = reference_attention(q, k, v, **kw)
                r._refine_rows(np.ones(r._tier.shape, dtype=bool))
                got.append((r.lower.copy(), r.upper.copy(),
                            [r.rounded(f).astype(np.float64)
                             for f in ("float64", "float32", "bfloat16")]))
        except Exception as e:  # reported; the run goes on
            print("exception", type(e).__name__, e, about)
            problems += 1
            continue
        finally:
            fwd.rows_path_pays = orig
        (lo1, hi1, r1), (lo2, hi2, r2) = got
        same = bool(np.all(np.maximum(lo1, lo2) <= np.minimum(hi1, hi2))) and all(
            np.array_equal(a, b, equal_nan=True) for a, b in zip(r1, r2, strict=True))
        if not same:
            print("mismatch", about)
            problems += 1
        n += 1
    print(f"{n} cases, {problems} problems (seed {args.seed}, {args.seconds:.0f} s)")


if __name__ == "__main__":
    main()
