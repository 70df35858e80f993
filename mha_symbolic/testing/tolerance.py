"""The rounding-error model of attention: how far may a correct kernel be from the
exact answer?

The testing tool judges an attention output against the *exact* answer (the
oracle's certified enclosure).  This module bounds the error of a correct
floating-point kernel, element by element, from a rounding-error analysis of the
algorithm, parameterised by what the kernel rounds (:class:`ErrorModel`):

* the **output dtype** (unit roundoff ``u``): inputs are exact values of it, and
  the output, the stored weights P and (eager kernels) the scores are rounded to it;
* the **accumulation dtype** (``u_a``): dot products, the softmax and the weighted
  sum; by default float32 for float16/bfloat16 outputs (FlashAttention, cuDNN,
  torch SDPA, JAX all accumulate there) and the output dtype otherwise;
* the **kernel** (:data:`KERNELS`): ``"fused"`` (scores and softmax in the
  accumulation dtype), ``"eager"`` (op by op: q·kᵀ, the scaled scores and the
  masked scores each rounded to the output dtype), ``"eager_scaled_query"`` (the
  scaled query q·c rounded to the output dtype before the product);
* the **error model**: ``"worst_case"`` (every rounding takes its worst value:
  Higham's deterministic analysis) or ``"probabilistic"`` (the default: Higham &
  Mary's model, in which rounding errors are independent, mean-zero random
  variables bounded by u, with a false-alarm probability of at most
  :data:`FALSE_ALARM_PROBABILITY` per check).

The building blocks here are general (any computation whose rounding errors are
bounded stage by stage): the worst-case factor :func:`gamma`, Higham & Mary's
probabilistic factor :func:`gamma_tilde`, the factor of a sum under the model of a
check (:meth:`ErrorModel.gamma_sum`), the λ of a false-alarm probability
(:func:`lambda_for`), Hoeffding's bound (:func:`hoeffding_bound`), the format
constants (:func:`unit_roundoff`, :func:`underflow_eta`, :func:`ulp`) and the bound
of a linear map (:func:`linear_error_bound`).  The bound of attention itself, with
its derivation, is :mod:`mha_symbolic.testing.forward.model`; docs/testing.md
repeats both.  Every model of the package is built on them: the forward bound
(:mod:`.attention_bound`), the variants and FP8 kernels (:mod:`.tolerance_variants`)
and the gradients (:mod:`.backward_model`, :mod:`.backward_mha`); the analysis
constants of all of them are the data below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import SpecError
from ..oracle.arith.formats import FORMATS as _ORACLE_FORMATS
from ..oracle.arith.formats import FloatFormat as _Format
from ..oracle.arith.formats import get_format

__all__ = [
    "DEFAULT_SAFETY",
    "ERROR_MODELS",
    "FALSE_ALARM_PROBABILITY",
    "FORMATS",
    "KERNELS",
    "K_EXP",
    "K_SCALE",
    "K_SCORE",
    "K_SOFTMAX",
    "K_TANH",
    "ErrorModel",
    "FloatFormat",
    "KernelModel",
    "error_model",
    "format_of",
    "gamma",
    "gamma_tilde",
    "hoeffding_bound",
    "lambda_for",
    "linear_error_bound",
    "ulp",
    "underflow_eta",
    "unit_roundoff",
]

# --------------------------------------------------------------------------------------
# Constants (data)

#: The false-alarm probability per check that λ is chosen for (union bound over the
#: check's probabilistic events, under Higham & Mary's model of rounding errors).
FALSE_ALARM_PROBABILITY = 1e-9
#: The exp is charged K_EXP u_a (libm and SLEEF exps are within 1–2 ulps = 2–4 u).
K_EXP = 4
#: Counts of a plain kernel used by the backward model (testing/backward_model.py):
#: roundings relative to a score (the scale, the stored product, the mask addition, the
#: stored sum) and of the softmax beyond its n additions (exp 4u, division, store).
K_SCORE = 4
K_SOFTMAX = 6
#: Roundings of the scale in the gradients dQ and dK (backward_model.py): q, k
#: pre-scaled by √c (torch MATH) or the scale applied to the accumulated sum
#: (FlashAttention), in u and u_a.
K_SCALE = 2
#: The tanh of a softcap is charged K_TANH u_a (CUDA's tanhf: 2 ulp; glibc's tanh:
#: within 2), doubled (tolerance_variants.py).
K_TANH = 4
#: The bound is used as it is (it is a derivation with its roundings counted).
DEFAULT_SAFETY = 1.0
#: Relative error factors saturate here (e^700): a bound that large is vacuous and
#: reported so; it is never inf.
_EXP_CAP = 700.0
_FMAX = float(np.finfo(np.float64).max)
ERROR_MODELS = ("probabilistic", "worst_case")
#: Other spellings accepted for ``error_model=`` (the gradients' first release said
#: "worst").
_KIND_ALIASES = {"worst": "worst_case"}


@dataclass(frozen=True)
class KernelModel:
    """What a kernel rounds, beyond its accumulation dtype (one row of :data:`KERNELS`)."""

    name: str
    description: str
    score_stores: int          # roundings of each score to the output dtype (q·kᵀ, ×c, +mask)
    scaled_query: bool         # q·c rounded to the output dtype before the product (shared)


#: The kernels the model describes.  ``fused`` covers FlashAttention, cuDNN, xformers,
#: torch SDPA (every backend) and jax.nn.dot_product_attention.
KERNELS: dict[str, KernelModel] = {
    "fused": KernelModel(
        "fused", "scores and softmax in the accumulation dtype, P rounded to the output "
        "dtype before P·V (FlashAttention, cuDNN, torch SDPA, JAX)", 0, False),
    "sequential": KernelModel(
        "sequential", "as 'fused', the sums over the keys accumulated one term at a time "
        "(a loop over the keys with one accumulator: a naive kernel)", 0, False),
    "eager": KernelModel(
        "eager", "op by op in the output dtype: q·kᵀ, the scaled scores and the masked "
        "scores each rounded to it (softmax(q @ k.T * c) @ v)", 2, False),
    "eager_scaled_query": KernelModel(
        "eager_scaled_query", "op by op, the scaled query q·c rounded to the output dtype "
        "before q·kᵀ (softmax((q * c) @ k.T) @ v)", 1, True),
}


# --------------------------------------------------------------------------------------
# Formats


@dataclass(frozen=True)
class FloatFormat(_Format):
    """The oracle's :class:`~mha_symbolic.oracle.arith.formats.FloatFormat` (precision ``p``,
    exponent range ``emin``..``emax``) with the constants of the error analysis."""

    @property
    def u(self) -> float:
        """Unit roundoff 2^-p."""
        return math.ldexp(1.0, -self.p)

    @property
    def eta(self) -> float:
        """Half the smallest subnormal: the absolute error of a rounding that underflows."""
        return math.ldexp(1.0, self.emin - self.p)

    @property
    def precision(self) -> int:
        return self.p

    @property
    def max(self) -> float:
        return self.max_finite


#: name -> format, the oracle's formats with the analysis' constants
FORMATS: dict[str, FloatFormat] = {
    name: FloatFormat(f.name, f.p, f.emin, f.emax, f.finite_only)
    for name, f in _ORACLE_FORMATS.items()}


def format_of(dtype: object) -> FloatFormat:
    """The :class:`FloatFormat` of a numpy dtype (ml_dtypes bfloat16 included), a torch
    dtype, a name, or an oracle format.

    >>> format_of("bfloat16").p, format_of("bfloat16").u == 2.0 ** -8
    (8, True)
    """
    return FORMATS[get_format(dtype).name]


def unit_roundoff(fmt: FloatFormat) -> float:
    """Unit roundoff u = 2^-p, half an ulp of 1 (2^-53, 2^-24, 2^-11, 2^-8).

    >>> unit_roundoff(format_of("float16")) == 2.0 ** -11
    True
    """
    return math.ldexp(1.0, -fmt.p)


def underflow_eta(fmt: FloatFormat) -> float:
    """Half the smallest subnormal, the absolute error of a rounding that underflows.

    >>> underflow_eta(format_of("float32")) == 2.0 ** -150
    True
    """
    return math.ldexp(1.0, fmt.emin - fmt.p)


def ulp(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """The ulp of the format at |x| (x given in float64): 2^(e - p + 1) for
    |x| in [2^e, 2^(e+1)), with e clamped below at emin (subnormals).

    >>> float(ulp(np.array(1.0), format_of("bfloat16"))) == 2.0 ** -7
    True
    """
    # 2^e by masking the float64 exponent field (0 for zeros and float64 subnormals,
    # which the clamp at 2^emin covers; every format here has emin ≥ float64's), then
    # times 2^(1 − p): exact, a power of two.  Non-finite x: as for |x| = 0 before the
    # clamp, e = max(−1, emin) (frexp(0) = (0, 0)).
    # One fresh array, the passes in place: the exponent field of inf and NaN is all
    # ones, so after the masking the non-finite x are exactly the infinite entries.
    ax = np.abs(np.asarray(x, dtype=np.float64))
    if ax.ndim == 0:
        ax = ax.reshape(1)
        return ulp(ax, fmt).reshape(())
    bits = ax.view(np.int64)
    np.bitwise_and(bits, np.int64(0x7FF0000000000000), out=bits)
    pw = np.maximum(ax, math.ldexp(1.0, fmt.emin), out=ax)
    nonfin = np.isinf(pw)
    if nonfin.any():
        pw[nonfin] = math.ldexp(1.0, max(-1, fmt.emin))
    return np.multiply(pw, math.ldexp(1.0, 1 - fmt.p), out=pw)


# --------------------------------------------------------------------------------------
# Building blocks (reusable by any error model built on this one)


def gamma(n: Any, u: float) -> np.ndarray:
    """Worst-case relative error of n roundings: ``(1 − u)^(−n) − 1``.

    |Π_{i≤n} (1 + δ_i)^{±1} − 1| ≤ (1 − u)^{−n} − 1 for |δ_i| ≤ u (each factor lies
    in [1 − u, (1 − u)^{−1}]).  It equals Higham's γ_n = nu/(1 − nu) to first order and
    is below it, but stays finite for every n (γ_n is +inf once nu ≥ 1); it saturates
    at e^700.

    >>> float(gamma(3, 2.0 ** -24)) <= 3 * 2.0 ** -24 / (1 - 3 * 2.0 ** -24)
    True
    >>> bool(np.isfinite(gamma(4096, 2.0 ** -8)))
    True
    """
    x = -np.asarray(n, dtype=np.float64) * math.log1p(-u)
    return np.asarray(np.expm1(np.minimum(x, _EXP_CAP)))


def gamma_tilde(n: Any, u: float, lam: float) -> np.ndarray:
    """Higham & Mary's probabilistic bound ``exp(λ√n u + n u²/(1 − u)) − 1``.

    Under their model (rounding errors independent, mean zero, |δ| ≤ u),
    |Π_{i≤n} (1 + δ_i)^{±1} − 1| ≤ γ̃_n(λ) with probability at least
    1 − 2 exp(−λ²(1 − u)²/2) (SIAM J. Sci. Comput. 41(5), 2019, Theorem 2.4); an
    inner product or sum of n terms is within γ̃_n(λ) Σ|x_i| of the exact value
    with probability at least 1 − 2n exp(−λ²(1 − u)²/2) (Theorem 3.1).  Finite for
    every n (saturates at e^700).

    >>> round(float(gamma_tilde(4096, 2.0 ** -8, 9.0)), 3)   # e^(9·64/256 + 4096/65280) − 1
    9.102
    """
    nn = np.asarray(n, dtype=np.float64)
    x = lam * np.sqrt(nn) * u + nn * u * u / (1.0 - u)
    return np.asarray(np.expm1(np.minimum(x, _EXP_CAP)))


def lambda_for(probability: float, events: float, u: float = 0.0) -> float:
    """The λ for which ``events`` probabilistic bounds, each failing with probability
    at most 2 exp(−λ²(1 − u)²/2), fail together with probability at most
    ``probability`` (union bound): λ = sqrt(2 ln(2·events/probability)) / (1 − u).

    >>> round(lambda_for(1e-9, 1e6), 3)   # sqrt(2 ln(2e15))
    8.394
    """
    if not (0.0 < probability < 1.0):
        raise SpecError(f"probability={probability!r} must lie in (0, 1)")
    ev = max(float(events), 1.0)
    return math.sqrt(2.0 * math.log(2.0 * ev / probability)) / (1.0 - u)


def hoeffding_bound(sum_sq: Any, lam: float) -> np.ndarray:
    """Hoeffding's inequality: a sum of independent mean-zero terms X_i with |X_i| ≤ b_i
    exceeds λ sqrt(Σ b_i²) in absolute value with probability at most 2 exp(−λ²/2).

    >>> float(hoeffding_bound(4.0, 3.0))
    6.0
    """
    return np.asarray(lam * np.sqrt(np.maximum(np.asarray(sum_sq, dtype=np.float64), 0.0)))


# --------------------------------------------------------------------------------------
# The model of one check


@dataclass(frozen=True)
class ErrorModel:
    """What the bound assumes: output and accumulation formats, the kernel, the error
    model, and λ (set per check by :meth:`with_events`)."""

    fmt: FloatFormat
    acc: FloatFormat
    kernel: KernelModel = field(default_factory=lambda: KERNELS["fused"])
    kind: str = "probabilistic"
    lam: float = 8.0                       # Hoeffding's λ (one event per bound element)
    lam_sums: float = 9.0                  # Higham–Mary's λ (one event per term of a sum)
    accumulation_default: bool = False     # acc chosen by the default rule (for reports)
    flush: bool = False                    # subnormal results flushed to zero (FTZ/DAZ)
    #: the format the weights P are stored in before P·V when it is not the output's:
    #: an FP8 kernel (FlashAttention-3) converts the unnormalised weights e^{s−m} ≤ 1
    #: to its fp8 input format (tolerance_variants.py); None: P in the output dtype
    weights: FloatFormat | None = None
    #: the absolute underflow errors (η, η_a) times this power of two: a check stated in
    #: power-of-two units 2^-n with n < 0 (testing/backward/units.py) meets the
    #: original run's underflows, η in its units, as η·2^-n
    floor_scale: float = 1.0

    @property
    def u(self) -> float:
        return unit_roundoff(self.fmt)

    @property
    def ua(self) -> float:
        return unit_roundoff(self.acc)

    @property
    def eta(self) -> float:
        """Absolute error of a rounding that underflows in the output dtype: half the
        smallest subnormal (gradual underflow); the smallest normal when subnormals are
        flushed *and* the output dtype is the accumulation dtype (flushing is a property
        of the arithmetic: converting to a narrower storage dtype keeps subnormals, as
        CUDA's cvt and x86's F16C conversions do)."""
        if self.flush and self.fmt == self.acc:
            return math.ldexp(1.0, self.fmt.emin) * self.floor_scale
        return underflow_eta(self.fmt) * self.floor_scale

    @property
    def eta_a(self) -> float:
        """The same in the accumulation dtype."""
        return (math.ldexp(1.0, self.acc.emin) if self.flush
                else underflow_eta(self.acc)) * self.floor_scale

    @property
    def us(self) -> float:
        """Unit roundoff of the dtype that holds the scores."""
        return self.u if self.kernel.score_stores else self.ua

    @property
    def uw(self) -> float:
        """Unit roundoff of the stored weights P (the output dtype's unless
        :attr:`weights` names another format)."""
        return self.u if self.weights is None else unit_roundoff(self.weights)

    def gamma_sum(self, n: Any, u: float | None = None) -> np.ndarray:
        """The factor of a sum of n terms accumulated in unit roundoff ``u`` (default
        u_a): |fl(Σ x_i) − Σ x_i| ≤ g Σ|x_i|.  Worst case: :func:`gamma` (finite for
        every n); probabilistic: the smaller of it and Higham & Mary's
        :func:`gamma_tilde` at this check's λ (:attr:`lam_sums`, one event per term:
        :meth:`with_events` must have counted the terms).

        >>> m = error_model("bfloat16", accumulation_dtype="same")
        >>> float(m.gamma_sum(256)) < 1.0 < float(gamma(256, m.ua))
        True
        """
        uu = self.ua if u is None else u
        g = gamma(n, uu)
        if self.kind == "probabilistic":
            g = np.minimum(g, gamma_tilde(n, uu, self.lam_sums))
        return np.asarray(g)

    def with_events(self, elements: float, sum_terms: float) -> ErrorModel:
        """The same model with its λs set for one check: half the false-alarm budget
        for the Hoeffding bounds (three per bound element: ``elements``), half for the
        Higham–Mary bounds (one per term of every sum: ``sum_terms``)."""
        half = FALSE_ALARM_PROBABILITY / 2
        return replace(self, lam=lambda_for(half, 3 * elements),
                       lam_sums=lambda_for(half, sum_terms, max(self.u, self.ua)))

    def describe(self, kernel: str | None = None) -> str:
        """One line for reports (``kernel``: the kernel's description when it is not a
        :data:`KERNELS` entry, as for the gradients)."""
        if self.kind == "worst_case":
            how = "worst case"
        else:
            how = (f"probabilistic, λ = {self.lam:.2f}, {self.lam_sums:.2f}: false-alarm "
                   f"probability ≤ "
                   f"{_sci(FALSE_ALARM_PROBABILITY)} per check under Higham & Mary's model")
        ftz = "; subnormals flushed" if self.flush else ""
        ker = f"kernel '{self.kernel.name}'" if kernel is None else kernel
        wts = (f"; weights converted to {self.weights.name} before P·V (FP8 kernel model)"
               if self.weights is not None else "")
        return f"rounding-error model ({how}; {ker}{wts}{ftz})"


def _sci(x: float) -> str:
    """1e-09 -> '1e-9'."""
    m, e = f"{x:.0e}".split("e")
    return f"{m}e{int(e)}"


def error_model(dtype: Any, *, accumulation_dtype: Any = None, kernel: str = "fused",
                kind: str = "probabilistic", subnormals: str = "keep",
                weights: Any = None) -> ErrorModel:
    """The :class:`ErrorModel` for outputs of ``dtype``.

    ``accumulation_dtype``: None (float32 for outputs narrower than float32: float16,
    bfloat16, fp8; the output dtype otherwise), ``"same"`` (the output dtype), or a
    dtype.  ``kernel``: a key of :data:`KERNELS`.  ``kind``: ``"probabilistic"`` or
    ``"worst_case"`` (``"worst"`` is accepted for it).  ``subnormals``: ``"keep"``
    (IEEE gradual underflow) or ``"flush"`` (a kernel that flushes subnormal results to
    zero, as XLA on CPU and CUDA fast-math code do).  ``weights``: the format of the
    weights before P·V when it is not the output's (an FP8 kernel's), or None.

    >>> m = error_model("bfloat16")
    >>> m.acc.name, m.kernel.name, m.kind
    ('float32', 'fused', 'probabilistic')
    """
    fmt = format_of(dtype)
    default = accumulation_dtype is None
    if default:
        acc = FORMATS["float32"] if fmt.p < FORMATS["float32"].p else fmt
    elif isinstance(accumulation_dtype, str) and accumulation_dtype == "same":
        acc = fmt
    else:
        try:
            acc = format_of(accumulation_dtype)
        except SpecError:
            raise SpecError(f"accumulation_dtype={accumulation_dtype!r} is not a float "
                            "format: expected 'same', float64, float32, float16 or "
                            "bfloat16") from None
    if kernel not in KERNELS:
        raise SpecError(f"kernel={kernel!r} is not a kernel model: expected one of "
                        f"{tuple(KERNELS)}")
    kind = _KIND_ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    if kind not in ERROR_MODELS:
        raise SpecError(f"error_model={kind!r} is not an error model: expected one of "
                        f"{ERROR_MODELS}")
    if subnormals not in ("keep", "flush"):
        raise SpecError(f"subnormals={subnormals!r}: expected 'keep' or 'flush'")
    wfmt = None
    if weights is not None:
        try:
            wfmt = format_of(weights)
        except SpecError:
            raise SpecError(f"weights_dtype={weights!r} is not a float format") from None
    return ErrorModel(fmt, acc, KERNELS[kernel], kind, accumulation_default=default,
                      flush=subnormals == "flush", weights=wfmt)


def linear_error_bound(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    *,
    y: np.ndarray,
    model: ErrorModel | None = None,
    dx: np.ndarray | None = None,
    fmt: FloatFormat | None = None,
    acc: FloatFormat | None = None,
) -> np.ndarray:
    """Bound on ``|fl(x Wᵀ + b) − (x Wᵀ + b)|`` (torch layout, W (out, in)), the result
    stored in the output dtype: ``g (|x||W|ᵀ + |b|) + |dx||W|ᵀ (1 + g) + u|y| + η``
    with g = γ(in + 1) in the worst case, min(γ, γ̃) in the probabilistic model.

    >>> import numpy as np
    >>> x, w = np.ones((1, 3)), np.ones((2, 3))
    >>> bool(np.all(linear_error_bound(x, w, None, y=x @ w.T,
    ...                                model=error_model("float32")) < 1e-5))
    True
    """
    if model is None:           # formats given (the backward model): the worst case
        if fmt is None:
            raise SpecError("linear_error_bound needs model= or fmt= (and acc=)")
        model = ErrorModel(format_of(fmt), format_of(acc if acc is not None else fmt),
                           kind="worst_case")
    n_in = x.shape[-1]
    g = float(model.gamma_sum(n_in + 1))
    aw = np.abs(w)
    t = np.abs(x) @ aw.T
    if b is not None:
        t = t + np.abs(b)
    bound = g * t + model.u * (1.0 + g) * np.abs(y) + model.eta \
        + model.eta_a * 2 * (n_in + 1)
    if dx is not None:
        bound = bound + (dx @ aw.T) * (1.0 + g)
    return np.asarray(bound, dtype=np.float64)
