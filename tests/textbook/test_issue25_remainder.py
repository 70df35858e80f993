"""Issue 25's remainder: the speed-ups that must not change a report, randint draws,
division in symbolic shapes, one token's all-head query, transposed printouts, and the
"printed values belong to input X′" diagnosis.  Expected values come from numpy itself,
hand computation or mpmath, never from the code under test."""

from __future__ import annotations

import sympy as sp

from mha_symbolic.textbook import check_examples, load_examples
from mha_symbolic.textbook.claims import parse_printed
from mha_symbolic.textbook.examples import Claim
from mha_symbolic.textbook.screening import may_hold
from mha_symbolic.textbook.verdicts import describe, short_form


def test_a_printout_over_the_batch_is_never_matched_by_a_one_element_variant() -> None:
    ex = load_examples(text="[[example]]\nname='A'\nd_k=4\nscores=[[[8, 0]], [[8, 0]]]\n")[0]
    # scale 1/2: weights 1/(1 + e^-4) = 0.98201…, e^-4/(1 + e^-4) = 0.01799…
    half = {"scale": sp.Rational(1, 2)}
    one = parse_printed("tensor([[0.9820, 0.0180]])")
    assert may_hold(ex, Claim("weight", one.text), one, half)
    # the printout spans the batch (4 entries); the variant is one element's 2 entries
    both = parse_printed("tensor([[[0.9820, 0.0180]], [[0.9820, 0.0180]]])")
    assert not may_hold(ex, Claim("weight", both.text), both, half)


def test_the_cached_exact_form_is_the_simplified_one() -> None:
    x = sp.exp(sp.sqrt(2) / 2)
    assert short_form((4 + 8 * x) / (1 + 2 * x)) == "4"
    w = x / (1 + x)
    assert describe(w, 15) == describe(w, 15)
    assert describe(w, 15)[1] == "exp(sqrt(2)/2)/(1 + exp(sqrt(2)/2))"
    assert describe(w, 15, form=False)[1] == ""


# --- numpy integer draws, replayed bit for bit (numpy's global API is the reference) ---

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mha_symbolic.errors import ExampleFileError  # noqa: E402
from mha_symbolic.textbook.seeded import draw, draw_entries  # noqa: E402

LEGACY_FORMS = [  # (draw text, the same call on numpy's global legacy API)
    ("randint(3, size=(3, 3))", lambda: np.random.randint(3, size=(3, 3))),
    ("randint(0, 10, (3, 4))", lambda: np.random.randint(0, 10, (3, 4))),
    ("randint(-5, 5, size=[2, 2])", lambda: np.random.randint(-5, 5, size=[2, 2])),
    ("randint(low=1, high=7, size=6)", lambda: np.random.randint(low=1, high=7, size=6)),
    ("randint(5, None, 4)", lambda: np.random.randint(5, None, 4)),
    ("randint(0, 100, size=(2, 3), dtype=np.int8)",
     lambda: np.random.randint(0, 100, size=(2, 3), dtype=np.int8)),
    ("randint(0, 2, (5,), dtype='int16')", lambda: np.random.randint(0, 2, (5,), dtype="int16")),
    ("randint(0, 9, 3, 'int32')", lambda: np.random.randint(0, 9, 3, "int32")),
    ("randint(2, size=4, dtype=bool)", lambda: np.random.randint(2, size=4, dtype=bool)),
    ("randint(0, 2**63 - 1 + 2**63, size=2, dtype=numpy.uint64)", None),  # refused: not digits
    ("randint(0, 18446744073709551615, size=3, dtype=np.uint64)",
     lambda: np.random.randint(0, 18446744073709551615, size=3, dtype=np.uint64)),
    ("randint(-9223372036854775808, 9223372036854775807, size=2, dtype=int)",
     lambda: np.random.randint(-9223372036854775808, 9223372036854775807, size=2, dtype=int)),
]


@pytest.mark.parametrize(("text", "ref"), [f for f in LEGACY_FORMS if f[1] is not None])
def test_legacy_randint_replays_every_form_bit_for_bit(text, ref) -> None:
    np.random.seed(1234)
    before = np.random.rand(2)           # draws before and after share the stream
    want, after = ref(), np.random.rand(3)
    got = draw({"numpy_seed": 1234, "draws": ["x = rand(2)", f"w_q = {text}", "w_k = rand(3)"]})
    assert got["x"].tobytes() == before.tobytes()
    assert [int(v) for v in np.ravel(got["w_q"])] == [int(v) for v in np.ravel(want)]
    assert np.shape(got["w_q"]) == np.shape(want)
    assert got["w_k"].tobytes() == after.tobytes()


GENERATOR_FORMS = [
    ("integers(10, size=(2, 2))", lambda g: g.integers(10, size=(2, 2))),
    ("integers(-3, 3, (4,), endpoint=True)", lambda g: g.integers(-3, 3, (4,), endpoint=True)),
    ("integers(low=0, high=255, size=[3, 2], dtype=np.uint8, endpoint=True)",
     lambda g: g.integers(low=0, high=255, size=[3, 2], dtype=np.uint8, endpoint=True)),
    ("integers(0, 1000, 5, dtype='int16')", lambda g: g.integers(0, 1000, 5, dtype="int16")),
    ("integers(2, size=3, dtype=bool)", lambda g: g.integers(2, size=3, dtype=bool)),
]


@pytest.mark.parametrize(("text", "ref"), GENERATOR_FORMS)
def test_generator_integers_replay_every_form_bit_for_bit(text, ref) -> None:
    g = np.random.default_rng(99)
    before = g.standard_normal(2)
    want, after = ref(g), g.random(2)
    got = draw({"numpy_default_rng": 99,
                "draws": ["x = randn(2)", f"w_q = {text}", "w_k = rand(2)"]})
    assert got["x"].tobytes() == before.tobytes() and got["w_k"].tobytes() == after.tobytes()
    assert [int(v) for v in np.ravel(got["w_q"])] == [int(v) for v in np.ravel(want)]
    assert np.shape(got["w_q"]) == np.shape(want)


def test_claims_from_randint_weights_are_judged_exactly() -> None:
    np.random.seed(5)
    wq, wk = np.random.randint(-2, 3, size=(2, 2)), np.random.randint(-2, 3, size=(2, 2))
    x = np.array([[1, 2], [3, -1]])
    s = int((x @ wq)[0] @ (x @ wk)[1])  # score[1,2] by integer arithmetic
    text = f"""
[[example]]
name = "ri"
x = [[1, 2], [3, -1]]
w_v = [[1, 0], [0, 1]]
[example.init]
numpy_seed = 5
draws = ["w_q = randint(-2, 3, size=(2, 2))", "w_k = randint(-2, 3, size=(2, 2))"]
[[example.claim]]
quantity = "score[1,2]"
claimed = "{s}"
[[example.claim]]
quantity = "score[1,2]"
claimed = "{s + 1}"
"""
    assert [r.verdict for r in check_examples(text).records] == ["exact", "wrong"]


@pytest.mark.parametrize("bad", [
    "w_q = randint(3)",                              # no size: a scalar
    "w_q = randint(3, size=(300, 300))",             # 90,000 entries
    "w_q = randint(3, size=(0, 3))",
    "w_q = randint(3, size=(1, 1, 1, 1, 1))",
    "w_q = randint(0, 300, size=2, dtype=np.int8)",  # numpy: high out of bounds for int8
    "w_q = randint(5, 5, size=2)",                   # numpy: low >= high
    "w_q = randint(3, size=2, dtype=float)",
    "w_q = randint(1e3, size=2)",
    "w_q = randint(123456789012345678901, size=2)",  # 21 digits
    "w_q = randint(3, size=2, foo=1)",
    "w_q = randint(3, high=4, size=2, low=0)",       # low given twice (positional, keyword)
    "w_q = randint(3, size=2, endpoint=True)",       # endpoint is the Generator's
    "w_q = integers(3, size=2)",                     # integers is the Generator's
    "w_q = randint(3, size=__import__('os'))",
    "mask = randint(2, size=(2, 2))",                # not an input target
])
def test_bad_integer_draws_are_one_line_errors(bad: str) -> None:
    text = f"[[example]]\nname = 'a'\nvalue = [[1]]\n[example.init]\nnumpy_seed = 1\ndraws = [{bad!r}]\n"
    with pytest.raises(ExampleFileError) as e:
        load_examples(text=text)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_randint_is_refused_for_the_other_generators() -> None:
    for kind in ("torch_seed", "numpy_default_rng"):
        text = (f"[[example]]\nname = 'a'\n[example.init]\n{kind} = 1\n"
                "draws = ['w_q = randint(3, size=(2, 2))']\n")
        with pytest.raises(ExampleFileError, match="not a draw of"):
            load_examples(text=text)


def test_a_draws_entries_are_counted_before_drawing() -> None:
    assert draw_entries("w_q = randint(3, size=(300, 200))") == 60_000
    assert draw_entries("x = Embedding(6, 16)[0, 1]") == 96        # the whole table is drawn
    assert draw_entries("seed(1000000000)") == 0                    # a seed draws nothing
