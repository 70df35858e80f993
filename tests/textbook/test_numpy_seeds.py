"""Inputs drawn with numpy seeds (issue 25): np.random.seed + rand/randn and
default_rng replayed bit for bit, and claims computed from them judged exactly.

The reference is numpy's own global API (``np.random.seed``), not the RandomState
object the replay uses; the expected claim values are computed here with Fractions
and mpmath from the float64 draws."""

from __future__ import annotations

from fractions import Fraction

import mpmath as mp
import numpy as np

from mha_symbolic.textbook import check_examples
from mha_symbolic.textbook.seeded import draw


def test_legacy_seed_replays_bit_for_bit() -> None:
    np.random.seed(42)
    x, w = np.random.rand(3, 4), np.random.randn(4, 2)
    got = draw({"numpy_seed": 42, "draws": ["x = rand(3, 4)", "w_q = randn(4, 2)"]})
    assert got["x"].tobytes() == x.tobytes() and got["w_q"].tobytes() == w.tobytes()


def test_default_rng_replays_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.random((2, 3)), rng.standard_normal((3, 3))
    got = draw({"numpy_default_rng": 7, "draws": ["query = rand(2, 3)", "key = randn(3, 3)"]})
    assert got["query"].tobytes() == a.tobytes() and got["key"].tobytes() == b.tobytes()


def test_claims_from_numpy_draws() -> None:
    np.random.seed(0)
    q, k = np.random.rand(2, 2), np.random.rand(2, 2)
    # the exact score q1·k1 from the binary float64 values, and its 4-decimal rounding
    s = sum(Fraction(float(q[0, t])) * Fraction(float(k[0, t])) for t in range(2))
    with mp.workdps(40):  # float64 entries are exact in mpf
        sc = [sum(mp.mpf(float(q[0, t])) * mp.mpf(float(k[j, t])) for t in range(2))
              / mp.sqrt(2) for j in range(2)]
        w11 = mp.e ** sc[0] / (mp.e ** sc[0] + mp.e ** sc[1])
    text = f"""
[[example]]
name = "np"
[example.init]
numpy_seed = 0
draws = ["query = rand(2, 2)", "key = rand(2, 2)"]
[[example.claim]]
quantity = "score[1,1]"
claimed = "{float(s):.4f}"
[[example.claim]]
quantity = "weight[1,1]"
claimed = "{float(w11):.4f}"
[[example.claim]]
quantity = "weight[1,1]"
claimed = "{float(w11) + 0.01:.4f}"
"""
    recs = check_examples(text).records
    assert [r.verdict for r in recs] == ["correctly rounded", "correctly rounded", "wrong"]


def test_bad_numpy_recipes_are_one_line_errors() -> None:
    import pytest

    from mha_symbolic.errors import ExampleFileError
    from mha_symbolic.textbook import load_examples

    for init in ('numpy_seed = 1\ntorch_seed = 1\ndraws = ["x = rand(2, 2)"]',
                 'numpy_seed = 1\ndraws = ["w_q = Linear(2, 2)"]',
                 'numpy_seed = -1\ndraws = ["x = rand(2, 2)"]'):
        with pytest.raises(ExampleFileError):
            load_examples(text=f"[[example]]\nname = 'a'\n[example.init]\n{init}\n")
