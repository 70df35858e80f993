"""Certified scaled dot-product attention: :func:`reference_attention`.

Method (proofs in docs/oracle.md and in the comments of each module):

1. :mod:`.fast` computes every output in float64 with a proved error bound.
2. An element whose enclosure does not round to a single value in the target
   format is recomputed with Arb balls (:mod:`.arb`), raising the precision
   until the ball rounds to one value (Ziv's strategy, capped; :mod:`.enclosure`).
3. A true value exactly on a rounding boundary must be a dyadic rational; by
   the Lindemann–Weierstrass theorem an attention output is rational only when
   every group of keys with equal scores has the same mean value, so that case
   is detected and decided in exact rational arithmetic (``rational_row``).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import InputValueError, ShapeError, SpecError
from .arb import Prec, arb_attention_rows, dd_dot_balls, to_arb_mat
from .constants import CHUNK_ELEMS
from .conventions import ALIGNMENTS, POLICIES, exact_scale, prepare_mask
from .enclosure import Enclosure, Problem
from .fast import fast_attention
from .inputs import as_exact_array, to_float64, validate_finite

__all__ = ["reference_attention"]


class _AttentionProblem(Problem):
    def __init__(self, q: Any, k: Any, v: Any, allowed: Any, madd: Any,
                 scale: Fraction | None, E: int) -> None:
        self.q, self.k, self.v = q, k, v
        self.allowed, self.madd = allowed, madd
        self.scale = scale  # exact rational scale, or None for 1/sqrt(E)
        self.E = E
        self._kv_key = -1
        self._km: Any = None
        self.exact_products = False  # set when q and k have <= 26-bit significands

    def scale_arb(self) -> Any:
        from flint import arb

        if self.scale is not None:
            # a float scale is dyadic: numerator / 2**k is exact in Arb
            return arb(self.scale.numerator) / arb(self.scale.denominator)
        if self.E == 0:
            return arb(0)
        return arb(self.E).rsqrt()

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import ctx

        old = ctx.prec
        ctx.prec = prec
        try:
            vb = self.v[b] if cols is None or kind != "output" else self.v[b][:, cols]
            vm = to_arb_mat(vb)
            madd = self.madd[b][rows] if self.madd is not None else None
            allowed = np.asarray(self.allowed[b][rows])
            shift = self._shift_idx(b, rows, allowed, madd)
            qrows = self.q[b][rows]
            g_rows = None
            # few rows at a low precision: error-free dot products in numpy are
            # cheaper than converting all of K to Arb (ball radius ~ (2E)²u²)
            if prec <= 128 and self.E and len(rows) * self.k.shape[1] <= 1 << 14:
                g_rows = dd_dot_balls(qrows, self.k[b], self.exact_products)
            if g_rows is not None:
                return arb_attention_rows(to_arb_mat(np.zeros((len(rows), 0))), None, vm,
                                           self.scale_arb(), allowed, madd, kind, shift,
                                           g_rows)
            if self._kv_key != b:
                self._km = to_arb_mat(self.k[b])
                self._kv_key = b
            return arb_attention_rows(to_arb_mat(qrows), self._km, vm, self.scale_arb(),
                                       allowed, madd, kind, shift)
        finally:
            ctx.prec = old

    def _shift_idx(self, b: int, rows: list[int], allowed: Any, madd: Any) -> list[int] | None:
        """Per row, an allowed key whose float score is largest (None if floats fail)."""
        c_f = float(self.scale) if self.scale is not None else (
            1.0 / math.sqrt(self.E) if self.E else 0.0)
        with np.errstate(all="ignore"):
            sa = (self.q[b][rows] @ self.k[b].T) * c_f
            if madd is not None:
                sa = sa + madd
            sa = np.where(allowed, sa, -np.inf)
            if not np.all(np.isfinite(sa[allowed])):
                return None
        return [int(j) for j in np.argmax(sa, axis=-1)]

    def _c_rat(self) -> Fraction | None:
        """The scale as an exact rational, or None when it is 1/sqrt(E) irrational."""
        if self.scale is not None:
            return self.scale
        if self.E == 0:
            return Fraction(0)
        rt = math.isqrt(self.E)
        return Fraction(1, rt) if rt * rt == self.E else None

    def _groups(self, b: int, i: int) -> dict[Any, list[int]]:
        """Unmasked keys of row (b, i) grouped by exact score.  Key: the score as a
        Fraction when the scale is rational, else (q·k_j, M_j) — with c irrational,
        c·g + M = c·g' + M' iff g = g' and M = M'."""
        cache = self.__dict__.setdefault("_group_cache", {})
        if (b, i) in cache:
            return cache[(b, i)]
        allowed = np.asarray(self.allowed[b][i])
        qrow = [Fraction(float(x)) for x in self.q[b][i]]
        c_rat = self._c_rat()
        groups: dict[Any, list[int]] = {}
        for j in np.flatnonzero(allowed).tolist():
            g = sum((a * Fraction(float(x)) for a, x in zip(qrow, self.k[b][j], strict=True)),
                    Fraction(0))
            mj = Fraction(float(self.madd[b][i][j])) if self.madd is not None else Fraction(0)
            key: Any = c_rat * g + mj if c_rat is not None else (g, mj)
            groups.setdefault(key, []).append(j)
        if len(cache) > 4096:
            cache.clear()
        cache[(b, i)] = groups
        return groups

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction) -> int | None:
        """sign(y - boundary) for one element, decided without computing y to the
        precision of its distance from the boundary.

        With groups g of equal exact score a_g, n_g keys and value sums V_g,
        y - T = Σ_g e^{a_g} (V_g - n_g T) / Σ_g n_g e^{a_g}, so the sign is that of
        Σ_g e^{a_g - A} c_g with exact rationals c_g = V_g - n_g T (weights: c_g =
        [j in g] - n_g T).  Terms with c_g = 0 are exactly 0; the others are balls of
        full relative accuracy however small e^{a_g - A} is, so a score gap of 1e4
        (a factor e^-10000 that no fixed precision resolves in y itself) costs nothing.
        Returns 0 when every c_g is 0 (y = T exactly), None if undecided at 2**16 bits."""
        from flint import arb, fmpq

        groups = self._groups(b, i)
        coef = []
        for key, js in groups.items():
            if kind == "weights":
                val = Fraction(1 if col in js else 0)
            else:
                val = sum((Fraction(float(self.v[b][j][col])) for j in js), Fraction(0))
            coef.append((key, val - len(js) * boundary))
        if all(cg == 0 for _, cg in coef):
            return 0
        c_rat = self._c_rat()
        prec = 256
        while prec <= 1 << 16:
            with Prec(prec):
                c = self.scale_arb()
                terms = []
                for key, cg in coef:
                    if c_rat is not None:
                        a_g = arb(fmpq(key.numerator, key.denominator))
                    else:
                        g, mj = key
                        a_g = c * arb(fmpq(g.numerator, g.denominator)) + arb(
                            fmpq(mj.numerator, mj.denominator))
                    terms.append((a_g, cg))
                top = max(terms, key=lambda t: float(t[0].mid()))[0].mid()
                total = arb(0)
                for a_g, cg in terms:
                    if cg != 0:
                        total += (a_g - top).exp() * arb(fmpq(cg.numerator, cg.denominator))
                if total > 0:
                    return 1
                if total < 0:
                    return -1
            prec *= 4
        return None

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        """The exact row when it is rational, else None (see module docstring, 3.).

        Scores c·g_j + M_j with g_j = q_i·k_j exact rationals.  If c is rational,
        group keys by the exact score; if c = 1/sqrt(E) is irrational, two scores
        are equal iff their g and M agree.  Output column l is rational iff every
        group has the same mean of v[:, l] (Lindemann–Weierstrass: the e^{a_g} of
        distinct algebraic a_g are linearly independent over the algebraic numbers),
        and then equals that mean.  Weights are rational iff there is one group
        (then p_j = 1/n)."""
        allowed = np.asarray(self.allowed[b][i])
        idx = np.flatnonzero(allowed).tolist()
        if not idx:
            return None
        groups = self._groups(b, i)
        if kind == "weights":
            if len(groups) != 1:
                return None
            n = len(idx)
            return [Fraction(1, n) if a else Fraction(0) for a in allowed.tolist()]
        out: list[Fraction | None] = []
        for col in range(self.v.shape[-1]):
            means = {sum((Fraction(float(self.v[b][j][col])) for j in js), Fraction(0)) / len(js)
                     for js in groups.values()}
            out.append(next(iter(means)) if len(means) == 1 else None)
        return out




def reference_attention(
    query: Any, key: Any, value: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left",
    masked_rows: str = "zero", return_weights: bool = False,
    window: Any = None, softcap: float | None = None, alibi_slopes: Any = None,
    sinks: Any = None, mask_mod: Any = None, score_mod: Any = None,
    q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
) -> Enclosure:
    """Certified scaled dot-product attention of the exact input values.

    Named and shaped like ``torch.nn.functional.scaled_dot_product_attention``:
    query (..., H_q, L, E), key (..., H_kv, S, E), value (..., H_kv, S, E_v);
    leading dimensions broadcast.  ``attn_mask``: bool (True = takes part) or float
    (added to the scores; -inf = weight exactly 0), broadcastable to
    (..., H_q, L, S); combined with ``is_causal`` (top_left: key j <= i,
    bottom_right: j <= i + S - L).  ``scale=None`` is exactly 1/sqrt(E); a float
    scale is its exact value (0 means zero).  ``enable_gqa``: query head g uses
    key/value head g // (H_q/H_kv).  ``masked_rows``: "zero" | "nan" | "error" for
    rows where every key is masked.

    >>> import numpy as np
    >>> r = reference_attention(np.ones((1, 2, 4)), np.ones((1, 3, 4)),
    ...                         np.arange(6.0).reshape(1, 3, 2), scale=0.0)
    >>> r.rounded("float32").tolist()
    [[[2.0, 3.0], [2.0, 3.0]]]

    Variants (docs/variants.md; exact semantics in :mod:`.variants`): ``window=(left,
    right)`` (FlashAttention's window_size, -1 = unbounded, aligned by
    ``causal_alignment``), ``softcap=C`` (s -> C·tanh(s/C) after the scale, before the
    masks), ``alibi_slopes`` (H,) or (B, H) (-slope·|j - (i + off)| added),
    ``sinks`` (H,) (a logit in the denominator only), ``mask_mod(b, h, q_idx,
    kv_idx) -> bool`` or a torch BlockMask, ``score_mod`` from the certified menu
    (``softcap_score_mod``, ``alibi_score_mod``, ``relative_bias_score_mod``), FP8
    ``q_descale``/``k_descale``/``v_descale`` (batch, H_kv) as FlashAttention-3.

    >>> r = reference_attention(np.ones((1, 3, 2)), np.ones((1, 3, 2)),
    ...                         np.arange(6.0).reshape(1, 3, 2), window=(0, 0))
    >>> r.rounded("float32").tolist()   # each query sees its own key only
    [[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]]
    """
    from .variants import variant_options

    variant = variant_options(window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                              sinks=sinks, mask_mod=mask_mod, score_mod=score_mod,
                              q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if variant is not None:
        from .variant_forward import variant_attention

        return variant_attention(
            query, key, value, variant, attn_mask=attn_mask, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
            masked_rows=masked_rows, return_weights=return_weights)
    if masked_rows not in POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {POLICIES}")
    if causal_alignment not in ALIGNMENTS:
        raise SpecError(f"causal_alignment={causal_alignment!r}: expected one of {ALIGNMENTS}")
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
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
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
        k = np.repeat(k, rep, axis=-3)
        v = np.repeat(v, rep, axis=-3)
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    try:
        batch = tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    except ValueError:
        hint = ""
        if q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3] and not enable_gqa:
            hint = f" (H_q={q.shape[-3]} != H_kv={k.shape[-3]}: pass enable_gqa=True for GQA)"
        raise ShapeError(
            f"query.shape={q.shape}, key.shape={k.shape}, value.shape={v.shape}: the "
            f"leading (batch, head) dimensions do not broadcast{hint}"
        ) from None
    scale_exact, c_f, rho_c = exact_scale(scale, E)
    allowed_b, madd_b = prepare_mask(attn_mask, is_causal, causal_alignment, batch, L, S)
    B = math.prod(batch)
    qf = np.broadcast_to(to_float64(q), (*batch, L, E)).reshape(B, L, E)
    kf = np.broadcast_to(to_float64(k), (*batch, S, E)).reshape(B, S, E)
    vf = np.broadcast_to(to_float64(v), (*batch, S, Ev)).reshape(B, S, Ev)
    allowed = np.broadcast_to(allowed_b, (*batch, L, S)).reshape(B, L, S)
    madd = None if madd_b is None else np.broadcast_to(madd_b, (*batch, L, S)).reshape(B, L, S)

    empty_rows: np.ndarray[Any, Any] = (np.asarray(~allowed.any(axis=-1)) if S
                                        else np.ones((B, L), dtype=bool))
    if masked_rows == "error" and empty_rows.any():
        b, i = np.argwhere(empty_rows)[0].tolist()
        where = (*tuple(int(x) for x in np.unravel_index(b, batch)), i) if batch else (i,)
        raise InputValueError(
            f"query row {where} has every key masked out (attn_mask/is_causal) and "
            "masked_rows='error'"
        )
    zero_rows = empty_rows if masked_rows == "zero" else np.zeros_like(empty_rows)
    nan_rows = empty_rows if masked_rows == "nan" else np.zeros_like(empty_rows)

    y = np.zeros((B, L, Ev))
    err_y = np.zeros((B, L, Ev))
    ok = np.zeros((B, L), dtype=bool)
    p = np.zeros((B, L, S)) if return_weights else None
    err_p = np.zeros((B, L, S)) if return_weights else None
    if B and L and S:
        c_step = max(1, CHUNK_ELEMS // max(1, L * S))
        for start in range(0, B, c_step):
            sl = slice(start, min(B, start + c_step))
            fr = fast_attention(qf[sl], None, kf[sl], None, vf[sl], None,
                                 np.ascontiguousarray(allowed[sl]),
                                 None if madd is None else madd[sl],
                                 c_f, rho_c, return_weights)
            y[sl], err_y[sl], ok[sl] = fr.y, fr.err_y, fr.ok
            if return_weights:
                p[sl], err_p[sl] = fr.p, fr.err_p  # type: ignore[index]
    ok &= ~empty_rows
    problem = _AttentionProblem(qf, kf, vf, allowed, madd, scale_exact, E)
    problem.exact_products = q.dtype.name != "float64" and k.dtype.name != "float64"
    out = Enclosure(problem, "output", (*batch, L, Ev), y, err_y, ok, zero_rows, nan_rows)
    if return_weights:
        assert p is not None and err_p is not None
        out.weights = Enclosure(problem, "weights", (*batch, L, S), p, err_p, ok,
                                zero_rows, nan_rows)
    return out
