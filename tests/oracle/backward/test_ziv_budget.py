"""Ziv's loop goes on raising Arb's precision where the exact boundary test gives up
(its term budget, exact.TERM_BUDGET): review r29h found PrecisionError on values that
Arb decides at more bits (dk of about 1e-141 to float32, whose ±0 needs the sign)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mha_symbolic import reference_attention_backward
from mha_symbolic.errors import PrecisionError
from mha_symbolic.oracle.backward import exact


def test_rounding_rises_past_a_boundary_test_that_gives_up(monkeypatch: Any) -> None:
    # weights 1/(1 + e^-1000) and e^-1000/(1 + e^-1000); dv_0 = P_00·dO lies about 2^-1443
    # below the float32 tie 1 + 3·2^-24 (between 1 + 2^-23, odd, and 1 + 2^-22, even):
    # it rounds down to 1 + 2^-23 (the tie itself would round up, to even)
    q = np.array([[40.0]])
    k = np.array([[25.0], [0.0]])
    v = np.array([[1.0], [2.0]])
    do = np.array([[1.0 + 3 * 2.0**-24]])

    calls: list[int] = []

    def gives_up(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        raise PrecisionError("exact test over its term budget")

    monkeypatch.setattr(exact.ExactDecisions, "boundary_sign", gives_up)
    g = reference_attention_backward(q, k, v, do, scale=1.0)
    assert float(g.dv.rounded("float32")[0, 0]) == 1.0 + 2.0**-23
    assert calls  # the boundary test was asked, and gave up
