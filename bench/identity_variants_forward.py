"""The forward testing side of the variants on two trees side by side (issue 23, h23f:
the testing wing's forward stops naming variants; its verdicts must not move).

    PYTHONPATH=<old tree> python bench/identity_variants_forward.py --save old.pkl
    PYTHONPATH=<new tree> python bench/identity_variants_forward.py --save new.pkl
    python bench/identity_variants_forward.py --compare old.pkl new.pkl

Saves, for ~25 calls with variants (window, softcap, ALiBi, sinks, FP8 descale,
score_mod, mask_mod, KV cache, attention_chunk, combinations; bf16/fp16/fp32; correct
kernels and mutants of tests/kernels/variant_kernels.py): the verdict of
``compare_attention`` (passed, counts, worst element, diagnoses with their ratios, the
report text) under the default rule and under ``rule="flash"``, that of
``check_attention`` on a numpy kernel returning the same output, the float64 evaluation
of every bug class that applies (``plain_variant``'s output and its bound under the
call's model), and two packed varlen calls (``compare_attention_varlen``: a correct
output and one attending across the boundaries).  ``--compare`` prints which entries
differ (np.array_equal / ==).
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from typing import Any

import ml_dtypes
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "kernels"))
import variant_kernels as vk

import mha_symbolic as ms
from mha_symbolic.oracle.variants.registry import variant_options
from mha_symbolic.testing.forward.bugs_variants import (
    plain_variant,
    variant_bug_classes,
)
from mha_symbolic.testing.forward.variants import (
    _variant_inputs,
    _variant_model,
)

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}

# (name, dtype, (B, H, L, S, E), torch variant keywords, door-only keywords, bug)
CASES: list[tuple[str, str, tuple[int, ...], dict[str, Any], dict[str, Any], str | None]] = [
    ("window", "float32", (1, 2, 12, 16, 8), {"window": (3, 1)}, {}, None),
    ("window_bug", "float32", (1, 2, 12, 16, 8), {"window": (3, 1)}, {},
     "window_left_off_by_one_wide"),
    ("window_misaligned", "float32", (1, 2, 10, 16, 8), {"window": (2, 0), "align":
     "bottom_right"}, {}, "window_misaligned"),
    ("window_causal_bf16", "bfloat16", (2, 2, 16, 16, 16), {"window": (4, 0), "causal": True},
     {}, "window_right_off_by_one_wide"),
    ("softcap", "float16", (1, 2, 16, 16, 16), {"softcap": 2.0}, {}, None),
    ("softcap_before", "float32", (1, 2, 16, 16, 16), {"softcap": 2.0}, {},
     "softcap_before_scale"),
    ("softcap_after_mask", "float32", (1, 2, 16, 16, 16), {"softcap": 2.0, "causal": True},
     {}, "softcap_after_mask"),
    ("softcap_window", "bfloat16", (1, 2, 16, 16, 16), {"softcap": 3.0, "window": (3, 0),
     "causal": True}, {}, "softcap_missing"),
    ("alibi", "float32", (1, 4, 12, 12, 8), {"alibi": "slopes"}, {}, None),
    ("alibi_sign", "float32", (1, 4, 12, 12, 8), {"alibi": "slopes"}, {},
     "alibi_sign_flipped"),
    ("alibi_reversed", "float16", (1, 4, 12, 12, 8), {"alibi": "slopes"}, {},
     "alibi_slopes_reversed"),
    ("alibi_misaligned", "float32", (1, 4, 8, 14, 8), {"alibi": "slopes", "align":
     "bottom_right"}, {}, "alibi_misaligned"),
    ("sinks", "float32", (1, 2, 12, 12, 8), {"sinks": "sinks"}, {}, None),
    ("sinks_ignored", "bfloat16", (1, 2, 12, 12, 8), {"sinks": "sinks", "causal": True}, {},
     "sinks_ignored"),
    ("sink_numerator", "float32", (1, 2, 12, 12, 8), {"sinks": "sinks"}, {},
     "sink_in_numerator"),
    ("fp8", "float8_e4m3fn", (2, 2, 12, 12, 16), {"descale": "descale"}, {}, None),
    ("fp8_q_missing", "float8_e4m3fn", (2, 2, 12, 12, 16), {"descale": "descale"}, {},
     "q_descale_missing"),
    ("fp8_twice", "float8_e4m3fn", (2, 2, 12, 12, 16), {"descale": "descale"}, {},
     "descale_applied_twice"),
    ("all", "float32", (1, 2, 12, 16, 8), {"window": (4, 2), "softcap": 5.0, "alibi":
     "slopes", "sinks": "sinks", "align": "bottom_right", "causal": True}, {}, None),
    ("all_bug", "float32", (1, 2, 12, 16, 8), {"window": (4, 2), "softcap": 5.0, "alibi":
     "slopes", "sinks": "sinks", "align": "bottom_right", "causal": True}, {},
     "alibi_missing"),
    ("score_mod", "float32", (1, 2, 12, 12, 8), {"softcap": 4.0}, {"score_mod": "softcap"},
     None),
    ("mask_mod", "float16", (1, 2, 12, 12, 8), {"keep": "band"}, {"mask_mod": "band"}, None),
    ("mask_mod_window", "float32", (1, 2, 12, 12, 8), {"keep": "band", "window": (3, 3)},
     {"mask_mod": "band"}, "window_right_off_by_one_narrow"),
    ("chunk", "float32", (1, 2, 12, 12, 8), {"keep": "chunk", "causal": True},
     {"attention_chunk": 4}, None),
    ("kvcache", "float32", (2, 2, 3, 12, 8), {"keep": "cache", "align": "bottom_right",
     "causal": True}, {"cache_seqlens": [7, 12]}, None),
    ("kvcache_window", "float32", (2, 2, 3, 12, 8), {"keep": "cache", "align":
     "bottom_right", "causal": True, "window": (2, 0)}, {"cache_seqlens": [7, 12]},
     "window_misaligned"),
]


def _inputs(i: int, dt: str, shape: tuple[int, ...]) -> tuple[Any, ...]:
    B, H, L, S, E = shape
    rng = np.random.default_rng(100 + i)
    if dt.startswith("float8"):
        f8 = ml_dtypes.float8_e4m3fn
        q, k, v = (rng.standard_normal((B, H, n, E)).astype(f8) for n in (L, S, S))
        return q, k, v
    D = NP[dt]
    return tuple(rng.standard_normal((B, H, n, E)).astype(D) for n in (L, S, S))


def _door_and_kernel(i: int, tv: dict[str, Any], door: dict[str, Any], H: int, L: int,
                     S: int, B: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The door's variant keywords and the torch mutant's, from one case."""
    rng = np.random.default_rng(200 + i)
    kw: dict[str, Any] = {}
    kern: dict[str, Any] = {}
    if tv.get("causal"):
        kw["is_causal"] = kern["causal"] = True
    if "align" in tv:
        kw["causal_alignment"] = kern["align"] = tv["align"]
    if "window" in tv:
        kw["window"] = kern["window"] = tv["window"]
    if "softcap" in tv and "score_mod" not in door:
        kw["softcap"] = kern["softcap"] = tv["softcap"]
    if "softcap" in tv and "score_mod" in door:
        kw["score_mod"] = ms.softcap_score_mod(tv["softcap"])
        kern["softcap"] = tv["softcap"]
    if "alibi" in tv:
        slopes = np.asarray([2.0 ** -(h + 1) for h in range(H)])
        slopes[0] = 0.75
        kw["alibi_slopes"] = slopes
        kern["alibi"] = torch.tensor(slopes)
    if "sinks" in tv:
        sinks = rng.standard_normal(H).astype(np.float32).astype(np.float64)
        kw["sinks"] = sinks
        kern["sinks"] = torch.tensor(sinks)
    if "descale" in tv:
        d = (rng.uniform(0.25, 2.0, (B, H)).astype(np.float32) for _ in range(3))
        dq, dk, dv = d
        kw.update(q_descale=dq, k_descale=dk, v_descale=dv)
        kern["descale"] = tuple(torch.tensor(x) for x in (dq, dk, dv))
    keep = tv.get("keep")
    if keep == "band":
        def band(b: Any, h: Any, qi: Any, kj: Any) -> Any:
            return abs(qi - kj) <= 4
        kw["mask_mod"] = band
        ii, jj = np.arange(L)[:, None], np.arange(S)[None, :]
        kern["keep"] = torch.tensor(np.abs(ii - jj) <= 4)
    elif keep == "chunk":
        kw["attention_chunk"] = door["attention_chunk"]
        ii, jj = np.arange(L)[:, None], np.arange(S)[None, :]
        kern["keep"] = torch.tensor(ii // door["attention_chunk"] == jj // door[
            "attention_chunk"])
    elif keep == "cache":
        lens = np.asarray(door["cache_seqlens"], dtype=np.int32)
        kw["cache_seqlens"] = lens
        # bottom-right per sequence: query i at lens[b] - L + i; keys < lens[b]
        ii, jj = np.arange(L)[:, None], np.arange(S)[None, :]
        m = np.stack([(jj < n) & (jj <= ii + n - L) for n in lens])[:, None]
        kern["keep"] = torch.tensor(m)
        kern.pop("causal", None)
    return kw, kern


def _comp(c: Any) -> dict[str, Any]:
    w = c.worst
    return {"passed": c.passed, "rule": c.rule, "n_mismatched": c.n_mismatched,
            "n_vacuous": c.n_vacuous, "max_error": c.max_error, "max_ulps": c.max_ulps,
            "worst": None if w is None else repr(w),
            "diagnoses": [(d.bug, d.ratio, d.kind) for d in c.diagnoses],
            "mismatched": np.asarray(c.mismatched), "notes": c.notes,
            "report": c.report()}


def _case(i: int, case: tuple[Any, ...]) -> dict[str, Any]:
    _name, dt, (B, H, L, S, E), tv, door, bug = case
    q, k, v = _inputs(i, dt, (B, H, L, S, E))
    kw, kern = _door_and_kernel(i, tv, door, H, L, S, B)
    # the KV cache: the mutant's window is measured from each sequence's own positions
    # (variant_kernels has one offset per call): built into its keep mask below
    keep_cache = tv.get("keep") == "cache"
    qt, kt, vt = (torch.tensor(np.asarray(t, dtype=np.float32)) for t in (q, k, v))
    out_dtype = torch.bfloat16 if dt.startswith("float8") else TORCH[dt]
    p_dtype = torch.float8_e4m3fn if dt.startswith("float8") else None
    kk = dict(kern)
    if keep_cache and "window" in kk:
        w = kk.pop("window")
        lens = np.asarray(door["cache_seqlens"])
        ii, jj = np.arange(L)[:, None], np.arange(S)[None, :]
        wm = np.stack([(jj >= ii + n - L - w[0]) & (jj <= ii + n - L + w[1]) for n in lens])
        kk["keep"] = kk["keep"] & torch.tensor(wm[:, None])
        if bug == "window_misaligned":   # measured from the cache's end instead
            wm2 = (jj >= ii + S - L - w[0]) & (jj <= ii + S - L + w[1])
            kk["keep"] = torch.tensor(np.stack([(jj < n) & (jj <= ii + n - L) for n in lens])
                                      [:, None]) & torch.tensor(wm2)
        bug_k = None
    else:
        bug_k = bug
    out = vk.reference_like(qt, kt, vt, out_dtype=out_dtype, p_dtype=p_dtype, bug=bug_k,
                            **kk).float().numpy()
    out = out.astype(ml_dtypes.bfloat16 if out_dtype is torch.bfloat16 else
                     {torch.float16: np.float16, torch.float32: np.float32}[out_dtype])
    res: dict[str, Any] = {"out": out.astype(np.float64)}
    res["compare"] = _comp(ms.compare_attention(out, q, k, v, **kw))
    if not dt.startswith("float8"):
        res["flash"] = _comp(ms.compare_attention(out, q, k, v, rule="flash", **kw))
    chk = ms.check_attention(lambda *a, **o: out, q, k, v, raise_on_failure=False, **kw)
    res["check"] = (chk.passed, chk.framework, _comp(chk.output))
    # the float64 evaluations of the catalogue (what the diagnosis and the bound read)
    opts = variant_options(**{n: kw[n] for n in kw if n not in (
        "is_causal", "causal_alignment")})
    x = _variant_inputs(q, k, v, opts, attn_mask=None, is_causal=kw.get("is_causal", False),
                        scale=None, enable_gqa=False,
                        causal_alignment=kw.get("causal_alignment", "top_left"),
                        masked_rows="zero")
    model = _variant_model(out, x.in_format, None, None, "fused", "probabilistic", "keep")
    vp = plain_variant(x)
    res["plain"] = (vp.out, *vp.bound(model), vp.p, vp.s, vp.A, vp.size, vp.n_add,
                    vp.qk_descaled, vp.v_descaled, vp.allowed)
    for b in variant_bug_classes():
        try:
            if not b.applies(x):
                continue
            bp = plain_variant(x, **b.switches(x))
            res["bug:" + b.name] = (bp.out, *bp.bound(model))
        except (ValueError, IndexError) as e:
            res["bug:" + b.name] = repr(e)
    return res


def _varlen() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    cu = [0, 5, 12]
    H, E = 2, 8
    q, k, v = (rng.standard_normal((12, H, E)).astype(np.float32) for _ in range(3))
    slopes = np.asarray([[0.5, 0.25], [0.75, 0.125]])
    ref = ms.reference_attention_varlen(q, k, v, cu, cu, is_causal=True, alibi_slopes=slopes)
    good = ref.rounded("float32")
    whole = ms.reference_attention(np.swapaxes(q, 0, 1)[None], np.swapaxes(k, 0, 1)[None],
                                   np.swapaxes(v, 0, 1)[None], is_causal=True,
                                   alibi_slopes=slopes[0]).rounded("float32")
    bad = np.swapaxes(np.asarray(whole)[0], 0, 1).astype(np.float32)
    out: dict[str, Any] = {}
    for tag, a in (("good", good), ("no_boundaries", bad)):
        out["varlen:" + tag] = _comp(ms.compare_attention_varlen(
            a, q, k, v, cu, cu, is_causal=True, alibi_slopes=slopes))
    d = rng.uniform(0.5, 2, (2, H)).astype(np.float32)
    q8, k8, v8 = (t.astype(ml_dtypes.float8_e4m3fn) for t in (q, k, v))
    ref8 = ms.reference_attention_varlen(q8, k8, v8, cu, cu, q_descale=d, k_descale=d,
                                         v_descale=d)
    out["varlen:fp8"] = _comp(ms.compare_attention_varlen(
        np.asarray(ref8.rounded("bfloat16")), q8, k8, v8, cu, cu, q_descale=d, k_descale=d,
        v_descale=d))
    return out


def save(path: str) -> None:
    results: dict[str, Any] = {}
    for i, case in enumerate(CASES):
        results[case[0]] = _case(i, case)
    results.update(_varlen())
    with open(path, "wb") as f:
        pickle.dump(results, f)
    for name, r in results.items():
        c = r.get("compare", r)
        print(f"{name:22s} passed={c['passed']!s:5} diagnoses={[d[0] for d in c['diagnoses']]}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (a != a and b != b)


def compare(old: str, new: str) -> int:
    with open(old, "rb") as f:
        a = pickle.load(f)
    with open(new, "rb") as f:
        b = pickle.load(f)
    bad = 0
    if a.keys() != b.keys():
        print("case lists differ:", sorted(set(a) ^ set(b)))
        bad += 1
    n = 0
    for case in a.keys() & b.keys():
        for key in a[case].keys() | b[case].keys():
            n += 1
            if key not in a[case] or key not in b[case] or not _same(a[case][key],
                                                                   b[case][key]):
                print(f"DIFFERENT: {case} / {key}")
                bad += 1
    print(f"{n} entries in {len(a)} cases: {n - bad} identical, {bad} different")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.save:
        save(args.save)
    if args.compare:
        return compare(*args.compare)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
