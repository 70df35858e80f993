"""KV-cache decode as a variant (mha_symbolic/oracle/variants/kvcache.py): the exact
answer of flash_attn_with_kvcache's semantics.  Expected values come from independent
methods written here: the valid keys of each batch element sliced out by hand and run
through plain attention one sequence at a time, a hand-built boolean mask, a hand loop
over the page table, and a plain-torch decode (torch SDPA on the sliced keys)."""

from __future__ import annotations

import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import InputValueError, SpecError

B, H, HKV, D = 3, 4, 2, 8


def _case(seed: int, S: int = 40, L: int = 1) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, D)).astype(np.float32)
    k = rng.standard_normal((B, HKV, S, D)).astype(np.float32)
    v = rng.standard_normal((B, HKV, S, D)).astype(np.float32)
    return q, k, v


def _by_sequence(q, k, v, seqlens, left, causal):
    """Each batch element on its own: its valid keys sliced out, plain attention."""
    outs = []
    L = q.shape[-2]
    for b in range(B):
        lo, hi = int(left[b]), int(seqlens[b])
        kb, vb = k[b:b + 1, :, lo:hi], v[b:b + 1, :, lo:hi]
        r = ms.reference_attention(q[b:b + 1], kb, vb, enable_gqa=True, is_causal=causal,
                                   causal_alignment="bottom_right" if causal else "top_left")
        assert kb.shape[2] >= L or not causal
        outs.append(r.rounded("float32"))
    return np.concatenate(outs)


@pytest.mark.parametrize("L,causal", [(1, False), (1, True), (3, True), (3, False)])
def test_decode_equals_each_sequence_on_its_own_valid_keys(L: int, causal: bool) -> None:
    q, k, v = _case(1, L=L)
    seqlens, left = np.array([7, 40, 19]), np.array([0, 5, 2])
    got = ms.reference_attention(q, k, v, enable_gqa=True, cache_seqlens=seqlens,
                                 cache_leftpad=left, is_causal=causal,
                                 causal_alignment="bottom_right")
    np.testing.assert_array_equal(got.rounded("float32"),
                                  _by_sequence(q, k, v, seqlens, left, causal))


def test_decode_equals_a_hand_built_mask() -> None:
    q, k, v = _case(2, L=2)
    seqlens = np.array([3, 9, 40])
    mask = np.zeros((B, 1, 2, 40), dtype=bool)
    for b, n in enumerate(seqlens):
        for i in range(2):
            mask[b, 0, i, :n - 2 + i + 1] = True  # causal from the end: j <= i + n - L
    got = ms.reference_attention(q, k, v, enable_gqa=True, cache_seqlens=seqlens,
                                 is_causal=True, causal_alignment="bottom_right")
    want = ms.reference_attention(q, k, v, enable_gqa=True, attn_mask=mask)
    for fmt in ("float64", "float32", "bfloat16"):
        np.testing.assert_array_equal(got.rounded(fmt), want.rounded(fmt))


def test_paged_gather_and_append_match_a_hand_loop() -> None:
    rng = np.random.default_rng(3)
    pages, page = 7, 4
    kp = rng.standard_normal((pages, page, HKV, D))
    vp = rng.standard_normal((pages, page, HKV, D))
    table = np.array([[5, 0, 3], [1, 6, 2], [4, 4, 4]])
    seqlens = np.array([5, 2, 0])
    kn = rng.standard_normal((B, 2, HKV, D))
    vn = rng.standard_normal((B, 2, HKV, D))
    k, v, after = ms.gather_kv_cache(kp, vp, seqlens, k=kn, v=vn, block_table=table)
    assert after.tolist() == [7, 4, 2]
    for b in range(B):
        for pos in range(12):
            if seqlens[b] <= pos < seqlens[b] + 2:
                want_k, want_v = kn[b, pos - seqlens[b]], vn[b, pos - seqlens[b]]
            else:
                want_k = kp[table[b, pos // page], pos % page]
                want_v = vp[table[b, pos // page], pos % page]
            np.testing.assert_array_equal(k[b, pos], want_k)
            np.testing.assert_array_equal(v[b, pos], want_v)
    # the caller's cache is not written (the exact answer reads a copy)
    assert not np.shares_memory(k, kp)


def _torch_decode(q, k, v, seqlens, bug=None):
    """A decode step written in plain torch (bshd cache sliced per sequence)."""
    torch = pytest.importorskip("torch")
    out = []
    for b in range(B):
        n = int(seqlens[b]) + (1 if bug == "off_by_one" else -1 if bug == "short" else 0)
        if bug == "stale":
            n = k.shape[2]
        qb = torch.from_numpy(q[b:b + 1])
        kb = torch.from_numpy(k[b:b + 1, :, :n]).repeat_interleave(H // HKV, dim=1)
        vb = torch.from_numpy(v[b:b + 1, :, :n]).repeat_interleave(H // HKV, dim=1)
        out.append(torch.nn.functional.scaled_dot_product_attention(qb, kb, vb).numpy())
    return np.concatenate(out)


def test_compare_judges_a_torch_decode_and_catches_cache_bugs() -> None:
    q, k, v = _case(4, S=64)
    seqlens = np.array([10, 33, 64])
    kw = dict(enable_gqa=True, cache_seqlens=seqlens)
    ok = _torch_decode(q, k, v, seqlens)
    assert ms.compare_attention(ok, q, k, v, **kw).passed
    stale = _torch_decode(q, k, v, seqlens, bug="stale")       # entries past the length
    comp = ms.compare_attention(stale, q, k, v, **kw)
    assert not comp.passed
    assert [d.bug for d in comp.diagnoses][:1] == ["kv_cache_lengths_ignored"], comp.report()
    seqlens2 = np.array([10, 33, 63])
    off = _torch_decode(q, k, v, seqlens2, bug="off_by_one")   # one key too many
    comp = ms.compare_attention(off, q, k, v, enable_gqa=True, cache_seqlens=seqlens2)
    assert not comp.passed
    assert [d.bug for d in comp.diagnoses][:1] == ["kv_cache_length_one_long"], comp.report()
    short = _torch_decode(q, k, v, seqlens, bug="short")       # the newest key missed
    comp = ms.compare_attention(short, q, k, v, **kw)
    assert not comp.passed
    assert [d.bug for d in comp.diagnoses][:1] == ["kv_cache_length_one_short"], comp.report()


def test_new_keys_not_appended_is_caught() -> None:
    rng = np.random.default_rng(5)
    kc = rng.standard_normal((B, 16, HKV, D)).astype(np.float32)
    vc = rng.standard_normal((B, 16, HKV, D)).astype(np.float32)
    kn = rng.standard_normal((B, 1, HKV, D)).astype(np.float32)
    vn = rng.standard_normal((B, 1, HKV, D)).astype(np.float32)
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    seqlens = np.array([3, 8, 15])
    k, v, after = ms.gather_kv_cache(kc, vc, seqlens, k=kn, v=vn)
    right = ms.reference_attention(q, k, v, layout="bshd", enable_gqa=True,
                                   cache_seqlens=after).rounded("float32")
    # a kernel that forgot to write the new key/value: it reads the stale cache slot
    forgot = ms.reference_attention(q, kc, vc, layout="bshd", enable_gqa=True,
                                    cache_seqlens=after).rounded("float32")
    assert ms.compare_attention(right, q, k, v, layout="bshd", enable_gqa=True,
                                cache_seqlens=after).passed
    assert not ms.compare_attention(forgot, q, k, v, layout="bshd", enable_gqa=True,
                                    cache_seqlens=after).passed


def test_bad_cache_arguments_are_one_clear_error() -> None:
    q, k, v = _case(6)
    with pytest.raises(SpecError, match="cache_seqlens"):
        ms.reference_attention(q, k, v, enable_gqa=True, cache_seqlens=[1.5, 2.0, 3.0])
    with pytest.raises(InputValueError, match="exceed"):
        ms.reference_attention(q, k, v, enable_gqa=True, cache_seqlens=[1, 2, 99])
    with pytest.raises(InputValueError, match="cache_leftpad must be <="):
        ms.reference_attention(q, k, v, enable_gqa=True, cache_seqlens=[1, 2, 3],
                               cache_leftpad=[2, 0, 0])
    with pytest.raises(SpecError, match="bottom_right"):
        ms.reference_attention(q, k, v, enable_gqa=True, cache_seqlens=[1, 2, 3],
                               is_causal=True)
    with pytest.raises(InputValueError, match="page indices"):
        ms.gather_kv_cache(np.zeros((2, 4, 1, 2)), np.zeros((2, 4, 1, 2)), [1],
                           block_table=[[0, 2]])


# -- ALiBi in a decode step: each sequence's own positions --------------------------------

def _alibi_mask(seqlens, slopes, L, S, causal):
    """flash_attn_with_kvcache's ALiBi, written out as a float mask: query i of sequence
    b at position n_b - L + i, bias -slope_h·|j - (n_b - L + i)| on its n_b valid keys
    (causal: j <= n_b - L + i), -inf elsewhere."""
    mask = np.full((B, H, L, S), -np.inf)
    for b, n in enumerate(seqlens):
        for h in range(H):
            for i in range(L):
                pos = int(n) - L + i
                for j in range(int(n)):
                    if not causal or j <= pos:
                        mask[b, h, i, j] = -float(slopes[h]) * abs(j - pos)
    return mask


def _alibi_by_hand(q, k, v, seqlens, slopes, causal):
    """Plain attention with :func:`_alibi_mask`."""
    mask = _alibi_mask(seqlens, slopes, q.shape[-2], k.shape[-2], causal)
    return ms.reference_attention(q, k, v, enable_gqa=True, attn_mask=mask)


@pytest.mark.parametrize("L,causal", [(1, False), (1, True), (3, True), (2, False)])
def test_alibi_in_a_decode_step_is_measured_from_each_sequences_own_position(
        L: int, causal: bool) -> None:
    q, k, v = _case(5, L=L)
    seqlens = np.array([7, 40, 19])
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    got = ms.reference_attention(q, k, v, enable_gqa=True, cache_seqlens=seqlens,
                                 alibi_slopes=slopes, is_causal=causal,
                                 causal_alignment="bottom_right")
    want = _alibi_by_hand(q, k, v, seqlens, slopes, causal)
    np.testing.assert_array_equal(got.rounded("float32"), want.rounded("float32"))
    np.testing.assert_array_equal(got.rounded("float64"), want.rounded("float64"))
    # and each sequence on its own: its valid keys, ALiBi from the bottom-right corner
    for b, n in enumerate(seqlens):
        one = ms.reference_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                     enable_gqa=True, alibi_slopes=slopes, is_causal=causal,
                                     causal_alignment="bottom_right")
        if not causal and L > 1:
            continue   # without causal the sliced call's ALiBi is top-left aligned
        np.testing.assert_array_equal(got.rounded("float32")[b], one.rounded("float32")[0])


def test_alibi_gradients_in_a_decode_step_match_the_hand_built_mask() -> None:
    q, k, v = _case(6, L=2)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float32)
    seqlens = np.array([5, 40, 12])
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    got = ms.reference_attention_backward(q, k, v, do, enable_gqa=True, cache_seqlens=seqlens,
                                          alibi_slopes=slopes, is_causal=True,
                                          causal_alignment="bottom_right")
    mask = _alibi_mask(seqlens, slopes, 2, k.shape[-2], True)
    want = ms.reference_attention_backward(q, k, v, do, enable_gqa=True, attn_mask=mask)
    for name in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(getattr(got, name).rounded("float32"),
                                      getattr(want, name).rounded("float32"))


def test_a_torch_decode_with_alibi_passes_and_alibi_not_offset_by_the_cache_is_named(
        ) -> None:
    torch = pytest.importorskip("torch")
    q, k, v = _case(8, L=1)
    seqlens = np.array([9, 40, 23])
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])

    def decode(offset: bool) -> np.ndarray:
        # plain torch, one sequence at a time, as a paged/vLLM-style decode would; the
        # bug: the query's position not offset by the cache (at 0).  (Measured from the
        # padded cache's end instead, the bias changes by a constant per row: no effect.)
        outs = []
        for b, n in enumerate(seqlens):
            pos = int(n) - 1 if offset else 0
            dist = torch.arange(int(n), dtype=torch.float32) - pos
            bias = -torch.tensor(slopes, dtype=torch.float32)[:, None, None] * dist.abs()
            kb = torch.from_numpy(k[b:b + 1, :, :n]).repeat_interleave(2, dim=1)
            vb = torch.from_numpy(v[b:b + 1, :, :n]).repeat_interleave(2, dim=1)
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                torch.from_numpy(q[b:b + 1]), kb, vb, attn_mask=bias[None]).numpy())
        return np.concatenate(outs)

    kw = dict(enable_gqa=True, cache_seqlens=seqlens, alibi_slopes=slopes)
    assert ms.compare_attention(decode(True), q, k, v, **kw).passed
    res = ms.compare_attention(decode(False), q, k, v, **kw)
    assert not res.passed
    # in a decode step (every key before the query) -slope·j and +slope·(j - pos) differ
    # by a constant per row: the sign flip fits too, and both are named
    assert "alibi_misaligned" in {d.bug for d in res.diagnoses}, res.report()


def test_alibi_with_a_softcap_in_a_decode_step_through_the_transformed_tiers() -> None:
    # softcap sends the call to the transformed-score tiers (tanh is not a double); the
    # cap comes first, then ALiBi (FlashAttention's order), as a float mask after a cap
    q, k, v = _case(9, L=2)
    q = q * 4
    seqlens = np.array([6, 40, 17])
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    got = ms.reference_attention(q, k, v, enable_gqa=True, cache_seqlens=seqlens,
                                 alibi_slopes=slopes, softcap=2.5, is_causal=True,
                                 causal_alignment="bottom_right")
    mask = _alibi_mask(seqlens, slopes, 2, k.shape[-2], True)
    want = ms.reference_attention(q, k, v, enable_gqa=True, attn_mask=mask, softcap=2.5)
    np.testing.assert_array_equal(got.rounded("float64"), want.rounded("float64"))
