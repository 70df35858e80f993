"""The fused loops of the tolerance model (testing/forward/model_jit.py, numba) against
the numpy steps they replace: the same tolerance and vacuity, bit for bit.

The numpy steps are themselves checked bit for bit against the verbatim plain
evaluation (test_attention_bound_fast.py); here the two paths of the package are run
on the same chunks with ``MHA_SYMBOLIC_NUMBA`` on and off."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic.testing.forward.model import attention_error_bound
from mha_symbolic.testing.forward.model_jit import kernels
from mha_symbolic.testing.tolerance import error_model

pytestmark = pytest.mark.skipif(kernels() is None, reason="numba is not installed")

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
          "float64": np.float64}


def _both(monkeypatch: Any, *args: Any, **kw: Any) -> None:
    monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", "1")
    fused = attention_error_bound(*args, **kw)
    monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", "0")
    plain = attention_error_bound(*args, **kw)
    assert np.array_equal(fused.vacuous, plain.vacuous)
    np.testing.assert_array_equal(fused.tol, plain.tol)


CASES = [
    # (dtype, kernel, kind, R, S, E, mask)
    ("bfloat16", "fused", "probabilistic", 16, 512, 64, None),
    ("bfloat16", "fused", "probabilistic", 33, 777, 16, "causal"),
    ("float16", "fused", "probabilistic", 9, 3000, 8, "bool"),
    ("float32", "fused", "probabilistic", 5, 129, 8, "float"),
    ("float16", "eager", "probabilistic", 6, 200, 8, None),
    ("float32", "fused", "worst_case", 7, 300, 8, "causal"),
    ("float64", "fused", "probabilistic", 4, 70, 4, None),
    ("bfloat16", "fused", "probabilistic", 3, 1, 8, None),
    ("float16", "fused", "probabilistic", 4, 7, 8, "bool"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_fused_loops_give_the_numpy_steps_bound_bit_for_bit(monkeypatch: Any,
                                                                  case: tuple) -> None:
    dtype, kernel, kind, R, S, E, mask = case
    rng = np.random.default_rng(sum(map(ord, str(case))))
    q, k, v = (np.asarray(rng.standard_normal((n, E)) * 2.0).astype(DTYPES[dtype])
               .astype(np.float64) for n in (R, S, S))
    allowed = np.ones((R, S), bool)
    madd = None
    if mask == "causal":
        allowed = np.arange(S)[None, :] <= np.arange(R)[:, None] + (S - R) // 2
    elif mask == "bool":
        allowed = rng.random((R, S)) < 0.7
        allowed[0] = False                                # a fully masked row
    elif mask == "float":
        madd = np.round(rng.standard_normal((R, S)) * 4) / 4
    model = error_model(dtype, kernel=kernel, kind=kind).with_events(R * E, 2 * S * R * E)
    _both(monkeypatch, q, k, v, scale=0.3, allowed=allowed, model=model, mask_add=madd)


def test_ties_overflow_and_huge_scores_agree(monkeypatch: Any) -> None:
    rng = np.random.default_rng(4)
    R, S, E = 8, 160, 8
    q = rng.standard_normal((R, E)).astype(np.float16).astype(np.float64)
    k = np.repeat(rng.standard_normal((S // 8, E)), 8, axis=0)      # tied scores
    v = rng.standard_normal((S, E))
    model = error_model("float16").with_events(R * E, 2 * S * R * E)
    _both(monkeypatch, q, k, v, scale=0.5, allowed=np.ones((R, S), bool), model=model)
    q[2] *= 3000.0                                   # a row beyond fp16's range (vacuous)
    q[3] *= 1e150                                    # scores near float64's limit
    _both(monkeypatch, q, k, v, scale=1.0, allowed=np.ones((R, S), bool), model=model)
    v[5] = 0.0
    _both(monkeypatch, q, k, v * 1e-300, scale=1.0, allowed=np.ones((R, S), bool),
          model=error_model("float32", subnormals="flush").with_events(10, 10))


@pytest.mark.parametrize("S", [0, 1, 7, 8, 9, 127, 128, 129, 255, 256, 1000, 4097, 20000])
def test_the_row_sums_are_numpys_pairwise_sums(S: int) -> None:
    from mha_symbolic.testing.forward import _model_kernels as kern

    rng = np.random.default_rng(S)
    a = rng.standard_normal((6, S)) * np.exp(rng.standard_normal((6, S)) * 8)
    a[0, :3] = -0.0
    np.testing.assert_array_equal(kern.row_sums(a), np.sum(a, axis=-1))


@pytest.mark.parametrize("dtype,mask", [("bfloat16", None), ("float16", "bool"),
                                        ("float16", "huge"), ("bfloat16", "flush"),
                                        ("float32", "tiny")])
def test_the_dtype_levels_fused_pass_gives_the_numpy_tolerance(monkeypatch: Any, dtype: str,
                                                               mask: str | None) -> None:
    from mha_symbolic.testing.call import AttentionCall
    from mha_symbolic.testing.forward.emulated import dtype_level
    from mha_symbolic.testing.forward.plain import Plain

    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 3, n, 16)).astype(DTYPES[dtype]).astype(np.float64)
               for n in (40, 90, 90))
    attn = None
    if mask == "bool":
        attn = rng.random((40, 90)) < 0.5
        attn[3] = False                               # a fully masked row (NaN policy)
    if mask == "huge":
        q[0, 1, 5] *= 2000.0                          # fp16 scores overflow in that row
    if mask == "tiny":
        v[0, 0] *= 1e-40                              # outputs near float32's subnormals
    x = AttentionCall(q, k, v, attn_mask=attn, masked_rows="nan" if attn is not None else "zero")
    pl = Plain(x)
    model = error_model(dtype, subnormals="flush" if mask == "flush" else "keep").with_events(
        *pl.events())
    lev = dtype_level(x, model)
    assert lev is not None
    mid = pl.out.copy()
    if mask == "huge":
        mid[0, 0, 0, 0] = np.nan                      # a NaN exact value, an infinite one
        mid[0, 0, 1, 1] = np.inf
    monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", "1")
    fused = lev._tolerance(mid, 4.0)
    monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", "0")
    plain = lev._tolerance(mid, 4.0)
    np.testing.assert_array_equal(fused[0], plain[0])
    np.testing.assert_array_equal(fused[1], plain[1])
    assert fused[2] == plain[2]


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, np.ndarray):
        return bool(np.array_equal(x, y))
    if isinstance(x, float) and isinstance(y, float) and np.isnan(x):
        return bool(np.isnan(y))
    if hasattr(x, "__dataclass_fields__"):
        return all(_same(getattr(x, f), getattr(y, f)) for f in x.__dataclass_fields__)
    return bool(x == y)


@pytest.mark.parametrize("seed", range(12))
def test_the_verdicts_fused_pass_gives_the_numpy_findings(seed: int) -> None:
    from mha_symbolic.testing.tolerance import format_of
    from mha_symbolic.testing.verdict import _elements, _elements_fused, mid_of

    rng = np.random.default_rng(seed)
    shape = (2, 3, int(rng.integers(1, 40)), 8)
    lower = rng.standard_normal(shape) * 10.0 ** rng.integers(-40, 3)
    upper = lower + np.abs(rng.standard_normal(shape)) * 1e-3 * (seed % 3)
    a = (lower + upper) / 2 + rng.standard_normal(shape) * 1e-3 * (seed % 4)
    tol = np.abs(rng.standard_normal(shape)) * 1e-3 * (seed % 5 != 0)
    if seed % 2:
        pick = rng.random(shape)
        a[pick < 0.05] = np.nan
        a[(pick > 0.05) & (pick < 0.08)] = np.inf
        lower[pick > 0.95] = upper[pick > 0.95] = np.nan        # NaN by policy
        a[pick > 0.98] = 1.0                                     # a missing NaN
        a[(pick > 0.4) & (pick < 0.42)] = 0.0
    vac = rng.random(shape) < 0.1 * (seed % 3)
    hull = rng.random(shape) < 0.05 if seed % 4 == 1 else None
    mid = mid_of(lower, upper)
    fmt = format_of(["bfloat16", "float16", "float32"][seed % 3])
    got = _elements_fused(a, lower, upper, tol, vac, hull, mid, fmt)
    assert got is not None
    want = _elements(a, lower, upper, tol, vac, hull, mid, fmt)
    assert all(_same(x, y) for x, y in zip(got, want, strict=True)), (got[1:], want[1:])


def test_the_fused_top_key_is_numpys_argmax() -> None:
    """shifted_scores' top key (h29f: _score_errors' argmax pass fused) is np.argmax of
    on(s, −inf): the first of tied maxima, the first NaN, key 0 in a fully masked row."""
    kern = kernels()
    if kern is None:
        pytest.skip("numba not installed")
    rng = np.random.default_rng(3)
    S = 9
    s = np.round(rng.standard_normal((64, S)) * 2) / 2        # many ties
    s[5, [2, 6]] = np.nan
    s[6, 4] = np.nan
    s[7, :] = -np.inf
    s[8, [1, 7]] = np.inf
    allowed = rng.random((64, S)) < 0.8
    allowed[9] = False
    allowed[6, 4] = False                                     # a masked NaN counts as −inf
    outs = [np.empty((64, S)) for _ in range(3)]
    top = np.empty(64, dtype=np.intp)
    kern.shifted_scores(s, allowed, 2.0**-7, 700.0, *outs, np.empty(64), top)
    want = np.argmax(np.where(allowed, s, -np.inf), axis=-1)
    assert np.array_equal(top, want)
    assert top[9] == 0 and top[7] == 0


def _brute_tie_counts(s: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """N_ij by a plain double loop: allowed keys of row i whose score == s_ij."""
    R, S = s.shape
    out = np.ones((R, S))
    for i in range(R):
        row = [float(x) for x, a in zip(s[i], allowed[i], strict=True) if a]
        for j in range(S):
            if allowed[i, j]:
                out[i, j] = float(sum(1 for x in row if x == s[i, j])) or 1.0
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_hashed_tie_counts_are_the_counts_of_equal_scores(monkeypatch: Any,
                                                              seed: int) -> None:
    """moments._tie_counts with the compiled hash tables (numba) and with the sort (numpy)
    against a double loop: ±0 equal, NaN equal to nothing, infinities tied, masked keys 1,
    rows with and without repeats, S = 1 and long rows (table growth)."""
    from mha_symbolic.testing.forward.moments import _tie_counts

    rng = np.random.default_rng(seed)
    pool = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 5e-324, 1e300])
    R, S = (7, 1) if seed == 0 else (int(rng.integers(2, 12)), int(rng.integers(2, 300)))
    s = rng.standard_normal((R, S))
    s[::2] = rng.choice(pool, (len(s[::2]), S))                 # ties and specials
    if seed % 2:
        s[1] = np.round(s[1] * 2) / 2
    allowed = rng.random((R, S)) < (1.0 if seed < 2 else 0.6)
    expect = _brute_tie_counts(s, allowed)
    for numba_on in ("1", "0"):
        monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", numba_on)
        np.testing.assert_array_equal(_tie_counts(s, allowed), expect)


@pytest.mark.parametrize("dtype,S,mask,scale", [
    ("bfloat16", 130, "float", 1.0), ("float16", 65, "bool", 1.0), ("float16", 7, None, 1.0),
    ("bfloat16", 200, "causal", 1.0), ("float16", 129, "dropout", 1.0),
    ("float16", 96, None, 300.0), ("float32", 64, "float", 30.0)])
def test_the_online_orders_compiled_blocks_give_the_numpy_passes_bytes(
        monkeypatch: Any, dtype: str, S: int, mask: str | None, scale: float) -> None:
    """emulated._online with numba (the block passes compiled) and without: the same
    output bytes, NaNs and infinities included (float masks with −inf, fully masked rows,
    causal, dropout multipliers, a short last block of 1–7 keys, overflowing scores)."""
    from mha_symbolic.testing.call import AttentionCall
    from mha_symbolic.testing.forward.emulated import _Cast, _online
    from mha_symbolic.testing.forward.plain import Plain

    rng = np.random.default_rng(S)
    L, E = 33, 16
    q, k, v = ((scale * rng.standard_normal((1, 2, n, E))).astype(DTYPES[dtype])
               .astype(np.float64) for n in (L, S, S))
    attn, drop = None, None
    if mask == "bool":
        attn = rng.random((L, S)) < 0.5
        attn[3] = False                                  # a fully masked row
    if mask == "float":
        attn = rng.standard_normal((L, S)) * 4.0
        attn[rng.random((L, S)) < 0.3] = -np.inf
        attn[5] = -np.inf
    if mask == "dropout":
        drop = rng.random((1, 2, L, S)) < 0.8
    x = AttentionCall(q, k, v, attn_mask=attn, is_causal=mask == "causal",
                      dropout_p=0.2 if drop is not None else 0.0, dropout_mask=drop)
    dt = np.dtype(DTYPES[dtype])
    for ch in Plain(x).chunks():
        outs = []
        for flag in ("1", "0"):
            monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", flag)
            with np.errstate(all="ignore"):
                wk = np.dtype(np.float32)
                outs.append(_online(ch, dt, wk, _Cast(ch, wk))[0])
        assert outs[0].tobytes() == outs[1].tobytes()
