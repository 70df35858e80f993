"""The forward testing hooks of the variant protocol (oracle/variants/protocol.py:
``plain_inputs``, ``plain_keep``, ``plain_scores``, ``packed_whole``): the testing side's
float64 evaluation composes them with no variant named, routes each bug switch to the
hook that names it and refuses an unknown one.  Expected values are plain attention
written here by hand in numpy (softmax of c·q·kᵀ), never the code under test."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import SpecError
from mha_symbolic.oracle.variants import protocol
from mha_symbolic.oracle.variants.registry import variant_options
from mha_symbolic.oracle.variants.semantics import Bias
from mha_symbolic.testing.call import AttentionCall
from mha_symbolic.testing.forward.bugs_variants import plain_variant
from mha_symbolic.testing.forward.variants import _packed_whole


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, s: np.ndarray | None = None,
               allowed: np.ndarray | None = None) -> np.ndarray:
    c = 1.0 / math.sqrt(q.shape[-1])
    s = c * (q @ np.swapaxes(k, -1, -2)) if s is None else s
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def _qkv(seed: int = 0, L: int = 6, S: int = 6, E: int = 4) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, 2, n, E)).astype(np.float32).astype(np.float64)
                 for n in (L, S, S))


@pytest.fixture
def value_gain() -> Iterator[None]:
    """A variant registered here: the values times a power of two g (exact), with an
    oracle ``inputs`` hook, a testing ``plain_inputs`` hook whose switch ``gain_missing``
    leaves the values as given, and the bug class that uses it."""

    def parse(value_gain: Any = None) -> dict[str, Any]:
        return {} if value_gain is None else {"value_gain": float(value_gain)}

    def inputs(opts: Any, q: Any, k: Any, v: Any, geo: Any, group: int) -> Any:
        f = lambda t: np.asarray(t, dtype=np.float64)  # noqa: E731
        return f(q), f(k), f(v) * opts.value_gain

    def plain_inputs(opts: Any, q: Any, k: Any, v: Any, outer: Any, H: int, group: int, *,
                     gain_missing: bool = False) -> Any:
        return q, k, (v if gain_missing else v * opts.value_gain), False, not gain_missing

    bug = protocol.BugClass("value_gain_missing", "the value gain not applied",
                            lambda x: x.opts.value_gain is not None,
                            lambda x: {"gain_missing": True})
    protocol.register(protocol.Variant(
        name="value_gain_test", keywords=("value_gain",), fields={"value_gain": None},
        parse=parse, summary="values times g", inputs=inputs, plain_inputs=plain_inputs,
        bugs=(bug,)))
    try:
        yield
    finally:
        protocol.unregister("value_gain_test")


def test_a_plain_inputs_hook_and_its_switch_reach_the_float64_evaluation(
        value_gain: None) -> None:
    q, k, v = _qkv()
    x = AttentionCall(q, k, v, opts=variant_options(value_gain=4.0), in_format="float32")
    vp = plain_variant(x)
    np.testing.assert_allclose(vp.out, _attention(q, k, 4.0 * v), rtol=1e-13, atol=1e-13)
    assert vp.v_descaled and not vp.qk_descaled        # the hook's flags
    missing = plain_variant(x, gain_missing=True)
    np.testing.assert_allclose(missing.out, _attention(q, k, v), rtol=1e-13, atol=1e-13)
    assert not missing.v_descaled


def test_a_switch_no_hook_names_is_refused() -> None:
    q, k, v = _qkv()
    x = AttentionCall(q, k, v, opts=variant_options(softcap=3.0))
    with pytest.raises(TypeError, match="no_such_switch"):
        plain_variant(x, no_such_switch=True)


def test_a_new_variants_plain_inputs_bug_is_named_by_the_door(value_gain: None) -> None:
    q, k, v = (t.astype(np.float32) for t in _qkv(1))
    truth = ms.reference_attention(q, k, v, value_gain=2.0).rounded("float32")
    assert ms.compare_attention(np.asarray(truth), q, k, v, value_gain=2.0).passed
    wrong = _attention(*(t.astype(np.float64) for t in (q, k, v))).astype(np.float32)
    comp = ms.compare_attention(wrong, q, k, v, value_gain=2.0)
    assert not comp.passed
    assert comp.diagnoses and comp.diagnoses[0].bug == "value_gain_missing"


def test_the_score_stages_place_a_cap_before_the_scale_and_after_the_masks() -> None:
    q, k, v = _qkv(2)
    C, c = 1.5, 0.5
    L = q.shape[-2]
    causal = np.arange(L)[None, :] <= np.arange(L)[:, None]
    x = AttentionCall(q, k, v, opts=variant_options(softcap=C), is_causal=True, scale=c)
    g = q @ np.swapaxes(k, -1, -2)
    right = _attention(q, k, v, s=C * np.tanh(c * g / C), allowed=causal)
    before = _attention(q, k, v, s=c * C * np.tanh(g / C), allowed=causal)
    # after the masks: a masked score is -inf, capped to -C, and its key takes part
    after = _attention(q, k, v, s=np.where(causal, C * np.tanh(c * g / C), -C))
    for mode, want in (("right", right), ("before_scale", before), ("after_mask", after)):
        got = plain_variant(x, softcap_mode=mode).out
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13, err_msg=mode)
    np.testing.assert_allclose(plain_variant(x, softcap_mode="none").out,
                               _attention(q, k, v, s=c * g, allowed=causal),
                               rtol=1e-13, atol=1e-13)


def test_only_a_cap_may_sit_outside_the_pipeline() -> None:
    def parse(odd_bias: Any = None) -> dict[str, Any]:
        return {} if odd_bias is None else {"odd_bias": float(odd_bias)}

    def plain_scores(opts: Any, geo: Any) -> Any:
        return (("unscaled", Bias("alibi", np.ones((1, geo.heads)), 0)),)

    protocol.register(protocol.Variant(
        name="odd_bias_test", keywords=("odd_bias",), fields={"odd_bias": None},
        parse=parse, summary="x", plain_scores=plain_scores))
    try:
        q, k, v = _qkv()
        with pytest.raises(SpecError, match="only a Cap"):
            plain_variant(AttentionCall(q, k, v, opts=variant_options(odd_bias=1.0)))
    finally:
        protocol.unregister("odd_bias_test")


def test_a_plain_keep_hook_is_measured_at_the_other_corner_when_misaligned() -> None:
    q, k, v = _qkv(3, L=4, S=7)
    L, S = 4, 7
    x = AttentionCall(q, k, v, opts=variant_options(window=(1, 0)))
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    top_left = (j >= i - 1) & (j <= i)
    bottom_right = (j >= i + S - L - 1) & (j <= i + S - L)
    np.testing.assert_allclose(plain_variant(x).out, _attention(q, k, v, allowed=top_left),
                               rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(plain_variant(x, flip_window_alignment=True).out,
                               _attention(q, k, v, allowed=bottom_right),
                               rtol=1e-13, atol=1e-13)
    wide = (j >= i - 2) & (j <= i)
    np.testing.assert_allclose(plain_variant(x, window=(2, 0)).out,
                               _attention(q, k, v, allowed=wide), rtol=1e-13, atol=1e-13)


def test_packed_whole_gives_each_active_variants_one_sequence_fields() -> None:
    d = np.ones((1, 2), dtype=np.float32)
    opts = variant_options(alibi_slopes=[[0.5, 0.25]], q_descale=d, k_descale=d,
                           v_descale=d, window=(3, 0))
    whole = _packed_whole(opts)
    assert whole.q_descale is None and whole.k_descale is None and whole.v_descale is None
    np.testing.assert_array_equal(whole.alibi_slopes, [0.5, 0.25])
    assert whole.window == (3, 0)
