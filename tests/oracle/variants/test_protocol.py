"""The variant protocol (mha_symbolic/oracle/variants/protocol.py, registry.py): every
registered variant reaches every door by its keywords, names only bug classes that
exist, and a variant registered from outside (here, in the test) works through the
doors with no other change.  The expected values of the new variant come from plain
attention with the equivalent boolean mask, built here by hand."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import SpecError, UnknownOptionError
from mha_symbolic.oracle.variants import protocol
from mha_symbolic.oracle.variants.registry import variant_keywords, variant_options
from mha_symbolic.testing.forward.bugs_variants import VARIANT_BUG_CLASSES

DOORS = ["reference_attention", "reference_attention_backward", "compare_attention",
         "assert_attention_close", "compare_attention_backward",
         "reference_attention_varlen", "reference_attention_varlen_backward",
         "compare_attention_varlen", "assert_attention_varlen_close"]


@pytest.mark.parametrize("door", DOORS)
def test_every_registered_keyword_is_in_every_door_signature(door: str) -> None:
    params = inspect.signature(getattr(ms, door)).parameters
    for kw in variant_keywords():
        assert kw in params, (door, kw)
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())


def test_the_registered_variants_are_the_documented_ones() -> None:
    names = [v.name for v in protocol.registered()]
    assert sorted(names) == sorted(["window", "softcap", "score_mod", "alibi", "sinks",
                                    "mask_mod", "fp8_descale", "kv_cache", "attention_chunk",
                                    "rotary"])
    assert set(variant_keywords()) == {"window", "softcap", "score_mod", "alibi_slopes",
                                       "sinks", "mask_mod", "q_descale", "k_descale",
                                       "v_descale", "cache_seqlens", "cache_leftpad",
                                       "attention_chunk", "rotary_cos", "rotary_sin", "rotary_interleaved",
                                       "rotary_dim", "rotary_base", "rotary_position_scale"}


def test_every_bug_class_a_variant_names_exists() -> None:
    catalogue = {b.name for b in VARIANT_BUG_CLASSES}
    for v in protocol.registered():
        for b in v.bugs:
            assert b in catalogue, (v.name, b)


def test_a_misspelt_variant_keyword_is_named_with_the_closest() -> None:
    q = np.ones((1, 2, 2))
    with pytest.raises(UnknownOptionError, match="did you mean 'softcap'"):
        ms.reference_attention(q, q, q, sofcap=2.0)
    with pytest.raises(UnknownOptionError, match="did you mean 'sinks'"):
        ms.compare_attention(q, q, q, q, sink=np.zeros(1))


def test_registration_refuses_a_taken_name_keyword_or_field() -> None:
    def parse(**kw: Any) -> dict[str, Any]:
        return {}
    with pytest.raises(ValueError, match="registered twice"):
        protocol.register(protocol.Variant("window", ("w2",), {"w2": None}, parse, "x"))
    with pytest.raises(ValueError, match="taken"):
        protocol.register(protocol.Variant("w3", ("window",), {"w3": None}, parse, "x"))
    with pytest.raises(ValueError, match="taken"):
        protocol.register(protocol.Variant("w4", ("w4",), {"window": None}, parse, "x"))


@pytest.fixture
def key_lengths() -> Iterator[None]:
    """A variant of the test's own: keys past each batch element's length masked."""
    def parse(key_lengths: Any = None) -> dict[str, Any]:
        return {} if key_lengths is None else {"key_lengths": np.asarray(key_lengths)}

    def keep(opts: Any, geo: Any, is_causal: bool) -> Any:
        n = opts.key_lengths.reshape(-1, *(1,) * (len(geo.batch) - 1), 1, 1)
        return np.arange(geo.S) < n

    def sequence(opts: Any, b: int, n: int) -> dict[str, Any]:
        return {"key_lengths": opts.key_lengths[b:b + 1]}   # one length per sequence

    protocol.register(protocol.Variant(
        name="key_lengths_test", keywords=("key_lengths",), fields={"key_lengths": None},
        parse=parse, keep=keep, summary="test", sequence=sequence))
    try:
        yield
    finally:
        protocol.unregister("key_lengths_test")


def test_a_new_variant_reaches_the_doors_with_no_other_change(key_lengths: None) -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)).astype(np.float32) for _ in range(3))
    lengths = [2, 4]
    mask = np.zeros((2, 1, 4, 4), dtype=bool)  # the equivalent mask, by hand
    mask[0, :, :, :2] = True
    mask[1, :, :, :4] = True
    got = ms.reference_attention(q, k, v, key_lengths=lengths)
    want = ms.reference_attention(q, k, v, attn_mask=mask)
    for fmt in ("float64", "float32", "bfloat16"):
        np.testing.assert_array_equal(got.rounded(fmt), want.rounded(fmt))
    # with another variant at once: the kept keys are AND-ed
    got = ms.reference_attention(q, k, v, key_lengths=lengths, window=(1, 0))
    band = np.tril(np.ones((4, 4), bool)) & ~np.tril(np.ones((4, 4), bool), -2)
    want = ms.reference_attention(q, k, v, attn_mask=mask & band)
    np.testing.assert_array_equal(got.rounded("float32"), want.rounded("float32"))
    # the gradients and the comparison take it too
    do = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g1 = ms.reference_attention_backward(q, k, v, do, key_lengths=lengths)
    g2 = ms.reference_attention_backward(q, k, v, do, attn_mask=mask)
    np.testing.assert_array_equal(g1.dq.rounded("float32"), g2.dq.rounded("float32"))
    out = ms.reference_attention(q, k, v, attn_mask=mask).rounded("float32")
    assert ms.compare_attention(out, q, k, v, key_lengths=lengths).passed
    assert not ms.compare_attention(ms.reference_attention(q, k, v).rounded("float32"),
                                    q, k, v, key_lengths=lengths).passed
    assert variant_options(key_lengths=lengths) is not None


def test_a_new_variant_reaches_the_varlen_doors_through_its_sequence_hook(
        key_lengths: None) -> None:
    """Packed sequences of 3 and 4 tokens, each with its own key length (the hook's row
    b): the same as each sequence alone with a hand-built mask."""
    rng = np.random.default_rng(5)
    H, E = 2, 4
    cu = [0, 3, 7]
    q, k, v = (rng.standard_normal((7, H, E)).astype(np.float32) for _ in range(3))
    lengths = [2, 3]
    got = ms.reference_attention_varlen(q, k, v, cu, cu, key_lengths=lengths)
    for b in range(2):
        sl = slice(cu[b], cu[b + 1])
        qb, kb, vb = (np.swapaxes(t[sl], 0, 1) for t in (q, k, v))
        S_b = cu[b + 1] - cu[b]
        mask = np.zeros((1, S_b, S_b), dtype=bool)
        mask[..., :lengths[b]] = True
        want = ms.reference_attention(qb, kb, vb, attn_mask=mask).rounded("float32")
        np.testing.assert_array_equal(got.rounded("float32")[sl], np.swapaxes(want, 0, 1))
    out = got.rounded("float32")
    assert ms.compare_attention_varlen(out, q, k, v, cu, cu, key_lengths=lengths).passed
    plain = ms.reference_attention_varlen(q, k, v, cu, cu).rounded("float32")
    assert not ms.compare_attention_varlen(plain, q, k, v, cu, cu, key_lengths=lengths).passed


def test_a_variant_that_is_not_packed_is_refused_by_the_varlen_doors() -> None:
    x = np.ones((3, 1, 4))
    with pytest.raises(SpecError, match="not available for packed varlen"):
        ms.reference_attention_varlen(x, x, x, [0, 1, 3], [0, 1, 3], cache_seqlens=[1, 2])
    with pytest.raises(UnknownOptionError, match="windw"):
        ms.reference_attention_varlen(x, x, x, [0, 1, 3], [0, 1, 3], windw=(1, 0))
