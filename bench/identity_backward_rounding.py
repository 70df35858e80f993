"""Bit-identity of the backward's rounded gradients across two trees (issue 29 item 4).

About twenty ``reference_attention_backward`` calls (plain float32- and float64-valued
inputs, causal top-left / bottom-right, GQA, bool and float masks, dropout with a
scale, window, ALiBi, sinks + window, softcap, uniform rows, one 256² head), each
gradient rounded to float64, float32 and bfloat16 (in that order, and on a fresh call
in the reverse order) and stored as int64 / int32 / int16 bit patterns, with the bounds
(lower, upper) after the roundings.  Usage, one tree each, then compare:

    PYTHONPATH=/tmp/before python bench/identity_backward_rounding.py /tmp/old.npz
    PYTHONPATH=$PWD python bench/identity_backward_rounding.py /tmp/new.npz
    python bench/identity_backward_rounding.py --compare /tmp/old.npz /tmp/new.npz
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

FORMATS = (("float64", np.int64), ("float32", np.int32), ("bfloat16", np.int16))


def _inputs(rng: Any, shape_q: tuple[int, ...], shape_kv: tuple[int, ...], f32: bool
            ) -> tuple[Any, ...]:
    def draw(sh: tuple[int, ...]) -> Any:
        x = rng.standard_normal(sh)
        return x.astype(np.float32) if f32 else x

    return draw(shape_q), draw(shape_kv), draw(shape_kv), draw(shape_q)


def _cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, input spec, door keywords)."""
    rng = np.random.default_rng(29)
    base = {"q": (1, 2, 7, 8), "kv": (1, 2, 9, 8)}
    mask_b = rng.random((7, 9)) < 0.7
    mask_b[3] = False                      # a row with no key
    mask_f = rng.standard_normal((7, 9))
    keep = rng.random((1, 2, 7, 9)) < 0.8
    out: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for f32 in (True, False):
        t = "f32" if f32 else "f64"
        out += [
            (f"plain {t}", {**base, "f32": f32}, {}),
            (f"causal tl {t}", {**base, "f32": f32}, {"is_causal": True}),
            (f"causal br {t}", {**base, "f32": f32},
             {"is_causal": True, "causal_alignment": "bottom_right"}),
            (f"gqa {t}", {"q": (1, 4, 6, 8), "kv": (1, 2, 9, 8), "f32": f32}, {"enable_gqa": True}),
            (f"bool mask {t}", {**base, "f32": f32}, {"attn_mask": mask_b}),
            (f"float mask {t}", {**base, "f32": f32}, {"attn_mask": mask_f}),
        ]
    out += [
        ("dropout + scale", {**base, "f32": True},
         {"dropout_p": 0.2, "dropout_mask": keep, "scale": 0.3}),
        ("window", {**base, "f32": True}, {"window": (2, 1)}),
        ("alibi", {**base, "f32": True}, {"alibi_slopes": np.array([0.5, 0.25])}),
        ("sinks + window", {**base, "f32": True},
         {"sinks": np.array([0.3, -1.0]), "window": (3, 0)}),
        ("softcap", {**base, "f32": True}, {"softcap": 5.0}),
        ("uniform rows", {**base, "f32": True}, {"attn_mask": mask_b, "masked_rows": "uniform"}),
        ("head 256 f32", {"q": (1, 1, 256, 64), "kv": (1, 1, 256, 64), "f32": True}, {}),
        ("head 256 causal f32", {"q": (1, 1, 256, 32), "kv": (1, 1, 200, 32), "f32": True},
         {"is_causal": True, "causal_alignment": "bottom_right"}),
        ("large scores f32", {**base, "f32": True, "mul": 8.0}, {}),
    ]
    return out


def run(path: str) -> None:
    from mha_symbolic import reference_attention_backward

    rng = np.random.default_rng(2929)
    res: dict[str, Any] = {}
    for name, spec, door in _cases():
        q, k, v, do = _inputs(rng, spec["q"], spec["kv"], spec["f32"])
        if "mul" in spec:
            q = (q * spec["mul"]).astype(q.dtype)
        for order in (FORMATS, FORMATS[::-1]):   # float64 first, and last
            g = reference_attention_backward(q, k, v, do, **door)
            tag = "" if order is FORMATS else "|reversed"
            for kind, enc in (("dq", g.dq), ("dk", g.dk), ("dv", g.dv), ("dmask", g.d_attn_mask)):
                if enc is None:
                    continue
                for fmt, view in order:
                    arr = np.asarray(enc.rounded(fmt))
                    res[f"{name}|{kind}|{fmt}{tag}"] = np.ascontiguousarray(arr).view(view)
                # the bounds after the roundings (tiers 2 and 3 may have tightened them)
                res[f"{name}|{kind}|lower{tag}"] = np.ascontiguousarray(enc.lower).view(np.int64)
                res[f"{name}|{kind}|upper{tag}"] = np.ascontiguousarray(enc.upper).view(np.int64)
        print(name, flush=True)
    np.savez(path, **res)
    print(f"{len(res)} arrays -> {path}")


def compare(a: str, b: str) -> int:
    fa, fb = np.load(a), np.load(b)
    keys = sorted(set(fa.files) | set(fb.files))
    bad = [k for k in keys if k not in fa.files or k not in fb.files
           or not np.array_equal(fa[k], fb[k])]
    for k in bad:
        print("DIFFERS:", k)
    print(f"{len(keys) - len(bad)} / {len(keys)} arrays bit-identical")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    run(sys.argv[1])
