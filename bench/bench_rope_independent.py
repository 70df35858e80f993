"""Verdicts of ms.compare_attention on RoPE + attention kernels written independently of
the library from real codebases (tests/kernels/rope_independent.py), correct and buggy,
against the naive baseline: torch.testing.assert_close of the output vs the same code run
in float64 ("ac self"), and vs the float64 run of the correct kernel ("ac gold").

Counts: false alarms (a correct kernel that ms fails), caught bugs (a buggy kernel that ms
fails) and whether the report names a diagnosis.  A bug whose output is bit-identical to
the correct kernel's (a precision bug at float32) is not counted.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/bench_rope_independent.py [--shapes a,b]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch

import mha_symbolic as ms
from mha_symbolic.errors import ToleranceError
from tests.kernels import rope_independent as ri

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Shape:
    """B, H, L queries (the last L of S positions), S keys, head dim D, rotary_dim for the
    kernels with partial rotary, causal, RoPE base, and a factor on q and k (peaked)."""

    B: int
    H: int
    L: int
    S: int
    D: int
    rd: int | None
    causal: bool
    base: float = 10000.0
    qk_scale: float = 1.0


SHAPES = {
    "decode": Shape(1, 2, 1, 4096, 128, 64, False),
    "chunk": Shape(1, 2, 16, 1024, 64, 32, True),
    "prefill": Shape(1, 2, 256, 256, 64, None, True),
}
#: shapes from real configs where a false alarm is likeliest (correct kernels only):
#: GPT-NeoX-20B (head 96, rotary_pct 0.25: 24 dims), StableLM-3B (head 80, 20 dims),
#: Llama 3 (base 500000), and peaked attention (q, k × 3)
HUNT = {
    "neox20b": Shape(1, 2, 1, 4096, 96, 24, False),
    "stablelm": Shape(1, 2, 16, 2048, 80, 20, True),
    "llama3": Shape(1, 2, 8, 4096, 128, None, True, base=500000.0),
    "peaked": Shape(1, 2, 128, 512, 64, 32, True, qk_scale=3.0),
    "decode_full": Shape(1, 2, 1, 4096, 128, None, False),
    "qwen_1e6": Shape(1, 2, 1, 4096, 128, None, False, base=1e6),
}


def _inputs(sh: Shape, dtype: Any, seed: int) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(seed)
    return ((sh.qk_scale * torch.randn(sh.B, sh.H, sh.L, sh.D, generator=g)).to(dtype),
            (sh.qk_scale * torch.randn(sh.B, sh.H, sh.S, sh.D, generator=g)).to(dtype),
            torch.randn(sh.B, sh.H, sh.S, sh.D, generator=g).to(dtype))


def _assert_close(out: Any, ref: Any) -> bool:
    try:
        torch.testing.assert_close(out, ref.to(out.dtype))
        return True
    except AssertionError:
        return False


def _ms(out: Any, q: Any, k: Any, v: Any, kw: dict[str, Any]) -> tuple[str, str, str]:
    try:
        res = ms.compare_attention(out, q, k, v, **kw)
    except ToleranceError as e:
        return "no verdict", "", str(e)[:80]
    diag = ",".join(f"{d.bug}({d.kind})" for d in res.diagnoses)
    return ("pass" if res else "FAIL"), diag, res.summary()


def case(kname: str, dname: str, sname: str, bug: str | None, seed: int) -> dict[str, Any] | None:
    """One row (None when the bug does not apply or changes nothing).  ``err`` is
    max|out - gold| over the same for the correct kernel on the same inputs (gold: the
    correct kernel's float64 run); ``ac_ok``: assert_close passes the correct kernel's
    output on the same inputs (so a failure of the buggy one tells something)."""
    kern = ri.KERNELS[kname]
    sh = {**SHAPES, **HUNT}[sname]
    spec = ri.spec_for(kern, rotary_dim=sh.rd, causal=sh.causal, base=sh.base)
    if bug in ri.PARTIAL_BUGS and spec.rotary_dim is None:
        return None
    q, k, v = _inputs(sh, DTYPES[dname], seed)
    out, good = ri.run(kern, q, k, v, spec, bug), ri.run(kern, q, k, v, spec)
    if bug is not None and torch.equal(out, good):
        return None
    gold = ri.run64(kern, q, k, v, spec)
    t0 = time.perf_counter()
    verdict, diag, summary = _ms(out, q, k, v, ri.ms_keywords(kern, spec, q, k))
    e_good = (good.double() - gold).abs().max().item()
    return {"kernel": kname, "dtype": dname, "shape": sname, "bug": bug or "-", "seed": seed,
            "ms": verdict, "diag": diag, "s": time.perf_counter() - t0,
            "err": (out.double() - gold).abs().max().item() / max(e_good, 1e-300),
            "ac_self": _assert_close(out, ri.run64(kern, q, k, v, spec, bug)),
            "ac_gold": _assert_close(out, gold), "ac_ok": _assert_close(good, gold),
            "summary": summary}


def _rows(names: list[str]) -> list[dict[str, Any]]:
    shapes = [n for n in names if n in SHAPES]
    rows = []
    for si, sname in enumerate(n for n in names if n in HUNT):
        for di, dname in enumerate(DTYPES):
            for ki, kname in enumerate(ri.KERNELS):
                r = case(kname, dname, sname, None, 9000 + 1000 * si + 100 * di + ki)
                if r:
                    rows.append(r)
    for si, sname in enumerate(shapes):
        for di, dname in enumerate(DTYPES):
            for ki, kname in enumerate(ri.KERNELS):
                r = case(kname, dname, sname, None, 1000 * si + 100 * di + ki)
                if r:
                    rows.append(r)
            for bi, (bug, kernels) in enumerate(ri.BUGS.items()):
                for kname in kernels:
                    r = case(kname, dname, sname, bug, 5000 + 1000 * si + 100 * di + bi)
                    if r:
                        rows.append(r)
    return rows


#: the library's bug class that names each planted bug (None: no class for it)
EXPECTED = {"inv_freq_lowp": "rotary_angles_", "pairs_mixup": "rotary_interleaved_swapped",
            "no_offset": "rotary_positions_not_offset", "rotary_dim_ignored": "rotary_dim_ignored",
            "inv_freq_headdim": "rotary_inv_freq_head_dim"}


def _named(r: dict[str, Any]) -> str:
    """right (the expected class listed first), listed (not first), wrong (only other
    classes), none (no diagnosis)."""
    names = [d.split("(")[0] for d in r["diag"].split(",") if d]
    if not names:
        return "none"
    want = EXPECTED.get(r["bug"])
    if want and names[0].startswith(want):
        return "right"
    return "listed" if want and any(n.startswith(want) for n in names) else "wrong"


def _summary_tables(rows: list[dict[str, Any]]) -> None:
    print("| correct kernel | dtype | cases | ms FAIL | no verdict | worst ms ratio | "
          "ac self FAIL |")
    print("|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["kernel"] if r["bug"] == "-" else r["bug"], r["dtype"])
        groups.setdefault(key, []).append(r)
    for (name, dt), rs in groups.items():
        if rs[0]["bug"] != "-":
            continue
        ratios = [float(_ratio(r["summary"])) for r in rs if _ratio(r["summary"]) != "-"]
        print(f"| {name} | {dt} | {len(rs)} | {sum(r['ms'] == 'FAIL' for r in rs)} | "
              f"{sum(r['ms'] == 'no verdict' for r in rs)} | {max(ratios, default=0):.3g} | "
              f"{sum(not r['ac_self'] for r in rs)} |")
    print()
    print("| bug | dtype | cases | ms caught | named right / listed / wrong / none | "
          "least ms ratio | least err × | ac self caught | ac gold caught |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, dt), rs in groups.items():
        if rs[0]["bug"] == "-":
            continue
        named = Counter(_named(r) for r in rs if r["ms"] == "FAIL")
        ratios = [float(_ratio(r["summary"])) for r in rs if _ratio(r["summary"]) != "-"]
        print(f"| {name} | {dt} | {len(rs)} | {sum(r['ms'] == 'FAIL' for r in rs)} | "
              f"{named['right']} / {named['listed']} / {named['wrong']} / {named['none']} | "
              f"{min(ratios, default=0):.3g} | {min(r['err'] for r in rs):.3g} | "
              f"{sum(not r['ac_self'] for r in rs)} | {sum(not r['ac_gold'] for r in rs)} |")
    print()


def _print(rows: list[dict[str, Any]], all_rows: bool) -> None:
    _summary_tables(rows)
    shown = rows
    if not all_rows:
        shown = [r for r in rows if (r["bug"] == "-") == (r["ms"] != "pass")
                 or (r["bug"] != "-" and _named(r) == "wrong")]
        print("rows: the correct kernels that did not pass, the bugs that passed or were "
              "misnamed")
    print("| kernel | bug | dtype | shape | seed | ms | ms ratio | diagnosis | err × | "
          "ac self | ac gold | ac correct | ms s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    pf = {True: "pass", False: "FAIL"}
    for r in shown:
        print(f"| {r['kernel']} | {r['bug']} | {r['dtype']} | {r['shape']} | {r['seed']} | "
              f"{r['ms']} | {_ratio(r['summary'])} | {r['diag'] or '-'} | {r['err']:.3g} | "
              f"{pf[r['ac_self']]} | {pf[r['ac_gold']]} | {pf[r['ac_ok']]} | {r['s']:.2f} |")
    good = [r for r in rows if r["bug"] == "-"]
    bad = [r for r in rows if r["bug"] != "-"]
    print()
    print(f"correct kernels: {len(good)} cases; ms false alarms "
          f"{sum(r['ms'] == 'FAIL' for r in good)}, no verdict "
          f"{sum(r['ms'] == 'no verdict' for r in good)}; assert_close(self f64) false alarms "
          f"{sum(not r['ac_self'] for r in good)}; assert_close(gold f64) false alarms "
          f"{sum(not r['ac_gold'] for r in good)}")
    caught = [r for r in bad if r["ms"] == "FAIL"]
    named = Counter(_named(r) for r in caught)
    print(f"buggy kernels: {len(bad)} cases; ms caught {len(caught)} (diagnosis: right "
          f"{named['right']}, listed not first {named['listed']}, only wrong classes "
          f"{named['wrong']}, none {named['none']}), no verdict "
          f"{sum(r['ms'] == 'no verdict' for r in bad)}; assert_close(self f64) caught "
          f"{sum(not r['ac_self'] for r in bad)}; assert_close(gold f64) caught "
          f"{sum(not r['ac_gold'] for r in bad)}")
    inform = [r for r in bad if r["ac_ok"] and not r["ac_self"]]
    print(f"assert_close(self) catches where it passes the correct kernel on the same inputs: "
          f"{len(inform)}; ms caught {sum(r['ms'] == 'FAIL' for r in inform)} of them")
    missed = [r for r in bad if r["ms"] != "FAIL" and not r["ac_self"]]
    print(f"bugs assert_close(self) caught and ms missed: {len(missed)}")
    missed_g = [r for r in bad if r["ms"] != "FAIL" and not r["ac_gold"]]
    print(f"bugs assert_close(gold) caught and ms missed: {len(missed_g)}")
    per_bug: Counter[str] = Counter()
    for r in bad:
        per_bug[f"{r['bug']}: {r['ms']}"] += 1
    print("per bug:", dict(sorted(per_bug.items())))
    for r in good:
        if r["ms"] != "pass":
            print("FALSE ALARM / NO VERDICT:", r["kernel"], r["dtype"], r["shape"], r["seed"],
                  r["summary"])


def _ratio(summary: str) -> str:
    """The "N × tolerance" of a summary (closest call when passed, worst when failed)."""
    m = re.search(r"(?:closest call|worst) ([0-9.e+-]+) × tolerance", summary)
    return m.group(1) if m else "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="decode,chunk,prefill",
                    help=f"comma-separated, of {list(SHAPES)} (kernels and bugs) and "
                         f"{list(HUNT)} (correct kernels only)")
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        print("load:", f.read().strip())
    t0, c0 = time.perf_counter(), time.process_time()
    rows = _rows(args.shapes.split(","))
    _print(rows, args.rows)
    print(f"wall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s, "
          f"threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
