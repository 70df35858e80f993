"""The certified log-sum-exp (oracle/lse.py): correctly rounded, checked against
mpmath loops written here (exact dot products, 300 bits, rounded by hand)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import SpecError
from mha_symbolic.oracle.lse import reference_lse


def _round_f32(x: mpmath.mpf) -> float:
    """x rounded to float32 by hand: the nearest of the candidates, ties to even."""
    f = np.float32(float(x))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    dist = [abs(mpmath.mpf(float(c)) - x) for c in cands]
    best = min(dist)
    winners = [c for c, d in zip(cands, dist, strict=True) if d == best]
    if len(winners) > 1:   # a tie: the even significand
        winners = [c for c in winners if int(np.float32(c).view(np.uint32)) % 2 == 0]
    return float(winners[0])


def _mp_lse(q: np.ndarray, k: np.ndarray, keep: np.ndarray, add: np.ndarray,
            scale: float | None, base: object) -> list[list[float | mpmath.mpf]]:
    mpmath.mp.prec = 300
    E = q.shape[-1]
    c = 1 / mpmath.sqrt(E) if scale is None else mpmath.mpf(scale)
    out = []
    for i in range(q.shape[0]):
        ts = [c * mpmath.fsum(mpmath.mpf(float(x)) * mpmath.mpf(float(y))
                              for x, y in zip(q[i], k[j], strict=True)) + mpmath.mpf(float(add[i, j]))
              for j in range(k.shape[0]) if keep[i, j]]
        if not ts:
            out.append(None)
            continue
        v = mpmath.log(mpmath.fsum(mpmath.exp(t) for t in ts))
        out.append(v / mpmath.log(2) if base == 2 else v)
    return out


@pytest.mark.parametrize("base", ["e", 2])
@pytest.mark.parametrize("case", ["causal", "bool_mask", "float_mask_scale"])
def test_lse_is_correctly_rounded_against_mpmath(base: object, case: str) -> None:
    rng = np.random.default_rng(hash((case, str(base))) % 2**32)
    L, S, E = 6, 9, 5
    q = rng.standard_normal((2, L, E)).astype(np.float32)
    k = rng.standard_normal((2, S, E)).astype(np.float32)
    keep = np.ones((L, S), bool)
    add = np.zeros((L, S))
    kw: dict[str, object] = {}
    scale = None
    if case == "causal":
        kw["is_causal"] = True
        keep = np.arange(S)[None, :] <= np.arange(L)[:, None]
    elif case == "bool_mask":
        keep = rng.random((L, S)) < 0.6
        keep[2] = False                                   # a row with no key
        kw["attn_mask"] = keep
    else:
        add = rng.standard_normal((L, S)).round(3)
        kw["attn_mask"] = add
        scale = 0.375
        kw["scale"] = scale
    for masked, inf in (("-inf", -math.inf), ("+inf", math.inf)):
        r = reference_lse(q, k, base=base, masked=masked, **kw)  # type: ignore[arg-type]
        got32, got64 = r.rounded("float32"), r.rounded("float64")
        for h in range(2):
            want = _mp_lse(q[h], k[h], keep, add, scale, base)
            for i, w in enumerate(want):
                if w is None:
                    assert got32[h, i] == inf and got64[h, i] == inf
                    continue
                assert got64[h, i] == float(mpmath.mpf(w)), (h, i)   # mpf->float rounds to nearest
                assert got32[h, i] == _round_f32(w), (h, i)
                assert r.lower[h, i] <= float(w) <= r.upper[h, i]


def test_a_single_key_row_is_exact_and_ties_go_to_even() -> None:
    # t = 1 + 2**-24 exactly (scale 1): halfway between float32 1 and 1 + 2**-23
    q = np.array([[[1.0 + 2.0**-24]]])
    k = np.array([[[1.0]]])
    r = reference_lse(q, k, scale=1.0)
    assert r.rounded("float32").tolist() == [[1.0]]
    assert r.rounded("float64").tolist() == [[1.0 + 2.0**-24]]


def test_reference_attention_returns_the_lse_in_both_layouts() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 4, 8)) for _ in range(3))
    r = ms.reference_attention(q, k, v, return_lse=True)
    assert r.lse.shape == (2, 3, 4)
    rb = ms.reference_attention(*(np.swapaxes(x, 1, 2) for x in (q, k, v)), layout="bshd",
                                return_lse=True)
    assert rb.shape == (2, 4, 3, 8) and rb.lse.shape == (2, 3, 4)
    assert np.array_equal(rb.lse.rounded("float32"), r.lse.rounded("float32"))
    s = np.einsum("bhle,bhse->bhls", q, k) / np.sqrt(8)
    want = np.log(np.exp(s).sum(-1))
    assert np.max(np.abs(r.lse.rounded("float64") - want)) < 1e-13


def test_bad_lse_options_are_one_clear_line() -> None:
    x = np.zeros((1, 2, 2))
    with pytest.raises(SpecError, match="lse_base=10"):
        ms.reference_attention(x, x, x, return_lse=True, lse_base=10)
    with pytest.raises(SpecError, match="lse_masked='nan'"):
        ms.reference_attention(x, x, x, return_lse=True, lse_masked="nan")
    with pytest.raises(SpecError, match="softcap or a bias that is not an exact"):
        ms.reference_attention(x, x, x, return_lse=True, softcap=5.0)
