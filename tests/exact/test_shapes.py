"""Shape algebra: the symbolic table, numeric cross-attention, and refused mismatches."""

from __future__ import annotations

import json

import pytest
import sympy as sp

from mha_symbolic.errors import ShapeError
from mha_symbolic.exact.shapes import Shape, attention_shapes, same_size
from mha_symbolic.exact.spec import AttentionSpec


def _sym(name: str) -> sp.Symbol:
    return sp.Symbol(name, integer=True, positive=True)


def test_symbolic_table_for_cross_attention() -> None:
    t = attention_shapes(cross=True)
    n_q, n_k, d_model, d_k, d_v, h = map(_sym, ["n_q", "n_k", "d_model", "d_k", "d_v", "h"])
    assert t["scores"].shape == Shape(n_q, n_k)
    assert t["weights"].shape == Shape(n_q, n_k)
    assert t["head"].shape == Shape(n_q, d_v)
    assert t["output"].shape == Shape(n_q, d_model)
    assert t["q"].shape == Shape(n_q, d_k)
    assert t["k"].shape == Shape(n_k, d_k)
    assert t["concat"].shape == Shape(n_q, h * d_v)
    assert str(t["scores"].shape) == "n_q × n_k"


def test_symbolic_table_for_self_attention() -> None:
    t = attention_shapes()
    assert str(t["scores"].shape) == "n_q × n_q"
    assert str(t["head"].shape) == "n_q × d_v"
    assert str(t["output"].shape) == "n_q × d_model"


def test_numeric_cross_attention() -> None:
    t = attention_shapes(n_q=3, n_k=5, d_model=512, heads=8)
    assert (t["scores"].shape.rows, t["scores"].shape.cols) == (3, 5)
    assert (t["head"].shape.rows, t["head"].shape.cols) == (3, 64)
    assert (t["output"].shape.rows, t["output"].shape.cols) == (3, 512)
    assert (t["concat"].shape.rows, t["concat"].shape.cols) == (3, 512)
    assert str(t["scores"].shape) == "3 × 5" and str(t["head"].shape) == "3 × 64"


def test_table_from_a_spec_and_order() -> None:
    t = attention_shapes(AttentionSpec(n_q=2, n_k=7, d_model=6, heads=3, kdim=5, vdim=4))
    assert t.names()[0] == "x" and t.names()[-1] == "output"
    assert str(t["w_k"].shape) == "5 × 2" and str(t["w_v"].shape) == "4 × 2"
    assert str(t["scores"].shape) == "2 × 7"
    with pytest.raises(KeyError):
        t["nonexistent"]


def test_renderings() -> None:
    t = attention_shapes(n_q=3, n_k=5, d_model=512, heads=8)
    assert "scores" in t.text() and "3 × 5" in t.text()
    d = json.loads(json.dumps(t.as_dict()))
    assert d["scores"]["shape"] == ["3", "5"]
    assert t.latex().startswith("\\begin{array}") and "3 \\times 5" in t.latex()
    assert t._repr_latex_().startswith("$$")


def test_numeric_mismatch_is_refused() -> None:
    with pytest.raises(ShapeError, match=r"inner sizes 4 and 5 differ"):
        Shape(3, 4) @ Shape(5, 6)
    assert Shape(3, 4) @ Shape(4, 6) == Shape(3, 6)


def test_symbolic_mismatch_that_cannot_be_proved_is_refused() -> None:
    a, b, c, d = map(_sym, "abcd")
    with pytest.raises(ShapeError, match="not provably equal"):
        Shape(a, b) @ Shape(c, d)
    # SymPy itself accepts X*X for a symbolic non-square MatrixSymbol; we do not
    with pytest.raises(ShapeError):
        Shape(a, b) @ Shape(a, b)


def test_symbolic_identity_is_accepted() -> None:
    d, h = _sym("d"), _sym("h")
    assert Shape(_sym("n"), h * (d / h)) @ Shape(d, 3) == Shape(_sym("n"), 3)
    assert same_size(2 * d, d + d)
    assert not same_size(d, h)
    assert same_size(4, 4) and not same_size(4, 5)


def test_transpose() -> None:
    assert Shape(3, 2) == Shape(2, 3).T


def test_sizes_given_as_digit_strings_are_numeric() -> None:
    t = attention_shapes(n_q="3", n_k="5", d_model="512", heads="8")
    assert str(t["head"].shape) == "3 × 64"
