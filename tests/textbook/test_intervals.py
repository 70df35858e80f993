"""Inputs printed rounded (inputs = "printed", mha_symbolic.textbook.intervals).

Independent side: the claimed entries are recomputed with mpmath at 50 digits at the
printed inputs and at hand-chosen points of the box of printed intervals.
"""

from __future__ import annotations

import json

import mpmath

from mha_symbolic.textbook import check_examples, load_examples

mp = mpmath.mp
mp.dps = 50


def records(text: str):
    return check_examples(load_examples(text=text)).records


def test_a_claim_explained_by_input_rounding_is_consistent() -> None:
    # scores printed 0.51 and 0: the weight is 1/(1 + e^-s); at s = 0.51 it is 0.62481…
    # (→ 0.6248), but at s = 0.505, which also prints as 0.51, it is 0.62363… (→ 0.6236):
    # a score that prints as 0.51 gives the text's 0.6236.
    w = lambda s: 1 / (1 + mpmath.exp(-mpmath.mpf(s)))  # noqa: E731
    assert mpmath.nstr(w("0.51"), 5) == "0.62481"
    assert mpmath.nstr(w("0.505"), 5) == "0.62363"
    text = ("[[example]]\nname='P'\ninputs='printed'\nscale=1\nscores=[[0.51, 0]]\n"
            "[[example.claim]]\nquantity='weight[1,1]'\nclaimed='0.6236'\n")
    (r,) = records(text)
    assert r.verdict == "consistent with the inputs as printed" and r.ok
    assert r.precision == "2 decimals" and r.diagnosis is None
    # the same claim with the inputs taken exactly is wrong
    (r,) = records(text.replace("inputs='printed'\n", ""))
    assert r.verdict == "wrong"


def test_a_claim_no_printed_inputs_give_stays_wrong_with_a_note() -> None:
    # at the far end s = 0.515 the weight is 0.62598…: 0.7 is out of reach of the box
    assert mpmath.nstr(1 / (1 + mpmath.exp(-mpmath.mpf("0.515"))), 5) == "0.62598"
    text = ("[[example]]\nname='P'\ninputs='printed'\nscale=1\nscores=[[0.51, 0]]\n"
            "[[example.claim]]\nquantity='weight[1,1]'\nclaimed='0.7000'\n")
    (r,) = records(text)
    assert r.verdict == "wrong" and "no inputs inside their printed intervals" in (r.detail or "")


def test_trailing_zeros_of_float_inputs_do_not_widen_the_intervals() -> None:
    # TOML reads 0.6380 as 0.638; the tensor's other entries show 4 decimals, so 0.638 is
    # taken as 0.6380 ± 0.00005 (not ± 0.0005): a claim that needs 0.6384 is not consistent
    text = ("[[example]]\nname='P'\ninputs='printed'\nscale=1\nscores=[[0.6380, 0.1234]]\n"
            "[[example.claim]]\nquantity='scaled_score[1,1]'\nclaimed='0.6384'\n")
    (r,) = records(text)
    assert r.verdict == "wrong"
    (r,) = records(text.replace("0.6384", "0.6380"))
    assert r.verdict == "exact"


def test_uva_tutorial_values_are_consistent_with_printed_q_k_v() -> None:
    q = [[0.3367, 0.1288], [0.2345, 0.2303], [-1.1229, -0.1863]]
    k = [[2.2082, -0.6380], [0.4617, 0.2674], [0.5349, 0.8094]]
    v = [[1.1103, -1.6898], [-0.9890, 0.9580], [1.3221, 0.8172]]
    text = (f"[[example]]\nname='U'\ninputs='printed'\nquery={json.dumps(q)}\nkey={json.dumps(k)}\n"
            f"value={json.dumps(v)}\n[[example.claim]]\nquantity='head_output[1,1]'\nclaimed='0.5698'\n"
            "[[example.claim]]\nquantity='head_output[1,1]'\nclaimed='0.5800'\n")
    ok, far = records(text)
    assert ok.verdict == "consistent with the inputs as printed" and ok.precision == "4 decimals"
    assert far.verdict == "wrong"
