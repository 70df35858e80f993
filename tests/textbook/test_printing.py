"""What the reports print: exact forms simplified within a bounded cost and shown only
when shorter than a line; symbolic counts as a book writes them."""

from __future__ import annotations

import time
from pathlib import Path

import sympy as sp

from mha_symbolic.textbook.verdicts import SIMPLIFY_MAX_OPS, describe, simplified

X = sp.exp(sp.sqrt(2) / 2)
SEED = Path(__file__).resolve().parents[2] / "examples" / "seed.toml"


def test_an_exact_form_is_simplified_before_it_is_printed() -> None:
    digits, form = describe((4 + 8 * X) / (1 + 2 * X), 15)
    assert digits == "4" and form in ("", "4")
    assert simplified(sp.exp(-3) / (sp.exp(-3) + sp.E)) == 1 / (1 + sp.exp(4))


def test_simplification_is_bounded_by_the_expression_size() -> None:
    a, b, c = sp.symbols("a b c", positive=True)
    big = (a + b + c) ** 40 / ((a + b + c) ** 39 * (a + 2 * b))  # expanding would be 12,341 terms
    start = time.perf_counter()
    assert simplified(big) == big
    assert time.perf_counter() - start < 1.0
    wide = sp.Add(*[sp.exp(sp.Rational(i, 7)) for i in range(SIMPLIFY_MAX_OPS + 5)])
    assert simplified(wide) is wide  # over the bound: kept as it is


def test_a_long_exact_form_goes_on_its_own_line_and_a_longer_one_is_left_out() -> None:
    from mha_symbolic import check_examples

    text = str(check_examples(SEED, only=["A"]))
    lines = text.splitlines()
    i = lines.index("      exact: (1.33952309865331…, 1.32095380269337…)")
    assert lines[i + 1] == "             = (2*exp(sqrt(2)/2)/(1 + exp(sqrt(2)/2)), 4/(1 + exp(sqrt(2)/2)))"
    assert max(len(ln) for ln in lines if ln.lstrip().startswith(("exact:", "= "))) <= 100


def test_symbolic_counts_are_printed_as_a_book_writes_them(capsys: object) -> None:
    from mha_symbolic.cli import main

    assert main(["params"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "total                           4·d_model² + 4·d_model\n" in out
    assert "d_model**2" not in out and "4*d_model*(d_model + 1)" not in out


def test_prove_says_what_is_proved_and_what_is_stated(capsys: object) -> None:
    from mha_symbolic.cli import main

    assert main(["prove", "--only", "uniform", "--only", "onehot"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert out.splitlines()[0].split()[:6] == ["#", "theorem", "status", "time", "stated", "method"]
    last = out.strip().splitlines()[-1]
    assert last.startswith("2 of 2 theorems hold: 1 fully machine-checked, 1 also resting on 3 "
                           "elementary facts stated, not machine-checked (the steps marked [stated])")
