"""Conventions of scaled dot-product attention, as torch SDPA states them, and the
*score model* the tiers share.

* the scale (``None`` = exactly 1/sqrt(E), a float is its exact value, 0 is zero),
  as an exact rational when it is one and as a double-double with an error bound;
* masks: bool True = takes part, float added (-inf = excluded), integer refused;
  causal alignment; fully masked rows (zero, nan, error, uniform); dropout with
  an explicit keep mask.  :class:`ScoreModel` hands them out **block by block**
  (a stack element ``c`` and a range of query rows), never materialising the
  (batch, L, S) arrays, so every tier works in memory O(block).

Variants never reach the tiers by name: a variant (docs/variants.md, "Adding a
variant"; :mod:`.variants.protocol`) is lowered to the pieces a :class:`Block`
already carries — kept keys in ``allowed``, exact biases in ``madd``, sinks as one
extra key — or, for scores that are not exact doubles (softcap), handed to the
transformed-score tiers of :mod:`.variants.transformed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import InputValueError, ShapeError, SpecError
from .arith.constants import ETA, UP, U
from .inputs import as_exact_array, to_float64, validate_finite

POLICIES = ("zero", "nan", "error", "uniform")
ALIGNMENTS = ("top_left", "bottom_right")


Array = np.ndarray[Any, Any]


def check_options(masked_rows: str, causal_alignment: str) -> None:
    """The masked-row policy and the causal alignment are among the known ones."""
    if masked_rows not in POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {POLICIES}")
    if causal_alignment not in ALIGNMENTS:
        raise SpecError(f"causal_alignment={causal_alignment!r}: expected one of {ALIGNMENTS}")


def check_sdpa_inputs(query: Any, key: Any, value: Any, enable_gqa: bool
                      ) -> tuple[Array, Array, Array, tuple[int, ...], int]:
    """query, key, value of SDPA read exactly and checked (float, finite, at least 2-D,
    E and S agree, GQA head counts): (q, k, v, batch shape, GQA repeat).  Shared by
    the forward and the backward."""
    q = as_exact_array(query, "query")
    k = as_exact_array(key, "key")
    v = as_exact_array(value, "value")
    for name, arr in (("query", q), ("key", k), ("value", v)):
        if arr.dtype == bool:
            raise SpecError(f"{name}.dtype=bool: expected a float array")
        if arr.ndim < 2:
            raise ShapeError(f"{name}.shape={arr.shape}: expected at least 2 dimensions (..., L, E)")
        validate_finite(arr, name)
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(
            f"key.shape={k.shape} does not match query.shape={q.shape}: "
            f"E must agree ({q.shape[-1]} vs {k.shape[-1]})"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(
            f"value.shape={v.shape} does not match key.shape={k.shape}: "
            f"S must agree ({k.shape[-2]} vs {v.shape[-2]})"
        )
    rep = 1
    if enable_gqa:
        if min(q.ndim, k.ndim, v.ndim) < 3:
            raise ShapeError(
                f"query.shape={q.shape}, key.shape={k.shape}, value.shape={v.shape}: with "
                "enable_gqa=True every input needs a head dimension (..., H, L, E), as in "
                "torch's scaled_dot_product_attention"
            )
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk != hv:
            raise ShapeError(f"value.shape={v.shape} does not match key.shape={k.shape}: "
                             f"H_kv must agree ({hk} vs {hv})")
        if hk == 0 or hq % hk:
            raise ShapeError(
                f"query.shape={q.shape}, key.shape={k.shape}: with enable_gqa=True H_q must "
                f"be a multiple of H_kv ({hq} vs {hk})"
            )
        rep = hq // hk
    try:
        if rep > 1:
            kb = (*k.shape[:-3], k.shape[-3] * rep)
            vb = (*v.shape[:-3], v.shape[-3] * rep)
        else:
            kb, vb = k.shape[:-2], v.shape[:-2]
        batch = tuple(np.broadcast_shapes(q.shape[:-2], kb, vb))
        if rep > 1 and batch[-1] != q.shape[-3]:
            raise ValueError
    except ValueError:
        hint = ""
        if q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3] and not enable_gqa:
            hint = f" (H_q={q.shape[-3]} != H_kv={k.shape[-3]}: pass enable_gqa=True for GQA)"
        raise ShapeError(
            f"query.shape={q.shape}, key.shape={k.shape}, value.shape={v.shape}: the "
            f"leading (batch, head) dimensions do not broadcast{hint}"
        ) from None
    return q, k, v, batch, rep


def check_dropout(dropout_p: Any, dropout_mask: Any) -> float:
    """dropout_p as a float in [0, 1); a positive p needs the keep mask that was used."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.floating,
                                                                  np.integer)):
        raise SpecError(f"dropout_p={dropout_p!r}: expected a number in [0, 1)")
    p = float(dropout_p)
    if not (0.0 <= p < 1.0):
        raise SpecError(f"dropout_p={dropout_p!r}: expected a number in [0, 1)")
    if p > 0 and dropout_mask is None:
        raise SpecError(
            f"dropout_p={dropout_p!r} without dropout_mask: dropout is random, so the "
            "oracle needs the keep mask that was used (dropout_mask=, True = kept)"
        )
    return p


def exact_scale(scale: Any, E: int) -> tuple[Fraction | None, float, float]:
    """(exact rational scale or None for 1/sqrt(E), c_f, rho_c) with |c - c_f| <= rho_c."""
    if scale is None:
        if E == 0:
            return None, 0.0, 0.0
        rt = math.isqrt(E)
        if rt * rt == E:
            c = Fraction(1, rt)
            c_f = float(c)  # correctly rounded
            return None, c_f, abs(float(c - Fraction(c_f))) * UP + (0.0 if c == c_f else ETA)
        c_f = 1.0 / math.sqrt(E)  # sqrt and division each round: |c - c_f| <= 2.01u c_f
        return None, c_f, 2.01 * U * c_f * UP + ETA
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise SpecError(f"scale={scale!r}: expected None or a real number")
    if isinstance(scale, (int, np.integer)) and abs(int(scale)) > 2**53:
        raise SpecError(f"scale={scale!r} is too large to be held exactly as a float")
    sf = float(scale)
    if not math.isfinite(sf):
        raise InputValueError(f"scale={scale!r}: expected a finite number")
    return Fraction(sf), sf, 0.0


def rational_scale(scale: Fraction | None, E: int) -> Fraction | None:
    """The scale as an exact rational (``scale`` from :func:`exact_scale`), or None when
    it is 1/sqrt(E) with E not a perfect square (irrational)."""
    if scale is not None:
        return scale
    if E == 0:
        return Fraction(0)
    rt = math.isqrt(E)
    return Fraction(1, rt) if rt * rt == E else None


@dataclass(frozen=True)
class DDScale:
    """The scale as ``2**e · (hi + lo)`` with ``1 <= |hi| < 2`` (or zero) and
    ``|c·2**-e - hi - lo| <= rho``: a float scale is exact (lo = rho = 0); 1/sqrt(E)
    comes from an integer square root at 160+ bits, so rho < 2**-150."""

    hi: float
    lo: float
    e: int
    rho: float


def dd_scale(scale_exact: Fraction | None, E: int) -> DDScale:
    """The scale of :func:`exact_scale` as a :class:`DDScale`."""
    if scale_exact is None and E == 0:
        scale_exact = Fraction(0)
    if scale_exact is not None:
        if scale_exact == 0:
            return DDScale(0.0, 0.0, 0, 0.0)
        m, e = math.frexp(float(scale_exact))  # a float scale: exact double
        if Fraction(float(scale_exact)) == scale_exact:
            return DDScale(2 * m, 0.0, e - 1, 0.0)
        value = scale_exact  # a rational 1/rt (perfect-square E)
    else:
        rt = math.isqrt(E)
        if rt * rt == E:
            value = Fraction(1, rt)
        else:
            # floor(sqrt(2**2P / E)) = isqrt(2**2P // E): c·2**P lies in [N, N + 1)
            P = 160 + E.bit_length()
            N = math.isqrt((1 << (2 * P)) // E)
            value = Fraction(N, 1 << P)
            e_lo = Fraction(1, 1 << P)
            return _dd_of(value, extra=e_lo)
    return _dd_of(value, extra=Fraction(0))


def _dd_of(value: Fraction, extra: Fraction) -> DDScale:
    """hi + lo for value·2**-e (1 <= value·2**-e < 2), rho covering the rounding of lo
    and an additional known error ``extra`` (in value's units)."""
    _, e = math.frexp(float(value))
    e -= 1
    mant = value / Fraction(2) ** e
    if mant >= 2:  # float(value) rounded up to a power of two
        e += 1
        mant /= 2
    hi = float(mant)
    lo = float(mant - Fraction(hi))
    rest = abs(mant - Fraction(hi) - Fraction(lo)) + extra / Fraction(2) ** e
    rho = float(rest) * 2 + 2.0**-1000 if rest else 0.0
    return DDScale(hi, lo, e, rho)


def check_mask_dtype(m: np.ndarray[Any, Any], name: str) -> None:
    """Refuse integer masks (torch refuses them too: a 0/1 integer mask is ambiguous
    between 'keep' flags and additive scores)."""
    if m.dtype.kind in "iu":
        raise SpecError(
            f"{name}.dtype={m.dtype}: integer masks are ambiguous; pass a bool mask "
            "(True = takes part) or a float mask (added to the scores, -inf = excluded)"
        )


def read_mask(x: Any, name: str) -> np.ndarray[Any, Any]:
    """A mask as an exact array, integer masks refused (before any conversion)."""
    module = type(x).__module__ or ""
    if module.startswith("torch"):
        text = str(getattr(x, "dtype", ""))
        if any(k in text for k in ("int", "uint")) and "bool" not in text:
            raise SpecError(
                f"{name}.dtype={text}: integer masks are ambiguous; pass a bool mask "
                "(True = takes part) or a float mask (added to the scores, -inf = excluded)"
            )
    raw = x if isinstance(x, np.ndarray) else None
    if raw is None and not module.startswith("torch"):
        try:
            raw = np.asarray(x)
        except (ValueError, TypeError):
            raw = None
    if raw is not None:
        check_mask_dtype(raw, name)
    return as_exact_array(x, name)


@dataclass
class Block:
    """Score model of rows ``i0:i1`` of stack element ``c`` (all ``S`` keys).

    ``allowed`` (r, S) bool or None (all keys); ``madd`` (r, S) float64 exact
    additive mask (0 where not allowed) or None; ``keep`` (r, S) bool dropout keep
    mask or None; ``uniform`` (r,) bool or None: rows that take uniform weights over
    all keys (``masked_rows="uniform"``: their scores are 0, every key allowed)."""

    allowed: np.ndarray[Any, Any] | None
    madd: np.ndarray[Any, Any] | None
    keep: np.ndarray[Any, Any] | None
    uniform: np.ndarray[Any, Any] | None


def concat_blocks(blocks: list[Block], sizes: list[int], S: int) -> Block:
    """The rows of several blocks (``sizes[n]`` rows of S keys in ``blocks[n]``) as one
    block: a field that is None in some blocks takes its meaning there explicitly
    (every key allowed, mask 0, every key kept, no uniform row); None where it is None
    in all.

    >>> b = concat_blocks([Block(None, None, None, None),
    ...                    Block(np.array([[True, False]]), None, None, None)], [1, 1], 2)
    >>> b.allowed.tolist(), b.madd
    ([[True, True], [True, False]], None)
    """
    def cat(field: str, fill: Any, dtype: Any, per_key: bool) -> Any:
        parts = [getattr(b, field) for b in blocks]
        if all(p is None for p in parts):
            return None
        return np.concatenate([
            np.full((n, S) if per_key else (n,), fill, dtype=dtype) if p is None else p
            for p, n in zip(parts, sizes, strict=True)])

    return Block(cat("allowed", True, bool, True), cat("madd", 0.0, np.float64, True),
                 cat("keep", True, bool, True), cat("uniform", False, bool, False))


class ScoreModel:
    """Masks, causal alignment, masked-row policy and dropout of a stack of
    attention problems with batch shape ``batch`` (flattened to ``c``), handed out
    block by block.  The (batch, L, S) arrays are never built: user masks are kept
    as broadcast views and indexed per block."""

    def __init__(self, batch: tuple[int, ...], L: int, S: int, *, attn_mask: Any = None,
                 masks: tuple[np.ndarray[Any, Any], ...] = (), is_causal: bool = False,
                 causal_alignment: str = "top_left", policy: str = "zero",
                 dropout_mask: Any = None, dropout_p: float = 0.0) -> None:
        """``attn_mask``: a user's SDPA mask (validated here); ``masks``: already
        validated arrays broadcastable to (batch..., L, S), bool (True = takes part)
        or float64 (added, -inf = excluded); at most one float mask in all."""
        self.batch, self.L, self.S = batch, L, S
        self.policy = policy
        self.causal_offset: int | None = None
        if is_causal:
            self.causal_offset = 0 if causal_alignment == "top_left" else S - L
        target = (*batch, L, S)
        all_masks = list(masks)
        if attn_mask is not None:
            m = read_mask(attn_mask, "attn_mask")
            self._check_shape(m, "attn_mask", target)
            if m.dtype != bool:
                validate_finite(m, "attn_mask", allow_neg_inf=True)
                m = to_float64(m)
            all_masks.append(m)
        self._bools = [np.broadcast_to(m, target) for m in all_masks if m.dtype == bool]
        floats = [np.broadcast_to(m, target) for m in all_masks if m.dtype != bool]
        if len(floats) > 1:  # pragma: no cover - callers refuse this with a clear message
            raise SpecError("at most one float mask can be combined exactly")
        self._float = floats[0] if floats else None
        self._keep: np.ndarray[Any, Any] | None = None
        self.dropout_factor: Fraction | None = None  # 1/(1 - p), exactly
        self.dropout_p = float(dropout_p)
        if dropout_mask is not None:
            k = read_mask(dropout_mask, "dropout_mask")
            if k.dtype != bool:
                raise SpecError(f"dropout_mask.dtype={k.dtype}: expected a bool keep mask "
                                "(True = kept)")
            self._check_shape(k, "dropout_mask", target)
            self._keep = np.broadcast_to(k, target)
            self.dropout_factor = 1 / (1 - Fraction(self.dropout_p))
        self._empty: np.ndarray[Any, Any] | None = None

    @staticmethod
    def _check_shape(m: np.ndarray[Any, Any], name: str, target: tuple[int, ...]) -> None:
        try:
            if np.broadcast_shapes(m.shape, target) != target:
                raise ValueError
        except ValueError:
            raise ShapeError(
                f"{name}.shape={m.shape} does not broadcast to the scores' shape "
                f"{target} (batch..., L, S)"
            ) from None

    @property
    def B(self) -> int:
        return math.prod(self.batch)

    @property
    def trivial(self) -> bool:
        """No mask, no causal mask and no dropout: every key of every row takes part."""
        return (not self._bools and self._float is None and self.causal_offset is None
                and self._keep is None)

    def _index(self, c: int) -> tuple[int, ...]:
        return tuple(int(x) for x in np.unravel_index(c, self.batch)) if self.batch else ()

    @staticmethod
    def _rows(rows: Any) -> np.ndarray[Any, Any]:
        if isinstance(rows, slice):
            return np.arange(rows.start, rows.stop)
        return np.asarray(rows, dtype=np.int64)

    def raw_allowed(self, c: int, rows: Any) -> np.ndarray[Any, Any] | None:
        """Allowed keys of ``rows`` (a slice or index array) before the masked-row
        policy (None: all)."""
        allowed = None
        idx = self._index(c)
        for m in self._bools:
            view = m[idx][rows]
            allowed = np.array(view, dtype=bool) if allowed is None else allowed & view
        if self._float is not None:
            fin = self._float[idx][rows] != -np.inf
            allowed = fin if allowed is None else allowed & fin
        if self.causal_offset is not None:
            ri = self._rows(rows)
            causal = np.arange(self.S)[None, :] <= (ri[:, None] + self.causal_offset)
            allowed = causal if allowed is None else allowed & causal
        return allowed

    def empty_rows(self) -> np.ndarray[Any, Any]:
        """(B, L) bool: rows with no allowed key (computed block by block, cached)."""
        if self._empty is None:
            B, L, S = self.B, self.L, self.S
            empty = np.zeros((B, L), dtype=bool)
            if S == 0:
                empty[:] = True
            elif not self.trivial:
                step = max(1, (1 << 20) // max(1, S))
                for c in range(B):
                    for i0 in range(0, L, step):
                        i1 = min(L, i0 + step)
                        al = self.raw_allowed(c, slice(i0, i1))
                        if al is not None:
                            empty[c, i0:i1] = ~al.any(axis=-1)
            self._empty = empty
        return self._empty

    def block(self, c: int, rows: Any) -> Block:
        """The score model of ``rows`` (a slice or an index array) of stack element c."""
        allowed = self.raw_allowed(c, rows)
        madd = None
        if self._float is not None:
            view = self._float[self._index(c)][rows]
            madd = np.where(view == -np.inf, 0.0, view)
        uniform: np.ndarray[Any, Any] | None = None
        if self.policy == "uniform" and allowed is not None:
            uni = np.asarray(~allowed.any(axis=-1))
            if uni.any():
                uniform = uni
                allowed = allowed.copy()
                allowed[uni] = True
                if madd is not None:
                    madd[uni] = 0.0
        keep = None
        if self._keep is not None:
            keep = np.ascontiguousarray(self._keep[self._index(c)][rows])
        if allowed is not None and allowed.all():
            allowed = None
        return Block(allowed, madd, keep, uniform)


@dataclass(frozen=True)
class MaskedRows:
    """What the fully-masked-row policy makes of the rows with no key (``empty``):
    rows whose output is exactly 0 (``zero``), NaN (``nan``), or computed with uniform
    weights over all keys (``uniform``, JAX: scores taken as 0, the output the mean of
    the values; only when S > 0).  "error" raises for the first empty row."""

    zero: np.ndarray[Any, Any]
    nan: np.ndarray[Any, Any]
    uniform: np.ndarray[Any, Any]


def masked_rows_of(policy: str, empty: np.ndarray[Any, Any], S: int,
                   batch: tuple[int, ...] = (), what: str = "attn_mask/is_causal",
                   check: bool = True) -> MaskedRows:
    """The one reading of ``masked_rows`` (:data:`POLICIES`) for rows ``empty``
    (flat problems × L, ``batch`` the leading shape for the error message).
    ``check=False`` (the testing side's float64 evaluations of buggy variants, whose
    empty rows the call itself may not have) reads "error" as "zero" instead of raising.

    >>> import numpy as np
    >>> r = masked_rows_of("uniform", np.array([[True, False]]), 3, (1,))
    >>> r.uniform.tolist(), r.zero.tolist()
    ([[True, False]], [[False, False]])
    """
    none = np.zeros_like(empty)
    if policy == "error" and not check:
        policy = "zero"
    if policy == "error" and empty.any():
        b, i = np.argwhere(empty)[0].tolist()  # empty is (flat problems, L)
        where = (*tuple(int(x) for x in np.unravel_index(b, batch)), i) if batch else (i,)
        by = f" ({what})" if what else ""
        raise InputValueError(f"query row {where} has every key masked out{by} and "
                              "masked_rows='error'")
    uniform = empty & (S > 0) if policy == "uniform" else none
    zero = (empty if policy == "zero" else empty & (S == 0) if policy == "uniform"
            else none)
    return MaskedRows(zero=zero, nan=empty if policy == "nan" else none, uniform=uniform)
