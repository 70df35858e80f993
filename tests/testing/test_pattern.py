"""The report's pattern line: planted boundary bugs, located.

The kernels here are float64 numpy written in this file (their bugs planted by hand);
the expected words are written by hand from where the bug was planted."""

from __future__ import annotations

import numpy as np
import pytest

from mha_symbolic.testing import compare_attention, compare_attention_varlen
from mha_symbolic.testing.pattern import KEY_HYPOTHESES, axis_clause, describe_pattern


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray | None = None,
               scale: float | None = None) -> np.ndarray:
    """float64 attention over (..., H, L, E) with GQA by repeat, keys ``keep`` (L, S)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    c = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("...le,...se->...ls", q, k) * c
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v


def _qkv(B: int, Hq: int, Hk: int, L: int, S: int, E: int, seed: int = 0
         ) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Hq, L, E)).astype(np.float32),
            rng.standard_normal((B, Hk, S, E)).astype(np.float32),
            rng.standard_normal((B, Hk, S, E)).astype(np.float32))


def test_a_kernel_that_drops_the_last_kv_tile_of_32_is_located_at_keys_4064() -> None:
    q, k, v = _qkv(1, 2, 2, 8, 4096, 32)
    keep = np.ones((8, 4096), bool)
    keep[:, 4064:] = False
    out = _attention(q, k, v, keep).astype(np.float32)
    c = compare_attention(out, q, k, v)
    assert not c.passed
    assert c.diagnoses[0].bug == "kv_last_tile_dropped"
    assert "keys 4064–4095 (the last tile of 32) left out" in c.pattern
    assert "Pattern: " in c.report() and "the last tile of 32" in c.report()
    # a key bug shows in every row: the verdicts alone cannot localise it
    assert c.pattern.startswith("not localised")
    assert c.report().startswith("FAIL [kv_last_tile_dropped]")


def test_a_partial_last_tile_is_named_with_its_true_end() -> None:
    q, k, v = _qkv(1, 1, 1, 4, 1000, 16, seed=3)
    keep = np.ones((4, 1000), bool)
    keep[:, 992:] = False                              # 1000 = 31 × 32 + 8
    c = compare_attention(_attention(q, k, v, keep).astype(np.float32), q, k, v)
    assert "keys 992–999 (the last tile of 32) left out" in c.pattern


def test_a_split_kv_kernel_that_loses_one_split_is_named() -> None:
    q, k, v = _qkv(1, 2, 2, 4, 512, 16, seed=1)
    keep = np.ones((4, 512), bool)
    keep[:, 128:256] = False                           # split 1 of 4
    c = compare_attention(_attention(q, k, v, keep).astype(np.float32), q, k, v)
    assert c.diagnoses[0].bug in ("kv_split_dropped",)
    assert "keys 128–255 (split 1 of 4" in c.diagnoses[0].description


def test_the_causal_mask_applied_per_tile_is_named() -> None:
    q, k, v = _qkv(1, 2, 2, 64, 64, 16, seed=2)
    i, j = np.arange(64)[:, None], np.arange(64)[None, :]
    out = _attention(q, k, v, j < (i // 16 + 1) * 16).astype(np.float32)
    c = compare_attention(out, q, k, v, is_causal=True)
    assert [d.bug for d in c.diagnoses] == ["causal_tile_granular"]
    assert "tile of 16" in c.diagnoses[0].description
    # row 15 of each tile of 16 sees exactly its causal keys: never wrong
    rows = c.mismatched.any(axis=(0, 1, 3))
    assert not rows[15::16].any() and rows[0]
    assert "every query but those ≡ 15 mod 16" in c.pattern


def test_only_head_group_2_is_named_as_a_group() -> None:
    q, k, v = _qkv(1, 8, 4, 16, 64, 16, seed=4)
    v_bad = v.copy()
    v_bad[:, 2] *= 1.5                                  # key/value head 2 wrong
    out = _attention(q, k, v_bad).astype(np.float32)
    c = compare_attention(out, q, k, v, enable_gqa=True)
    assert not c.passed
    assert "only head group 2 of 4 (query heads 4–5, key/value head 2)" in c.pattern


def test_only_the_last_query_tile_wrong() -> None:
    q, k, v = _qkv(1, 2, 2, 128, 128, 16, seed=5)
    out = _attention(q, k, v)
    out[:, :, 96:] = _attention(q[:, :, 96:], k, v, scale=1.0)   # scale forgotten there
    c = compare_attention(out.astype(np.float32), q, k, v)
    assert "only queries 96–127 of 128 (the last tile of 32)" in c.pattern
    assert not any(d.bug in KEY_HYPOTHESES for d in c.diagnoses)


def test_only_sequence_3_of_8_of_a_varlen_batch() -> None:
    rng = np.random.default_rng(6)
    lens = [5, 9, 3, 12, 7, 4, 10, 6]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    tot = int(cu[-1])
    q, k, v = (rng.standard_normal((tot, 2, 16)).astype(np.float32) for _ in range(3))
    out = np.zeros((tot, 2, 16))
    for b in range(8):
        s = slice(cu[b], cu[b + 1])
        sw = [np.swapaxes(x[s], 0, 1) for x in (q, k, v)]
        o = _attention(*sw, scale=1.0 if b == 3 else None)        # sequence 3 wrong
        out[s] = np.swapaxes(o, 0, 1)
    c = compare_attention_varlen(out.astype(np.float32), q, k, v, cu, cu)
    assert not c.passed
    assert c.pattern.startswith(f"only sequence 3 of 8 (tokens {cu[3]}–{cu[4] - 1})")


def test_a_dk_wrong_in_the_last_key_tile_is_named_from_its_verdicts() -> None:
    torch = pytest.importorskip("torch")
    from mha_symbolic.testing import compare_attention_backward

    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64) if i == 0 else
               torch.randn(1, 2, 256, 16, dtype=torch.float64) for i in range(3))
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = torch.nn.functional.scaled_dot_product_attention(*leaves)
    do = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, leaves, do)
    dk = dk.clone()
    dk[..., 224:, :] *= 1.1                                       # last tile of 32 of dk
    c = compare_attention_backward(dq, dk, dv, q, k, v, do)
    g = c.gradients["dk"]
    assert not g.passed and c.gradients["dq"].passed
    assert "only keys 224–255 of 256 (the last tile of 32)" in g.pattern
    assert "Pattern: only keys 224–255" in c.report()


def test_a_correct_output_has_no_pattern_and_noise_no_key_claim() -> None:
    q, k, v = _qkv(1, 2, 2, 8, 256, 16, seed=8)
    good = _attention(q, k, v)
    c = compare_attention(good.astype(np.float32), q, k, v)
    assert c.passed and c.pattern == "" and "Pattern" not in c.report()
    noisy = good + 1e-3 * np.random.default_rng(0).standard_normal(good.shape)
    c = compare_attention(noisy.astype(np.float32), q, k, v)
    assert not c.passed and "keys:" not in c.pattern
    assert not any(d.bug in KEY_HYPOTHESES for d in c.diagnoses)


def test_axis_clauses() -> None:
    f = np.zeros(128, bool)
    f[31::32] = True
    assert axis_clause("query", f) == ("only queries ≡ 31 mod 32 (row 31 of every tile of "
                                       "32), 4 of 128")
    f = np.zeros(256, bool)
    f[64:128] = True
    assert axis_clause("key", f) == "only keys 64–127 of 256 (tile 1 of 64)"
    f = np.zeros(10, bool)
    f[[1, 7]] = True
    assert axis_clause("head", f) == "only heads 1, 7 of 10"
    assert axis_clause("head", np.ones(4, bool)) == ""
    bad = np.zeros((2, 4, 8, 3), bool)
    bad[1, :, 7, :] = True
    assert describe_pattern(bad, ("batch", "head", "query", "feature")) == (
        "only batch 1 of 2; only query 7 of 8")
