"""The slowest inputs the limits allow (issue 15): every documented limit is meant to keep
one worked-example file within a few CPU seconds.  This script builds, for each kind of
input, the largest example the limits accept (deterministic entries), and times

* load + check (3 claims, all wrong: every diagnosis runs) + the four report formats,
* ``derive`` to a LaTeX document,

in CPU seconds (``time.process_time``: the machine may be shared), min and median of
``--runs``, next to the example's work count, the limit, and the load average.  Also
the claim-work limit: the most wrong claims a small example may carry.

    OMP_NUM_THREADS=1 python bench/bench_limits.py [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mha_symbolic.exact.engine as engine  # noqa: E402
from mha_symbolic.errors import MhaSymbolicError  # noqa: E402
from mha_symbolic.textbook import check_examples, load_examples  # noqa: E402
from mha_symbolic.textbook.derivation import derive  # noqa: E402

IRRATIONAL = ['"sqrt(2)"', '"1/3"', '"e^(1/2)"', '-2', '"ln(3)"', '0.25', '"sqrt(3)/2"', '1']
CLAIMS = ('[[example.claim]]\nquantity = "weight[1,1]"\nclaimed = "0.5"\n'
          '[[example.claim]]\nquantity = "head_output[1,1]"\nclaimed = "0.5"\n'
          '[[example.claim]]\nquantity = "output[1,1]"\nclaimed = "0.5"\n')


def matrix(n: int, m: int, irrational: bool, salt: int) -> str:
    def entry(i: int, j: int) -> str:
        k = (i * 7 + j * 3 + salt) % 11
        return IRRATIONAL[k % len(IRRATIONAL)] if irrational else str(k % 5 - 2)

    return "[" + ", ".join("[" + ", ".join(entry(i, j) for j in range(m)) + "]"
                           for i in range(n)) + "]"


def document(kind: str, n: int, d: int, heads: int, irrational: bool) -> str:
    lines = ["[[example]]", 'name = "big"', f"heads = {heads}"]
    if kind == "x":
        lines += [f"x = {matrix(n, d, irrational, 0)}"] + [
            f"{w} = {matrix(d, d, irrational, k)}" for k, w in enumerate(("w_q", "w_k", "w_v", "w_o"), 1)]
    elif kind == "qkv":
        lines += [f"{w} = {matrix(n, d, irrational, k)}"
                  for k, w in enumerate(("query", "key", "value"))]
    else:
        lines += [f"scores = {matrix(n, n, irrational, 0)}", f"value = {matrix(n, d, irrational, 1)}"]
    return "\n".join(lines) + "\n" + CLAIMS


def work_of(text: str) -> int | None:
    """The work count the engine computes for the document (None if refused)."""
    seen: list[int] = []
    real = engine._check_work

    def spy(kwargs: dict[str, Any], terms: dict[str, int] | None = None) -> None:
        real(kwargs, terms)
        if terms is not None:
            w = engine.attention_work(**kwargs, terms=terms)
            w.pop("entries")
            seen.append(sum(w.values()) * (engine.IRRATIONAL_COST if any(terms.values()) else 1))

    engine._check_work = spy
    try:
        load_examples(text=text.split("[[example.claim]]")[0])
    except MhaSymbolicError:
        return None
    finally:
        engine._check_work = real
    return seen[-1] if seen else None


def largest(kind: str, d: int, heads: int, irrational: bool) -> tuple[int, str, int] | None:
    """The largest n whose example the limits accept."""
    best = None
    for n in range(1, 65):
        text = document(kind, n, d, heads, irrational)
        w = work_of(text)
        if w is None:
            break
        best = (n, text, w)
    return best


def cpu(fn: Any, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        out.append(time.process_time() - t0)
    return out


def check_all(text: str) -> None:
    report = check_examples(load_examples(text=text))
    report.text(), report.json(), report.markdown(), report._repr_html_()


def toml_cases() -> list[tuple[str, str]]:
    """Files near the 1 MB limit built to make the TOML reader slow: table names and dotted
    keys of the most parts allowed (its cost grows as their square), long float rows (every
    line has many dots: the key scan runs), and refused ones (one part too many,
    nesting, a megabyte hexadecimal integer)."""
    from mha_symbolic.textbook.examples import MAX_FILE_BYTES
    from mha_symbolic.textbook.toml_reader import MAX_KEY_PARTS

    def fill(make: Any) -> str:
        out, size, i = [], 0, 0
        while True:
            line = make(i)
            if size + len(line) > MAX_FILE_BYTES:
                return "".join(out)
            out.append(line)
            size += len(line.encode())
            i += 1

    parts = ".a" * (MAX_KEY_PARTS - 1)
    return [
        (f"table names of {MAX_KEY_PARTS} parts", fill(lambda i: f"[k{i}{parts}]\n")),
        (f"dotted keys of {MAX_KEY_PARTS} parts", fill(lambda i: f"k{i}{parts} = 1\n")),
        ("rows of floats", "[[example]]\nscores = [" + fill(
            lambda i: "[" + ", ".join(["0.125"] * 16) + "],\n")[:-2].rstrip(",") + "]\n"),
        (f"a key of {MAX_KEY_PARTS + 1} parts, refused", fill(lambda i: f"k{i}{parts}.a = 1\n")),
        ("nested arrays, refused", "x = " + "[" * (MAX_FILE_BYTES // 2 - 4) + "\n"),
        ("a hexadecimal integer, refused", "x = 0x" + "f" * (MAX_FILE_BYTES - 10) + "\n"),
    ]


def _load_or_refuse(text: str) -> None:
    with contextlib.suppress(MhaSymbolicError):
        load_examples(text=text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = []
    cases = [("x", 4, 1, False), ("x", 8, 2, False), ("x", 4, 1, True), ("x", 8, 4, False),
             ("qkv", 4, 1, False), ("qkv", 16, 4, False), ("qkv", 4, 1, True), ("qkv", 8, 2, True),
             ("scores", 2, 1, False), ("scores", 2, 1, True)]
    for kind, d, heads, irr in cases:
        found = largest(kind, d, heads, irr)
        if found is None:
            continue
        n, text, w = found
        check_s = cpu(lambda text=text: check_all(text), args.runs)
        derive_s = cpu(lambda text=text: derive(load_examples(text=text)).text, args.runs)
        rows.append({"input": f"{kind} n={n} d={d} h={heads} {'irrational' if irr else 'rational'}",
                     "work": w, "check_min_s": min(check_s),
                     "check_median_s": statistics.median(check_s), "derive_min_s": min(derive_s),
                     "derive_median_s": statistics.median(derive_s)})
        print(json.dumps(rows[-1]), flush=True)
    # the claim-work limit: the most wrong claims a small example may carry
    base = "[[example]]\nquery = [[1, 0], [0, 1]]\nkey = [[1, 0], [0, 1]]\nvalue = [[2, 0], [0, 4]]\n"
    claim = '[[example.claim]]\nquantity = "head_output[{}]"\nclaimed = "0.{:04d}"\n'
    k = 1
    while True:
        text = base + "".join(claim.format(f"{i % 2 + 1},{i // 2 % 2 + 1}", i) for i in range(k + 50))
        try:
            load_examples(text=text)
        except MhaSymbolicError:
            break
        k += 50
    text = base + "".join(claim.format(f"{i % 2 + 1},{i // 2 % 2 + 1}", i) for i in range(k))
    check_s = cpu(lambda: check_all(text), args.runs)
    rows.append({"input": f"{k} wrong claims on a 2 x 2 example", "check_min_s": min(check_s),
                 "check_median_s": statistics.median(check_s)})
    print(json.dumps(rows[-1]), flush=True)
    # the TOML reader: a file of the largest size whose structure tomllib reads slowest
    for name, text in toml_cases():
        load_s = cpu(lambda text=text: _load_or_refuse(text), args.runs)
        rows.append({"input": f"TOML, {len(text):,} bytes: {name}", "check_min_s": min(load_s),
                     "check_median_s": statistics.median(load_s)})
        print(json.dumps(rows[-1]), flush=True)
    print(f"MAX_WORK={engine.MAX_WORK} IRRATIONAL_COST={engine.IRRATIONAL_COST} "
          f"loadavg={os.getloadavg()}")
    worst_check = max(r["check_median_s"] for r in rows)
    worst_derive = max(r.get("derive_median_s", 0.0) for r in rows)
    print(f"slowest check {worst_check:.2f} CPU s, slowest derive {worst_derive:.2f} CPU s "
          f"(per-input fuzz limit 5 CPU s)")


if __name__ == "__main__":
    main()
