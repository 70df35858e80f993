"""Huge finite masks decided by magnitude analysis (mha_symbolic.exact.magnitude and the
verdicts built on it).

The independent side is mpmath, whose exponent range is unbounded: e^(−10^6) is a number
of about 10^(−434294) there, computed at 50 significant digits, so 2 − 2/(1 + e^(−10^6))
can be evaluated directly and its decimal exponent read off.
"""

from __future__ import annotations

import json

import mpmath
import pytest
import sympy as sp

from mha_symbolic.exact.magnitude import dominated
from mha_symbolic.textbook import check_examples, load_examples

mp = mpmath.mp
mp.dps = 50


def check(scores: str, mask: str, value: str, quantity: str, claimed: str, **extra: str):
    text = (f"[[example]]\nname='M'\nscale=1\nscores={scores}\nmask={mask}\nvalue={value}\n"
            + "".join(f"{k}={v}\n" for k, v in extra.items())
            + f"[[example.claim]]\nquantity={json.dumps(quantity)}\nclaimed={json.dumps(claimed)}\n")
    (r,) = check_examples(load_examples(text=text)).records
    return r


def test_the_issue_example_2_minus_ten_to_the_minus_434294() -> None:
    # output = 2·1/(1 + t) + 0·t/(1 + t) with t = e^-1e6; 2 − output = 2t/(1 + t) (by hand:
    # subtracting at 50 digits would cancel), which is 10^-434294.18…
    t = mpmath.exp(-10**6)
    gap = 2 * t / (1 + t)
    assert mpmath.floor(-mpmath.log10(gap)) == 434294
    r = check("[[0, 0]]", "[[0, -1e6]]", "[[2], [0]]", "output[1,1]", "2")
    assert r.verdict == "correctly rounded" and r.ok
    assert r.detail == ("holds to 434,294 digits; not exactly 2 (masked keys contribute "
                        "e^−1000000)")


@pytest.mark.parametrize("fill", ["-1e5", "-1e6", "-1e9", "-9e15"])
def test_tutorial_mask_values_are_decided(fill: str) -> None:
    # a masked_fill with each value tutorials use: the weight of a kept key of two equal
    # scores is 1/(1 + e^fill), i.e. 1 minus a number below 10^-43000
    r = check("[[0, 0]]", "[[true, false]]", "[[2], [0]]", "weight[1,1]", "1.0000",
              mask_fill=fill)
    assert r.verdict == "correctly rounded", r
    t = mpmath.exp(mpmath.mpf(fill))
    places = int(mpmath.floor(-mpmath.log10(t / (1 + t))))  # 1 − 1/(1 + t) = t/(1 + t)
    assert f"holds to {places:,} digits" in (r.detail or "")
    r = check("[[0, 0]]", "[[true, false]]", "[[2], [0]]", "weight[1,2]", "0",
              mask_fill=fill)
    assert r.verdict == "correctly rounded" and "not exactly 0" in (r.detail or "")


def test_an_exact_claim_equal_only_to_the_dominant_part_is_wrong() -> None:
    r = check("[[0, 0, 0]]", "[[true, true, false]]", "[[1], [1], [1]]", "weight[1,1]", "1/2",
              mask_fill="-1e6")
    assert r.verdict == "wrong" and "not exactly 1/2" in (r.detail or "")


def test_rounding_of_a_non_tie_with_a_masked_contribution() -> None:
    # scores (0, 1) kept, a third key masked by -1e6: weight 1 = 1/(1 + e + e^-1e6)
    w = 1 / (1 + mpmath.e + mpmath.exp(-10**6))
    assert mpmath.nstr(w, 6) == "0.268941"
    r = check("[[0, 1, 0]]", "[[0, 0, -1e6]]", "[[1], [1], [1]]", "weight[1,1]", "0.2689")
    assert r.verdict == "correctly rounded"
    r = check("[[0, 1, 0]]", "[[0, 0, -1e6]]", "[[1], [1], [1]]", "weight[1,1]", "0.2690")
    assert r.verdict == "wrong" and r.rounded == "0.2689"


def test_dominated_split_and_sign() -> None:
    t = sp.exp(-10**6)
    d = dominated(2 / (1 + t))
    assert d is not None and d.main == 2 and d.sign == -1 and d.places == 434294
    d = dominated(t / (1 + t))
    assert d is not None and d.main == 0 and d.sign == 1
    assert dominated(sp.exp(-5) / (1 + sp.exp(-5))) is None  # nothing tiny: plain evaluation
    assert dominated(sp.Rational(1, 3)) is None


def test_huge_masks_are_bounded_not_refused() -> None:
    # beyond MAX_ABS_MASK (1e30) a mask is refused with one line
    from mha_symbolic.errors import ExampleFileError

    with pytest.raises(ExampleFileError, match="mask"):
        load_examples(text="[[example]]\nname='M'\nscale=1\nscores=[[0, 0]]\nmask=[[0, -1e40]]\n")
