"""The attention variants kernels ship, and their exact semantics.

This module validates the variant options of :func:`reference_attention` and turns
them into exact mathematical objects: which keys each query may see (an *allowed*
mask) and what is added to or done with each scaled score.  The computation itself
is in :mod:`.variant_forward` (lowering to plain attention, or the transformed-score
path of :mod:`.transformed`).

The exact result, for query ``i`` of flat problem ``f`` (batch ``b``, head ``h``)
and key ``j``, with ``off = 0`` (``causal_alignment="top_left"``) or ``off = S - L``
("bottom_right", FlashAttention's alignment)::

    s⁰_ij = c · q_i·k_j                      c = scale (exact; None = 1/sqrt(E))
    s¹_ij = C · tanh(s⁰_ij / C)              softcap=C          (else s¹ = s⁰)
    s²_ij = score_mod items in order         each a softcap or an added exact bias
    s_ij  = s²_ij - slope_bh·|j - (i + off)| + M_ij     alibi_slopes, float attn_mask
    keep_ij = bool mask ∧ (M_ij ≠ -inf) ∧ causal ∧ window ∧ mask_mod ∧ block mask
    y_i   = Σ_{j kept} e^{s_ij} v_j / (Σ_{j kept} e^{s_ij} + e^{σ_h})    sinks=σ

Sources of each convention (read in this session; docs/variants.md quotes them):

* window — FlashAttention ``flash_attn_interface.flash_attn_func``: "Query at position
  i will only attend to keys between [i + seqlen_k - seqlen_q - window_size[0], i +
  seqlen_k - seqlen_q + window_size[1]] inclusive", -1 = unbounded, and
  ``tests/test_flash_attn.py::construct_local_mask``.  FlashAttention aligns the
  window bottom-right; here it follows ``causal_alignment`` (pass "bottom_right"
  to match FlashAttention when L ≠ S).  ``is_causal`` caps the right edge at 0
  (``attention_ref``: ``if causal: window_size = (window_size[0], 0)``).
* softcap — FlashAttention ``attention_ref``: ``scores = tanh(scores / softcap) *
  softcap`` after the scale, before the masks and before ``attn_bias``; 0 = off.
* ALiBi — ``flash_attn_func``: "A bias of (-alibi_slope * |i + seqlen_k - seqlen_q -
  j|) is added to the attention score", slopes (nheads,) or (batch, nheads); in
  ``attention_ref`` it is added after the softcap.  With ``causal=True``
  FlashAttention's test reference adds ``-slope · (S - 1 - j)`` instead, which
  differs from ``-slope·|i + S - L - j|`` on every kept key of row i by the row
  constant ``slope · (L - 1 - i)``: softmax cancels it, so outputs and weights are
  identical (proved in docs/variants.md; tested).
* sinks — gpt-oss ``sdpa``: ``QK = cat([QK, S], -1); W = softmax(QK); W = W[..., :-1]``:
  a per-head logit in the denominator only.  A row whose keys are all masked then
  puts all its weight on the sink: its output is exactly 0 (the ``masked_rows``
  policy only applies without sinks).
* mask_mod — FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = the
  key takes part); a ``BlockMask`` as its kernel uses it: keys in blocks it does not
  list are masked, full blocks are kept without calling mask_mod.
* FP8 descale — FlashAttention-3 ``hopper/flash_attn_interface.py``: ``q_descale``,
  ``k_descale``, ``v_descale`` of shape (batch, nheads_k), the query heads of a GQA
  group sharing their kv head's factor (``hopper/test_util.py::attention_ref``):
  the exact inputs are q·dq, k·dk, v·dv.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import ShapeError, SpecError
from ..arith.dd import two_prod
from ..inputs import as_exact_array, to_float64, validate_finite

__all__ = ["Bias", "Cap", "Geometry", "float_array", "sequence_row"]

#: Most calls a mask_mod gets one element at a time (when it cannot take arrays).
MASK_MOD_LOOP_LIMIT = 1 << 20
#: Positions at which a vectorised mask_mod is re-evaluated one at a time, as a
#: check that it is elementwise (a mask_mod using max() or .sum() is not).
MASK_MOD_SPOT_CHECKS = 64


# --------------------------------------------------------------------------------------
# The geometry of one call: flat problems f = (outer batch index, head)


@dataclass(frozen=True)
class Geometry:
    """Leading dims ``batch`` (the head axis last when there is one), ``heads`` H,
    ``outer`` the dims before the head axis, L, S and the alignment offset."""

    batch: tuple[int, ...]
    heads: int
    L: int
    S: int
    offset: int

    @property
    def outer(self) -> tuple[int, ...]:
        return self.batch[:-1] if self.batch else ()

    @property
    def n_outer(self) -> int:
        return math.prod(self.outer)

    @property
    def B(self) -> int:
        return math.prod(self.batch)

    def relative(self) -> np.ndarray[Any, Any]:
        """d_ij = j - (i + off): the key's position relative to the aligned query."""
        return np.arange(self.S)[None, :] - (np.arange(self.L)[:, None] + self.offset)


def per_problem(arr: np.ndarray[Any, Any], geo: Geometry, name: str,
                heads: int | None = None) -> np.ndarray[Any, Any]:
    """``arr`` of shape (H,), (outer..., H) or anything broadcasting to it, as a flat
    (n_outer, H) array (H = ``heads`` or the query heads)."""
    H = geo.heads if heads is None else heads
    target = (*geo.outer, H)
    try:
        out = np.broadcast_to(arr, target)
    except ValueError:
        raise ShapeError(f"{name}.shape={arr.shape} does not broadcast to (batch..., heads) "
                         f"= {target}") from None
    return out.reshape(geo.n_outer, H)


# --------------------------------------------------------------------------------------
# Allowed keys: window, causal, mask_mod, block mask


def window_allowed(window: tuple[int | None, int | None] | None, is_causal: bool,
                   geo: Geometry) -> np.ndarray[Any, Any] | None:
    """(L, S) keys within the window (and the causal limit), or None when all are.
    Key j is kept iff -left <= j - (i + off) <= right (FlashAttention's window_size)."""
    left, right = window if window is not None else (None, None)
    if is_causal:
        right = 0 if right is None else min(right, 0)
    if left is None and right is None:
        return None
    d = geo.relative()
    keep = np.ones((geo.L, geo.S), dtype=bool)
    if left is not None:
        keep &= d >= -left
    if right is not None:
        keep &= d <= right
    return keep


def _to_bool(res: Any, shape: tuple[int, ...], where: str) -> np.ndarray[Any, Any]:
    if (type(res).__module__ or "").startswith("torch"):
        res = res.detach().cpu().numpy()
    arr = np.asarray(res)
    if arr.dtype != np.bool_:
        raise SpecError(f"mask_mod returned dtype={arr.dtype} {where}: expected bool "
                        "(True = the key takes part)")
    try:
        return np.broadcast_to(arr, shape)
    except ValueError:
        raise SpecError(f"mask_mod returned shape={arr.shape} {where}: it does not "
                        f"broadcast to (B, H, L, S) = {shape}") from None


def _index_arrays(geo: Geometry, kind: str) -> tuple[Any, ...]:
    n, H, L, S = geo.n_outer, geo.heads, geo.L, geo.S
    idx = [np.arange(n).reshape(n, 1, 1, 1), np.arange(H).reshape(1, H, 1, 1),
           np.arange(L).reshape(1, 1, L, 1), np.arange(S).reshape(1, 1, 1, S)]
    if kind == "torch":
        import torch

        return tuple(torch.from_numpy(a) for a in idx)
    return tuple(idx)


def _scalar(x: int, kind: str) -> Any:
    if kind == "torch":
        import torch

        return torch.tensor(x)
    return np.int64(x)


def eval_mask_mod(mask_mod: Callable[..., Any], geo: Geometry) -> np.ndarray[Any, Any]:
    """mask_mod on every (b, h, q_idx, kv_idx), as a (n_outer, H, L, S) bool array.

    Vectorised first: called once with broadcasting integer index arrays (numpy,
    then torch tensors when torch is already imported), and spot-checked against
    calls on single indices of the same kind at MASK_MOD_SPOT_CHECKS random
    positions (a mask_mod that is not elementwise — using max() or .sum() — is
    caught there).  Otherwise a loop over Python ints, at most
    MASK_MOD_LOOP_LIMIT calls."""
    shape = (geo.n_outer, geo.heads, geo.L, geo.S)
    total = math.prod(shape)
    if total == 0:
        return np.zeros(shape, dtype=bool)
    kinds = ["numpy"] + (["torch"] if "torch" in sys.modules else [])
    failure = ""
    for kind in kinds:
        try:
            res = mask_mod(*_index_arrays(geo, kind))
        except Exception as exc:  # the user's code: any failure means "not vectorisable"
            failure = f"{type(exc).__name__}: {exc}"
            continue
        # a result of the wrong dtype or shape is the mask_mod's error, not a sign
        # that it needs scalars: _to_bool's SpecError propagates
        full = np.array(_to_bool(res, shape, f"on {kind} index arrays"))
        rng = np.random.default_rng(0)
        picks = rng.integers(0, total, size=min(MASK_MOD_SPOT_CHECKS, total))
        consistent = True
        for flat in picks.tolist():
            pos = np.unravel_index(flat, shape)
            try:
                one = mask_mod(*(_scalar(int(p), kind) for p in pos))
                val = _to_bool(one, (), f"at {tuple(int(p) for p in pos)}")
            except Exception:
                consistent = False
                break
            if bool(val) != bool(full[pos]):
                raise SpecError(
                    f"mask_mod is not elementwise: on index arrays it gives {bool(full[pos])} "
                    f"at (b, h, q_idx, kv_idx)={tuple(int(p) for p in pos)}, called on "
                    f"that element alone {bool(val)}"
                )
        if consistent:
            return full
    if total > MASK_MOD_LOOP_LIMIT:
        raise SpecError(
            f"mask_mod could not be evaluated on index arrays ({failure}) and calling it "
            f"element by element would take {total} calls (limit {MASK_MOD_LOOP_LIMIT})"
        )
    out = np.empty(shape, dtype=bool)
    for pos in np.ndindex(*shape):
        try:
            one = mask_mod(*(int(p) for p in pos))
        except Exception as exc:
            raise SpecError(f"mask_mod raised {type(exc).__name__} at (b, h, q_idx, kv_idx)="
                            f"{pos}: {exc}") from None
        out[pos] = bool(_to_bool(one, (), f"at {pos}"))
    return out


def _dense_blocks(num: Any, idx: Any, n_cols: int) -> np.ndarray[Any, Any]:
    """(..., rows, n_cols) bool from FlexAttention's (num_blocks, indices) layout."""
    num = num.detach().cpu().numpy()
    idx = idx.detach().cpu().numpy()
    cols = np.arange(idx.shape[-1])
    valid = cols < num[..., None]
    dense = np.zeros((*idx.shape[:-1], n_cols + 1), dtype=bool)
    where = np.where(valid, idx, n_cols)
    np.put_along_axis(dense, where.astype(np.int64), True, axis=-1)
    return dense[..., :n_cols]


def block_mask_allowed(bm: Any, geo: Geometry) -> np.ndarray[Any, Any]:
    """A torch BlockMask as the (n_outer, H, L, S) keys its kernel attends to."""
    q_len, kv_len = (int(x) for x in bm.seq_lengths)
    if (q_len, kv_len) != (geo.L, geo.S):
        raise ShapeError(f"mask_mod (a BlockMask) has seq_lengths={(q_len, kv_len)}, but "
                         f"(L, S) = {(geo.L, geo.S)}")
    qb, kb = (int(x) for x in (bm.BLOCK_SIZE if isinstance(bm.BLOCK_SIZE, tuple)
                               else (bm.BLOCK_SIZE, bm.BLOCK_SIZE)))
    n_kb = -(-geo.S // kb)
    partial = _dense_blocks(bm.kv_num_blocks, bm.kv_indices, n_kb)
    full = (_dense_blocks(bm.full_kv_num_blocks, bm.full_kv_indices, n_kb)
            if bm.full_kv_num_blocks is not None else np.zeros_like(partial))
    shape = (geo.n_outer, geo.heads)
    try:
        partial = np.broadcast_to(partial, (*shape, *partial.shape[-2:]))
        full = np.broadcast_to(full, (*shape, *full.shape[-2:]))
    except ValueError:
        raise ShapeError(f"mask_mod (a BlockMask) has shape={tuple(bm.shape)}, which does not "
                         f"broadcast to (B, H) = {shape}") from None
    rows = np.arange(geo.L) // qb
    cols = np.arange(geo.S) // kb
    full_e = full[:, :, rows][:, :, :, cols]
    part_e = partial[:, :, rows][:, :, :, cols]
    out = full_e.copy()
    if part_e.any():
        out |= part_e & eval_mask_mod(bm.mask_mod, geo)
    return out


# --------------------------------------------------------------------------------------
# The score pipeline: softcaps and exact additive biases


@dataclass(frozen=True)
class Cap:
    """s -> C · tanh(s / C), C an exact positive double."""

    C: float


@dataclass(frozen=True)
class Bias:
    """s -> s + bias; ``kind`` "alibi" (-slope·|d|, slopes (n_outer, H)) or "table"
    (table[h, clip(d, -W, W) + W], table (H or 1, 2W + 1)), d = j - (i + offset).
    ``offset``: one for the call, or an int array (n_outer,) of each batch element's own
    query offset (a KV cache's ``cache_seqlens[b] - L``: the ``own_positions`` hook)."""

    kind: str
    data: np.ndarray[Any, Any]
    offset: Any

    @property
    def per_sequence(self) -> bool:
        """Whether the offset differs by batch element (an array)."""
        return np.ndim(self.offset) > 0

    def offset_of(self, f: int, heads: int) -> int:
        """The query offset of flat problem ``f``."""
        return int(self.offset[f // heads]) if self.per_sequence else int(self.offset)

    def _rel(self, geo: Geometry, fs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """d = j - (i + offset): (L, S), or (len(fs), L, S) with per-sequence offsets."""
        base = np.arange(geo.S)[None, :] - np.arange(geo.L)[:, None]
        if not self.per_sequence:
            return base - int(self.offset)
        offs = np.asarray(self.offset, dtype=np.int64)[fs // geo.heads]
        return base[None] - offs[:, None, None]

    def floats(self, geo: Geometry, flat: range, rows: slice | None = None
               ) -> tuple[np.ndarray[Any, Any], bool]:
        """(values (len(flat), L, S) float64, exact) — exact is True when every value is
        the exact bias (ALiBi: slope·|d| is a double when the product needs <= 53 bits);
        ``rows`` (a slice of the query rows): those rows only."""
        fs = np.asarray(flat)
        d = self._rel(geo, fs)
        if rows is not None:
            d = d[..., rows, :]
        h = fs % geo.heads
        if self.kind == "alibi":
            slope = self.data[fs // geo.heads, h]
            absd = np.abs(d).astype(np.float64)
            val = -(slope[:, None, None] * (absd if absd.ndim == 3 else absd[None]))
            # exactness on the distinct factors only: |d| takes the values 0 … max|d|
            dist = np.arange(int(absd.max(initial=0.0)) + 1, dtype=np.float64)
            uniq = np.unique(slope)
            prod = uniq[:, None] * dist[None, :]
            return val, products_exact(uniq[:, None], dist[None, :], prod)
        w = (self.data.shape[-1] - 1) // 2
        col = np.clip(d, -w, w) + w
        tab = self.data[h if self.data.shape[0] > 1 else np.zeros_like(h)]
        if col.ndim == 3:
            return np.take_along_axis(tab[:, None, :], col.reshape(len(fs), 1, -1),
                                      axis=-1).reshape(col.shape), True
        return tab[:, col], True

    def floats_min(self, geo: Geometry) -> tuple[np.ndarray[Any, Any], bool]:
        """(values, exact) as :meth:`floats`, in the smallest shape that broadcasts to
        (*batch, L, S): (H, L, S) when every batch element has the same data (the
        common case: slopes (H,), one table), else (*outer, H, L, S)."""
        H = geo.heads
        if geo.B == 0:
            return np.zeros((*geo.batch, geo.L, geo.S)), True
        same = self.data.shape[0] == 1 or bool(np.all(self.data == self.data[:1]))
        if (self.kind == "table" or same) and not self.per_sequence:
            vals, ok = self.floats(geo, range(H))
            if not geo.batch:
                return vals.reshape(geo.L, geo.S), ok
            return vals.reshape(H, geo.L, geo.S), ok
        vals, ok = self.floats(geo, range(geo.B))
        return vals.reshape(*geo.batch, geo.L, geo.S), ok

    def exact(self, geo: Geometry, f: int, i: int, j: int) -> Fraction:
        d = j - (i + self.offset_of(f, geo.heads))
        h = f % geo.heads
        if self.kind == "alibi":
            return -Fraction(float(self.data[f // geo.heads, h])) * abs(d)
        w = (self.data.shape[-1] - 1) // 2
        row = self.data[h if self.data.shape[0] > 1 else 0]
        return Fraction(float(row[min(max(d, -w), w) + w]))


def products_exact(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any],
                    p: np.ndarray[Any, Any]) -> bool:
    """Is every float64 product p = fl(a·b) exact?  TwoProduct (Dekker, Veltkamp split)
    gives the exact error when no partial product under- or overflows, which holds
    for |a|, |b| in [2**-450, 2**450] (or 0)."""

    for x in (a, b):
        ax = np.abs(x[x != 0])
        if ax.size and (ax.min() < 2.0**-450 or ax.max() > 2.0**450):
            return False
    aa, bb = np.broadcast_arrays(a, b)
    prod, err = two_prod(aa, bb)
    return bool(np.all(err == 0) and np.all(prod == np.broadcast_to(p, aa.shape)))


def _outer_heads(slopes: np.ndarray[Any, Any], geo: Geometry) -> np.ndarray[Any, Any]:
    """(B, H) slopes of a score_mod: B must be the outer batch (flattened)."""
    if slopes.shape != (geo.n_outer, geo.heads):
        raise ShapeError(f"score_mod slopes.shape={slopes.shape}: expected (H,) or "
                         f"(B, H) = {(geo.n_outer, geo.heads)}")
    return slopes


def float_array(x: Any, name: str) -> np.ndarray[Any, Any]:
    """A variant's float array option: exact, finite, not bool (float64 copy)."""
    arr = as_exact_array(x, name)
    if arr.dtype == bool:
        raise SpecError(f"{name}.dtype=bool: expected a float array")
    validate_finite(arr, name)
    return to_float64(arr)


def sequence_row(arr: np.ndarray[Any, Any], b: int, n: int, name: str,
                 what: str) -> np.ndarray[Any, Any]:
    """Sequence b's row of a per-batch parameter of a packed varlen call: ``arr`` of
    shape (width,) is shared by the n sequences, (n, width) gives row b."""
    if arr.ndim == 1:
        return arr
    if arr.ndim != 2 or arr.shape[0] != n:
        raise ShapeError(f"{name}.shape={arr.shape}: expected ({what},) or (batch, {what}) "
                         f"with batch = {n} sequences")
    return arr[b]
