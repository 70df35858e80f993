"""Identity check for the decode set-up (issue 29 item 5): the forward's results on a
fixed set of calls, pickled, to compare two trees bit for bit.

    PYTHONPATH=<old tree> python bench/identity_decode.py --out /tmp/old.pkl
    PYTHONPATH=<new tree> python bench/identity_decode.py --out /tmp/new.pkl
    python bench/identity_decode.py --compare /tmp/old.pkl /tmp/new.pkl

Calls: decode (L = 1) and short L (2, 3, 5, 16), MHA, GQA and MQA, causal (both
alignments), boolean and additive masks, weights, the KV-cache variant with
``cache_seqlens`` / ``cache_leftpad``, float32, float16, bfloat16 and float64 inputs
(float32-valued and not), values near the float64 limits, -0.0, tiny values; each
rounded to float64, float32, bfloat16 and float16, and the enclosure (lower, upper)
recorded as well (identical enclosures are a stronger check than identical roundings).
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _cases() -> list[tuple[str, Any, Any, Any, dict[str, Any]]]:
    import ml_dtypes

    out: list[tuple[str, Any, Any, Any, dict[str, Any]]] = []
    rng = np.random.default_rng(29)

    def qkv(B: int, H: int, Hk: int, L: int, S: int, E: int, dt: Any = np.float32,
            scale: float = 1.0) -> tuple[Any, Any, Any]:
        q = (rng.standard_normal((B, H, L, E)) * scale).astype(dt)
        k = (rng.standard_normal((B, Hk, S, E)) * scale).astype(dt)
        v = rng.standard_normal((B, Hk, S, E)).astype(dt)
        return q, k, v

    gqa = {"enable_gqa": True}
    for B, H, Hk, L, S, E in [(1, 32, 8, 1, 4096, 128), (1, 8, 2, 1, 300, 64),
                              (2, 8, 1, 1, 257, 32), (3, 4, 4, 1, 100, 16),
                              (8, 64, 1, 1, 512, 64), (2, 6, 3, 1, 1, 8),
                              (1, 4, 2, 2, 700, 32), (2, 4, 2, 3, 129, 16),
                              (1, 8, 4, 5, 2048, 64), (1, 4, 1, 16, 512, 64)]:
        out.append((f"decode {B},{H}/{Hk},{L},{S},{E}", *qkv(B, H, Hk, L, S, E), gqa))
    for L, S, al in [(1, 64, "bottom_right"), (3, 64, "bottom_right"), (5, 300, "top_left"),
                     (16, 1000, "bottom_right"), (2, 2, "top_left")]:
        out.append((f"causal {L},{S},{al}", *qkv(2, 8, 2, L, S, 32),
                    {**gqa, "is_causal": True, "causal_alignment": al}))
    for name, dt in [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16),
                     ("float64 f32-valued", np.float32), ("float64", np.float64)]:
        q, k, v = qkv(2, 8, 2, 1, 512, 64, dt)
        if name == "float64 f32-valued":
            q, k, v = (x.astype(np.float64) for x in (q, k, v))
        out.append((f"decode {name}", q, k, v, gqa))
        q, k, v = qkv(1, 4, 1, 3, 200, 32, dt)
        if name == "float64 f32-valued":
            q, k, v = (x.astype(np.float64) for x in (q, k, v))
        out.append((f"causal {name}", q, k, v, {**gqa, "is_causal": True,
                                                "causal_alignment": "bottom_right"}))
    q, k, v = qkv(2, 4, 2, 2, 100, 16)
    out.append(("bool mask", q, k, v, {**gqa, "attn_mask": rng.random((2, 4, 2, 100)) > 0.3}))
    out.append(("additive mask", q, k, v, {**gqa, "attn_mask": rng.standard_normal(
        (2, 1, 2, 100)).astype(np.float32)}))
    out.append(("weights", q, k, v, {**gqa, "return_weights": True}))
    out.append(("scale 0.3", q, k, v, {**gqa, "scale": 0.3}))
    out.append(("peaked x8", *qkv(1, 8, 2, 1, 1024, 64, scale=8.0), gqa))
    out.append(("large f32 1e30", *(x * np.float32(1e30) if i == 2 else x
                                    for i, x in enumerate(qkv(1, 4, 2, 1, 256, 16))), gqa))
    q, k, v = qkv(1, 4, 2, 1, 256, 16, np.float64)
    out.append(("values 1e300", q, k, v * 1e300, gqa))
    out.append(("values 1e-300", q, k, v * 1e-300, gqa))
    v0 = v.copy()
    v0[:, :, ::3] = -0.0
    out.append(("values -0.0", q, k, v0, gqa))
    vt = v * 2.0**-1060                         # subnormal values: the scaling check
    out.append(("values subnormal", q, k, vt, gqa))
    vm = v.copy()
    vm[:, :, 0, 0] = 5e-324
    vm[:, :, 1, :] *= 1e300
    out.append(("values mixed 1e300 and 5e-324", q, k, vm, gqa))
    q, k, v = qkv(2, 4, 2, 1, 64, 16)
    v[:, :, ::3] = -0.0
    v[:, 0, :, 1] = -0.0                        # a column of -0.0 only
    v[:, 1, :, 2] = np.where(np.arange(64) % 2, 0.0, -0.0)
    out.append(("f32 values -0.0", q, k, v, gqa))
    out.append(("f32 values -0.0 causal", q[:, :, :1].repeat(3, axis=2), k, v,
                {**gqa, "is_causal": True, "causal_alignment": "bottom_right"}))
    out.append(("broadcast kv batch", *qkv(3, 4, 2, 1, 128, 16)[:1],
                *qkv(1, 4, 2, 1, 128, 16)[1:], gqa))
    # the KV-cache variant
    for L, causal in [(1, False), (1, True), (3, True), (2, False)]:
        q, k, v = qkv(3, 8, 2, L, 300, 32)
        out.append((f"kvcache L={L} causal={causal}", q, k, v,
                    {**gqa, "cache_seqlens": np.array([7, 300, 129]),
                     "cache_leftpad": np.array([0, 5, 2]), "is_causal": causal,
                     "causal_alignment": "bottom_right"}))
    q, k, v = qkv(2, 4, 4, 1, 64, 16, ml_dtypes.bfloat16)
    out.append(("kvcache bf16 seqlens", q, k, v, {"cache_seqlens": np.array([1, 64])}))
    return out


def run(path: str) -> None:
    sys.path.insert(0, str(Path.cwd()))
    from mha_symbolic import reference_attention

    res: dict[str, Any] = {}
    for name, q, k, v, kw in _cases():
        r = reference_attention(q, k, v, **kw)
        got: dict[str, Any] = {f: r.rounded(f) for f in ("float64", "float32", "bfloat16",
                                                         "float16")}
        got["lower"], got["upper"] = r.lower, r.upper
        if kw.get("return_weights"):
            got["weights32"] = r.weights.rounded("float32")
            got["wlower"], got["wupper"] = r.weights.lower, r.weights.upper
        res[name] = got
    with open(path, "wb") as fh:
        pickle.dump(res, fh)
    print(f"{len(res)} calls written to {path}")


def compare(a: str, b: str) -> int:
    with open(a, "rb") as fh:
        ra = pickle.load(fh)
    with open(b, "rb") as fh:
        rb = pickle.load(fh)
    assert ra.keys() == rb.keys()
    bad_round = bad_encl = 0
    for name in ra:
        for key in ra[name]:
            x, y = np.asarray(ra[name][key]), np.asarray(rb[name][key])
            same = x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8))
            if not same:
                print(f"DIFFERENT: {name} / {key}")
                if key in ("lower", "upper", "wlower", "wupper"):
                    bad_encl += 1
                else:
                    bad_round += 1
    print(f"{len(ra)} calls: roundings differing {bad_round}, enclosure arrays differing "
          f"{bad_encl}")
    return 1 if bad_round else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.compare:
        raise SystemExit(compare(*args.compare))
    run(args.out)


if __name__ == "__main__":
    main()
