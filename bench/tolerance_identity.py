"""The tolerance arrays of two trees side by side (issue 29: the fast evaluation must give
the values of the plain one).

    PYTHONPATH=<old tree> python bench/tolerance_identity.py --save old.npz
    PYTHONPATH=<new tree> python bench/tolerance_identity.py --save new.npz
    python bench/tolerance_identity.py --compare old.npz new.npz

Saves, per case, the model's tolerance and vacuity (``Plain.bound``) and the dtype
level's tolerance and undecided rows (``dtype_level(...).tolerance`` against the float64
output) for nine cases (bf16/fp16/fp32, plain, causal, bool and float masks, GQA, decode,
kernels fused/eager/sequential; three unmasked ones of several chunks); ``--compare``
prints which are bit-identical.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

try:                                   # this tree, the tree after issue 23's move, or before it
    from mha_symbolic.testing.call import AttentionCall
    from mha_symbolic.testing.forward.emulated import dtype_level
    from mha_symbolic.testing.forward.plain import Plain
except ImportError:
    try:
        from mha_symbolic.testing.forward.emulated import dtype_level  # type: ignore[no-redef]
        from mha_symbolic.testing.forward.plain import (  # type: ignore[attr-defined,no-redef]
            AttentionInputs as AttentionCall,
        )
        from mha_symbolic.testing.forward.plain import Plain  # type: ignore[no-redef]
    except ImportError:
        from mha_symbolic.testing.emulated import dtype_level  # type: ignore[no-redef]
        from mha_symbolic.testing.plain import (  # type: ignore[no-redef]
            AttentionInputs as AttentionCall,
        )
        from mha_symbolic.testing.plain import Plain  # type: ignore[no-redef]
from mha_symbolic.testing.tolerance import error_model

CASES = [("bfloat16", (2, 4, 4, 384, 384, 64), False, None, False, None),
         ("float16", (1, 8, 2, 300, 777, 32), True, None, True, None),
         ("float32", (2, 2, 2, 200, 900, 16), False, "bool", False, None),
         ("bfloat16", (1, 32, 8, 1, 4096, 128), False, None, True, None),
         ("float16", (1, 2, 2, 500, 500, 16), True, "float", False, "eager"),
         ("bfloat16", (1, 4, 4, 256, 1024, 64), True, None, False, "sequential"),
         # unmasked chunks of 2^17 scores (issue 29): the benchmark's rows, odd key counts
         ("bfloat16", (1, 4, 4, 512, 512, 64), False, None, False, None),
         ("float32", (1, 2, 2, 700, 1024, 32), False, None, False, None),
         ("float16", (1, 4, 2, 2500, 64, 16), False, None, True, "eager")]


def save(path: str) -> None:
    out: dict[str, np.ndarray] = {}
    for i, (dt, (B, Hq, Hkv, L, S, E), causal, mask, gqa, ker) in enumerate(CASES):
        rng = np.random.default_rng(i)
        D = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[dt]
        q = rng.standard_normal((B, Hq, L, E)).astype(D).astype(np.float64)
        k, v = (rng.standard_normal((B, Hkv, S, E)).astype(D).astype(np.float64) for _ in range(2))
        attn = None
        if mask == "bool":
            attn = rng.random((L, S)) < 0.6
        elif mask == "float":
            attn = np.where(rng.random((L, S)) < 0.1, -np.inf,
                            np.round(rng.standard_normal((L, S))))
        x = AttentionCall(q, k, v, attn_mask=attn, is_causal=causal, enable_gqa=gqa)
        pl = Plain(x)
        model = error_model(dt, kernel=ker or "fused").with_events(*pl.events())
        tol, vac = pl.bound(model)
        lev = dtype_level(x, model)
        assert lev is not None
        dtol, und, _ = lev.tolerance(pl.out)
        out[f"{i}_tol"], out[f"{i}_vac"], out[f"{i}_dtol"], out[f"{i}_und"] = tol, vac, dtol, und
    np.savez(path, **out)


def compare(p_old: str, p_new: str) -> None:
    a, b = np.load(p_old), np.load(p_new)
    for key in a.files:
        x, y = a[key], b[key]
        if np.array_equal(x, y):
            print(key, "bit-identical")
        elif x.dtype == bool:
            print(key, f"DIFFERENT: {int(np.sum(x != y))} of {x.size}")
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = float(np.nanmax(np.abs(y / x - 1)))
            print(key, f"max relative difference {rel:.3g}, {int(np.sum(x != y))} of {x.size} differ")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_mutually_exclusive_group(required=True)
    sub.add_argument("--save", metavar="OUT.npz", help="record this tree's tolerances")
    sub.add_argument("--compare", nargs=2, metavar=("OLD.npz", "NEW.npz"))
    args = parser.parse_args(argv)
    if args.compare:
        compare(*args.compare)
    else:
        if not args.save.endswith(".npz"):
            parser.error("--save takes a file name ending in .npz")
        save(args.save)


if __name__ == "__main__":
    main()
