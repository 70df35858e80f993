"""Identity check for the numeric-first other-input diagnosis (issue 30, task h30d).

Runs ``mha-symbolic check`` (in process) on the seed page, on every file under
examples/ and tests/data/, and ``check_examples`` on fuzz ``document`` inputs
(tests/fuzz/long.py, ``--seed``), and pickles every report's text and Markdown (or the
error) to ``--out``.  Run it once with PYTHONPATH set to each tree, then ``--compare``::

    PYTHONPATH=/tmp/old python bench/diagnosis_identity.py --out /tmp/old.pkl
    PYTHONPATH=$PWD     python bench/diagnosis_identity.py --out /tmp/new.pkl
    python bench/diagnosis_identity.py --compare /tmp/old.pkl /tmp/new.pkl
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pickle
import sys
import time
from pathlib import Path


def _files(root: Path) -> list[Path]:
    seed = [p for p in sorted(Path("/work/shared/seed").glob("*")) if p.is_file()]
    mine = [p for d in ("examples", "tests/data") for p in sorted((root / d).rglob("*"))
            if p.is_file()]
    return seed + mine


def _cli(argv: list[str]) -> tuple[int | str, str, str]:
    from mha_symbolic.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc: int | str = main(argv)
        except SystemExit as exc:
            rc = f"exit {exc.code}"
    return rc, out.getvalue(), err.getvalue()


def _document(text: str) -> tuple[str, str]:
    from mha_symbolic.errors import MhaSymbolicError
    from mha_symbolic.textbook import check_examples, load_examples

    try:
        report = check_examples(load_examples(text=text))
    except MhaSymbolicError as exc:
        return f"{type(exc).__name__}: {exc}", ""
    return report.text(), report.markdown()


def run(out: str, inputs: int, seed: int) -> None:
    from tests.fuzz import long as fuzz

    root = Path.cwd()
    results: dict[str, object] = {}
    t0 = time.process_time()
    results["--example seed"] = _cli(["check", "--example", "seed"])
    for p in _files(root):
        name = str(p.relative_to(root)) if p.is_relative_to(root) else str(p)
        results[name] = _cli(["check", name])  # relative: the same text from either tree
    t1 = time.process_time()
    fuzz.ONLY = ("document",)
    for i in range(inputs):
        kind, payload = fuzz.make_input(seed, i)
        assert kind == "document"
        results[f"fuzz {seed}/{i}"] = _document(payload)
    t2 = time.process_time()
    print(f"files {t1 - t0:.1f} CPU s, {inputs} documents {t2 - t1:.1f} CPU s", file=sys.stderr)
    with open(out, "wb") as f:
        pickle.dump(results, f)


def compare(a: str, b: str) -> int:
    with open(a, "rb") as f:
        old = pickle.load(f)
    with open(b, "rb") as f:
        new = pickle.load(f)
    differ = [k for k in old if old[k] != new.get(k)] + [k for k in new if k not in old]
    for k in differ[:20]:
        print("DIFFERS:", k)
    print(f"{len(old)} inputs, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--inputs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    run(args.out, args.inputs, args.seed)
