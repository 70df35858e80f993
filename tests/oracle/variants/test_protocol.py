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
from mha_symbolic.errors import ShapeError, SpecError, UnknownOptionError
from mha_symbolic.oracle.variants import protocol
from mha_symbolic.oracle.variants.registry import (
    backward_bug_classes,
    grad_params,
    variant_keywords,
    variant_options,
)
from mha_symbolic.testing.forward.bugs_variants import variant_bug_classes

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


def test_the_catalogue_is_the_variants_own_bug_classes_then_the_plain_ones() -> None:
    names = [b.name for b in variant_bug_classes()]
    assert len(names) == len(set(names))
    own = {v.name: [b.name for b in v.bugs] for v in protocol.registered()}
    for v, bugs in own.items():
        assert set(bugs) <= set(names), v
    # the classes as listed in docs/variants.md (by hand), each owned by its variant
    assert own["window"] == ["window_left_off_by_one_wide", "window_left_off_by_one_narrow",
                             "window_right_off_by_one_wide", "window_right_off_by_one_narrow",
                             "window_misaligned"]
    assert own["softcap"] == ["softcap_before_scale", "softcap_after_mask", "softcap_missing"]
    assert own["alibi"] == ["alibi_sign_flipped", "alibi_slopes_reversed", "alibi_misaligned",
                            "alibi_missing"]
    assert own["sinks"] == ["sinks_ignored", "sink_in_numerator"]
    assert own["fp8_descale"] == ["q_descale_missing", "k_descale_missing",
                                  "v_descale_missing", "descale_missing",
                                  "descale_applied_twice"]
    assert own["kv_cache"] == ["kv_cache_lengths_ignored", "kv_cache_length_one_long",
                               "kv_cache_length_one_short", "kv_cache_leftpad_ignored",
                               "kv_cache_leftpad_chunk_origin"]
    assert own["attention_chunk"] == ["attention_chunk_ignored", "attention_chunk_misaligned",
                                      "attention_chunk_boundary_off_by_one",
                                      "attention_chunk_boundary_off_by_one_late"]
    assert own["rotary"] == ["rotary_interleaved_swapped", "rotary_positions_not_offset",
                             "rotary_angles_bf16", "rotary_angles_fp16", "rotary_dim_ignored",
                             "rotary_inv_freq_head_dim", "rotary_on_v", "rotary_sign_flipped"]
    assert names[-3:] == ["no_scale", "causal_excludes_diagonal", "causal_sees_next_key"]


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

    bug = protocol.BugClass(
        "key_lengths_ignored", "key_lengths ignored: keys past the length attended",
        lambda x: x.opts.key_lengths is not None,
        lambda x: {"keep_changes": {"key_lengths": None}})
    protocol.register(protocol.Variant(
        name="key_lengths_test", keywords=("key_lengths",), fields={"key_lengths": None},
        parse=parse, keep=keep, summary="test", sequence=sequence, bugs=(bug,)))
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
    bad = ms.compare_attention(ms.reference_attention(q, k, v).rounded("float32"),
                               q, k, v, key_lengths=lengths)
    assert not bad.passed
    # its bug class, registered with it, is tried and named
    assert [d.bug for d in bad.diagnoses][:1] == ["key_lengths_ignored"], bad.report()
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


def test_a_positional_score_op_with_the_kv_cache_keeps_its_literal_offset() -> None:
    # a score_mod's distances use the raw q_idx, kv_idx and its own offset (as
    # FlexAttention calls it), which the cache does not move; ALiBi's keyword reads each
    # sequence's own positions (tests/oracle/variants/test_kvcache.py)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 1, 4))
    k, v = rng.standard_normal((2, 1, 1, 16, 4))
    mask = np.full((1, 1, 1, 16), -np.inf)
    mask[..., :10] = -0.5 * np.abs(np.arange(10) - 2)        # d = j - (0 + 2)
    call = dict(cache_seqlens=np.array([10]), is_causal=True, causal_alignment="bottom_right",
                score_mod=ms.alibi_score_mod(np.array([0.5]), offset=2))
    got = ms.reference_attention(q, k, v, **call)
    want = ms.reference_attention(q, k, v, attn_mask=mask)
    np.testing.assert_array_equal(got.rounded("float64"), want.rounded("float64"))
    with pytest.raises(ShapeError, match="offset"):
        ms.reference_attention(q, k, v, score_mod=ms.alibi_score_mod([0.5], offset=[1, 2]))


def _sliced_by_hand(q: Any, k: Any, v: Any, n: list[int], **kw: Any) -> np.ndarray:
    """Each sequence b alone, its keys cut to the n[b] valid ones (bottom-right)."""
    return np.concatenate([
        ms.reference_attention(q[b:b + 1], k[b:b + 1, :, :n[b]], v[b:b + 1, :, :n[b]],
                               causal_alignment="bottom_right", **kw).rounded("float64")
        for b in range(len(n))])


@pytest.mark.parametrize("kw", [{"window": (2, 0)}, {"window": (3, 1)},
                                {"attention_chunk": 4}, {"attention_chunk": 3, "window": (4, 0)}])
@pytest.mark.parametrize("causal", [True, False])
def test_a_window_or_chunk_in_a_kv_cache_decode_is_measured_from_each_sequence(
        kw: dict[str, Any], causal: bool) -> None:
    # before, the window was measured from the cache's end (16 - L), so a decode step
    # with 10 valid keys saw none of them: a row of zeros
    rng = np.random.default_rng(1)
    n = [10, 16, 5]
    for L in (1, 3):
        q = rng.standard_normal((3, 2, L, 4))
        k, v = rng.standard_normal((2, 3, 2, 16, 4))
        got = ms.reference_attention(q, k, v, cache_seqlens=np.array(n), is_causal=causal,
                                     causal_alignment="bottom_right", **kw)
        want = _sliced_by_hand(q, k, v, n, is_causal=causal, **kw)
        np.testing.assert_array_equal(got.rounded("float64"), want)
        assert np.all(np.abs(want).sum(axis=-1) > 0)        # every row sees a key
        # the gradients: those of the sliced calls, zero past each length
        do = rng.standard_normal(q.shape)
        g = ms.reference_attention_backward(q, k, v, do, cache_seqlens=np.array(n),
                                            is_causal=causal, causal_alignment="bottom_right",
                                            **kw)
        for b in range(3):
            gb = ms.reference_attention_backward(
                q[b:b + 1], k[b:b + 1, :, :n[b]], v[b:b + 1, :, :n[b]], do[b:b + 1],
                is_causal=causal, causal_alignment="bottom_right", **kw)
            np.testing.assert_array_equal(g.dq.rounded("float64")[b:b + 1],
                                          gb.dq.rounded("float64"))
            np.testing.assert_array_equal(g.dk.rounded("float64")[b:b + 1, :, :n[b]],
                                          gb.dk.rounded("float64"))
            assert not np.any(g.dk.rounded("float64")[b, :, n[b]:])


def test_a_windowed_decode_in_plain_torch_passes_and_one_measured_from_the_cache_end_fails(
        ) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    n, L, S, W = [10, 16, 5], 1, 16, 3
    q = rng.standard_normal((3, 4, L, 8)).astype(np.float32)
    k, v = rng.standard_normal((2, 3, 4, S, 8)).astype(np.float32)

    def decode(end_of_cache: bool) -> np.ndarray:
        # Mistral-style sliding-window decode: query i at position n_b - L + i sees
        # keys p - W … p of its own sequence
        out = []
        for b in range(3):
            qb, kb, vb = (torch.from_numpy(x[b]) for x in (q, k, v))
            j = torch.arange(S)
            p = (S if end_of_cache else n[b]) - L + torch.arange(L)[:, None]
            keep = (j < n[b]) & (j <= p) & (j >= p - W)
            s = (qb @ kb.transpose(-1, -2)) / 8 ** 0.5
            out.append(torch.softmax(s.masked_fill(~keep, -torch.inf), -1).nan_to_num() @ vb)
        return torch.stack(out).numpy()

    call = dict(cache_seqlens=np.array(n), is_causal=True, causal_alignment="bottom_right",
                window=(W, 0))
    assert ms.compare_attention(decode(False), q, k, v, **call).passed
    bad = ms.compare_attention(decode(True), q, k, v, **call)
    assert not bad.passed
    assert "window_misaligned" in [d.bug for d in bad.diagnoses], bad.report()


def test_a_variant_not_positional_takes_part_in_a_kv_cache_decode() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 1, 4))
    k, v = rng.standard_normal((2, 1, 1, 16, 4))
    got = ms.reference_attention(q, k, v, cache_seqlens=np.array([10]), softcap=3.0)
    want = ms.reference_attention(q, k[..., :10, :], v[..., :10, :], softcap=3.0)
    np.testing.assert_array_equal(got.rounded("float64"), want.rounded("float64"))
    # a softcap score_mod is not positional either
    got = ms.reference_attention(q, k, v, cache_seqlens=np.array([10]),
                                 score_mod=ms.softcap_score_mod(3.0))
    np.testing.assert_array_equal(got.rounded("float64"), want.rounded("float64"))


@pytest.fixture
def key_lengths_with_backward_bug() -> Iterator[None]:
    """The test's key-lengths variant with a backward bug class of its own (the
    ``backward_bugs`` hook): the backward recomputes P without the lengths."""
    def parse(key_lengths: Any = None) -> dict[str, Any]:
        return {} if key_lengths is None else {"key_lengths": np.asarray(key_lengths)}

    def keep(opts: Any, geo: Any, is_causal: bool) -> Any:
        return np.arange(geo.S) < opts.key_lengths.reshape(-1, 1, 1, 1)

    bug = protocol.BugClass(
        "key_lengths_missing_in_backward", "key lengths not applied when the backward "
        "recomputes P", lambda x: x.opts.key_lengths is not None,
        lambda x: {"variant_changes": {"key_lengths": None}})
    protocol.register(protocol.Variant(
        name="key_lengths_bwd_test", keywords=("key_lengths",), fields={"key_lengths": None},
        parse=parse, keep=keep, summary="test", backward_bugs=(bug,)))
    try:
        yield
    finally:
        protocol.unregister("key_lengths_bwd_test")


def _hand_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray,
                   keep: np.ndarray, keep_bwd: np.ndarray) -> list[np.ndarray]:
    """FlashAttention-2's backward in float64 by hand: the forward's lse over ``keep``,
    P recomputed over ``keep_bwd`` (a bug when they differ)."""
    c = 1.0 / np.sqrt(q.shape[-1])
    s = c * q @ np.swapaxes(k, -1, -2)
    sm = np.where(keep, s, -np.inf)
    mx = sm.max(axis=-1, keepdims=True)
    lse = mx + np.log(np.exp(sm - mx).sum(axis=-1, keepdims=True))
    out = np.exp(sm - lse) @ v
    p = np.where(keep_bwd, np.exp(s - lse), 0.0)
    dv = np.swapaxes(p, -1, -2) @ do
    ds = p * (do @ np.swapaxes(v, -1, -2) - (do * out).sum(axis=-1, keepdims=True))
    return [c * ds @ k, c * np.swapaxes(ds, -1, -2) @ q, dv]


def test_a_new_variants_backward_bug_class_is_tried_and_named(
        key_lengths_with_backward_bug: None) -> None:
    rng = np.random.default_rng(5)
    q, do = (rng.standard_normal((2, 2, 3, 4)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((2, 2, 5, 4)).astype(np.float32) for _ in range(2))
    lengths = [2, 4]
    keep = np.arange(5)[None, None, None, :] < np.array(lengths)[:, None, None, None]
    args = [x.astype(np.float64) for x in (q, k, v, do)]
    good = [g.astype(np.float32) for g in _hand_backward(*args, keep, keep)]
    comp = ms.compare_attention_backward(*good, q, k, v, do, key_lengths=lengths)
    assert comp.passed, comp.report()
    bad = [g.astype(np.float32) for g in _hand_backward(*args, keep, np.ones_like(keep))]
    comp = ms.compare_attention_backward(*bad, q, k, v, do, key_lengths=lengths)
    assert not comp.passed
    assert [d.bug for d in comp.diagnoses][:1] == ["key_lengths_missing_in_backward"], \
        comp.report()


def test_the_backward_side_asks_the_variants_for_their_hooks() -> None:
    """The parameter gradients, backward bug classes, chain rules and refusals the
    backward side uses are the registered variants' own (protocol.py's backward hooks)."""
    owners = {p.keyword: v.name for v, p in grad_params()}
    assert owners == {"d_alibi_slopes": "alibi", "d_score_mod": "score_mod",
                      "d_sinks": "sinks"}
    names = {b.name for b in backward_bug_classes()}
    assert {"window_missing_in_backward", "alibi_missing_in_backward",
            "alibi_slopes_reversed_in_backward", "softcap_derivative_missing"} <= names
    with pytest.raises(SpecError, match="FP8 descale factors are not supported"):
        x = np.ones((1, 1, 2, 2), np.float32)
        ms.compare_attention_backward(x, x, x, x, x, x, x, q_descale=np.ones((1, 1)))
