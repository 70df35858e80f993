"""Certified multi-head attention blocks (``torch.nn.MultiheadAttention``
conventions): :func:`reference_mha`, with exact (unrounded) intermediate
projections."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InputValueError, ShapeError, SpecError
from .arb import arb_attention_rows, to_arb_mat
from .constants import ETA, FLOOR, UP, U, gamma
from .conventions import POLICIES
from .enclosure import Enclosure, Problem
from .fast import fast_attention, proj_fast
from .inputs import as_exact_array, to_float64, validate_finite

__all__ = ["reference_mha"]


class _MhaProblem(Problem):
    """Exact composition: projections, per-head attention, output projection."""

    def __init__(self, xq: Any, xk: Any, xv: Any, w: dict[str, Any], H: int, Hkv: int,
                 hd: int, allowed: Any, madd: Any, masked_rows: str) -> None:
        self.xq, self.xk, self.xv = xq, xk, xv
        self.w = w
        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.allowed, self.madd = allowed, madd  # (N, H, L, S)
        self.masked_rows = masked_rows
        self._cache_key: tuple[int, int] | None = None
        self._cache: Any = None

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import arb, ctx

        old = ctx.prec
        ctx.prec = prec
        try:
            w, hd, H, Hkv = self.w, self.hd, self.H, self.Hkv
            S = self.xk.shape[1]
            if self._cache_key != (b, prec):
                ks, vs = [], []
                xk, xv = to_arb_mat(self.xk[b]), to_arb_mat(self.xv[b])
                for h in range(Hkv):
                    sl = slice(h * hd, (h + 1) * hd)
                    kh = xk * to_arb_mat(w["wk"][sl]).transpose()
                    vh = xv * to_arb_mat(w["wv"][sl]).transpose()
                    if w["bk"] is not None:
                        kh = kh + to_arb_mat(np.broadcast_to(w["bk"][sl], (S, hd)))
                    if w["bv"] is not None:
                        vh = vh + to_arb_mat(np.broadcast_to(w["bv"][sl], (S, hd)))
                    ks.append(kh)
                    vs.append(vh)
                self._cache = (ks, vs)
                self._cache_key = (b, prec)
            ks, vs = self._cache
            r = len(rows)
            xq = to_arb_mat(self.xq[b][rows])
            c = arb(hd).rsqrt() if hd else arb(0)
            zero = arb(0)
            a_rows: list[list[Any]] = [[] for _ in range(r)]
            rep = H // Hkv
            for h in range(H):
                sl = slice(h * hd, (h + 1) * hd)
                qh = xq * to_arb_mat(w["wq"][sl]).transpose()
                if w["bq"] is not None:
                    qh = qh + to_arb_mat(np.broadcast_to(w["bq"][sl], (r, hd)))
                al = np.asarray(self.allowed[b, h][rows])
                has = al.any(axis=-1) if S else np.zeros(r, dtype=bool)
                out_h: list[list[Any]] = [[zero] * hd for _ in range(r)]
                live = np.flatnonzero(has).tolist()
                if live:
                    from flint import arb_mat

                    qlive = arb_mat([[qh[i, j] for j in range(hd)] for i in live]) if hd \
                        else arb_mat(len(live), 0)
                    madd = None if self.madd is None else self.madd[b, h][rows][live]
                    got = arb_attention_rows(qlive, ks[h // rep], vs[h // rep], c,
                                              al[live], madd, "output")
                    for n_, i in enumerate(live):
                        out_h[i] = got[n_]
                for i in range(r):
                    a_rows[i].extend(out_h[i])
            from flint import arb_mat

            E_out = w["wo"].shape[0]
            cols = list(range(E_out)) if cols is None else cols
            am = arb_mat(a_rows) if a_rows and a_rows[0] else arb_mat(r, 0)
            wo = to_arb_mat(w["wo"][cols])
            om = am * wo.transpose() if am.ncols() else arb_mat(r, len(cols))
            if w["bo"] is not None:
                om = om + to_arb_mat(np.broadcast_to(w["bo"][cols], (r, len(cols))))
            n_c = len(cols)
            ents = om.entries()
            return [ents[i * n_c:(i + 1) * n_c] for i in range(r)]
        finally:
            ctx.prec = old


def _get(module: Any, name: str) -> Any:
    val = getattr(module, name, None)
    if val is None:
        return None
    return as_exact_array(val, f"module.{name}")


def reference_mha(
    query: Any, key: Any, value: Any, *,
    num_heads: int | None = None,
    in_proj_weight: Any = None, in_proj_bias: Any = None,
    q_proj_weight: Any = None, k_proj_weight: Any = None, v_proj_weight: Any = None,
    out_proj_weight: Any = None, out_proj_bias: Any = None,
    num_kv_heads: int | None = None,
    key_padding_mask: Any = None, attn_mask: Any = None, is_causal: bool = False,
    batch_first: bool = False, masked_rows: str = "zero", module: Any = None,
) -> Enclosure:
    """Certified output of a multi-head attention block, ``torch.nn.MultiheadAttention``
    conventions throughout.

    Inputs: ``batch_first=False`` (torch's default): query (L, N, E_q), key (S, N, kdim),
    value (S, N, vdim); ``batch_first=True``: (N, L, E_q) ...; unbatched (L, E_q) too.
    Weights in torch's layout, y = x Wᵀ + b: ``in_proj_weight`` (3E, E) (rows: W_q,
    W_k, W_v) or ``q_proj_weight`` (E, E_q), ``k_proj_weight`` (E_kv, kdim),
    ``v_proj_weight`` (E_kv, vdim); ``in_proj_bias`` (E + 2 E_kv); ``out_proj_weight``
    (E_out, E); ``out_proj_bias``.  E_kv = num_kv_heads · E/num_heads (GQA;
    default num_kv_heads = num_heads); query head g uses key/value head
    g // (num_heads/num_kv_heads).  Or pass ``module=`` a torch
    ``nn.MultiheadAttention`` to read all of these (and batch_first) from it.

    Masks, as torch.nn.MultiheadAttention.forward: ``key_padding_mask`` (N, S) and
    ``attn_mask`` (L, S) or (N·num_heads, L, S), bool **True = masked out** (ignored),
    or float (added to the scores; -inf = masked out).  ``is_causal=True`` applies
    the top-left causal mask (key j <= query i) in addition.  Scale 1/sqrt(E/num_heads),
    exactly.  Every intermediate (projections, attention) is an exact real number:
    the result encloses the exact composition of the exact inputs.
    """
    if masked_rows not in POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {POLICIES}")
    if module is not None:
        if getattr(module, "bias_k", None) is not None or getattr(module, "add_zero_attn", False):
            raise SpecError("module uses add_bias_kv or add_zero_attn, which reference_mha "
                            "does not model")
        num_heads = int(module.num_heads)
        batch_first = bool(getattr(module, "batch_first", False))
        in_proj_weight = _get(module, "in_proj_weight")
        q_proj_weight = _get(module, "q_proj_weight")
        k_proj_weight = _get(module, "k_proj_weight")
        v_proj_weight = _get(module, "v_proj_weight")
        in_proj_bias = _get(module, "in_proj_bias")
        out_proj_weight = as_exact_array(module.out_proj.weight, "module.out_proj.weight")
        ob = getattr(module.out_proj, "bias", None)
        out_proj_bias = None if ob is None else as_exact_array(ob, "module.out_proj.bias")
    if num_heads is None or isinstance(num_heads, bool) or int(num_heads) < 1:
        raise SpecError(f"num_heads={num_heads!r}: expected a positive integer")
    H = int(num_heads)
    Hkv = H if num_kv_heads is None else int(num_kv_heads)
    if Hkv < 1 or H % Hkv:
        raise SpecError(f"num_kv_heads={num_kv_heads!r}: expected a positive divisor of "
                        f"num_heads={H}")
    if out_proj_weight is None:
        raise SpecError("out_proj_weight is required (or pass module=)")

    def arr(x: Any, name: str) -> np.ndarray[Any, Any]:
        a = as_exact_array(x, name)
        if a.dtype == bool:
            raise SpecError(f"{name}.dtype=bool: expected a float array")
        validate_finite(a, name)
        return to_float64(a)

    xq, xk, xv = arr(query, "query"), arr(key, "key"), arr(value, "value")
    unbatched = xq.ndim == 2
    for name, x in (("query", xq), ("key", xk), ("value", xv)):
        if x.ndim != (2 if unbatched else 3):
            raise ShapeError(f"{name}.shape={x.shape}: expected "
                             f"{'(L, E)' if unbatched else '3 dimensions'} like query.shape="
                             f"{xq.shape}")
    if unbatched:
        xq, xk, xv = xq[None], xk[None], xv[None]
    elif not batch_first:
        xq, xk, xv = (np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (xq, xk, xv))
    N, L, Eq = xq.shape
    if xk.shape[:2] != xv.shape[:2] or xk.shape[0] != N:
        raise ShapeError(f"key.shape={np.shape(key)} and value.shape={np.shape(value)} must "
                         f"share batch and length, with query.shape={np.shape(query)}")
    S = xk.shape[1]
    if in_proj_weight is not None:
        wi = arr(in_proj_weight, "in_proj_weight")
        if wi.ndim != 2 or wi.shape[0] % 3 or Hkv != H:
            raise ShapeError(f"in_proj_weight.shape={wi.shape}: expected (3E, E) "
                             "(GQA needs separate q/k/v_proj_weight)")
        E = wi.shape[0] // 3
        wq, wk, wv = wi[:E], wi[E:2 * E], wi[2 * E:]
    else:
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise SpecError("pass in_proj_weight or all of q_proj_weight, k_proj_weight, "
                            "v_proj_weight")
        wq = arr(q_proj_weight, "q_proj_weight")
        wk = arr(k_proj_weight, "k_proj_weight")
        wv = arr(v_proj_weight, "v_proj_weight")
        E = wq.shape[0]
    if E % H:
        raise ShapeError(f"embed_dim={E} is not divisible by num_heads={H}")
    hd = E // H
    Ekv = Hkv * hd
    for name, wmat, rows_, cols_ in (("q_proj_weight", wq, E, Eq),
                                     ("k_proj_weight", wk, Ekv, xk.shape[2]),
                                     ("v_proj_weight", wv, Ekv, xv.shape[2])):
        if wmat.shape != (rows_, cols_):
            raise ShapeError(f"{name}.shape={wmat.shape} does not match the inputs: expected "
                             f"({rows_}, {cols_}) (E={E}, num_heads={H}, num_kv_heads={Hkv})")
    bq = bk = bv = None
    if in_proj_bias is not None:
        bi = arr(in_proj_bias, "in_proj_bias")
        if bi.shape != (E + 2 * Ekv,):
            raise ShapeError(f"in_proj_bias.shape={bi.shape}: expected ({E + 2 * Ekv},)")
        bq, bk, bv = bi[:E], bi[E:E + Ekv], bi[E + Ekv:]
    wo = arr(out_proj_weight, "out_proj_weight")
    if wo.ndim != 2 or wo.shape[1] != E:
        raise ShapeError(f"out_proj_weight.shape={wo.shape}: expected (E_out, {E})")
    E_out = wo.shape[0]
    bo = None
    if out_proj_bias is not None:
        bo = arr(out_proj_bias, "out_proj_bias")
        if bo.shape != (E_out,):
            raise ShapeError(f"out_proj_bias.shape={bo.shape}: expected ({E_out},)")

    # masks -> allowed (N, H, L, S) and additive (N, H, L, S) or None
    allowed = np.ones((N, H, L, S), dtype=bool)
    madd: np.ndarray[Any, Any] | None = None

    def add_mask(m: Any, name: str, shape4: Callable[[np.ndarray[Any, Any]],
                                                        np.ndarray[Any, Any]]) -> None:
        nonlocal allowed, madd
        a = as_exact_array(m, name)
        if a.dtype == bool:
            allowed = allowed & ~shape4(a)
            return
        validate_finite(a, name, allow_neg_inf=True)
        a4 = shape4(to_float64(a))
        allowed = allowed & (a4 != -np.inf)
        fin = np.where(a4 == -np.inf, 0.0, a4)
        madd = fin if madd is None else madd + fin  # exact? see below
        if madd is not fin:
            # two float masks: their sum must be exact for the truth to be the sum of
            # the exact masks; refuse when it is not (rare; pass one combined mask).
            raise SpecError("key_padding_mask and attn_mask are both float masks; pass one "
                            "combined float mask (or bool masks) so the sum stays exact")

    if key_padding_mask is not None:
        kp_shape = (S,) if unbatched else (N, S)

        def kp4(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            if a.shape != kp_shape:
                raise ShapeError(f"key_padding_mask.shape={a.shape}: expected {kp_shape} "
                                 "(batch, S)")
            return np.broadcast_to(a.reshape(N, 1, 1, S), (N, H, L, S))

        add_mask(key_padding_mask, "key_padding_mask", kp4)
    if attn_mask is not None:

        def am4(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            if a.shape == (L, S):
                return np.broadcast_to(a, (N, H, L, S))
            if a.shape == (N * H, L, S):
                return a.reshape(N, H, L, S)  # torch layout: index n*num_heads + h
            raise ShapeError(f"attn_mask.shape={a.shape}: expected ({L}, {S}) or "
                             f"({N * H}, {L}, {S}) (batch*num_heads, L, S)")

        add_mask(attn_mask, "attn_mask", am4)
    if is_causal:
        allowed = allowed & (np.arange(S)[None, :] <= np.arange(L)[:, None])
    allowed = np.ascontiguousarray(allowed)
    empty: np.ndarray[Any, Any] = (np.asarray(~allowed.any(axis=-1)) if S
                                   else np.ones((N, H, L), dtype=bool))
    if masked_rows == "error" and empty.any():
        n, h, i = np.argwhere(empty)[0].tolist()
        raise InputValueError(f"query row {i} of batch {n}, head {h} has every key masked out "
                              "(key_padding_mask/attn_mask/is_causal) and masked_rows='error'")

    # ---- fast path
    q_t, q_e = proj_fast(xq, wq, bq)
    k_t, k_e = proj_fast(xk, wk, bk)
    v_t, v_e = proj_fast(xv, wv, bv)

    def heads(x: np.ndarray[Any, Any], n_h: int) -> np.ndarray[Any, Any]:
        n, ln, _ = x.shape
        x = x.reshape(n, ln, n_h, hd).transpose(0, 2, 1, 3)
        if n_h != H:
            x = np.repeat(x, H // n_h, axis=1)
        return np.ascontiguousarray(x.reshape(n * H, ln, hd))

    c_f = 1.0 / math.sqrt(hd) if hd else 0.0
    rho_c = 2.01 * U * c_f * UP + (ETA if hd else 0.0)
    y = np.zeros((N * H, L, hd))
    err = np.zeros((N * H, L, hd))
    ok = np.ones((N * H, L), dtype=bool)
    if L and S:
        fr = fast_attention(heads(q_t, H), heads(q_e, H), heads(k_t, Hkv), heads(k_e, Hkv),
                             heads(v_t, Hkv), heads(v_e, Hkv), allowed.reshape(N * H, L, S),
                             None if madd is None else madd.reshape(N * H, L, S),
                             c_f, rho_c, False)
        y, err, ok = fr.y, fr.err_y, fr.ok
    em = empty.reshape(N * H, L)
    y[em] = 0.0
    err[em] = 0.0
    ok = ok | em
    a_t = y.reshape(N, H, L, hd).transpose(0, 2, 1, 3).reshape(N, L, E)
    a_e = err.reshape(N, H, L, hd).transpose(0, 2, 1, 3).reshape(N, L, E)
    ok_rows = ok.reshape(N, H, L).all(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        o_t = a_t @ wo.T
        abs_wo = np.abs(wo)
        o_e = a_e @ abs_wo.T + gamma(max(E, 1)) * (np.abs(a_t) @ abs_wo.T) + E * ETA
        if bo is not None:
            o_t = o_t + bo
            o_e = o_e + U * np.abs(o_t) + ETA
        o_e = o_e * UP + FLOOR
    ok_rows &= np.all(np.isfinite(o_t) & np.isfinite(o_e), axis=-1)
    nan_rows: np.ndarray[Any, Any] = (np.asarray(empty.any(axis=1)) if masked_rows == "nan"
                                      else np.zeros((N, L), dtype=bool))
    zero_rows = np.zeros((N, L), dtype=bool)
    w = {"wq": wq, "wk": wk, "wv": wv, "bq": bq, "bk": bk, "bv": bv, "wo": wo, "bo": bo}
    problem = _MhaProblem(xq, xk, xv, w, H, Hkv, hd, allowed, madd, masked_rows)
    if unbatched:
        return Enclosure(problem, "output", (L, E_out), o_t, o_e, ok_rows, zero_rows, nan_rows)
    if batch_first:
        return Enclosure(problem, "output", (N, L, E_out), o_t, o_e, ok_rows, zero_rows,
                         nan_rows)
    return Enclosure(problem, "output", (L, N, E_out), o_t, o_e, ok_rows, zero_rows, nan_rows,
                     perm=(1, 0, 2))
