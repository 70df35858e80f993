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


# -- left padding: positions of a window, ALiBi, chunks and rotary -----------------------
# FlashAttention's test reference (tests/test_flash_attn.py, hopper/test_util.py:
# construct_local_mask, construct_chunk_mask, attn_bias_from_alibi_slopes) shifts the
# keys by the padding, col = j - leftpad, and puts query i at row i + sk - sq with sk the
# valid count (n - leftpad); rotary reads cache indices (FA3: seqlen_rotary =
# seqlen_k_og + leftpad_k).  Written out here one element at a time.

LP_N, LP_LEFT = np.array([11, 40, 23]), np.array([4, 0, 9])


def _fa_leftpad_mask(seqlens, left, L, S, causal, window=None, chunk=None, slopes=None):
    """The additive float mask of flash_attn_with_kvcache with cache_leftpad, by hand."""
    mask = np.full((B, H, L, S), -np.inf)
    for b in range(B):
        n, lp = int(seqlens[b]), int(left[b])
        for i in range(L):
            row = i + (n - lp) - L                    # the query's shifted position
            for j in range(lp, n):
                col = j - lp
                if causal and col > row:
                    continue
                if window is not None and not (row - window[0] <= col <= row + window[1]):
                    continue
                if chunk is not None and not (row - row % chunk <= col < row - row % chunk
                                              + chunk):
                    continue
                for h in range(H):
                    mask[b, h, i, j] = 0.0 if slopes is None else -float(slopes[h]) * abs(
                        col - row)
    return mask


LP_CASES = [dict(window=(5, 0)), dict(window=(3, 2)), dict(attention_chunk=4),
            dict(attention_chunk=8, window=(6, 0)),
            dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]))]


def _mask_kw(kw):
    return dict(window=kw.get("window"), chunk=kw.get("attention_chunk"),
                slopes=kw.get("alibi_slopes"))


@pytest.mark.parametrize("kw", LP_CASES)
@pytest.mark.parametrize("L,causal", [(1, True), (3, True), (2, False)])
def test_leftpad_positions_match_flash_attention_written_out_by_hand(kw, L, causal) -> None:
    if not causal and "window" in kw and kw["window"][1] == 0:
        kw = {**kw, "window": (kw["window"][0], 1)}
    q, k, v = _case(11, L=L)
    call = dict(enable_gqa=True, cache_seqlens=LP_N, cache_leftpad=LP_LEFT, is_causal=causal,
                causal_alignment="bottom_right", **kw)
    got = ms.reference_attention(q, k, v, **call)
    mask = _fa_leftpad_mask(LP_N, LP_LEFT, L, k.shape[-2], causal, **_mask_kw(kw))
    want = ms.reference_attention(q, k, v, enable_gqa=True, attn_mask=mask)
    for fmt in ("float64", "float32", "bfloat16"):
        np.testing.assert_array_equal(got.rounded(fmt), want.rounded(fmt))
    # each sequence on its own, its valid keys sliced out: FlashAttention's shifted frame
    if causal:
        for b in range(B):
            lo, hi = int(LP_LEFT[b]), int(LP_N[b])
            one = ms.reference_attention(q[b:b + 1], k[b:b + 1, :, lo:hi], v[b:b + 1, :, lo:hi],
                                         enable_gqa=True, is_causal=True,
                                         causal_alignment="bottom_right", **kw)
            np.testing.assert_array_equal(got.rounded("float32")[b], one.rounded("float32")[0])


@pytest.mark.parametrize("kw", [LP_CASES[0], LP_CASES[2], LP_CASES[4]])
def test_leftpad_gradients_match_the_hand_built_mask(kw) -> None:
    q, k, v = _case(12, L=2)
    do = np.random.default_rng(13).standard_normal(q.shape).astype(np.float32)
    got = ms.reference_attention_backward(q, k, v, do, enable_gqa=True, cache_seqlens=LP_N,
                                          cache_leftpad=LP_LEFT, is_causal=True,
                                          causal_alignment="bottom_right", **kw)
    mask = _fa_leftpad_mask(LP_N, LP_LEFT, 2, k.shape[-2], True, **_mask_kw(kw))
    want = ms.reference_attention_backward(q, k, v, do, enable_gqa=True, attn_mask=mask)
    for name in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(getattr(got, name).rounded("float32"),
                                      getattr(want, name).rounded("float32"))


def _torch_leftpad_decode(q, k, v, chunk_origin="leftpad", chunk=4, window=None):
    """A decode step with left padding in plain torch: per sequence, positions by hand."""
    torch = pytest.importorskip("torch")
    outs, L = [], q.shape[-2]
    for b in range(B):
        n, lp = int(LP_N[b]), int(LP_LEFT[b])
        o = lp if chunk_origin == "leftpad" else 0             # the bug: the cache's start
        qpos = torch.arange(L)[:, None] + (n - L)
        kpos = torch.arange(lp, n)[None, :]
        keep = kpos <= qpos
        if chunk:
            keep &= (kpos - o) // chunk == (qpos - o) // chunk
        if window is not None:
            keep &= kpos >= qpos - window
        bias = torch.where(keep, 0.0, float("-inf")).to(torch.float32)
        kb = torch.from_numpy(k[b:b + 1, :, lp:n]).repeat_interleave(H // HKV, dim=1)
        vb = torch.from_numpy(v[b:b + 1, :, lp:n]).repeat_interleave(H // HKV, dim=1)
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            torch.from_numpy(q[b:b + 1]), kb, vb, attn_mask=bias).numpy())
    return np.concatenate(outs)


def test_a_torch_decode_with_leftpad_and_chunks_passes_and_a_cache_start_grid_fails() -> None:
    q, k, v = _case(14, L=2)
    kw = dict(enable_gqa=True, cache_seqlens=LP_N, cache_leftpad=LP_LEFT, is_causal=True,
              causal_alignment="bottom_right", attention_chunk=4)
    assert ms.compare_attention(_torch_leftpad_decode(q, k, v), q, k, v, **kw).passed
    bad = ms.compare_attention(_torch_leftpad_decode(q, k, v, chunk_origin="cache"),
                               q, k, v, **kw)
    assert not bad.passed
    # (where the cache-start chunk of a query holds no padding, ignoring the padding
    # altogether gives the same keys: that class is named beside it)
    assert "kv_cache_leftpad_chunk_origin" in {d.bug for d in bad.diagnoses}, bad.report()
    win = dict(kw, attention_chunk=None, window=(3, 0))
    ok = _torch_leftpad_decode(q, k, v, chunk=0, window=3)
    assert ms.compare_attention(ok, q, k, v, **win).passed


def _rope_torch(x, pos, base):
    """HF's half-split rotary in float64 torch, x (..., P, D) at positions pos (P,)."""
    import torch
    D = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _torch_rotary_leftpad_decode(q, k, v, offset_queries=True):
    torch = pytest.importorskip("torch")
    outs = []
    for b in range(B):
        n, lp = int(LP_N[b]), int(LP_LEFT[b])
        qpos, kpos = torch.arange(n - 2, n), torch.arange(lp, n)
        qb = _rope_torch(torch.from_numpy(q[b:b + 1]).double(),
                         qpos if offset_queries else torch.arange(2), 100.0)
        kb = _rope_torch(torch.from_numpy(k[b:b + 1, :, lp:n]).double(), kpos,
                         100.0).repeat_interleave(H // HKV, dim=1)
        vb = torch.from_numpy(v[b:b + 1, :, lp:n]).double().repeat_interleave(H // HKV, dim=1)
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=kpos[None, :] <= qpos[:, None]).float().numpy())
    return np.concatenate(outs)


def test_a_torch_decode_with_leftpad_and_rotary_at_cache_indices_passes() -> None:
    # (rotated from the left padding instead, j - leftpad and n - leftpad - L + i, the
    # scores are the same in exact arithmetic: a rotation's score reads p_q - p_k only)
    q, k, v = _case(15, L=2)
    kw = dict(enable_gqa=True, cache_seqlens=LP_N, cache_leftpad=LP_LEFT, is_causal=True,
              causal_alignment="bottom_right", rotary_base=100.0)
    assert ms.compare_attention(_torch_rotary_leftpad_decode(q, k, v), q, k, v, **kw).passed
    bad = ms.compare_attention(_torch_rotary_leftpad_decode(q, k, v, False), q, k, v, **kw)
    assert not bad.passed


# -- a positional score_mod in a decode step: its own literal offset ---------------------

def test_a_score_mod_with_the_cache_keeps_its_literal_offset_or_one_per_sequence() -> None:
    torch = pytest.importorskip("torch")
    q, k, v = _case(16, L=2)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    table = np.array([0.0, -1.0, 0.5, 2.0, -0.25])
    call = dict(enable_gqa=True, cache_seqlens=LP_N, is_causal=True,
                causal_alignment="bottom_right")
    S = k.shape[-2]
    for offset in (3, LP_N - 2):
        offs = np.broadcast_to(offset, (B,))
        for mod, bias in ((ms.alibi_score_mod(slopes, offset=offset),
                           lambda h, d: -slopes[h] * abs(d)),
                          (ms.relative_bias_score_mod(table, offset=offset),
                           lambda h, d: table[min(max(d, -2), 2) + 2])):
            mask = np.full((B, H, 2, S), -np.inf)
            for b in range(B):
                for h in range(H):
                    for i in range(2):
                        for j in range(int(LP_N[b])):
                            if j <= i + int(LP_N[b]) - 2:
                                mask[b, h, i, j] = bias(h, j - (i + int(offs[b])))
            got = ms.reference_attention(q, k, v, score_mod=mod, **call)
            want = ms.reference_attention(q, k, v, enable_gqa=True, attn_mask=mask)
            np.testing.assert_array_equal(got.rounded("float32"), want.rounded("float32"))
            # the object as FlexAttention calls it, in torch: the same bias
            bb, hh, ii, jj = (torch.arange(n).view(*([1] * a), n, *([1] * (3 - a)))
                              for a, n in enumerate((B, H, 2, S)))
            t = mod(torch.zeros(B, H, 2, S, dtype=torch.float64), bb, hh, ii, jj).numpy()
            np.testing.assert_array_equal(np.where(mask == -np.inf, 0, t),
                                          np.where(mask == -np.inf, 0, mask))
    do = np.random.default_rng(17).standard_normal(q.shape).astype(np.float32)
    g = ms.reference_attention_backward(q, k, v, do, score_mod=mod, **call)
    w = ms.reference_attention_backward(q, k, v, do, enable_gqa=True, attn_mask=mask)
    for name in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(getattr(g, name).rounded("float32"),
                                      getattr(w, name).rounded("float32"))


def test_rotary_with_leftpad_equals_each_sequence_sliced_out_forward_and_backward() -> None:
    # a rotation's score reads p_q - p_k only, so in exact arithmetic sequence b's keys
    # sliced out (positions 0 … n-lp-1, queries at n - lp - L + i) give the same exact
    # answer as the padded cache at cache indices; correctly rounded, the same bits
    q, k, v = _case(18, S=16, L=2)
    n, lp = np.array([7, 16, 12]), np.array([2, 0, 5])
    do = np.random.default_rng(19).standard_normal(q.shape).astype(np.float32)
    kw = dict(enable_gqa=True, is_causal=True, causal_alignment="bottom_right",
              rotary_base=100.0, rotary_dim=4)
    got = ms.reference_attention(q, k, v, cache_seqlens=n, cache_leftpad=lp, **kw)
    g = ms.reference_attention_backward(q, k, v, do, cache_seqlens=n, cache_leftpad=lp, **kw)
    for b in range(B):
        sl = slice(int(lp[b]), int(n[b]))
        one = ms.reference_attention(q[b:b + 1], k[b:b + 1, :, sl], v[b:b + 1, :, sl], **kw)
        np.testing.assert_array_equal(got.rounded("float32")[b], one.rounded("float32")[0])
        g1 = ms.reference_attention_backward(q[b:b + 1], k[b:b + 1, :, sl], v[b:b + 1, :, sl],
                                             do[b:b + 1], **kw)
        np.testing.assert_array_equal(g.dq.rounded("float32")[b], g1.dq.rounded("float32")[0])
        np.testing.assert_array_equal(g.dk.rounded("float32")[b, :, sl],
                                      g1.dk.rounded("float32")[0])
        assert not np.any(g.dk.rounded("float32")[b, :, :int(lp[b])])


def test_flex_attention_decode_with_a_per_sequence_score_mod_offset_passes() -> None:
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) for n in (1, 16, 16))
    n = np.array([9, 16])
    nt = torch.tensor(n)
    mod = ms.alibi_score_mod(np.array([0.5, 0.25]), offset=n - 1)
    bm = flex.create_block_mask(lambda b, h, qi, kv: kv < nt[b], 2, None, 1, 16, device="cpu")
    out = flex.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    assert ms.compare_attention(out, q, k, v, score_mod=mod, cache_seqlens=n).passed
    # the same decode with the ALiBi keyword (each sequence's own positions): equal
    want = ms.reference_attention(q, k, v, alibi_slopes=np.array([0.5, 0.25]),
                                  cache_seqlens=n).rounded("float32")
    got = ms.reference_attention(q, k, v, score_mod=mod, cache_seqlens=n).rounded("float32")
    np.testing.assert_array_equal(got, want)
