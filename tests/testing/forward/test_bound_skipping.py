"""Issue 29 item 2 on the testing side: the tolerance model computed on the range of
keys some row of a chunk may see (``Chunk.restricted``) against the same model on every
key (the restriction switched off): vacuity identical, tolerances within 2^-45
relative (BLAS and numpy summation over fewer zeros), on causal, window, block-sparse,
float-mask, GQA, dropout, rows without any key and uniform rows."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic.testing.call import AttentionCall
from mha_symbolic.testing.forward.plain import Chunk, Plain
from mha_symbolic.testing.tolerance import error_model

_DT = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def _rounded(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(_DT[dtype]).astype(np.float64)


def _band(L: int, S: int, left: int, right: int) -> np.ndarray:
    d = np.arange(S)[None, :] - np.arange(L)[:, None]
    return (d >= -left) & (d <= right)


def _tiles(rng: np.random.Generator, L: int, S: int, t: int) -> np.ndarray:
    tl = (np.abs(np.arange(L // t)[:, None] - np.arange(S // t)[None, :]) <= 1) | (
        rng.random((L // t, S // t)) < 0.1)
    tl[1] = False                     # a tile row without any key
    return np.kron(tl, np.ones((t, t), dtype=bool))


CASES = [
    ("bfloat16", (2, 4, 4, 384, 384), {"is_causal": True}, "probabilistic"),
    ("float16", (1, 8, 2, 300, 777), {"is_causal": True, "enable_gqa": True}, "probabilistic"),
    ("float32", (1, 2, 2, 400, 200), {"is_causal": True, "causal_alignment": "bottom_right"},
     "worst_case"),
    ("bfloat16", (1, 2, 2, 512, 512), {"band": (40, 0)}, "probabilistic"),
    ("float16", (1, 2, 2, 512, 512), {"tiles": 64}, "probabilistic"),
    ("float16", (1, 2, 2, 512, 512), {"tiles": 64, "masked_rows": "uniform"}, "worst_case"),
    ("bfloat16", (1, 2, 2, 300, 300), {"is_causal": True, "float": True}, "probabilistic"),
    ("bfloat16", (1, 2, 2, 300, 300), {"is_causal": True, "dropout": 0.25}, "probabilistic"),
]


def _no_restriction(self: Chunk) -> Chunk:
    return self


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{sorted(c[2])}-{c[3]}")
def test_the_bound_on_the_keys_some_row_sees_is_the_bound_on_every_key(
        monkeypatch: pytest.MonkeyPatch, case: tuple[Any, ...]) -> None:
    dtype, (B, Hq, Hkv, L, S), opts, kind = case
    rng = np.random.default_rng(L + S)
    E = 32
    q = _rounded(rng, (B, Hq, L, E), dtype)
    k, v = (_rounded(rng, (B, Hkv, S, E), dtype) for _ in range(2))
    kw: dict[str, Any] = {key: opts[key] for key in ("is_causal", "enable_gqa",
                                                      "causal_alignment", "masked_rows")
                          if key in opts}
    if "band" in opts:
        kw["attn_mask"] = _band(L, S, *opts["band"])
    if "tiles" in opts:
        kw["attn_mask"] = _tiles(rng, L, S, opts["tiles"])
    if opts.get("float"):
        kw["attn_mask"] = np.where(rng.random((L, S)) < 0.1, -np.inf,
                                   np.round(rng.standard_normal((L, S))))
    if "dropout" in opts:
        kw["dropout_p"] = opts["dropout"]
        kw["dropout_mask"] = rng.random((B, Hq, L, S)) >= opts["dropout"]
    x = AttentionCall(q, k, v, **kw)
    pl = Plain(x)
    model = error_model(dtype, kind=kind).with_events(*pl.events())
    # the restriction does cut: some chunk holds fewer keys than S
    assert any(ch.restricted().keys is not None for ch in pl.chunks(1 << 16)) or (
        opts.get("masked_rows") == "uniform")
    tol, vac = pl.bound(model)
    with monkeypatch.context() as m:
        m.setattr(Chunk, "restricted", _no_restriction)
        rtol, rvac = pl.bound(model)
    assert np.array_equal(vac, rvac)
    assert np.all(np.isfinite(tol)) and np.any(tol > 0)
    np.testing.assert_allclose(tol, rtol, rtol=2.0**-45, atol=0)
