"""Issue 25's remainder: the speed-ups that must not change a report, randint draws,
division in symbolic shapes, one token's all-head query, transposed printouts, and the
"printed values belong to input X′" diagnosis.  Expected values come from numpy itself,
hand computation or mpmath, never from the code under test."""

from __future__ import annotations

from typing import Any

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


# --- division in a symbolic shape ---------------------------------------------------------

from mha_symbolic.textbook.sizes import NotWhole, parse_size, size_value  # noqa: E402


def test_sizes_with_a_division_are_read_exactly() -> None:
    n, h = sp.symbols("n_embd n_head", integer=True, positive=True)
    assert size_value("n_embd/n_head", {}) == n / h
    assert size_value("n_embd // n_head", {}) == n / h            # // read as / for names
    assert size_value("(3·d_model / h)", {"d_model": 512, "h": 8}) == 192   # 3·512/8 by hand
    assert size_value("384 // 6", {}) == 64
    assert parse_size("h·d_v") is None and parse_size("a/b/c") is None
    with pytest.raises(NotWhole, match="510 = 63·8 \\+ 6"):
        size_value("510 // 8", {})
    with pytest.raises(NotWhole, match="512/7"):
        size_value("d_model/heads", {"d_model": 512, "heads": 7})


SIZES = """
[[example]]
name = "gpt"
d_model = 384
heads = 6
d_k = "d_model // heads"
n_q = "T"
[[example.claim]]
quantity = "dim.d_k"
claimed = "64"
[[example.claim]]
quantity = "shape.q"
claimed = "(T, 384 // 6)"

[[example]]
name = "sym"
d_model = "n_embd"
heads = "n_head"
n_q = "T"
d_k = "n_embd/n_head"
[[example.claim]]
quantity = "shape.q"
claimed = "T × n_embd/n_head"
[[example.claim]]
quantity = "shape.k"
claimed = "(T, (n_embd // n_head))"
[[example.claim]]
quantity = "shape.q"
claimed = "T × n_embd"

[[example]]
name = "slip"
d_model = 512
heads = 8
n_q = 10
[[example.claim]]
quantity = "shape.q"
claimed = "10 × 512/8"
[[example.claim]]
quantity = "shape.q"
claimed = "10 × 510 // 8"
[[example.claim]]
quantity = "shape.q"
claimed = "10 × 512/7"
"""


def test_division_in_stated_sizes_and_shape_claims() -> None:
    recs = check_examples(SIZES).records
    assert [r.verdict for r in recs] == ["exact", "exact", "exact", "exact", "wrong",
                                         "exact", "wrong", "wrong"]
    assert recs[4].diagnosis is None or "not whole" not in recs[4].diagnosis
    assert "510 // 8 does not divide" in recs[6].diagnosis
    assert "512/7 does not divide" in recs[7].diagnosis


@pytest.mark.parametrize("bad", ['d_k = "d_model // 5"', 'd_k = "1/0"', 'd_k = "a/b/c"',
                                 'd_k = "9999999999/1"', 'd_k = "__import__(1)/2"',
                                 'd_v = "d_model / (2*0)"'])
def test_bad_quotients_in_stated_sizes_are_one_line_errors(bad: str) -> None:
    with pytest.raises(ExampleFileError) as e:
        load_examples(text=f"[[example]]\nname = 'a'\nd_model = 512\nheads = 8\n{bad}\n")
    assert "\n" not in str(e.value)


def test_a_shape_divided_by_zero_is_unreadable() -> None:
    text = ("[[example]]\nname='a'\nd_model=8\nheads=2\nn_q=3\n[[example.claim]]\n"
            "quantity='shape.q'\nclaimed='3 × 5/0'\n")
    assert check_examples(text).records[0].verdict == "unreadable"


# --- one token's all-head query -----------------------------------------------------------

TOKEN = """
[[example]]
name = "tok"
x = [[1, 2], [3, -1], [0, 1]]
w_q = [[1, 0, 2, -1], [0, 1, 1, 3]]
w_k = [[1, 1], [0, 2]]
w_v = [[2, 0], [1, 1]]
heads = 2
kv_heads = 1
[[example.claim]]
quantity = "q_token[2]"
claimed = "tensor([[3, -1], [5, -6]])"
[[example.claim]]
quantity = "q_token[2]"
claimed = "tensor([3, -1, 5, -6])"
[[example.claim]]
quantity = "q_token[3]"
claimed = "[[0, 1], [1, 3]]"
[[example.claim]]
quantity = "q_token[2]"
claimed = "tensor([[3, -1], [5, 6]])"
[[example.claim]]
quantity = "k_token[1]"
claimed = "tensor([[1, 5]])"
[[example.claim]]
quantity = "v_token[2]"
claimed = "(5, -1)"
"""


def test_one_tokens_query_across_heads() -> None:
    # by hand: x[2] = (3, -1); x[2]·W_Q = (3·1 + −1·0, 3·0 + −1·1, 3·2 + −1·1, 3·(−1) + −1·3)
    # = (3, −1, 5, −6): head 1 (3, −1), head 2 (5, −6).  x[3]·W_Q = (0, 1, 1, 3).
    # one kv head: x[1]·W_K = (1, 1 + 4) = (1, 5); x[2]·W_V = (6 − 1, −1) = (5, −1)
    recs = check_examples(TOKEN).records
    assert [r.verdict for r in recs] == ["exact", "exact", "exact", "wrong", "exact", "exact"]
    assert recs[3].entries and recs[3].entries[0]["index"] == "[2,2]"


@pytest.mark.parametrize("bad", ["q_token", "q_token[1,2]", "q_token[4]", "q_token.x[1]"])
def test_token_quantities_need_one_token_in_range(bad: str) -> None:
    text = (TOKEN.split("[[example.claim]]")[0]
            + f"[[example.claim]]\nquantity = {bad!r}\nclaimed = \"(1, 2)\"\n")
    assert check_examples(text).records[0].verdict == "unreadable"


# --- transposed and column printouts of any quantity --------------------------------------

ORIENT = """
[[example]]
name = "o"
query = [[1, 0], [0, 1]]
key = [[1, 0], [0, 1], [1, 1]]
value = [[1, 2], [3, 4], [5, 6]]
scale = 1
[[example.claim]]
quantity = "score"
claimed = "tensor([[1, 0], [0, 1], [1, 1]])"
note = "Q K^T is 2 × 3 = [[1, 0, 1], [0, 1, 1]]; printed as (Q K^T).T, 3 × 2"
[[example.claim]]
quantity = "score"
claimed = "tensor([[1, 0, 1], [0, 1, 1]])"
[[example.claim]]
quantity = "score[1]"
claimed = "tensor([[1], [0], [1]])"
[[example.claim]]
quantity = "v"
claimed = "tensor([[1, 3, 5], [2, 4, 7]])"

[[example]]
name = "sq"
query = [[2, 0], [0, 1]]
key = [[1, 3], [0, 1]]
scale = 1
[[example.claim]]
quantity = "score"
claimed = "tensor([[2, 0], [3, 1]])"
note = "Q K^T = [[2, 0], [3, 1]]"
[[example.claim]]
quantity = "score"
claimed = "tensor([[2, 3], [0, 1]])"
note = "the transpose: ambiguous without the key"
[[example.claim]]
quantity = "score"
claimed = "tensor([[2, 3], [0, 1]])"
transposed = true
[[example.claim]]
quantity = "score"
claimed = "tensor([[2, 3], [0, 1]])"
transposed = false
[[example.claim]]
quantity = "score"
claimed = "tensor([[2, 4], [0, 1]])"
"""


def test_printouts_in_the_transposed_orientation() -> None:
    # by hand: "o": q1 = (1, 0), q2 = (0, 1) against k = (1, 0), (0, 1), (1, 1):
    # Q K^T = [[1, 0, 1], [0, 1, 1]].  "sq": q1 = (2, 0), q2 = (0, 1) against k1 = (1, 3),
    # k2 = (0, 1): Q K^T = [[2, 0], [3, 1]], its transpose [[2, 3], [0, 1]]
    recs = check_examples(ORIENT).records
    got = [r.verdict for r in recs]
    assert got == ["exact", "exact", "exact", "wrong",
                   "exact", "ambiguous", "exact", "wrong", "wrong"], got
    assert "read transposed" in recs[0].detail and "column vector" in recs[2].detail
    assert recs[3].entries[0]["index"] == "[2,3]"     # V^T[2,3] = v[3,2] = 6, printed 7
    assert "transposed = true or false" in recs[5].detail and recs[5].diagnosis is None
    only = ("[[example]]\nname = 'sq'\nquery = [[2, 0], [0, 1]]\nkey = [[1, 3], [0, 1]]\n"
            "scale = 1\n[[example.claim]]\nquantity = 'score'\nclaimed = 'tensor([[2, 3], [0, 1]])'\n")
    assert check_examples(only).exit_status == 4   # ambiguous, nothing wrong: never counted wrong


@pytest.mark.parametrize(("claimed", "key"), [("tensor([[2, 0], [3, 1]])", "transposed = 1"),
                                              ("(2, 0)", "transposed = true"),
                                              ("tensor([[2, 0, 1]])", "transposed = true")])
def test_bad_orientations_are_unreadable(claimed: str, key: str) -> None:
    text = (ORIENT.split("[[example]]\nname = \"sq\"")[1].split("[[example.claim]]")[0]
            + f"[[example.claim]]\nquantity = \"score\"\nclaimed = \"{claimed}\"\n{key}\n")
    rec = check_examples("[[example]]\nname = \"sq\"" + text).records[0]
    assert rec.verdict == "unreadable", rec


# --- "the printed values are what another input X′ gives" ---------------------------------

import mpmath as mp  # noqa: E402


def _softmax(row: list[Any]) -> list[Any]:
    with mp.workdps(40):
        e = [mp.e ** mp.mpf(t) for t in row]
        return [x / sum(e) for x in e]


def _t(row: list[Any], places: int = 4) -> str:
    """A tuple printed to ``places`` decimals (the values are far from rounding ties)."""
    return "(" + ", ".join(f"{float(x):.{places}f}" for x in row) + ")"


def test_printed_values_of_the_transposed_input_are_named() -> None:
    # scores S = [[1, 2], [3, 4]], scale 1: the text printed softmax of Sᵀ's first row (1, 3)
    claimed = _t(_softmax([1, 3]))                     # (0.1192, 0.8808)
    text = f"""
[[example]]
name = "t"
scores = [[1, 2], [3, 4]]
scale = 1
[[example.claim]]
quantity = "weight[1]"
claimed = "{claimed}"
"""
    rec = check_examples(text).records[0]
    assert rec.verdict == "wrong"
    assert rec.diagnosis == ("the printed values are what another input gives: scores transposed "
                             "(scoresᵀ: the input before a transpose)")


def test_printed_values_of_the_previous_examples_input_are_named() -> None:
    s = 1 / mp.sqrt(2)
    claimed = _t(_softmax([s, 0]))                     # softmax(q1·k / √2) of the first example
    text = f"""
[[example]]
name = "first"
query = [[1, 0]]
key = [[1, 0], [0, 1]]

[[example]]
name = "second"
query = [[3, 0]]
key = [[1, 0], [0, 1]]
[[example.claim]]
quantity = "weight[1]"
claimed = "{claimed}"
"""
    rec = check_examples(text).records[0]
    assert rec.verdict == "wrong"
    assert rec.diagnosis.startswith("the printed values are what another input gives: query "
                                    "replaced by query of example 'first'"), rec.diagnosis


def test_weights_from_the_wrongly_printed_scores_are_named() -> None:
    # Q = I, K = [[1, 0], [2, 2]]: Q Kᵀ = Kᵀ = [[1, 2], [0, 2]]; the text prints
    # [[1, 5], [0, 2]] (its claimed line is 8) and then softmax(row 1 / √2) of the row (1, 5)
    claimed = _t(_softmax([1 / mp.sqrt(2), 5 / mp.sqrt(2)]))
    text = f"""
[[example]]
name = "s"
query = [[1, 0], [0, 1]]
key = [[1, 0], [2, 2]]
[[example.claim]]
quantity = "score"
claimed = "tensor([[1, 5], [0, 2]])"
[[example.claim]]
quantity = "weight[1]"
claimed = "{claimed}"
"""
    recs = check_examples(text).records
    assert [r.verdict for r in recs] == ["wrong", "wrong"]
    assert recs[1].diagnosis == ("the printed values are what another input gives: the scores "
                                 "the text prints at line 8 in place of Q Kᵀ"), recs[1].diagnosis


def test_several_inputs_that_fit_are_said_together() -> None:
    # Q = I, K = [[1, 3], [2, 4]]: the printed scores' row (1, 5) and K Kᵀ's row
    # (k1·k1, k1·k2) = (10, 14) differ by 4 alike: both give softmax((1, 5)/√2)
    claimed = _t(_softmax([1 / mp.sqrt(2), 5 / mp.sqrt(2)]))
    text = f"""
[[example]]
name = "s"
query = [[1, 0], [0, 1]]
key = [[1, 3], [2, 4]]
[[example.claim]]
quantity = "score"
claimed = "tensor([[1, 5], [3, 4]])"
[[example.claim]]
quantity = "weight[1]"
claimed = "{claimed}"
"""
    d = check_examples(text).records[1].diagnosis
    assert d.startswith("the printed values are what another input gives, and several fit")
    assert "key in place of query" in d and "the scores the text prints at line 8" in d


def test_a_one_digit_claim_names_no_other_input() -> None:
    text = """
[[example]]
name = "t"
scores = [[1, 2], [3, 4]]
scale = 1
[[example.claim]]
quantity = "weight[1,1]"
claimed = "0.1"
"""
    rec = check_examples(text).records[0]   # softmax(1, 3)[1] = 0.119… would print 0.1
    assert rec.verdict == "wrong" and "another input" not in (rec.diagnosis or "")


# --- the planted file: each claim's note states what it must get -------------------------

from pathlib import Path  # noqa: E402

PLANTED = Path(__file__).resolve().parents[1] / "data" / "planted-remainder.toml"


def test_planted_remainder_claims_get_what_their_notes_state() -> None:
    # the values in the file are derived by hand in its comments; here the transposed and
    # earlier-input slips are recomputed with mpmath
    assert _t(_softmax([1, 3])) == "(0.1192, 0.8808)"
    assert _t(_softmax([1 / mp.sqrt(2), 0])) == "(0.6698, 0.3302)"
    assert _t(_softmax([1 / mp.sqrt(2), 5 / mp.sqrt(2)])) == "(0.0558, 0.9442)"
    w = _softmax([0, 1])
    assert _t([w[0] * 1 + w[1] * 2, w[0] * 3 + w[1] * 4]) == "(1.7311, 3.7311)"
    report = check_examples(PLANTED)
    for r in report.records:
        if r.note == "correct":
            assert r.ok, r
        elif r.note == "ambiguous":
            assert r.verdict == "ambiguous", r
        elif r.note.startswith("root: "):
            assert r.verdict == "wrong" and (r.diagnosis or "").startswith(r.note[6:]), r
        else:
            assert r.verdict == "wrong" and r.diagnosis is None, r


def test_the_alternatives_are_bounded_per_run() -> None:
    from mha_symbolic.textbook.alternatives import file_allowance, other_input_diagnosis

    ex = load_examples(text="[[example]]\nname='t'\nscores=[[1, 2], [3, 4]]\nscale=1\n")[0]
    p = parse_printed("(0.1192, 0.8808)")
    claim = Claim("weight[1]", p.text)
    with file_allowance(0):
        assert other_input_diagnosis(ex, claim, p) is None      # no computation allowed
    with file_allowance(1):
        assert other_input_diagnosis(ex, claim, p) is not None  # the transposed scores


def test_integer_draws_as_written_with_their_module() -> None:
    np.random.seed(3)
    a = np.random.randint(0, 5, size=(2, 2))
    b = np.random.randint(4, size=3)
    got = draw({"numpy_seed": 3, "draws": ["w_q = np.random.randint(0, 5, size=(2, 2))",
                                           "w_k = random.randint(4, size=3)"]})
    assert got["w_q"].tolist() == a.tolist() and got["w_k"].tolist() == b.tolist()
    g = np.random.default_rng(3)
    c = g.integers(7, size=(2, 2))
    assert draw({"numpy_default_rng": 3,
                 "draws": ["w_q = rng.integers(7, size=(2, 2))"]})["w_q"].tolist() == c.tolist()
    # a prefixed integer draw under torch's seed is refused like a bare one
    with pytest.raises(ExampleFileError, match="not a draw of"):
        load_examples(text="[[example]]\nname='a'\n[example.init]\ntorch_seed = 1\n"
                           "draws = ['w_q = np.random.randint(3, size=(2, 2))']\n")


# --- the input repeated per head ------------------------------------------------------------

X_HEADS = """
[[example]]
name = "xh"
n_q = 6
d_model = 16
heads = 3
d_k = 24
d_v = 28
[[example.claim]]
quantity = "shape.x_heads"
claimed = "torch.Size([3, 16, 6])"
axes = "heads × columns × rows"
[[example.claim]]
quantity = "shape.x_heads"
claimed = "torch.Size([3, 6, 16])"
axes = "heads × rows × columns"
[[example.claim]]
quantity = "shape.x_heads"
claimed = "torch.Size([2, 6, 16])"
axes = "heads × rows × columns"
[[example.claim]]
quantity = "shape.x_heads"
claimed = "torch.Size([1, 3, 6, 16])"
[[example.claim]]
quantity = "shape.k"
claimed = "torch.Size([1, 3, 6, 24])"
"""


def test_the_input_repeated_per_head_has_a_shape() -> None:
    # by hand: X is n_q × d_model = 6 × 16, once per head (3): x.repeat(3, 1, 1) is
    # 3 × 6 × 16, its transpose per head 3 × 16 × 6; two heads is wrong; a 4-size
    # claim is read as the other per-head shapes read it (the keys' the same way)
    recs = check_examples(X_HEADS).records
    assert [r.verdict for r in recs[:3]] == ["exact", "exact", "wrong"]
    assert recs[3].verdict == recs[4].verdict
