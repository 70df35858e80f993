"""The fast evaluation of the tolerance model (issue 29) against the plain one.

``tests/kernels/bound_reference.py`` holds the one-function evaluation of the model as it stood
before issue 29, verbatim; the package's step-wise evaluation (skipped passes where
every key takes part, the worst case only on the rows that need it, smaller chunks in
:meth:`Plain.bound`) must give the same tolerance and the same vacuity: bit for bit on
one chunk, and at the check level within the float64 summation order of a matrix
product of another shape (2⁻⁴⁰ relative is the slack the bound already carries for
its own float64 evaluation; the differences measured are ≤ 2.3e-15, a few ulps).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic.testing.call import AttentionCall
from mha_symbolic.testing.forward import plain as plain_mod
from mha_symbolic.testing.forward.model import ScoreExtras, attention_error_bound
from mha_symbolic.testing.forward.plain import Plain
from mha_symbolic.testing.tolerance import error_model
from tests.kernels.bound_reference import reference_attention_error_bound

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
          "float64": np.float64}


def _rounded(rng: np.random.Generator, shape: tuple[int, ...], dtype: str,
             scale: float = 1.0) -> np.ndarray:
    a = rng.standard_normal(shape) * scale
    return a.astype(DTYPES[dtype]).astype(np.float64)


def _both(q: np.ndarray, k: np.ndarray, v: np.ndarray, **kw: object) -> None:
    fast = attention_error_bound(q, k, v, **kw)  # type: ignore[arg-type]
    opts = {"mask_add": None, "kappa": None, "uniform_rows": None, "dq": None, "dk": None,
            "dv": None, "softmax_axis": -1, "extras": None}
    opts.update(kw)
    with np.errstate(all="ignore"):
        ref = reference_attention_error_bound(q, k, v, **opts)  # type: ignore[arg-type]
    assert np.array_equal(fast.vacuous, ref.vacuous)
    np.testing.assert_array_equal(fast.tol, ref.tol)


CHUNK_CASES = [
    # (dtype, kernel, kind, subnormals, R, S, E, mask)
    ("bfloat16", "fused", "probabilistic", "keep", 16, 40, 8, None),
    ("float16", "fused", "probabilistic", "keep", 7, 300, 16, "causal"),
    ("float32", "fused", "worst_case", "keep", 9, 33, 8, "bool"),
    ("float64", "fused", "probabilistic", "keep", 5, 70, 4, "float"),
    ("float16", "eager", "probabilistic", "keep", 6, 50, 8, "float"),
    ("bfloat16", "eager_scaled_query", "probabilistic", "flush", 6, 50, 8, "causal"),
    ("float16", "sequential", "worst_case", "flush", 4, 600, 8, None),
    ("float32", "fused", "probabilistic", "keep", 3, 1, 8, None),
    ("bfloat16", "fused", "probabilistic", "keep", 12, 900, 32, "bool"),
]


@pytest.mark.parametrize("case", CHUNK_CASES, ids=lambda c: "-".join(map(str, c)))
def test_a_chunk_bound_is_bit_identical_to_the_plain_evaluation(case: tuple) -> None:
    dtype, kernel, kind, sub, R, S, E, mask = case
    rng = np.random.default_rng(sum(map(ord, str(case))))
    q, k, v = (_rounded(rng, (n, E), dtype, 2.0) for n in (R, S, S))
    allowed = np.ones((R, S), bool)
    madd = None
    if mask == "causal":
        allowed = np.arange(S)[None, :] <= np.arange(R)[:, None] + (S - R)
    elif mask == "bool":
        allowed = rng.random((R, S)) < 0.7
        allowed[0] = False                                # a fully masked row
    elif mask == "float":
        madd = np.round(rng.standard_normal((R, S)) * 4) / 4
    model = error_model(dtype, kernel=kernel, kind=kind, subnormals=sub).with_events(
        R * E, 2 * S * R * E)
    _both(q, k, v, scale=0.3, allowed=allowed, model=model, mask_add=madd)


def test_ties_dropout_uniform_rows_projections_and_row_axis_agree() -> None:
    rng = np.random.default_rng(3)
    R, S, E = 6, 20, 4
    q = _rounded(rng, (R, E), "float16")
    k = np.repeat(_rounded(rng, (S // 4, E), "float16"), 4, axis=0)   # tied scores
    v = _rounded(rng, (S, E), "float16")
    model = error_model("float16").with_events(R * E, 2 * S * R * E)
    allowed = rng.random((R, S)) < 0.8
    allowed[2] = False
    kappa = (rng.random((R, S)) < 0.9) / 0.9
    uni = ~np.any(allowed, axis=-1)
    small = np.abs(_rounded(rng, (R, E), "float16")) * 1e-3
    _both(q, k, v, scale=0.5, allowed=allowed, model=model, kappa=kappa, uniform_rows=uni)
    _both(q, k, v, scale=0.5, allowed=allowed, model=model, dq=small,
          dk=np.abs(k) * 1e-3, dv=np.abs(v) * 1e-3)
    _both(q, k, v, scale=0.5, allowed=np.ones((R, S), bool), model=model, softmax_axis=-2)
    _both(q, k, v, scale=0.5, allowed=allowed,
          model=error_model("float16", kernel="eager_scaled_query").with_events(10, 10),
          dq=small)


def test_overflowing_rows_variants_and_fp8_weights_agree() -> None:
    rng = np.random.default_rng(5)
    R, S, E = 5, 30, 8
    q, k, v = (_rounded(rng, (n, E), "float16") for n in (R, S, S))
    q[1] *= 3000.0                                             # a row beyond fp16's range
    model = error_model("float16", kernel="eager").with_events(R * E, 2 * S * R * E)
    _both(q, k, v, scale=1.0, allowed=np.ones((R, S), bool), model=model)
    q[1] /= 3000.0
    t = 0.35 * q @ k.T
    cap = 5.0
    ex = ScoreExtras(scores=cap * np.tanh(t / cap), ind=1e-7 * np.abs(t), var=1e-14 * t * t,
                     d_eval=1e-16 * np.abs(t), centred=False, scale_roundings=3,
                     final_roundings=1)
    _both(q, k, v, scale=0.35, allowed=np.ones((R, S), bool),
          model=error_model("float16").with_events(R * E, 2 * S * R * E), extras=ex)
    m8 = error_model("float16", weights="float8_e4m3fn").with_events(R * E, 2 * S * R * E)
    _both(q, k, v, scale=0.35, allowed=np.ones((R, S), bool), model=m8)


def _plain_bound_reference(pl: Plain, model: object) -> tuple[np.ndarray, np.ndarray]:
    lay = pl.layout
    tol = np.zeros((lay.B, lay.L, lay.Ev))
    vac = np.zeros(tol.shape, bool)
    for ch in pl.chunks(plain_mod.CHUNK_SCORES):
        with np.errstate(all="ignore"):
            b = reference_attention_error_bound(
                ch.q, ch.k, ch.v, scale=ch.scale, allowed=ch.allowed, model=model,  # type: ignore[arg-type]
                mask_add=ch.mask_add, kappa=ch.kappa, uniform_rows=ch.uniform, dq=ch.dq,
                dk=ch.dk, dv=ch.dv, softmax_axis=pl.variant.softmax_axis)
        tol[ch.b, ch.rows], vac[ch.b, ch.rows] = b.tol, b.vacuous
    return tol.reshape(pl.shape), vac.reshape(pl.shape)


CHECK_CASES = [
    # (dtype, shape (B, Hq, Hkv, L, S, E), causal, mask, gqa)
    ("bfloat16", (2, 4, 4, 300, 300, 32), False, None, False),
    ("float16", (1, 4, 2, 257, 513, 16), True, None, True),
    ("float32", (2, 2, 2, 130, 1100, 8), False, "bool", False),
    ("bfloat16", (1, 8, 2, 1, 2000, 64), False, None, True),            # decode, GQA
    ("float16", (1, 2, 2, 600, 600, 16), True, "float", False),
]


@pytest.mark.parametrize("case", CHECK_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[3]}")
def test_a_check_bound_matches_the_plain_evaluation(case: tuple) -> None:
    dtype, (B, Hq, Hkv, L, S, E), causal, mask, gqa = case
    rng = np.random.default_rng(11)
    q = _rounded(rng, (B, Hq, L, E), dtype)
    k, v = (_rounded(rng, (B, Hkv, S, E), dtype) for _ in range(2))
    attn = None
    if mask == "bool":
        attn = rng.random((L, S)) < 0.6
    elif mask == "float":
        attn = np.where(rng.random((L, S)) < 0.1, -np.inf, np.round(rng.standard_normal((L, S))))
    x = AttentionCall(q, k, v, attn_mask=attn, is_causal=causal, enable_gqa=gqa)
    pl = Plain(x)
    model = error_model(dtype).with_events(*pl.events())
    tol, vac = pl.bound(model)
    rtol, rvac = _plain_bound_reference(pl, model)
    assert np.array_equal(vac, rvac)
    np.testing.assert_allclose(tol, rtol, rtol=2.0**-45, atol=0)


def _ulp_by_frexp(x: np.ndarray, emin: int, p: int) -> np.ndarray:
    """The ulp as tolerance.ulp computed it before issue 29 (frexp, ldexp)."""
    ax = np.abs(np.asarray(x, dtype=np.float64))
    _, ex = np.frexp(np.where(np.isfinite(ax), ax, 0.0))
    e = np.maximum(ex.astype(np.int64) - 1, emin)
    e = np.where(ax == 0, emin, e)
    return np.ldexp(1.0, (e - (p - 1)).astype(np.int32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_ulp_is_the_frexp_ulp_on_every_kind_of_value(dtype: str) -> None:
    from mha_symbolic.testing.tolerance import format_of, ulp

    fmt = format_of(dtype)
    rng = np.random.default_rng(9)
    with np.errstate(over="ignore"):
        x = np.ldexp(rng.standard_normal(4000), rng.integers(-1080, 1030, 4000))
    x = np.concatenate([x, [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 2.0**-1022,
                            1.0, -1.0, 65504.0, 2.0**fmt.emin, 2.0**(fmt.emin - 3)]])
    got = ulp(x, fmt)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, _ulp_by_frexp(x, fmt.emin, fmt.p))
    assert float(ulp(np.float64(3.0), fmt)) == float(_ulp_by_frexp(np.float64(3.0), fmt.emin, fmt.p))


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def update(self, n: int) -> None:
        self.n += n


def test_the_bound_and_the_dtype_level_advance_a_progress_bar_by_every_row() -> None:
    from mha_symbolic.testing.forward.emulated import dtype_level

    rng = np.random.default_rng(2)
    q, k, v = (_rounded(rng, (2, 3, 700, 8), "bfloat16") for _ in range(3))
    x = AttentionCall(q, k, v, is_causal=True)
    pl = Plain(x)
    model = error_model("bfloat16").with_events(*pl.events())
    bar = _Counter()
    tol, _ = pl.bound(model, bar)
    assert bar.n == 2 * 3 * 700
    np.testing.assert_array_equal(tol, pl.bound(model)[0])
    bar2 = _Counter()
    assert dtype_level(x, model, bar2) is not None
    assert bar2.n == 2 * 3 * 700
