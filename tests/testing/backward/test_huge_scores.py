"""The backward's tolerance at scores of 1e300 (issue 30, fuzz seed 51): never NaN (it
was "the tolerance is nan": the probabilistic bound's e^(score error) terms gave
inf · 0, and the forward bound inside D overflowed).  What is still open (a decided
verdict there: the model's weight bound is vacuous when the score error is 1e284) is
recorded in bench/RESULTS.md ("Issue 30, session 2026-12-02 third").  Behaviour only."""

from __future__ import annotations

import warnings

import numpy as np

import mha_symbolic as ms
from mha_symbolic.errors import ToleranceError


def test_backward_tolerance_at_scores_of_1e300_is_not_nan() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 3)) * 1e300
    k = rng.standard_normal((1, 3, 3))
    v = rng.uniform(-1, 1, (1, 3, 2))
    do = rng.uniform(-1, 1, (1, 2, 2))
    # P is one-hot (score gaps of ~1e300): dV = Pᵀ dO exactly, by hand
    s = np.einsum("ble,bse->bls", q, k)
    p = (s == s.max(axis=-1, keepdims=True)).astype(np.float64)
    dv = np.einsum("bls,ble->bse", p, do)
    zq, zk = np.zeros_like(q), np.zeros_like(k)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        try:
            r = ms.compare_attention_backward(zq, zk, dv, q, k, v, do)
        except ToleranceError as exc:  # no verdict is allowed, a NaN tolerance is not
            msg = str(exc)
            assert "nan" not in msg and "please report" not in msg, msg
        else:
            assert r.passed
