"""The slowest inputs the limits allow (issue 15): every documented limit is meant to keep
one worked-example file within a few CPU seconds.  This script builds, for each kind of
input, the largest example the limits accept (deterministic entries), and times

* load + check (3 claims, all wrong: every diagnosis runs) + the four report formats,
* ``derive`` to a LaTeX document,

in CPU seconds (``time.process_time``: the machine may be shared), min and median of
``--runs``, next to the example's work count, the limit, and the load average.  Also
the claim-work limit: the most wrong claims a small example may carry.

    OMP_NUM_THREADS=1 python bench/bench_limits.py [--runs 3] [--work-only]
    OMP_NUM_THREADS=1 python bench/bench_limits.py --scout 40 [--seed 11]

``--scout K`` draws K families at random (kind, widths, heads, GQA, masks, sinks, cross
shapes, size of the entries) and times each once at the largest size the limits accept.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
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


def matrix(n: int, m: int, irrational: bool, salt: int, size: int = 3) -> str:
    """Deterministic entries drawn like the n = 64 example's (bench/bench_check.py): integers
    from −3 to 3, or the irrational list; varied, so that few exponentials repeat (SymPy
    and the certified values' caches make repeated entries cheaper than a real example)."""
    rng = random.Random(f"{n},{m},{salt},{irrational}")

    def entry() -> str:
        return rng.choice(IRRATIONAL) if irrational else str(rng.randint(-size, size))

    return "[" + ", ".join("[" + ", ".join(entry() for _ in range(m)) + "]" for _ in range(n)) + "]"


@dataclass(frozen=True)
class Case:
    """A family of inputs: ``kind`` x (with W^O), qkv or scores; ``n`` tokens searched
    (``n_q`` fixed when given: then n is the number of keys); options as TOML lines."""

    kind: str
    d: int
    heads: int = 1
    irrational: bool = False
    kv_heads: int | None = None
    n_q: int | None = None
    options: tuple[str, ...] = ()
    mask: str = ""  # "" | "causal" | "huge": an additive mask of −10^9 below the diagonal
    queries: bool = False  # time the softmax-over-queries variant instead of check/derive
    size: int = 3  # rational entries from −size to size
    hi: int = 64

    def label(self, n: int) -> str:
        shape = f"n_q={self.n_q} n_k={n}" if self.n_q else f"n={n}"
        extra = [f"kv_heads={self.kv_heads}"] if self.kv_heads else []
        extra += [o.split(" =")[0] for o in self.options] + ([f"mask {self.mask}"] if self.mask else [])
        extra += ["softmax over queries"] if self.queries else []
        extra += [f"entries ±{self.size}"] if self.size != 3 else []
        return (f"{self.kind} {shape} d={self.d} h={self.heads} "
                f"{'irrational' if self.irrational else 'rational'}"
                + (" " + ", ".join(extra) if extra else ""))

    def document(self, n: int) -> str:
        n_q = self.n_q or n
        kv = self.kv_heads or self.heads
        lines = ["[[example]]", 'name = "big"', f"heads = {self.heads}"]
        lines += [f"kv_heads = {kv}"] if self.kv_heads else []
        lines += list(self.options)
        irr, d = self.irrational, self.d
        if self.kind == "x":
            lines += [f"x = {matrix(n_q, d, irr, 0, self.size)}"]
            lines += [f"x_kv = {matrix(n, d, irr, 5, self.size)}"] if self.n_q else []
            lines += [f"w_q = {matrix(d, d, irr, 1)}", f"w_k = {matrix(d, d * kv // self.heads, irr, 2)}",
                      f"w_v = {matrix(d, d * kv // self.heads, irr, 3)}", f"w_o = {matrix(d, d, irr, 4)}"]
        elif self.kind == "qkv":
            lines += [f"query = {matrix(n_q, d, irr, 0, self.size)}",
                      f"key = {matrix(n, d * kv // self.heads, irr, 1, self.size)}",
                      f"value = {matrix(n, d * kv // self.heads, irr, 2)}"]
        else:
            mats = [matrix(n_q, n, irr, h, self.size) for h in range(self.heads)]
            lines += [f"scores = {mats[0] if self.heads == 1 else '[' + ', '.join(mats) + ']'}",
                      f"value = {matrix(n, d * self.heads, irr, 1)}"]
        if self.mask == "causal":
            lines += ['mask = "causal"']
        elif self.mask == "huge":
            rows = [[0 if j <= i else "-1e9" for j in range(n)] for i in range(n_q)]
            lines += ["mask = " + str(rows).replace("'", '"')]
        return "\n".join(lines) + "\n" + CLAIMS


CASES = [
    Case("x", 4), Case("x", 8, 2), Case("x", 4, irrational=True), Case("x", 8, 4),
    Case("x", 4, 2, irrational=True), Case("x", 4, n_q=4, hi=1024),
    Case("qkv", 4), Case("qkv", 2), Case("qkv", 16, 4), Case("qkv", 8, 4, kv_heads=2),
    Case("qkv", 4, irrational=True), Case("qkv", 8, 2, irrational=True),
    Case("qkv", 4, mask="causal"), Case("qkv", 4, irrational=True, mask="huge"),
    Case("qkv", 4, size=10), Case("qkv", 4, size=30), Case("qkv", 4, size=100),
    Case("qkv", 4, size=200),
    Case("qkv", 4, queries=True), Case("qkv", 4, irrational=True, queries=True),
    Case("scores", 2), Case("scores", 2, irrational=True),
    Case("scores", 2, n_q=1, hi=4096), Case("scores", 2, n_q=4, hi=1024),
    Case("scores", 2, options=("sinks = [1]",)),
    Case("scores", 2, irrational=True, options=('sinks = ["sqrt(2)"]',)),
]


class _Accepted(BaseException):
    """Raised by the spy once the limits have accepted an example (its build is skipped)."""


def work_of(text: str, changes: dict[str, Any] | None = None) -> int | None:
    """The work count of the document's first example (with ``changes``, of that variant),
    None when a limit refuses it; the build itself is skipped."""
    seen: list[int] = []
    real = engine._check_work

    def spy(kwargs: dict[str, Any], terms: dict[str, int] | None = None,
            magnitude: float = 0.0) -> int:
        total = real(kwargs, terms, magnitude)
        if terms is not None and (not changes or kwargs.get("softmax_over") == "queries"):
            seen.append(total)
            raise _Accepted
        return total

    engine._check_work = spy
    try:
        ex = load_examples(text=text.split("[[example.claim]]")[0])[0]
        ex.attention(**(changes or {}))
    except _Accepted:
        pass
    except MhaSymbolicError:
        return None
    finally:
        engine._check_work = real
    return seen[-1] if seen else None


def largest(case: Case) -> tuple[int, str, int] | None:
    """The largest n whose example the limits accept (the work grows with n: bisection)."""
    changes = {"softmax_over": "queries"} if case.queries else None

    def accepted(n: int) -> int | None:
        return work_of(case.document(n), changes)

    if accepted(1) is None:
        return None
    lo, hi = 1, case.hi
    if accepted(hi) is not None:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accepted(mid) is not None else (lo, mid)
    w = accepted(lo)
    assert w is not None
    return lo, case.document(lo), w


def queries_variant(text: str) -> None:
    """Build the softmax-over-queries variant (the checker's diagnosis) and give certified
    digits of every weight and head output, as a consumer walking each entry does."""
    from mha_symbolic.exact.certified import certify

    att = load_examples(text=text)[0].attention(softmax_over="queries")
    for h in att.heads:
        for e in list(h.weights) + list(h.output):
            certify(e).digits(12)


def cpu(fn: Any, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        out.append(time.process_time() - t0)
    return out


def derive_or_refuse(text: str, row: dict[str, Any]) -> None:
    """``derive`` to LaTeX; a refusal (exit 2 from the command line) is timed too, and noted."""
    try:
        _ = derive(load_examples(text=text)).text
    except MhaSymbolicError as exc:
        row["derive_refused"] = str(exc)[:60]


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


def other_limits(runs: int) -> list[dict[str, Any]]:
    """The claim-work limit (the most wrong claims a small example may carry) and the
    TOML reader (a file of the largest size whose structure tomllib reads slowest)."""
    rows: list[dict[str, Any]] = []
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
    check_s = cpu(lambda: check_all(text), runs)
    rows.append({"input": f"{k} wrong claims on a 2 x 2 example", "check_min_s": min(check_s),
                 "check_median_s": statistics.median(check_s)})
    print(json.dumps(rows[-1]), flush=True)
    # the TOML reader: a file of the largest size whose structure tomllib reads slowest
    for name, text in toml_cases():
        load_s = cpu(lambda text=text: _load_or_refuse(text), runs)
        rows.append({"input": f"TOML, {len(text):,} bytes: {name}", "check_min_s": min(load_s),
                     "check_median_s": statistics.median(load_s)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def random_case(rng: random.Random) -> Case:
    """A family drawn at random: kind, widths, heads (and GQA), entries, masks, cross shapes."""
    kind = rng.choice(["x", "qkv", "qkv", "scores"])
    heads = rng.choice([1, 1, 2, 4])
    kv = rng.choice([None, heads // 2]) if heads > 1 and kind == "qkv" else None
    d = heads * rng.choice([1, 2, 4]) if kind != "scores" else rng.choice([1, 2, 4])
    n_q = rng.choice([None, None, None, 1, 2, 8])
    options = tuple(rng.sample(['sinks = ["1/3"]', "d_k = 2", 'scale = "1/2"'], rng.randint(0, 1)))
    if kind != "scores":
        options = tuple(o for o in options if o != "d_k = 2")
    if heads > 1:
        options = tuple(o for o in options if not o.startswith("sinks"))
    return Case(kind, d, heads, irrational=rng.random() < 0.3, kv_heads=kv or None, n_q=n_q,
                options=options, mask=rng.choice(["", "", "causal", "huge"]) if not n_q else "",
                size=rng.choice([1, 3, 10, 30, 100]), hi=64 if not n_q else 1024)


def scout(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` random families, each at the largest n the limits accept: check + derive
    once (CPU s), as a boundary fuzz run of the work model."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        case = random_case(rng)
        try:
            found = largest(case)
        except MhaSymbolicError:
            found = None
        if found is None:
            continue
        n, text, w = found
        row: dict[str, Any] = {"input": case.label(n), "work": w}
        try:
            row["check_s"] = cpu(lambda text=text: check_all(text), 1)[0]
        except MhaSymbolicError as exc:  # refused at load (a limit the work count does not see)
            row["refused"] = str(exc)[:80]
            print(json.dumps(row, ensure_ascii=False), flush=True)
            continue
        row["derive_s"] = cpu(lambda text=text, row=row: derive_or_refuse(text, row), 1)[0]
        rows.append(row)
        print(json.dumps(row, ensure_ascii=False), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work-only", action="store_true",
                    help="only the work limit's cases (not the claims' limit nor the TOML reader)")
    ap.add_argument("--scout", type=int, default=0, metavar="K",
                    help="instead: K random families at the largest size accepted, timed once")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    if args.scout:
        found = scout(args.scout, args.seed)
        print(f"MAX_WORK={engine.MAX_WORK} loadavg={os.getloadavg()}; {len(found)} timed; slowest "
              f"check {max(r['check_s'] for r in found):.2f} CPU s, slowest derive "
              f"{max(r['derive_s'] for r in found):.2f} CPU s")
        return
    rows = []
    for case in CASES:
        found = largest(case)
        if found is None:
            continue
        n, text, w = found
        row: dict[str, Any] = {"input": case.label(n), "work": w}
        if case.queries:
            q_s = cpu(lambda text=text: queries_variant(text), args.runs)
            row.update(check_min_s=min(q_s), check_median_s=statistics.median(q_s))
        else:
            check_s = cpu(lambda text=text: check_all(text), args.runs)
            derive_s = cpu(lambda text=text, row=row: derive_or_refuse(text, row), args.runs)
            row.update(check_min_s=min(check_s), check_median_s=statistics.median(check_s),
                       derive_min_s=min(derive_s), derive_median_s=statistics.median(derive_s))
        rows.append(row)
        print(json.dumps(row, ensure_ascii=False), flush=True)
    if not args.work_only:
        rows += other_limits(args.runs)
    print(f"MAX_WORK={engine.MAX_WORK} IRRATIONAL_COST={engine.IRRATIONAL_COST} "
          f"loadavg={os.getloadavg()}")
    worst_check = max(r["check_median_s"] for r in rows)
    worst_derive = max(r.get("derive_median_s", 0.0) for r in rows)
    print(f"slowest check {worst_check:.2f} CPU s, slowest derive {worst_derive:.2f} CPU s "
          f"(per-input fuzz limit 5 CPU s)")


if __name__ == "__main__":
    main()
