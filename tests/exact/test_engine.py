"""The exact engine against hand-derived closed forms (the seed's Examples A and B,
masks, fully masked rows, GQA, scale, cross-attention, x-level with biases)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import mpmath
import pytest
import sympy as sp

from mha_symbolic.errors import InputValueError, MhaSymbolicError, ShapeError, SpecError
from mha_symbolic.exact.engine import exact_attention, exact_matrix, exact_number

E = sp.E
R = sp.Rational


def _eq(a: sp.Expr, b: sp.Expr) -> bool:
    return a == b or sp.simplify(a - b) == 0


def _meq(a: sp.Matrix, b: sp.Matrix) -> bool:
    return a.shape == b.shape and all(_eq(x, y) for x, y in zip(a, b, strict=True))


# -- Example A ------------------------------------------------------------------------
# Q1 = K1 = I (2×2), d_k = 2: S = I, scaled = I/sqrt(2), so row 1 weights are
# e^(sqrt2/2)/(e^(sqrt2/2)+1) and 1/(e^(sqrt2/2)+1); values (2,0) and (0,4).

S2 = sp.exp(sp.sqrt(2) / 2)
W11 = S2 / (S2 + 1)
W12 = 1 / (S2 + 1)


@pytest.fixture(scope="module")
def example_a():
    return exact_attention(query=[[1, 0], [0, 1]], key=[[1, 0], [0, 1]], value=[[2, 0], [0, 4]])


def test_example_a_scores_and_scale(example_a) -> None:
    assert example_a.scores() == sp.eye(2)
    assert _eq(example_a.scale, 1 / sp.sqrt(2))
    assert _meq(example_a.scaled_scores(), sp.eye(2) / sp.sqrt(2))


def test_example_a_weights_are_exact(example_a) -> None:
    w = example_a.weights()
    assert sp.simplify(w[0, 0] - W11) == 0
    assert sp.simplify(w[0, 1] - W12) == 0
    assert sp.simplify(w[1, 0] - W12) == 0
    assert sp.simplify(w[1, 1] - W11) == 0
    # each row sums to exactly 1
    assert all(sp.simplify(sum(w.row(r)) - 1) == 0 for r in range(2))


def test_example_a_weight_matches_the_books_0_6698(example_a) -> None:
    mp = mpmath.mp.clone()
    mp.dps = 50
    ref = 1 / (1 + mp.exp(-mp.sqrt(2) / 2))
    assert abs(sp.N(example_a.weights()[0, 0], 50) - sp.Float(str(ref), 50)) < sp.Float("1e-45")
    assert round(float(ref), 4) == 0.6698


def test_example_a_output_is_hand_derived(example_a) -> None:
    out = example_a.head_output()
    expected = sp.Matrix([[2 * W11, 4 * W12], [2 * W12, 4 * W11]])
    assert _meq(out, expected)
    assert _meq(example_a.final(), expected)  # no W^O: the output is the concat


# -- Example B ------------------------------------------------------------------------
# One token x = (1,2,3,4), two heads, W^Q = W^K = W^V = W^O = I: each head sees one
# key, so its weight is exactly 1 and its output is its slice of x.

@pytest.fixture(scope="module")
def example_b():
    eye = sp.eye(4).tolist()
    return exact_attention(x=[[1, 2, 3, 4]], w_q=eye, w_k=eye, w_v=eye, w_o=eye, heads=2)


def test_example_b_is_exact(example_b) -> None:
    assert example_b.weights(0) == sp.Matrix([[1]])
    assert example_b.weights(1) == sp.Matrix([[1]])
    assert example_b.head_output(0) == sp.Matrix([[1, 2]])
    assert example_b.head_output(1) == sp.Matrix([[3, 4]])
    assert example_b.concat == sp.Matrix([[1, 2, 3, 4]])
    assert example_b.final() == sp.Matrix([[1, 2, 3, 4]])
    # head 1: q = k = (1,2), score 5; head 2: (3,4), score 25; d_k = 2
    assert example_b.scores(0) == sp.Matrix([[5]])
    assert example_b.scores(1) == sp.Matrix([[25]])
    assert _eq(example_b.scale, 1 / sp.sqrt(2))


# -- masks ----------------------------------------------------------------------------

Z23 = [[0, 0, 0], [0, 0, 0]]
Z32 = [[0, 0], [0, 0], [0, 0]]


def test_causal_top_left_with_fewer_queries_than_keys() -> None:
    # query i sees keys j <= i
    w = exact_attention(scores=Z23, mask="causal").weights()
    assert w == sp.Matrix([[1, 0, 0], [R(1, 2), R(1, 2), 0]])


def test_causal_bottom_right_with_fewer_queries_than_keys() -> None:
    # query i sees keys j <= i + n_k - n_q = i + 1
    w = exact_attention(scores=Z23, mask="causal", causal_alignment="bottom_right").weights()
    assert w == sp.Matrix([[R(1, 2), R(1, 2), 0], [R(1, 3), R(1, 3), R(1, 3)]])


def test_causal_top_left_with_more_queries_than_keys() -> None:
    w = exact_attention(scores=Z32, mask="causal").weights()
    assert w == sp.Matrix([[1, 0], [R(1, 2), R(1, 2)], [R(1, 2), R(1, 2)]])


def test_causal_bottom_right_with_more_queries_than_keys_masks_row_0() -> None:
    # j <= i - 1: row 0 sees nothing, row 1 key 0, row 2 keys 0 and 1
    w = exact_attention(scores=Z32, mask="causal", causal_alignment="bottom_right").weights()
    assert w == sp.Matrix([[0, 0], [1, 0], [R(1, 2), R(1, 2)]])


def test_causal_with_unequal_scores() -> None:
    # row 1: softmax of (1, 2) over both keys = (1/(1+e), e/(1+e))
    w = exact_attention(scores=[[3, 9], [1, 2]], mask="causal").weights()
    assert w[0, 0] == 1 and w[0, 1] == 0
    assert _eq(w[1, 0], 1 / (1 + E)) and _eq(w[1, 1], E / (1 + E))


def test_boolean_mask_true_takes_part() -> None:
    w = exact_attention(scores=[[1, 2, 3]], mask=[[True, False, True]]).weights()
    assert w[0, 1] == 0
    assert _eq(w[0, 0], 1 / (1 + E**2)) and _eq(w[0, 2], E**2 / (1 + E**2))


def test_additive_mask_adds_to_scaled_scores_and_minus_inf_gives_exactly_zero() -> None:
    for minus_inf in (float("-inf"), "-inf", -sp.oo, "−inf"):
        w = exact_attention(scores=[[1, 2], [3, 4]], mask=[[0, minus_inf], [1, 0]]).weights()
        assert w[0, 0] == 1 and w[0, 1] == 0  # exactly, not a tiny number
        # row 2: (3+1, 4+0) are equal -> 1/2 each
        assert w[1, 0] == R(1, 2) and w[1, 1] == R(1, 2)


def test_large_finite_mask_keeps_a_tiny_exact_weight() -> None:
    # -1e9 is not -inf: the key keeps weight e^(-1e9 - 1)/(1 + e^(-1e9 - 1)) > 0
    w = exact_attention(scores=[[1, 2]], mask=[[0, -1e9]]).weights()
    assert w[0, 1] != 0
    assert _eq(w[0, 1], sp.exp(2 - 10**9) / (E + sp.exp(2 - 10**9)))


@pytest.mark.parametrize("policy", ["zero", "nan", "error"])
def test_fully_masked_row_policy(policy: str) -> None:
    kwargs: dict[str, Any] = dict(scores=[[1, 2], [3, 4]], value=[[1, 2], [3, 4]],
                  mask=[[False, False], [True, True]], masked_rows=policy)
    if policy == "error":
        with pytest.raises(InputValueError, match="query row 1 of head 1"):
            exact_attention(**kwargs)
        return
    att = exact_attention(**kwargs)
    w, out = att.weights(), att.head_output()
    if policy == "zero":
        assert list(w.row(0)) == [0, 0]
        assert list(out.row(0)) == [0, 0]
    else:
        assert all(x is sp.nan for x in w.row(0))
        assert all(x.has(sp.nan) for x in out.row(0))
    # the other row is untouched: softmax(3, 4)
    assert _eq(w[1, 0], 1 / (1 + E))


def test_fully_masked_row_via_additive_minus_inf() -> None:
    w = exact_attention(scores=[[1, 2]], mask=[["-inf", "-inf"]]).weights()
    assert list(w) == [0, 0]


# -- scale ------------------------------------------------------------------------------

def test_scale_zero_means_zero_and_gives_uniform_weights() -> None:
    for zero in (0, "0", Fraction(0), 0.0):
        att = exact_attention(query=[[1, 2]], key=[[1, 0], [5, 7], [0, 3]],
                              value=[[3], [6], [9]], scale=zero)
        assert att.weights() == sp.Matrix([[R(1, 3), R(1, 3), R(1, 3)]])
        assert att.head_output() == sp.Matrix([[6]])


def test_scale_one_is_unscaled() -> None:
    # scores (1·1 + 2·0, 1·5 + 2·7) = (1, 19)
    w = exact_attention(query=[[1, 2]], key=[[1, 0], [5, 7]], scale=1).weights()
    assert _eq(w[0, 0], E / (E + sp.exp(19)))


def test_default_scale_is_one_over_sqrt_dk() -> None:
    att = exact_attention(query=[[1, 0, 0, 0]], key=[[1, 0, 0, 0], [0, 0, 0, 0]])
    assert _eq(att.scale, R(1, 2))  # d_k = 4
    assert _eq(att.weights()[0, 0], sp.exp(R(1, 2)) / (sp.exp(R(1, 2)) + 1))


def test_raw_scores_without_dk_are_taken_as_scaled() -> None:
    att = exact_attention(scores=[[0, 1]])
    assert att.scale == 1


def test_exact_scale_from_a_string() -> None:
    att = exact_attention(scores=[[0, 2]], scale="1/2")
    assert _eq(att.weights()[0, 1], E / (1 + E))


# -- GQA / MQA ------------------------------------------------------------------------

def test_gqa_query_head_g_uses_kv_head_g_over_group() -> None:
    # 4 query heads, 2 kv heads, d_k = 2; group = 2 -> heads 0,1 use kv 0; 2,3 use kv 1
    q = [[1, 0, 0, 1, 0, 1, 1, 0]]
    k = [[1, 0, 0, 1],   # key 0: kv0 = (1,0), kv1 = (0,1)
         [0, 1, 1, 0]]   # key 1: kv0 = (0,1), kv1 = (1,0)
    att = exact_attention(query=q, key=k, heads=4, kv_heads=2, scale=1)
    hi = sp.Matrix([[E / (1 + E), 1 / (1 + E)]])  # score (1, 0)
    lo = sp.Matrix([[1 / (1 + E), E / (1 + E)]])  # score (0, 1)
    # repeat_interleave: head0·kv0 = (1,0), head1·kv0 = (0,1), head2·kv1 = (1,0), head3·kv1=(0,1)
    # (a tile mapping g % 2 would give head1·kv1 = (1,0) instead)
    expected = [hi, lo, hi, lo]
    for g in range(4):
        assert _meq(att.weights(g), expected[g]), g


def test_mqa_all_heads_share_one_kv_head() -> None:
    q = [[1, 0, 0, 1]]
    att = exact_attention(query=q, key=[[1, 0], [0, 1]], value=[[10], [20]],
                          heads=2, kv_heads=1, scale=1)
    assert _eq(att.head_output(0)[0, 0], (10 * E + 20) / (1 + E))
    assert _eq(att.head_output(1)[0, 0], (10 + 20 * E) / (1 + E))
    assert att.final().shape == (1, 2)


# -- cross-attention and x-level --------------------------------------------------------

def test_cross_attention_shapes() -> None:
    att = exact_attention(query=[[1, 0]] * 3, key=[[0, 1]] * 5, value=[[1, 2, 3]] * 5)
    assert att.scores().shape == (3, 5)
    assert att.weights().shape == (3, 5)
    assert att.head_output().shape == (3, 3)
    # every key is the same, so the weights are uniform and the output is the value row
    assert att.weights() == sp.Matrix(3, 5, lambda i, j: R(1, 5))
    assert att.head_output() == sp.Matrix([[1, 2, 3]] * 3)


def test_x_level_with_biases() -> None:
    # q = x + b_q = (2, 1); k = x + b_k = (1, 1); single key -> weight 1;
    # v = x + b_v = (3, 3); out = v W^O + b_o = (3, 3) + (10, 20)
    eye = [[1, 0], [0, 1]]
    att = exact_attention(x=[[1, 0]], w_q=eye, w_k=eye, w_v=eye, b_q=[1, 1], b_k=[0, 1],
                          b_v=[2, 3], w_o=eye, b_o=[10, 20], scale=1)
    assert att.scores() == sp.Matrix([[3]])
    assert att.final() == sp.Matrix([[13, 23]])


def test_x_level_cross_attention_with_projection() -> None:
    # x (1×2), x_kv (2×2); w_q = w_k = I, w_v picks column 0, w_o doubles
    att = exact_attention(x=[[1, 0]], x_kv=[[1, 0], [0, 1]], w_q=[[1, 0], [0, 1]],
                          w_k=[[1, 0], [0, 1]], w_v=[[1], [0]], w_o=[[2]], scale=1)
    # scores (1, 0); v = (1, 0); out = 2·e/(1+e)
    assert _eq(att.final()[0, 0], 2 * E / (1 + E))


# -- inputs -----------------------------------------------------------------------------

def test_floats_are_read_as_the_decimal_they_print_as() -> None:
    assert exact_number(0.1) == R(1, 10)
    assert exact_number("sqrt(2)") == sp.sqrt(2)
    assert exact_number(Fraction(2, 3)) == R(2, 3)
    assert exact_matrix([1, 2], "v").shape == (1, 2)


@pytest.mark.parametrize(("kwargs", "error", "pattern"), [
    (dict(query=[[1, 0]], key=[[1, 0, 0]]), ShapeError, "key has 3 columns"),
    (dict(query=[[1, 0]], key=[[1, 0]], value=[[1], [2]]), ShapeError, "value has n_k=2"),
    (dict(query=[[1, 0], [1]], key=[[1, 0]]), ShapeError, "row 1"),
    (dict(query=[[float("nan"), 0]], key=[[1, 0]]), MhaSymbolicError, "nan"),
    (dict(query=[["abc", 0]], key=[[1, 0]]), MhaSymbolicError, "abc"),
    (dict(query=[[True, 0]], key=[[1, 0]]), SpecError, "boolean"),
    (dict(query=[[1, 0]], key=[[1, 0]], heads=0), SpecError, "heads=0"),
    (dict(query=[[1, 0, 0, 0]], key=[[1, 0, 0]], heads=4, kv_heads=3), SpecError, "kv_heads=3"),
    (dict(scores=[[1, 2]], mask=[[True, True], [True, True]]), SpecError, "n_q=1"),
    (dict(scores=[[1, 2]], mask="causl"), SpecError, "causl"),
    (dict(scores=[[1, 2]], masked_rows="zeros"), SpecError, "masked_rows"),
    (dict(scores=[[1, 2]], mask="causal", causal_alignment="bottom"), SpecError, "bottom"),
    (dict(scores=[[1, 2]], mask=[[0, float("nan")]]), MhaSymbolicError, "mask"),
    (dict(scores=[[0] * 100] * 100), SpecError, "too large"),
    (dict(query=[[1, 0]]), SpecError, "together"),
    (dict(), SpecError, "give scores"),
    (dict(x=[[1, 0]], w_q=[[1, 0], [0, 1]]), SpecError, "w_k"),
    (dict(x=[[1, 0, 0]], w_q=[[1, 0], [0, 1]], w_k=[[1]], w_v=[[1]]), ShapeError, "w_q"),
])
def test_bad_input_gives_one_clear_library_error(kwargs: dict[str, Any], error: type,
                                                 pattern: str) -> None:
    with pytest.raises(error, match=pattern) as info:
        exact_attention(**kwargs)
    assert "\n" not in str(info.value)


def test_head_index_out_of_range() -> None:
    att = exact_attention(scores=[[1, 2]])
    with pytest.raises(SpecError, match="head=3"):
        att.weights(3)
    with pytest.raises(SpecError):
        att.head_output()  # no values given


def test_numpy_boolean_mask_is_accepted() -> None:
    np = pytest.importorskip("numpy")
    w = exact_attention(scores=[[1, 2]], mask=np.array([[True, False]])).weights()
    assert w == sp.Matrix([[1, 0]])


def test_latex_is_available() -> None:
    att = exact_attention(scores=[[0, 0]], value=[[1], [3]])
    text = att.latex()
    assert "A_{1}" in text and r"\frac{1}{2}" in text
    assert att._repr_latex_().startswith("$$")


# -- the work model (issue 11 item 7): what the engine builds and its consumers walk ----------
# Expected counts by hand from the formulas in attention_work's docstring, for shapes whose
# entries do not matter (rational: one term each).

def _rows(n: int, m: int) -> list[list[int]]:
    return [[(3 * i + 5 * j) % 7 - 3 for j in range(m)] for i in range(n)]


def test_the_work_model_shares_each_rows_softmax_denominator() -> None:
    from mha_symbolic.exact.engine import attention_work

    w = attention_work(query=_rows(64, 4), key=_rows(64, 4), value=_rows(64, 2))
    assert w["scores"] == 64 * 64                 # 4,096 rational scores
    assert w["softmax"] == 64 * 64 * 64           # each weight walked with its 64-term D
    assert w["A·V"] == 64 * 2 * (64 + 64)         # (Σ_j e^(t_j) v_j) / D: 128 terms, not 64²
    assert w["projections"] == w["W^O"] == 0
    assert sum(v for k, v in w.items() if k != "entries") == 282_624


def test_the_work_model_counts_the_softmax_over_queries_without_sharing() -> None:
    from mha_symbolic.exact.engine import attention_work

    w = attention_work(query=_rows(64, 4), key=_rows(64, 4), value=_rows(64, 2),
                       softmax_over="queries")
    # a weight has its column's 64 terms; an entry of A·V sums 64 such weights
    assert w["softmax"] == 64 * 64 * 64
    assert w["A·V"] == 64 * 2 * 64 * 64


def test_the_work_model_counts_a_sink_in_every_denominator_and_w_o_twice() -> None:
    from mha_symbolic.exact.engine import W_O_COST, attention_work

    w = attention_work(scores=_rows(2, 3), value=_rows(3, 1), sinks=[1])
    assert (w["scores"], w["softmax"], w["A·V"]) == (6, 2 * 4 * 4, 2 * 1 * (3 + 4))
    w = attention_work(query=_rows(2, 2), key=_rows(3, 2), value=_rows(3, 2), w_o=_rows(2, 2))
    # an A·V entry: 3 numerator terms + 3 in D; W^O: 2 rows · 2 outputs · 2 entries each
    assert w["A·V"] == 2 * 2 * 6 and w["W^O"] == W_O_COST * 2 * 2 * 2 * 6


def test_the_work_model_multiplies_the_terms_of_irrational_entries() -> None:
    from mha_symbolic.exact.engine import IRRATIONAL_COST, attention_work, work_total

    terms = {"query": 0, "key": 0, "value": 2}
    w = attention_work(query=_rows(64, 4), key=_rows(64, 4), value=_rows(64, 2), terms=terms)
    assert w["A·V"] == 64 * 2 * (64 * 2 + 64)
    assert work_total(w, terms) == IRRATIONAL_COST * (4_096 + 262_144 + 24_576)


def test_an_example_of_64_tokens_is_built() -> None:
    att = exact_attention(query=_rows(64, 4), key=_rows(64, 4), value=_rows(64, 2))
    assert att.weights().shape == (64, 64) and att.head_output().shape == (64, 2)


def test_the_softmax_over_queries_of_64_tokens_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match="790,528 terms") as exc:
        # 4,096 + 262,144 + 524,288: nothing shared across a column's weights
        exact_attention(query=_rows(64, 4), key=_rows(64, 4), value=_rows(64, 2),
                        softmax_over="queries")
    assert "\n" not in str(exc.value)
