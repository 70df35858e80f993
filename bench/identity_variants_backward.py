"""Bit-identity of the backward side with variants across two trees (issue 23, h23b).

Runs compare_attention_backward and reference_attention_backward on ~20 variant calls
(window, softcap, ALiBi with d_alibi_slopes, sinks with d_sinks, score_mod tables and
slopes, mask_mod, combinations; float32 / bfloat16 / float64; planted bugs from
tests/kernels/variant_backward_kernels.py so that the diagnoses are compared) and
pickles everything they return.  Usage, one tree each, then compare:

    PYTHONPATH=/tmp/h23b-old python bench/identity_variants_backward.py /tmp/old.pkl
    PYTHONPATH=$PWD python bench/identity_variants_backward.py /tmp/new.pkl
    python bench/identity_variants_backward.py --compare /tmp/old.pkl /tmp/new.pkl
    OMP_NUM_THREADS=1 PYTHONPATH=<tree> python bench/identity_variants_backward.py --time
"""

from __future__ import annotations

import importlib.util
import pathlib
import pickle
import sys
from typing import Any

import numpy as np

_KERNELS = pathlib.Path(__file__).resolve().parents[1] / "tests/kernels/variant_backward_kernels.py"


def _kernel_module() -> Any:
    spec = importlib.util.spec_from_file_location("vbk", _KERNELS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _enc(e: Any) -> Any:
    if e is None:
        return None
    if isinstance(e, tuple):
        return tuple(_enc(x) for x in e)
    return (np.asarray(e.lower, dtype=np.float64).copy(), np.asarray(e.upper, dtype=np.float64).copy())


def _comp(c: Any) -> Any:
    return {
        "passed": c.passed, "rule": c.rule, "dtype": c.dtype, "acc": c.accumulation,
        "report": c.report(), "summary": c.summary(),
        "diagnoses": [(d.bug, d.description, d.ratio) for d in c.diagnoses],
        "diagnosis_run": c.diagnosis_run, "warnings": c.warnings,
        "bounds": {k: np.asarray(v).copy() for k, v in c.bounds.items()},
        "grads": {k: (g.passed, g.n_mismatched, g.n_elements,
                      None if g.worst is None else g.worst.ratio) for k, g in c.gradients.items()},
    }


def _cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, kernel keywords, door keywords)."""
    import mha_symbolic as ms
    H = 2
    slopes = np.array([0.5, 0.25])
    sinks = np.array([0.3, -1.0])
    tab = np.array([[0.25, -0.5, 0.125, 0.0, 0.75], [0.5, 0.0, -0.25, 0.125, -0.125]])
    out: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for dt in ("float32", "bfloat16", "float64"):
        out += [
            (f"window {dt}", {"dtype": dt, "window": (2, 1)}, {"window": (2, 1)}),
            (f"softcap {dt}", {"dtype": dt, "softcap": 5.0}, {"softcap": 5.0}),
            (f"alibi+d {dt}", {"dtype": dt, "alibi": slopes}, {"alibi_slopes": slopes, "_d": "slopes"}),
            (f"sinks+d {dt}", {"dtype": dt, "sinks": sinks}, {"sinks": sinks, "_d": "sinks"}),
        ]
    out += [
        ("window causal br", {"dtype": "float32", "window": (1, 0), "causal": True, "align": "bottom_right"},
         {"window": (1, 0), "is_causal": True, "causal_alignment": "bottom_right"}),
        ("softcap+alibi+sinks", {"dtype": "float32", "softcap": 4.0, "alibi": slopes, "sinks": sinks},
         {"softcap": 4.0, "alibi_slopes": slopes, "sinks": sinks, "_d": "both"}),
        ("window+alibi", {"dtype": "bfloat16", "window": (1, 1), "alibi": slopes},
         {"window": (1, 1), "alibi_slopes": slopes, "_d": "slopes"}),
        ("score_mod alibi", {"dtype": "float32", "alibi": slopes},
         {"score_mod": ms.alibi_score_mod(slopes)}),
        ("score_mod softcap", {"dtype": "float32", "softcap": 6.0},
         {"score_mod": ms.softcap_score_mod(6.0)}),
        ("score_mod table", {"dtype": "float64"}, {"score_mod": ms.relative_bias_score_mod(tab), "_ref": 1}),
        ("mask_mod", {"dtype": "float32", "causal": True},
         {"mask_mod": lambda b, h, qi, ki: ki <= qi}),
    ]
    bugs = [
        ("bug window", {"dtype": "float32", "window": (1, 0), "bug": "window_missing_in_backward"},
         {"window": (1, 0)}),
        ("bug alibi reversed", {"dtype": "float32", "alibi": slopes,
                                "bug": "alibi_slopes_reversed_in_backward"}, {"alibi_slopes": slopes}),
        ("bug softcap", {"dtype": "float32", "softcap": 3.0, "bug": "softcap_derivative_missing"},
         {"softcap": 3.0}),
        ("bug softcap score_mod", {"dtype": "float32", "softcap": 3.0, "bug": "softcap_derivative_missing"},
         {"score_mod": ms.softcap_score_mod(3.0)}),
        ("bug sink sign", {"dtype": "float32", "sinks": sinks, "bug": "sink_gradient_sign_flipped"},
         {"sinks": sinks, "_d": "sinks"}),
        ("bug window bf16", {"dtype": "bfloat16", "window": (0, 0), "bug": "window_missing_in_backward"},
         {"window": (0, 0)}),
    ]
    del H
    return out + bugs


def run(path: str) -> None:
    import mha_symbolic as ms
    vbk = _kernel_module()
    rng = np.random.default_rng(2323)
    B, H, L, S, E = 1, 2, 5, 6, 4
    res: dict[str, Any] = {}
    for name, kw, door in _cases():
        dt = np.dtype(kw["dtype"]) if kw["dtype"] != "bfloat16" else None
        import ml_dtypes
        npdt = ml_dtypes.bfloat16 if kw["dtype"] == "bfloat16" else dt
        q, k, v, do = (rng.standard_normal(sh).astype(npdt).astype(np.float64)
                       for sh in ((B, H, L, E), (B, H, S, E), (B, H, S, E), (B, H, L, E)))
        door = dict(door)
        d_what = door.pop("_d", None)
        want_ref = door.pop("_ref", None)
        kkw = dict(kw)
        kkw["dtype"] = npdt
        g = vbk.variant_backward(q, k, v, do, **kkw)
        extra: dict[str, Any] = {}
        if d_what in ("sinks", "both"):
            extra["d_sinks"] = g["d_sinks"].astype(np.float32)
        if d_what in ("slopes", "both"):
            extra["d_alibi_slopes"] = g["d_slopes"].astype(np.float32)
        grads = [g[n].astype(npdt) for n in ("dq", "dk", "dv")]
        qi, ki, vi, doi = (x.astype(npdt) for x in (q, k, v, do))
        entry: dict[str, Any] = {}
        try:
            c = ms.compare_attention_backward(*grads, qi, ki, vi, doi, **door, **extra)
            entry["compare"] = _comp(c)
        except Exception as exc:
            entry["compare"] = ("raised", type(exc).__name__, str(exc))
        if want_ref or d_what or "bug" not in kw:
            try:
                r = ms.reference_attention_backward(qi, ki, vi, doi, **{
                    x: y for x, y in door.items() if x not in ("_d",)})
                entry["reference"] = {"dq": _enc(r.dq), "dk": _enc(r.dk), "dv": _enc(r.dv),
                                      "d_sinks": _enc(r.d_sinks),
                                      "d_alibi_slopes": _enc(r.d_alibi_slopes),
                                      "d_score_mod": _enc(r.d_score_mod)}
            except Exception as exc:
                entry["reference"] = ("raised", type(exc).__name__, str(exc))
        res[name] = entry
        print(name, "compare:", entry["compare"]["passed"] if isinstance(entry["compare"], dict)
              else entry["compare"][:2],
              [d[0] for d in entry["compare"]["diagnoses"]] if isinstance(entry["compare"], dict)
              else "", flush=True)
    # refusals and errors of the doors
    q = k = v = do = np.eye(4, dtype=np.float32)[None, None]
    dsc = np.ones((1, 1), np.float32)
    refusals: dict[str, Any] = {}
    for label, kw in (("descale", {"q_descale": dsc}), ("d_sinks alone", {"d_sinks": np.zeros(1)}),
                      ("d_slopes no alibi", {"window": (1, 1), "d_alibi_slopes": np.zeros(1)}),
                      ("d_sinks no sinks", {"window": (1, 1), "d_sinks": np.zeros(1)}),
                      ("flash d_sinks", {"sinks": np.zeros(1), "d_sinks": np.zeros(1),
                                         "rule": "flash"}),
                      ("rotary d_sinks", {"rotary_base": 10000.0, "sinks": np.zeros(1),
                                          "d_sinks": np.zeros(1)}),
                      ("d_sinks shape", {"sinks": np.zeros(1), "d_sinks": np.zeros(2)})):
        try:
            ms.compare_attention_backward(q, k, v, q, k, v, do, **kw)
            refusals[label] = "no error"
        except Exception as exc:
            refusals[label] = (type(exc).__name__, str(exc))
        print(label, refusals[label])
    res["_refusals"] = refusals
    res["_oracle"] = _oracle_cases(ms, rng)
    res["_plain"] = _plain_cases(ms, rng)
    with open(path, "wb") as f:
        pickle.dump(res, f)


def _oracle_cases(ms: Any, rng: Any) -> dict[str, Any]:
    """reference_attention_backward with FP8 descale (GQA) and a float mask beside
    variants; reference_attention_varlen_backward with (batch, H) slopes (stacked),
    sinks and score_mods (summed)."""
    out: dict[str, Any] = {}

    def grads(r: Any) -> dict[str, Any]:
        return {"dq": _enc(r.dq), "dk": _enc(r.dk), "dv": _enc(r.dv), "d_mask": _enc(r.d_attn_mask),
                "d_sinks": _enc(r.d_sinks), "d_alibi_slopes": _enc(r.d_alibi_slopes),
                "d_score_mod": _enc(r.d_score_mod)}

    q = rng.standard_normal((2, 4, 3, 4))
    k, v = (rng.standard_normal((2, 2, 5, 4)) for _ in range(2))
    do = rng.standard_normal((2, 4, 3, 4))
    d = [np.array([[0.5, 2.0], [0.25, 1.0]]) for _ in range(3)]
    out["descale gqa"] = grads(ms.reference_attention_backward(
        q, k, v, do, enable_gqa=True, q_descale=d[0], k_descale=d[1], v_descale=d[2],
        sinks=np.array([0.1, 0.2, 0.3, -0.4])))
    mask = rng.standard_normal((3, 5))
    out["float mask + alibi"] = grads(ms.reference_attention_backward(
        q[:, :2], k, v, do[:, :2], attn_mask=mask, alibi_slopes=np.array([0.5, 0.125])))
    cu = [0, 2, 5]
    qp, kp, vp, dop = (rng.standard_normal((5, 2, 4)) for _ in range(4))
    tab = np.array([0.25, -0.5, 0.125])
    for name, kw in (("varlen slopes (B, H)", {"alibi_slopes": np.array([[0.5, 0.25], [1.0, 2.0]])}),
                     ("varlen slopes (H,) sinks", {"alibi_slopes": np.array([0.5, 0.25]),
                                                   "sinks": np.array([0.0, 1.0])}),
                     ("varlen score_mods", {"score_mod": (ms.softcap_score_mod(5.0),
                                                          ms.relative_bias_score_mod(tab),
                                                          ms.alibi_score_mod(np.array([0.5, 0.25])))})):
        out[name] = grads(ms.reference_attention_varlen_backward(qp, kp, vp, dop, cu, cu,
                                                                 is_causal=True, **kw))
        print(name, "done", flush=True)
    return out


def _plain_cases(ms: Any, rng: Any) -> dict[str, Any]:
    """Plain calls through the float64 backward the catalogue shares (plain_backward):
    rule='flash' (its simulated kernel), masked_rows='nan' with an empty row, a wrong
    dk (the diagnosis over the whole catalogue), a float mask's gradient."""
    out: dict[str, Any] = {}
    q, do = (rng.standard_normal((2, 2, 4, 4)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((2, 2, 5, 4)).astype(np.float32) for _ in range(2))
    mask = np.ones((4, 5), dtype=bool)
    mask[1] = False
    fmask = rng.standard_normal((4, 5)).astype(np.float32)
    for name, kw in (("flash", {"rule": "flash", "is_causal": True}),
                     ("nan rows", {"attn_mask": mask, "masked_rows": "nan"}),
                     ("zero rows", {"attn_mask": mask}),
                     ("float mask", {"attn_mask": fmask, "_dmask": 1}),
                     ("wrong dk", {"is_causal": True, "_bad": 1})):
        kw = dict(kw)
        dmask, bad = kw.pop("_dmask", None), kw.pop("_bad", None)
        r = ms.reference_attention_backward(q, k, v, do, **{a: b for a, b in kw.items()
                                                            if a != "rule"})
        g = [e.rounded("float32") for e in (r.dq, r.dk, r.dv)]
        if bad:
            g[1] = 2 * g[1]
        extra = {"d_attn_mask": r.d_attn_mask.rounded("float32")} if dmask else {}
        try:
            out[name] = _comp(ms.compare_attention_backward(*g, q, k, v, do, **kw, **extra))
        except Exception as exc:
            out[name] = ("raised", type(exc).__name__, str(exc))
        print(name, out[name]["passed"] if isinstance(out[name], dict) else out[name][:2],
              flush=True)
    return out


def _same(a: Any, b: Any, where: str, bad: list[str]) -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and np.array_equal(a, b, equal_nan=True)):
            bad.append(where)
    elif isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            bad.append(f"{where}: keys {sorted(a)} != {sorted(b)}")
        for key in a.keys() & b.keys():
            _same(a[key], b[key], f"{where}/{key}", bad)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            bad.append(f"{where}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _same(x, y, f"{where}[{i}]", bad)
    elif a != b and not (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b)):
        bad.append(f"{where}: {a!r} != {b!r}")


def compare(old: str, new: str) -> int:
    with open(old, "rb") as f:
        a = pickle.load(f)
    with open(new, "rb") as f:
        b = pickle.load(f)
    bad: list[str] = []
    _same(a, b, "", bad)
    print(f"{len(a)} entries; {len(bad)} differences")
    for line in bad[:40]:
        print(" ", line[:300])
    return 1 if bad else 0


def _rounded(g: Any) -> Any:
    return [x.rounded("float32") for x in (g.dq, g.dk, g.dv, g.d_sinks)]


def timing(repeat: int = 7) -> None:
    """CPU and wall seconds (min, median of ``repeat``) of three backward checks with
    variants: compare_attention_backward with window + ALiBi + d_alibi_slopes and with
    softcap + sinks + d_sinks (float32, (2, 4, 64, 32)), the varlen backward with sinks."""
    import statistics
    import time

    import mha_symbolic as ms
    rng = np.random.default_rng(1)
    q, k, v, do = (rng.standard_normal((2, 4, 64, 32)).astype(np.float32) for _ in range(4))
    slopes, sinks = np.array([0.5, 0.25, 0.125, 0.0625]), np.array([0.1, -0.2, 0.3, 0.0])
    g1 = ms.reference_attention_backward(q, k, v, do, window=(8, 0), alibi_slopes=slopes)
    e1 = [x.rounded("float32") for x in (g1.dq, g1.dk, g1.dv)]
    d1 = g1.d_alibi_slopes.rounded("float32")
    g2 = ms.reference_attention_backward(q, k, v, do, softcap=5.0, sinks=sinks)
    e2 = [x.rounded("float32") for x in (g2.dq, g2.dk, g2.dv)]
    d2 = g2.d_sinks.rounded("float32")
    qp, kp, vp, dop = (rng.standard_normal((96, 4, 32)) for _ in range(4))
    jobs = {
        "compare window+alibi+d": lambda: ms.compare_attention_backward(
            *e1, q, k, v, do, window=(8, 0), alibi_slopes=slopes, d_alibi_slopes=d1),
        "compare softcap+sinks+d": lambda: ms.compare_attention_backward(
            *e2, q, k, v, do, softcap=5.0, sinks=sinks, d_sinks=d2),
        "varlen backward sinks": lambda: _rounded(ms.reference_attention_varlen_backward(
            qp, kp, vp, dop, [0, 40, 96], [0, 40, 96], is_causal=True, sinks=sinks)),
    }
    for name, job in jobs.items():
        job()
        cpu, wall = [], []
        for _ in range(repeat):
            c0, w0 = time.process_time(), time.perf_counter()
            job()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        print(f"{name:26s} cpu min {min(cpu):.3f} med {statistics.median(cpu):.3f}  "
              f"wall min {min(wall):.3f} med {statistics.median(wall):.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "--time":
        timing()
        sys.exit(0)
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    run(sys.argv[1])
