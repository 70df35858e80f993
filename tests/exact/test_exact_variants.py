"""Tests of the variants in the exact engine, the worked-example format and derive
(mha_symbolic.exact.variants, the engine's window/softcap/alibi_slopes/sinks,
examples/variants.toml, textbook.derivation_variants).

Expected values: the independent Arb-loop reference of tests/oracle/variants/test_variants.py
(written from the sources' conventions), values computed by hand in comments, and
mpmath at 40 digits for the worked examples' printed claims (examples/variants.toml)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mha_symbolic.errors import ExampleFileError, ShapeError, SpecError
from mha_symbolic.exact.certified import certify
from mha_symbolic.exact.engine import exact_attention
from mha_symbolic.exact.grammar import parse_number
from mha_symbolic.textbook.check import check_examples
from mha_symbolic.textbook.derivation import derive
from mha_symbolic.textbook.examples import load_examples

flint = pytest.importorskip("flint")
from variant_reference import PREC, ref_attention  # noqa: E402  (tests/kernels/)

ROOT = Path(__file__).resolve().parents[2]
Q = [[1, 0], [0, 1], [1, 1]]
V = [[2, 0], [0, 4], [1, 1]]


@pytest.mark.parametrize("opts,ref_opts", [
    ({"window": (1, 0)}, {"window": (1, 0)}),
    ({"softcap": "3/2"}, {"softcap": 1.5}),
    ({"alibi_slopes": ["1/4"], "mask": "causal"}, {"alibi": np.array([[0.25]]),
                                                   "causal": True}),
    ({"sinks": ["-1/2"], "window": (0, 1)}, {"sinks": np.array([-0.5]), "window": (0, 1)}),
])
def test_engine_variants_agree_with_the_independent_arb_reference(opts: dict,
                                                                   ref_opts: dict) -> None:
    att = exact_attention(query=Q, key=Q, value=V, **opts)
    q = np.array(Q, dtype=np.float64)[None, None]
    v = np.array(V, dtype=np.float64)[None, None]
    balls = ref_attention(q, q, v, **ref_opts)
    old = flint.ctx.prec
    flint.ctx.prec = PREC
    try:
        for r in range(3):
            for c in range(2):
                val = float(certify(att.head_output()[r, c]).round_significant(15))
                ref = balls[0][0][r][c]
                assert abs(flint.arb(val) - ref) < flint.arb(1e-13), (r, c, val, ref)
    finally:
        flint.ctx.prec = old


def test_sink_weight_and_weights_sum_to_one_exactly() -> None:
    att = exact_attention(query=Q, key=Q, value=V, sinks=[0], mask="causal")
    head = att.head(0)
    for r in range(3):
        total = sum(head.weights[r, j] for j in range(3)) + head.sink_weight[r, 0]
        assert certify(total - 1).sign() == 0


def test_a_shifted_rows_sink_weight_shares_the_rows_denominator() -> None:
    # a mask of −10^9 makes the row shift by its largest score; the sink's share is
    # e^(σ − m) / D over the weights' own D, so the derivation sees the row sum to 1
    # structurally (no precision ladder).  Its value, by a hand-written Arb sum:
    # e^(1/3) / (e^1 + e^(2 − 10^9) + e^(1/3)).
    from mha_symbolic.exact.certified import to_arb
    from mha_symbolic.textbook.derivation.checks import _over_sum, _sums_to_one

    att = exact_attention(scores=[[1, 2]], mask=[[0, "-1e9"]], sinks=["1/3"], scale=1)
    head = att.head(0)
    share = head.sink_weight[0, 0]
    over = [_over_sum(e) for e in (head.weights[0, 0], head.weights[0, 1], share)]
    assert all(o is not None for o in over) and len({o[1] for o in over if o}) == 1
    assert _sums_to_one(head.weights[0, 0] + head.weights[0, 1] + share)
    with flint.ctx.workprec(256):
        third = flint.arb(1) / 3
        expected = third.exp() / (flint.arb(1).exp() + (flint.arb(2) - flint.arb(10) ** 9).exp()
                                  + third.exp())
        assert to_arb(share, 256).overlaps(expected)


def test_alibi_bias_is_minus_slope_times_distance_bottom_right() -> None:
    att = exact_attention(scores=[[0, 0, 0, 0], [0, 0, 0, 0]], alibi_slopes=["1/2"],
                          causal_alignment="bottom_right")
    # n_q = 2, n_k = 4: query r is at position r + 2
    assert att.head(0).bias.tolist() == [[-1, parse_number("-1/2"), 0, parse_number("-1/2")],
                                         [parse_number("-3/2"), -1, parse_number("-1/2"), 0]]


def test_softcap_keeps_scores_inside_the_cap_and_is_exact_tanh() -> None:
    att = exact_attention(scores=[[100, -100, 0]], softcap=2)
    t = att.scaled_scores()
    assert str(t[0, 0]) == "2*tanh(50)"
    assert t[0, 2] == 0
    assert certify(2 - t[0, 0]).sign() > 0


@pytest.mark.parametrize("kwargs,err,msg", [
    ({"window": (1,)}, SpecError, "window"),
    ({"window": (-2, 0)}, SpecError, "window"),
    ({"softcap": -1}, SpecError, "softcap"),
    ({"alibi_slopes": [1, 2]}, ShapeError, "alibi_slopes"),
    ({"sinks": [0, 0]}, ShapeError, "sinks"),
])
def test_engine_refuses_malformed_variant_options(kwargs: dict, err: type, msg: str) -> None:
    with pytest.raises(err, match=msg):
        exact_attention(query=Q, key=Q, value=V, **kwargs)


def test_grammar_reads_tanh_exactly() -> None:
    assert str(parse_number("2 tanh(1/2)")) == "2*tanh(1/2)"
    assert certify("tanh(0)").digits(5) == "0"


def test_variants_worked_examples_all_hold() -> None:
    report = check_examples(load_examples(ROOT / "examples" / "variants.toml"))
    assert report.ok, report.text()
    assert len(report.records) == 26


def test_variant_keys_are_checked_in_worked_example_files() -> None:
    base = ('[[example]]\nname = "x"\nquery = [[1, 0]]\nkey = [[1, 0]]\nvalue = [[1, 2]]\n')
    for line, msg in (("window = [1]", "window"), ("softcap = true", "softcap"),
                      ("alibi_slopes = 0.5", "alibi_slopes"), ("sinks = [0, 1]", "sinks"),
                      ("window = [-3, 0]", "window")):
        with pytest.raises(ExampleFileError, match=msg):
            load_examples(text=base + line + "\n")


def test_wrong_variant_claims_are_wrong() -> None:
    text = ('[[example]]\nname = "x"\nquery = [[1, 0], [0, 1]]\nkey = [[1, 0], [0, 1]]\n'
            'value = [[1, 0], [0, 1]]\nwindow = [0, 0]\n'
            '[[example.claim]]\nquantity = "weight[2,1]"\nclaimed = "0.3302"\n')
    report = check_examples(load_examples(text=text))
    assert not report.ok   # key 1 is outside query 2's window: its weight is exactly 0


def test_derive_shows_each_variant_and_its_checks_pass() -> None:
    d = derive(load_examples(ROOT / "examples" / "variants.toml"), format="markdown").text
    assert "B_{1} &= -0.5" in d            # the ALiBi bias matrix
    assert r"\tanh\left(" in d             # the softcap formula
    assert "sliding window (left 1, right 0)" in d
    assert r"w_{r,\text{sink}}" in d
    assert "✗" not in d


def test_a_huge_sink_logit_is_refused_before_exponentiation() -> None:
    from mha_symbolic.errors import InputValueError

    with pytest.raises(InputValueError, match="sinks"):
        exact_attention(query=Q, key=Q, value=V, sinks=["1000000000 ln(2)"])


def test_a_huge_alibi_bias_is_refused_before_exponentiation() -> None:
    from mha_symbolic.errors import InputValueError

    with pytest.raises(InputValueError, match="beyond"):
        exact_attention(query=Q, key=Q, value=V, alibi_slopes=["1000000000 ln(2)"])
