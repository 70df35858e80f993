"""The checks' options (mha_symbolic/testing/options.py): explicit signatures, msg=,
rtol/atol implying the allclose rule, misspelt options named from the function called,
and the one-line summary that opens every failure."""

from __future__ import annotations

import inspect
import pydoc

import numpy as np
import pytest

from mha_symbolic import (
    AttentionMismatchError,
    SpecError,
    UnknownOptionError,
    assert_attention_backward_close,
    assert_attention_close,
    assert_attention_varlen_close,
    assert_mha_backward_close,
    assert_mha_close,
    check_attention,
    compare_attention,
    compare_attention_backward,
    compare_attention_varlen,
    compare_mha,
    compare_mha_backward,
)
from mha_symbolic.testing.pytest_plugin import AttentionOracle

Q = K = V = np.eye(2, dtype=np.float32)[None]
ZEROS = np.zeros((1, 2, 2), np.float32)
PAIRS = [(assert_attention_close, compare_attention),
         (assert_mha_close, compare_mha),
         (assert_attention_backward_close, compare_attention_backward),
         (assert_mha_backward_close, compare_mha_backward),
         (assert_attention_varlen_close, compare_attention_varlen)]


@pytest.mark.parametrize(("assert_fn", "compare_fn"), PAIRS,
                         ids=[a.__name__ for a, _ in PAIRS])
def test_assert_functions_show_their_compare_twins_options_and_msg(assert_fn, compare_fn) -> None:
    a = inspect.signature(assert_fn).parameters
    c = inspect.signature(compare_fn).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in a.values())
    assert not any(p.kind is p.VAR_KEYWORD for p in c.values())
    assert list(a) == [*c, "msg"]
    assert a["msg"].kind is inspect.Parameter.KEYWORD_ONLY and a["msg"].default is None
    for name in ("rule", "rtol", "atol", "accumulation_dtype"):
        assert name in a and a[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert "rtol" in pydoc.render_doc(assert_fn, renderer=pydoc.plaintext)


def test_the_multi_head_checks_list_reference_mhas_options() -> None:
    for fn in (compare_mha, assert_mha_close, compare_mha_backward, assert_mha_backward_close):
        params = inspect.signature(fn).parameters
        assert {"num_heads", "in_proj_weight", "key_padding_mask", "module"} <= set(params)


def test_check_attention_lists_its_tolerance_options() -> None:
    params = inspect.signature(check_attention).parameters
    assert {"rule", "rtol", "atol", "kernel", "subnormals", "msg"} <= set(params)
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())


@pytest.mark.parametrize(("call", "want"), [
    (lambda: assert_attention_close(ZEROS, Q, K, V, rtoll=1e-3),
     "assert_attention_close() got an unexpected keyword argument 'rtoll'; did you mean "
     "'rtol' or 'atol'?"),
    (lambda: compare_attention(ZEROS, Q, K, V, is_casual=True),
     "compare_attention() got an unexpected keyword argument 'is_casual'; did you mean "
     "'is_causal'?"),
    (lambda: compare_mha(ZEROS, Q, K, V, num_head=1),
     "compare_mha() got an unexpected keyword argument 'num_head'; did you mean "
     "'num_heads' or 'num_kv_heads'?"),
    (lambda: assert_mha_close(ZEROS, Q, K, V, batchfirst=True),
     "assert_mha_close() got an unexpected keyword argument 'batchfirst'; did you mean "
     "'batch_first'?"),
    (lambda: check_attention(lambda q, k, v: q, Q, K, V, accumulation="same"),
     "check_attention() got an unexpected keyword argument 'accumulation'; did you mean "
     "'accumulation_dtype'?"),
    (lambda: AttentionOracle().assert_close(ZEROS, Q, K, V, ulp=2),
     "attention_oracle.assert_close() got an unexpected keyword argument 'ulp'; did you "
     "mean 'ulps'?"),
    (lambda: AttentionOracle(xyzzy=1).compare(ZEROS, Q, K, V),
     "attention_oracle.compare() got an unexpected keyword argument 'xyzzy'"),
    (lambda: AttentionOracle().reference(Q, K, V, is_causl=True),
     "attention_oracle.reference() got an unexpected keyword argument 'is_causl'; did you "
     "mean 'is_causal' or 'scale'?"),
])
def test_a_misspelt_option_is_named_from_the_function_called(call, want) -> None:
    with pytest.raises(UnknownOptionError) as info:
        call()
    assert str(info.value) == want
    assert isinstance(info.value, TypeError) and isinstance(info.value, SpecError)


def test_a_hostile_option_name_is_echoed_escaped() -> None:
    with pytest.raises(UnknownOptionError) as info:
        compare_attention(ZEROS, Q, K, V, **{"\x1b[31mred": 1})
    assert "\x1b" not in str(info.value)


def test_rtol_and_atol_without_rule_imply_the_allclose_rule() -> None:
    implied = compare_attention(ZEROS, Q, K, V, rtol=0.1, atol=0.1)
    explicit = compare_attention(ZEROS, Q, K, V, rule="allclose", rtol=0.1, atol=0.1)
    assert implied.rule == explicit.rule == "atol=0.1 + rtol=0.1 × |exact|"
    assert implied.n_mismatched == explicit.n_mismatched == 4
    # the exact weights of the identity inputs are e^(1/√2)/(1 + e^(1/√2)) ≈ 0.6698 and
    # 1/(1 + e^(1/√2)) ≈ 0.3302: a copy of the output within atol=0.1 passes
    s = np.float32(1 / (1 + np.exp(2 ** -0.5)))
    near = np.array([[[1 - s, s], [s, 1 - s]]], np.float32) + np.float32(0.05)
    assert compare_attention(near, Q, K, V, rtol=0, atol=0.1).passed
    assert not compare_attention(near, Q, K, V, rtol=0, atol=0.01).passed


@pytest.mark.parametrize("options", [{"rtol": 1e-3}, {"atol": 1e-3}])
def test_one_of_rtol_atol_alone_is_refused_as_torch_does(options) -> None:
    with pytest.raises(SpecError, match=r"imply rule='allclose'.*needs both"):
        compare_attention(ZEROS, Q, K, V, **options)


def test_rtol_with_another_rule_is_still_refused() -> None:
    with pytest.raises(SpecError, match=r"rtol=0\.1 does not apply to rule='model'"):
        compare_attention(ZEROS, Q, K, V, rule="model", rtol=0.1, atol=0.1)


def test_msg_string_goes_above_the_report() -> None:
    with pytest.raises(AttentionMismatchError) as info:
        assert_attention_close(ZEROS, Q, K, V, msg="layer 3, head 0")
    lines = str(info.value).splitlines()
    assert lines[0] == "layer 3, head 0"
    assert lines[1].startswith("FAIL [")  # the headline: verdict and bug class
    assert lines[2] == info.value.comparison.summary()  # type: ignore[attr-defined]
    assert "\n".join(lines[1:]) == info.value.comparison.report()  # type: ignore[attr-defined]


def test_msg_callable_replaces_the_message_as_torch_testing_does() -> None:
    seen: list[str] = []

    def shout(default: str) -> str:
        seen.append(default)
        return "WRONG: " + default.splitlines()[0]

    with pytest.raises(AttentionMismatchError) as info:
        assert_attention_close(ZEROS, Q, K, V, msg=shout)
    comp = info.value.comparison  # type: ignore[attr-defined]
    assert seen == [comp.report()]
    assert str(info.value) == "WRONG: " + comp.report().splitlines()[0]
    assert str(info.value).startswith("WRONG: FAIL [")


def test_msg_of_another_type_is_refused() -> None:
    with pytest.raises(SpecError, match=r"msg=3 \(int\) must be a string or a callable"):
        assert_attention_close(ZEROS, Q, K, V, msg=3)


def test_msg_is_unused_when_the_check_passes() -> None:
    ref = compare_attention(ZEROS, Q, K, V)
    assert not ref.passed
    exact = np.asarray(AttentionOracle().reference(Q, K, V).rounded("float32"))
    assert assert_attention_close(exact, Q, K, V, msg="never shown") is None


def test_check_attention_takes_msg() -> None:
    with pytest.raises(AttentionMismatchError) as info:
        check_attention(lambda q, k, v: 0 * q, Q, K, V, msg="my kernel")
    text = str(info.value)
    assert text.splitlines()[0] == "my kernel"
    assert text.splitlines()[1] == "FAIL [no known bug] numpy kernel: output 4 / 4 off"
    assert text.splitlines()[2].startswith("attention kernel FAILED (numpy): attention "
                                           "output is not close to the exact answer: 4 / 4 "
                                           "elements mismatched")


def test_the_summary_is_one_line_and_names_count_worst_and_bug() -> None:
    q = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], np.float32)
    v = np.array([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], np.float32)
    # scale 1 instead of 1/√2: FlashAttention's classic 'no_scale' bug
    s = q[0].astype(np.float64) @ q[0].T.astype(np.float64)
    w = np.exp(s - s.max(-1, keepdims=True))
    out = ((w / w.sum(-1, keepdims=True)) @ v[0])[None].astype(np.float32)
    comp = compare_attention(out, q, q, v)
    line = comp.summary()
    assert "\n" not in line
    assert line.startswith("attention output is not close to the exact answer: ")
    assert " / 6 elements mismatched, worst " in line
    assert line.endswith("; matches bug class 'no_scale'")
    assert comp.report().splitlines()[1] == line
    assert comp.report().splitlines()[0] == "FAIL [no_scale] attention output: 4 / 6 off"


def test_a_passing_comparison_summarises_in_one_line_too() -> None:
    exact = np.asarray(AttentionOracle().reference(Q, K, V).rounded("float32"))
    line = compare_attention(exact, Q, K, V).summary()
    assert line.startswith("attention output is close to the exact answer: 4 elements, "
                           "closest call ")


def test_the_fixtures_methods_show_the_options_they_hand_on() -> None:
    oracle = AttentionOracle()
    params = inspect.signature(oracle.assert_close).parameters
    assert list(params) == list(inspect.signature(assert_attention_close).parameters)
    assert "msg" in params and "rtol" in params
    assert "num_heads" in inspect.signature(oracle.assert_mha_close).parameters


def test_doctests_of_the_options_module() -> None:
    import doctest

    from mha_symbolic.testing import options

    result = doctest.testmod(options)
    assert result.failed == 0 and result.attempted > 0
