"""Gradient claims in worked examples (grad_output, grad_query/key/value/score) and the
backward section of derive.  Expected values: exact fractions derived by hand, and the
certified oracle (reference_attention_backward, an independent method from SymPy)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from mha_symbolic import check_examples, derive, load_examples, reference_attention_backward
from mha_symbolic.errors import ExampleFileError

UNIFORM = """
[[example]]
name = "uniform"
query = [[1, 0], [0, 1]]
key = [[1, 0], [0, 1]]
value = [[1, 2], [3, 4]]
scale = 0
grad_output = [[1, 0], [0, 1]]
"""


def test_uniform_weights_give_hand_derived_gradients() -> None:
    # scale 0: A = 1/2 everywhere; dV = Aᵀ dO = (dO_1 + dO_2)/2 in every row;
    # row 1: dP = (1, 3), D = 2, dS = (-1/2, 1/2); row 2: dP = (2, 4), D = 3; dQ = dK = 0
    text = UNIFORM + """
[[example.claim]]
quantity = "grad_value[2]"
claimed = "(0.5, 0.5)"
[[example.claim]]
quantity = "grad_score[2,1]"
claimed = "-0.5"
[[example.claim]]
quantity = "grad_key[1,2]"
claimed = "0"
[[example.claim]]
quantity = "grad_score[1,2]"
claimed = "0.25"
"""
    ex = load_examples(text=text)[0]
    g = ex.gradients()[0]
    assert g.dv == sp.Matrix([[sp.Rational(1, 2)] * 2] * 2)
    assert list(g.ds) == [-sp.Rational(1, 2), sp.Rational(1, 2), -sp.Rational(1, 2),
                          sp.Rational(1, 2)]
    verdicts = [r.verdict for r in check_examples([ex]).records]
    assert verdicts[:3] == ["exact", "exact", "exact"]
    assert verdicts[3] == "wrong"


def test_gradients_agree_with_the_certified_oracle() -> None:
    text = """
[[example]]
name = "two_heads"
query = [[1, 0, 0.5, 1], [0, 1, 1, -1], [2, 1, 0, 0]]
key = [[1, 0], [0, 1], [1, 1]]
value = [[1, 2], [3, 4], [-1, 0]]
heads = 2
kv_heads = 1
grad_output = [[1, 0, 0.5, 1], [0, 1, 2, 0], [1, 1, -1, 1]]
"""
    ex = load_examples(text=text)[0]
    grads = ex.gradients()
    # the oracle: key/value shared (kv_heads = 1), so per query head h the gradients
    # w.r.t. its own Q, K, V are those of the single-head problem with its columns
    q = np.array([[1, 0, 0.5, 1], [0, 1, 1, -1], [2, 1, 0, 0]])
    k = np.array([[1.0, 0], [0, 1], [1, 1]])
    v = np.array([[1.0, 2], [3, 4], [-1, 0]])
    do = np.array([[1, 0, 0.5, 1], [0, 1, 2, 0], [1, 1, -1, 1]])
    for h in range(2):
        cols = slice(2 * h, 2 * h + 2)
        ref = reference_attention_backward(q[:, cols], k, v, do[:, cols])
        for name, enc in (("dq", ref.dq), ("dk", ref.dk), ("dv", ref.dv)):
            # evalf(40) of a cancelling expression may leave ~1e-160 noise where the
            # value is exactly 0: allow 1e-30 beyond the oracle's certified enclosure
            exact = np.array(getattr(grads[h], name).evalf(40).tolist(), dtype=float)
            assert np.all(enc.lower - 1e-30 <= exact) and np.all(exact <= enc.upper + 1e-30)


def test_derive_shows_the_backward_pass() -> None:
    ex = load_examples(text=UNIFORM)[0]
    md = derive(ex).markdown()
    for piece in ("The gradient of the output", "dV = A^{\\top} dO", "dS = A \\circ (dP - D)",
                  "dQ = c\\, dS\\, K"):
        assert piece in md
    assert "-0.5 & 0.5" in md   # dS, row 1


def test_grad_output_is_checked_when_the_file_loads() -> None:
    with pytest.raises(ExampleFileError, match=r"grad_output is 2 × 3: expected 2 × 2"):
        load_examples(text=UNIFORM.replace("grad_output = [[1, 0], [0, 1]]",
                                           "grad_output = [[1, 0, 0], [0, 1, 0]]"))
    with pytest.raises(ExampleFileError, match="needs the values"):
        load_examples(text="""
[[example]]
name = "s"
scores = [[1, 2]]
grad_output = [[1]]
""")


def test_gradient_claim_without_grad_output_is_unreadable_and_says_why() -> None:
    ex = load_examples(text=UNIFORM.replace("grad_output = [[1, 0], [0, 1]]", "") + """
[[example.claim]]
quantity = "grad_value[1,1]"
claimed = "0.5"
""")[0]
    rec = check_examples([ex]).records[0]
    assert rec.verdict == "unreadable" and not rec.ok
    assert "gives no grad_output" in str(rec.error)


def test_a_wrong_gradient_claim_is_wrong_not_an_error() -> None:
    ex = load_examples(text=UNIFORM + """
[[example.claim]]
quantity = "grad_value[1,1]"
claimed = "0.25"
""")[0]
    rec = check_examples([ex]).records[0]
    assert rec.verdict == "wrong" and not rec.ok
