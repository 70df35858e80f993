"""CPU of fuzz document inputs and the share of other_input_diagnosis in it (issue 30, h30d).

    PYTHONPATH=TREE python bench/diagnosis_share.py 400

(seed 5, the documents of tests/fuzz/long.py, in this process, one after the other)."""

from __future__ import annotations

import sys
import time
from typing import Any

import mha_symbolic.textbook.check as check
from tests.fuzz import long as fuzz
from tests.fuzz import properties as prop

_orig = check.other_input_diagnosis
_spent = [0.0]


def _timed(*a: Any, **k: Any) -> Any:
    t0 = time.process_time()
    try:
        return _orig(*a, **k)
    finally:
        _spent[0] += time.process_time() - t0


def main(n: int) -> None:
    check.other_input_diagnosis = _timed  # type: ignore[assignment]
    fuzz.ONLY = ("document",)
    t0 = time.process_time()
    for i in range(n):
        prop.run_document(fuzz.make_input(5, i)[1])
    tot = time.process_time() - t0
    print(f"{n} documents: {tot:.1f} CPU s ({1000 * tot / n:.1f} ms each), "
          f"other_input_diagnosis {_spent[0]:.1f} CPU s ({100 * _spent[0] / tot:.0f} %)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400)
