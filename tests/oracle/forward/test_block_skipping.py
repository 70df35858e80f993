"""Issue 29 item 2: blocks of keys that no query row of a block may see are skipped in
tier 1 and in tier 2 by rows.  Each case is computed twice, skipping and with the skipping switched off
(``ScoreModel.block_keys`` and the tiers' ``restrict_keys`` patched to hand out every
key; tier 1 and tier 2 by rows: the float64 roundings of float32-valued inputs go
through the latter), and must give the same
correctly rounded output bit for bit, with enclosures that overlap (both hold the exact
value); a few small cases are also checked element by element against the independent
Fraction/Arb reference of tests/kernels/oracle_reference.py."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic import reference_attention
from mha_symbolic.oracle.arith.jit import numba_active
from mha_symbolic.oracle.conventions import ScoreModel
from mha_symbolic.oracle.forward import attention as attention_mod
from mha_symbolic.oracle.forward.rows import KVrows
from tests.kernels.oracle_reference import check_against_reference


def _unskipped(self: ScoreModel, c: int, rows: Any) -> Any:
    return self.block(c, rows), 0, self.S


def _both(monkeypatch: pytest.MonkeyPatch, *args: Any, **kw: Any) -> tuple[Any, Any]:
    skip = reference_attention(*args, **kw)
    with monkeypatch.context() as m:
        m.setattr(ScoreModel, "block_keys", _unskipped)
        m.setattr(attention_mod, "restrict_keys", lambda blk, S: (blk, 0, S))
        full = reference_attention(*args, **kw)
    return skip, full


def _same(skip: Any, full: Any, dtypes: tuple[str, ...] = ("float64", "float32")) -> None:
    # both enclosures hold the exact value: they overlap everywhere
    assert np.all(skip.lower <= full.upper) and np.all(full.lower <= skip.upper)
    for dt in dtypes:
        a, b = skip.rounded(dt), full.rounded(dt)
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), dt


def _inputs(rng: np.random.Generator, shape_q: tuple[int, ...], shape_kv: tuple[int, ...],
            dtype: Any = ml_dtypes.bfloat16) -> tuple[np.ndarray, ...]:
    q = rng.standard_normal(shape_q).astype(dtype).astype(np.float64)
    k, v = (rng.standard_normal(shape_kv).astype(dtype).astype(np.float64) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("L,S,align", [(300, 300, "top_left"), (200, 700, "top_left"),
                                       (200, 700, "bottom_right"), (700, 200, "bottom_right")])
def test_causal_skipping_gives_the_unskipped_rounding(monkeypatch: pytest.MonkeyPatch,
                                                      L: int, S: int, align: str) -> None:
    rng = np.random.default_rng(L + S)
    q, k, v = _inputs(rng, (2, L, 32), (2, S, 32))
    cut: list[int] = []
    keys = KVrows.keys

    def spy(self: KVrows, j0: int, j1: int) -> KVrows:
        cut.append(int((j0, j1) != (0, self.S)))
        return keys(self, j0, j1)

    with monkeypatch.context() as m:
        m.setattr(KVrows, "keys", spy)
        skip, full = _both(monkeypatch, q, k, v, is_causal=True, causal_alignment=align)
        _same(skip, full)
    # tier 2 by rows (numba's: without it the sliced tier runs) ran on restricted
    # ranges (L > S: its blocks of joined rows see every key)
    assert any(cut) or L > S or not numba_active()


def test_rows_with_no_key_keep_their_policy_when_skipping(monkeypatch: pytest.MonkeyPatch) -> None:
    # bottom-right alignment with L > S: the first L - S rows see no key (whole blocks
    # of them: at S = 64 a block holds 1024 rows)
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, (1, 3000, 16), (1, 64, 16))
    for policy in ("zero", "nan", "uniform"):
        skip, full = _both(monkeypatch, q, k, v, is_causal=True,
                           causal_alignment="bottom_right", masked_rows=policy)
        a, b = skip.rounded("float32"), full.rounded("float32")
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.array_equal(np.nan_to_num(a), np.nan_to_num(b))
        empty = np.arange(3000) < 3000 - 64
        if policy == "zero":
            assert np.all(a[0, empty] == 0)
        elif policy == "nan":
            assert np.all(np.isnan(a[0, empty]))
        else:   # the mean of the values (scores all 0)
            assert np.allclose(a[0, empty], v[0].mean(axis=0), rtol=1e-6, atol=1e-7)


def test_window_and_gqa_skipping_gives_the_unskipped_rounding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, (1, 8, 600, 32), (1, 2, 900, 32), np.float16)
    skip, full = _both(monkeypatch, q, k, v, window=(64, 16), enable_gqa=True)
    _same(skip, full, ("float64", "float32", "float16"))


def test_block_sparse_mask_skipping_gives_the_unskipped_rounding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    L = S = 1024
    q, k, v = _inputs(rng, (2, L, 32), (2, S, 32), np.float32)
    # block-sparse by 128 x 128 tiles: a band plus a few random tiles, one empty tile row
    tiles = (np.abs(np.arange(8)[:, None] - np.arange(8)[None, :]) <= 1) | (
        rng.random((8, 8)) < 0.15)
    tiles[5] = False
    mask = np.kron(tiles, np.ones((128, 128), dtype=bool))
    skip, full = _both(monkeypatch, q, k, v, attn_mask=mask, return_weights=True)
    _same(skip, full)
    _same(skip.weights, full.weights)


def test_float_mask_and_causal_skipping(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(8)
    q, k, v = _inputs(rng, (1, 2, 500, 16), (1, 2, 500, 16), np.float16)
    fm = np.where(rng.random((500, 500)) < 0.2, -np.inf, np.round(rng.standard_normal((500, 500))))
    skip, full = _both(monkeypatch, q, k, v, attn_mask=fm, is_causal=True, return_weights=True)
    _same(skip, full)
    _same(skip.weights, full.weights)


def test_skipped_blocks_agree_with_the_independent_reference() -> None:
    rng = np.random.default_rng(9)
    q, k, v = _inputs(rng, (1, 2, 40, 8), (1, 2, 70, 8))
    i, j = np.arange(40)[:, None], np.arange(70)[None, :]
    tiles = np.kron(np.eye(5, 7, dtype=bool), np.ones((8, 10), dtype=bool))
    for kw, keep in (({"is_causal": True, "causal_alignment": "bottom_right"}, j <= i + 30),
                     ({"attn_mask": tiles}, tiles)):
        enc = reference_attention(q, k, v, **kw)
        check_against_reference(enc, q, k, v, np.broadcast_to(keep, (1, 2, 40, 70)), None, None)
    qs, ks, vs = q[..., :40, :], k[..., :40, :], v[..., :40, :]
    i, j = np.arange(40)[:, None], np.arange(40)[None, :]
    enc = reference_attention(qs, ks, vs, window=(5, 0))
    keep = (j <= i) & (j >= i - 5)
    check_against_reference(enc, qs, ks, vs, np.broadcast_to(keep, (1, 2, 40, 40)), None, None)


def test_block_keys_hands_out_only_the_keys_some_row_may_see() -> None:
    m = ScoreModel((1,), 1000, 1000, is_causal=True)
    blk, j0, j1 = m.block_keys(0, slice(16, 32))
    assert (j0, j1) == (0, 32) and blk.allowed is not None and blk.allowed.shape == (16, 32)
    assert np.array_equal(blk.allowed, np.arange(32)[None, :] <= np.arange(16, 32)[:, None])
    band = np.abs(np.arange(1000)[:, None] - np.arange(1000)[None, :]) <= 3
    blk, j0, j1 = ScoreModel((1,), 1000, 1000, attn_mask=band).block_keys(0, slice(500, 510))
    assert (j0, j1) == (497, 513)
    blk, j0, j1 = ScoreModel((1,), 1000, 1000).block_keys(0, slice(0, 10))
    assert (j0, j1) == (0, 1000) and blk.allowed is None
    none = np.zeros((1000, 1000), dtype=bool)
    assert ScoreModel((1,), 1000, 1000, attn_mask=none).block_keys(0, slice(0, 10))[1:] == (0, 0)
    uni = ScoreModel((1,), 1000, 1000, attn_mask=none, policy="uniform")
    assert uni.block_keys(0, slice(0, 10))[1:] == (0, 1000)
