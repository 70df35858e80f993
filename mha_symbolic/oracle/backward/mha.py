"""Certified gradients of a multi-head attention block (``torch.nn.MultiheadAttention``
conventions): :func:`reference_mha_backward`.

The block (batch-first, torch layout y = x Wᵀ + b)::

    Q = X_q W_qᵀ + b_q,  K = X_k W_kᵀ + b_k,  V = X_v W_vᵀ + b_v      (exact, not rounded)
    A_h = attention(Q_h, K_{g(h)}, V_{g(h)})   scale 1/sqrt(E/H), masks as reference_mha
    out = A W_oᵀ + b_o,   A = [A_1 … A_H]

and its gradients against grad_output G (summed over batch and positions for the
weights, as autograd does)::

    d b_o = Σ_{n,l} G        d W_o = Σ_n G_nᵀ A_n        dA = G W_o
    dQ_h, dK_g, dV_g  from the attention backward of head h with grad dA_h
                      (summed over the query heads of kv head g)
    dX_q = dQ W_q    d W_q = Σ_n dQ_nᵀ X_q,n    d b_q = Σ_{n,l} dQ     (same for k, v)

Every intermediate is an exact real number.  The fast path propagates the proved
bounds of :mod:`..fast` (projections) and :mod:`.fast` (attention with
uncertain inputs) through these products by (H1); the Arb fallback recomputes the
whole block in ball arithmetic (every weight gradient sums over every row).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np

from ..._validate import door
from ...errors import ShapeError, SpecError
from ..arith.balls import to_arb_mat
from ..arith.constants import ETA, FLOOR, UP, U, gamma
from ..conventions import POLICIES, ScoreModel, masked_rows_of
from ..enclosure import Enclosure, Problem
from ..forward.fast import proj_fast
from ..forward.mha import mha_inputs
from ..inputs import as_exact_array, to_float64, validate_finite
from .arb import arb_backward
from .exact import (
    Accumulator,
    Decomposition,
    ExactDecisions,
    ExactProblem,
    IntMatrix,
    QField,
)
from .fast import Radii, mm_up, tier1_backward

__all__ = ["MhaGradients", "reference_mha_backward"]

Arr = np.ndarray[Any, Any]


class MhaGradients:
    """Certified gradients of a multi-head attention block: ``query``, ``key``,
    ``value`` (shaped like the inputs; for self-attention with one tensor x its
    gradient is their sum) and ``parameters``, a dict keyed by torch's
    ``named_parameters()`` names ("in_proj_weight" or "q_proj_weight",
    "k_proj_weight", "v_proj_weight"; "in_proj_bias"; "out_proj.weight";
    "out_proj.bias"), each an :class:`~mha_symbolic.oracle.enclosure.Enclosure`."""

    def __init__(self, query: Enclosure, key: Enclosure, value: Enclosure,
                 parameters: dict[str, Enclosure]) -> None:
        self.query, self.key, self.value = query, key, value
        self.parameters = parameters

    def __repr__(self) -> str:
        ps = ", ".join(f"{n}={e.shape}" for n, e in self.parameters.items())
        return f"MhaGradients(query={self.query.shape}, key={self.key.shape}, {ps})"


def _merge(x: Arr, N: int, n_h: int, ln: int, hd: int) -> Arr:
    """(N·n_h, ln, hd) per-head arrays back to (N, ln, n_h·hd)."""
    return x.reshape(N, n_h, ln, hd).transpose(0, 2, 1, 3).reshape(N, ln, n_h * hd)


def _heads(x: Arr, n_h: int, H: int, hd: int) -> Arr:
    """(N, ln, n_h·hd) -> (N·H, ln, hd), kv heads repeated for their query heads."""
    n, ln, _ = x.shape
    y = x.reshape(n, ln, n_h, hd).transpose(0, 2, 1, 3)
    if n_h != H:
        y = np.repeat(y, H // n_h, axis=1)
    return np.ascontiguousarray(y.reshape(n * H, ln, hd))


def _linear_grads(dy: Arr, e_dy: Arr, x: Arr, w: Arr) -> tuple[Arr, ...]:
    """For y = x Wᵀ + b with dy ± e_dy (N, ln, out): dX = dy W, dW = Σ dyᵀ x,
    db = Σ dy, each with its (H1) bound (x, W exact doubles)."""
    N, ln, n_out = dy.shape
    aw = np.abs(w)
    dx = dy @ w
    e_dx = (mm_up(e_dy + gamma(max(n_out, 1)) * np.abs(dy), aw) + n_out * ETA) * UP
    rows = N * ln
    dyf, e_dyf, xf = dy.reshape(rows, n_out), e_dy.reshape(rows, n_out), x.reshape(rows, -1)
    dw = dyf.T @ xf
    e_dw = (mm_up((e_dyf + gamma(max(rows, 1)) * np.abs(dyf)).T, np.abs(xf)) + rows * ETA) * UP
    db = dyf.sum(axis=0)
    e_db = (e_dyf.sum(axis=0) + gamma(max(rows, 1)) * np.abs(dyf).sum(axis=0)) \
        / (1.0 - gamma(max(rows, 1) + 1)) * UP
    return dx, e_dx + FLOOR, dw, e_dw + FLOOR, db, e_db + FLOOR


def _c_rat(hd: int) -> Fraction | None:
    """1/sqrt(hd) when rational, else None."""
    if hd == 0:
        return Fraction(0)
    rt = math.isqrt(hd)
    return Fraction(1, rt) if rt * rt == hd else None


class _MhaBackwardProblem(ExactDecisions, Problem):
    """The whole block in Arb at one precision (cached), served row by row.

    Kinds: "dxq", "dxk", "dxv" (flat (N, ln, width)); "dwq", "dwk", "dwv", "dwin",
    "dwo_t" (dW_oᵀ, so that a NaN column is a row), "dbq", "dbk", "dbv", "dbin",
    "dbo" (flat (1, rows, cols))."""

    def __init__(self, xq: Arr, xk: Arr, xv: Arr, w: dict[str, Any], H: int, Hkv: int,
                 hd: int, model: ScoreModel, dout: Arr) -> None:
        self.xq, self.xk, self.xv, self.w = xq, xk, xv, w
        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.model, self.dout = model, dout
        self._prec = -1
        self._block: dict[str, list[list[list[Any]]]] = {}
        self.fld = QField(_c_rat(hd), hd)
        self._int_cache: dict[tuple[str, int | None], IntMatrix] = {}
        self._exact_cache: dict[tuple[int, int], ExactProblem] = {}
        self._decomp: dict[tuple[str, int, int, int], Decomposition] = {}
        E, Ekv = H * hd, Hkv * hd
        self._row_widths = {"dxq": range(xq.shape[2]), "dxk": range(xk.shape[2]),
                            "dxv": range(xv.shape[2]), "dwq": range(xq.shape[2]),
                            "dwk": range(xk.shape[2]), "dwv": range(xv.shape[2]),
                            "dwin": range(xq.shape[2]), "dwo_t": range(w["wo"].shape[0]),
                            "dbq": range(E), "dbk": range(Ekv), "dbv": range(Ekv),
                            "dbin": range(E + 2 * Ekv), "dbo": range(w["wo"].shape[0])}

    def scale_arb(self) -> Any:
        from flint import arb

        return arb(self.hd).rsqrt() if self.hd else arb(0)

    def _compute(self, prec: int) -> None:
        from flint import ctx

        old = ctx.prec
        ctx.prec = prec
        try:
            w, H, Hkv, hd = self.w, self.H, self.Hkv, self.hd
            E, Ekv, E_out = H * hd, Hkv * hd, w["wo"].shape[0]
            grads: dict[str, Any] = {k_: _zeros(*shape) for k_, shape in (
                ("dwq", (E, self.xq.shape[2])), ("dwk", (Ekv, self.xk.shape[2])),
                ("dwv", (Ekv, self.xv.shape[2])), ("dwo", (E_out, E)),
                ("dbq", (1, E)), ("dbk", (1, Ekv)), ("dbv", (1, Ekv)), ("dbo", (1, E_out)))}
            xs: dict[str, list[Any]] = {"dxq": [], "dxk": [], "dxv": []}
            for n in range(self.xq.shape[0]):
                self._sequence(n, prec, grads, xs)
            blk: dict[str, list[list[list[Any]]]] = dict(xs)
            for name in ("dwq", "dwk", "dwv", "dbq", "dbk", "dbv", "dbo"):
                blk[name] = [grads[name]]
            dwo = grads["dwo"]
            blk["dwo_t"] = [[[dwo[r][c] for r in range(E_out)] for c in range(E)]]
            blk["dwin"] = [grads["dwq"] + grads["dwk"] + grads["dwv"]]
            blk["dbin"] = [[grads["dbq"][0] + grads["dbk"][0] + grads["dbv"][0]]]
            self._block = blk
            self._prec = prec
        finally:
            ctx.prec = old

    def _sequence(self, n: int, prec: int, grads: dict[str, Any],
                  xs: dict[str, list[Any]]) -> None:
        """Sequence ``n``'s gradients in Arb at ``prec`` bits: its input gradients
        appended to ``xs``, its weight and bias gradients added to ``grads``."""
        from flint import arb, arb_mat, ctx

        w, H, Hkv, hd = self.w, self.H, self.Hkv, self.hd
        L, S = self.xq.shape[1], self.xk.shape[1]
        E, Ekv = H * hd, Hkv * hd
        rep = H // Hkv
        zero = arb(0)
        qp = _lin(self.xq[n], w["wq"], w["bq"])
        kp = _lin(self.xk[n], w["wk"], w["bk"])
        vp = _lin(self.xv[n], w["wv"], w["bv"])
        dout = to_arb_mat(self.dout[n])
        da = dout * to_arb_mat(w["wo"])
        dq_rows, a_rows = _zeros(L, E), _zeros(L, E)
        dk_rows, dv_rows = _zeros(S, Ekv), _zeros(S, Ekv)
        for h in range(H):
            g = h // rep
            qh, dah = _cols(qp, h * hd, (h + 1) * hd), _cols(da, h * hd, (h + 1) * hd)
            kh, vh = _cols(kp, g * hd, (g + 1) * hd), _cols(vp, g * hd, (g + 1) * hd)
            ctx.prec = prec
            g_ents = (qh * kh.transpose()).entries() if hd and L and S else []
            g_rows = [g_ents[i * S:(i + 1) * S] for i in range(L)] if g_ents else \
                [[zero] * S for _ in range(L)]
            res = arb_backward(g_rows, prec, qh, kh, vh, dah,
                               self.model.block(n * H + h, slice(0, L)), list(range(L)),
                               None, hd, Fraction(1), prec, keys=list(range(S)),
                               want_out=True)
            assert res.dk is not None and res.dv is not None and res.out is not None
            for i in range(L):
                for c in range(hd):
                    dq_rows[i][h * hd + c] = res.dq[i][c]
                    a_rows[i][h * hd + c] = res.out[i][c]
            for j in range(S):
                for c in range(hd):
                    dk_rows[j][g * hd + c] += res.dk[j][c]
                    dv_rows[j][g * hd + c] += res.dv[j][c]
        dqm = arb_mat(dq_rows) if L and E else arb_mat(L, E)
        dkm = arb_mat(dk_rows) if S and Ekv else arb_mat(S, Ekv)
        dvm = arb_mat(dv_rows) if S and Ekv else arb_mat(S, Ekv)
        am = arb_mat(a_rows) if L and E else arb_mat(L, E)
        for name, dm, x, wm in (("q", dqm, self.xq[n], w["wq"]), ("k", dkm, self.xk[n], w["wk"]),
                                ("v", dvm, self.xv[n], w["wv"])):
            dx = dm * to_arb_mat(wm)
            xs["dx" + name].append([[dx[i, j] for j in range(dx.ncols())]
                                    for i in range(dx.nrows())])
            _acc(grads["dw" + name], dm.transpose() * to_arb_mat(x))
            _acc(grads["db" + name], _colsum(dm))
        _acc(grads["dwo"], dout.transpose() * am)
        _acc(grads["dbo"], _colsum(dout))

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        if self._prec != prec:
            self._compute(prec)
        src = self._block[kind][b]
        return [src[r] for r in rows]

    # -- exact decisions: every element is a linear combination (rational weights from
    # the inputs and weights) of attention-level elements of the heads' exact problems
    def _ints(self, name: str, n: int | None = None) -> IntMatrix:
        key = (name, n)
        got = self._int_cache.get(key)
        if got is None:
            arr = self.w[name] if n is None else getattr(self, name)[n]
            got = IntMatrix.of_doubles(np.atleast_2d(arr))
            self._int_cache[key] = got
        return got

    def _proj(self, n: int, which: str) -> IntMatrix:
        """Q, K or V of batch n exactly: x Wᵀ + b as integers times 2**-2148."""
        key = ("proj" + which, n)
        got = self._int_cache.get(key)
        if got is None:
            x = self._ints("x" + which, n)
            wm = self._ints("w" + which)
            b = self.w["b" + which]
            bi = None if b is None else self._ints("b" + which).rows[0]
            rows = []
            for xr in x.rows:
                r = [sum(a * c for a, c in zip(xr, wr, strict=True)) for wr in wm.rows]
                if bi is not None:
                    r = [y + (bb << 1074) for y, bb in zip(r, bi, strict=True)]
                rows.append(r)
            got = IntMatrix(rows, 2148)
            self._int_cache[key] = got
        return got

    def _exact(self, n: int, h: int) -> ExactProblem:
        key = (n, h)
        got = self._exact_cache.get(key)
        if got is None:
            hd, g = self.hd, h // (self.H // self.Hkv)

            def cols(m: IntMatrix, lo: int) -> IntMatrix:
                return IntMatrix([r[lo:lo + hd] for r in m.rows], m.shift)

            dout = self._ints("dout", n)
            wo = self._ints("wo")
            da = IntMatrix([[sum(dout.rows[i][r] * wo.rows[r][c] for r in range(len(wo.rows)))
                             for c in range(h * hd, (h + 1) * hd)] for i in range(len(dout.rows))],
                           2148)
            got = ExactProblem(self.fld, cols(self._proj(n, "q"), h * hd),
                               cols(self._proj(n, "k"), g * hd), cols(self._proj(n, "v"), g * hd),
                               da, *self._dense(n, h))
            self._exact_cache[key] = got
        return got

    def _dense(self, n: int, h: int) -> tuple[Arr, Arr | None, None, Fraction, Arr]:
        """allowed (L, S), madd, keep (None), f = 1, uniform (L,) of head h of batch n."""
        L, S = self.model.L, self.model.S
        blk = self.model.block(n * self.H + h, slice(0, L))
        allowed = np.ones((L, S), dtype=bool) if blk.allowed is None else blk.allowed
        uniform = np.zeros(L, dtype=bool) if blk.uniform is None else blk.uniform
        return allowed, blk.madd, None, Fraction(1), uniform

    def _decomposition(self, kind: str, b: int, r: int, col: int) -> Decomposition:
        key = (kind, b, r, col)
        got = self._decomp.get(key)
        if got is not None:
            return got
        H, hd, rep = self.H, self.hd, self.H // self.Hkv
        E, Ekv = H * hd, self.Hkv * hd
        N = self.xq.shape[0]
        acc = Accumulator(self.fld)
        zero = Fraction(0)

        def w(name: str, i: int, j: int) -> tuple[Fraction, Fraction]:
            return (Fraction(float(self.w[name][i, j])), zero)

        def x(name: str, n: int, i: int, j: int) -> tuple[Fraction, Fraction]:
            return (Fraction(float(getattr(self, name)[n][i, j])), zero)

        one = (Fraction(1), zero)
        if kind == "dwin":   # packed rows: W_q, then W_k, then W_v
            kind, r = ("dwq", r) if r < E else (("dwk", r - E) if r < E + Ekv else ("dwv", r - E - Ekv))
        if kind == "dbin":
            kind, col = ("dbq", col) if col < E else (("dbk", col - E) if col < E + Ekv
                                                      else ("dbv", col - E - Ekv))
        if kind == "dxq":
            for h in range(H):
                for c in range(hd):
                    self._exact(b, h).add_dq(acc, r, c, w("wq", h * hd + c, col))
        elif kind in ("dxk", "dxv"):
            wn = "wk" if kind == "dxk" else "wv"
            for h in range(H):
                ex = self._exact(b, h)
                for c in range(hd):
                    wt = w(wn, (h // rep) * hd + c, col)
                    (ex.add_dk if kind == "dxk" else ex.add_dv)(acc, r, c, wt)
        elif kind in ("dwq", "dbq"):
            h, c = divmod(r if kind == "dwq" else col, hd)
            for n in range(N):
                for i in range(self.xq.shape[1]):
                    self._exact(n, h).add_dq(acc, i, c, x("xq", n, i, col) if kind == "dwq" else one)
        elif kind in ("dwk", "dwv", "dbk", "dbv"):
            g, c = divmod(r if kind in ("dwk", "dwv") else col, hd)
            xn = "xk" if kind in ("dwk", "dbk") else "xv"
            for n in range(N):
                for h in range(g * rep, (g + 1) * rep):
                    ex = self._exact(n, h)
                    add = ex.add_dk if kind in ("dwk", "dbk") else ex.add_dv
                    for j in range(self.xk.shape[1]):
                        add(acc, j, c, x(xn, n, j, col) if kind in ("dwk", "dwv") else one)
        elif kind == "dwo_t":   # dW_o[col, r] = Σ_{n,i} G[n,i,col] A[n,i,r]
            h, c = divmod(r, hd)
            for n in range(N):
                for i in range(self.xq.shape[1]):
                    self._exact(n, h).add_out(acc, i, c, x("dout", n, i, col))
        elif kind == "dbo":
            for n in range(N):
                for i in range(self.xq.shape[1]):
                    acc.add_const(x("dout", n, i, col))
        else:  # pragma: no cover - every kind is listed above
            raise KeyError(kind)
        dec = acc.decomposition()
        self._decomp[key] = dec
        return dec

    def _n_cols(self, kind: str) -> int:
        return len(self._row_widths[kind])

    def _describe(self, kind: str, b: int, i: int, col: int) -> str:
        return f"the {_PUBLIC.get(kind, kind)} gradient element (flat {b}, {i}, {col})"


_PUBLIC = {"dxq": "query", "dxk": "key", "dxv": "value", "dwq": "q_proj_weight",
           "dwk": "k_proj_weight", "dwv": "v_proj_weight", "dwin": "in_proj_weight",
           "dwo_t": "out_proj.weight", "dbq": "in_proj_bias (q)", "dbk": "in_proj_bias (k)",
           "dbv": "in_proj_bias (v)", "dbin": "in_proj_bias", "dbo": "out_proj.bias"}


@functools.partial(door, quiet=True)
def reference_mha_backward(
    query: Any, key: Any, value: Any, grad_output: Any, *,
    num_heads: int | None = None,
    in_proj_weight: Any = None, in_proj_bias: Any = None,
    q_proj_weight: Any = None, k_proj_weight: Any = None, v_proj_weight: Any = None,
    out_proj_weight: Any = None, out_proj_bias: Any = None,
    num_kv_heads: int | None = None,
    key_padding_mask: Any = None, attn_mask: Any = None, is_causal: bool = False,
    batch_first: bool = False, masked_rows: str = "zero", module: Any = None,
) -> MhaGradients:
    """Certified gradients of :func:`mha_symbolic.reference_mha`'s block against
    ``grad_output`` (shaped like its output), with respect to query, key, value and
    every weight and bias; the arguments are those of ``reference_mha``.

    Masks are not differentiated (nn.MultiheadAttention's masks are inputs, not
    parameters).  ``masked_rows``: "zero", "error", "uniform" (weights 1/S), "nan"
    (NaN wherever autograd would propagate the NaN of a fully masked row's softmax).

    >>> import numpy as np
    >>> x = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])      # (L=2, N=1, E=2)
    >>> eye = np.eye(2)
    >>> g = reference_mha_backward(x, x, x, np.ones((2, 1, 2)), num_heads=1,
    ...                            in_proj_weight=np.vstack([eye, eye, eye]),
    ...                            out_proj_weight=eye, out_proj_bias=np.zeros(2))
    >>> g.parameters["out_proj.bias"].rounded("float32").tolist()   # Σ grad_output
    [2.0, 2.0]
    """
    if masked_rows not in POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {POLICIES}")
    # the forward's reading and checks of every argument (masks included)
    inp = mha_inputs(query, key, value, num_heads=num_heads, in_proj_weight=in_proj_weight,
                     in_proj_bias=in_proj_bias, q_proj_weight=q_proj_weight,
                     k_proj_weight=k_proj_weight, v_proj_weight=v_proj_weight,
                     out_proj_weight=out_proj_weight, out_proj_bias=out_proj_bias,
                     num_kv_heads=num_kv_heads, key_padding_mask=key_padding_mask,
                     attn_mask=attn_mask, is_causal=is_causal, batch_first=batch_first,
                     masked_rows=masked_rows, module=module)
    N, L, _ = inp.xq.shape
    S = inp.xk.shape[1]
    dout = _grad_output(grad_output, inp.out_shape, inp.unbatched,
                        not inp.unbatched and not inp.batch_first)
    empty = inp.model.empty_rows().reshape(N, inp.H, L)
    rows = masked_rows_of(masked_rows, empty.reshape(N * inp.H, L), S, (N, inp.H),
                          "key_padding_mask/attn_mask/is_causal")
    g = _gradients(inp, dout, empty, rows.uniform.reshape(empty.shape))
    return _enclosures(inp, dout, g, np.asarray(rows.nan).reshape(empty.shape))


def _grad_output(grad_output: Any, out_shape: tuple[int, ...], unbatched: bool,
                 seq_first: bool) -> Arr:
    """grad_output read, checked against the block's output shape, as (N, L, E_out)."""
    g_in = as_exact_array(grad_output, "grad_output")
    if g_in.dtype == bool:
        raise SpecError("grad_output.dtype=bool: expected a float array")
    validate_finite(g_in, "grad_output")
    if tuple(g_in.shape) != out_shape:
        raise ShapeError(f"grad_output.shape={tuple(g_in.shape)} does not match the block's "
                         f"output shape {out_shape}")
    dout = to_float64(g_in)
    dout = dout[None] if unbatched else (np.ascontiguousarray(dout.transpose(1, 0, 2))
                                         if seq_first else dout)
    return dout


def _gradients(inp: Any, dout: Arr, empty: Arr, uniform: Arr) -> dict[str, Any]:
    """Tier 1 of the block's backward: the projections (fast.proj_fast), dA = G W_o,
    each head's attention backward (fast.tier1_backward), the GQA sums, the projections'
    and the output projection's gradients, with their bounds and the rows they leave
    valid."""
    xq, xk, xv, w, model = inp.xq, inp.xk, inp.xv, inp.w, inp.model
    H, Hkv, hd = inp.H, inp.Hkv, inp.hd
    N, L, _ = xq.shape
    S = xk.shape[1]
    E, E_out = H * hd, w["wo"].shape[0]
    q_t, q_e = proj_fast(xq, w["wq"], w["bq"])
    k_t, k_e = proj_fast(xk, w["wk"], w["bk"])
    v_t, v_e = proj_fast(xv, w["wv"], w["bv"])
    da = dout @ w["wo"]
    e_da = (mm_up(gamma(max(E_out, 1)) * np.abs(dout), np.abs(w["wo"])) + E_out * ETA) * UP
    c_f = 1.0 / math.sqrt(hd) if hd else 0.0
    rho_c = 2.01 * U * c_f * UP + (ETA if hd else 0.0)
    qh, kh = _heads(q_t, H, H, hd), _heads(k_t, Hkv, H, hd)
    NH = N * H
    dqh, e_dqh, a_h, e_ah = (np.zeros((NH, L, hd)) for _ in range(4))
    dkh, e_dkh, dvh, e_dvh = (np.zeros((NH, S, hd)) for _ in range(4))
    row_ok, all_ok = np.ones((NH, L), dtype=bool), np.ones(NH, dtype=bool)
    if L and S:
        qe, ke, ve = _heads(q_e, H, H, hd), _heads(k_e, Hkv, H, hd), _heads(v_e, Hkv, H, hd)
        vh, dah, edah = _heads(v_t, Hkv, H, hd), _heads(da, H, H, hd), _heads(e_da, H, H, hd)
        for c in range(NH):
            hg = tier1_backward(qh[c], kh[c], vh[c], dah[c],
                                partial(model.block, c), c_f, rho_c,
                                radii=Radii(qe[c], ke[c], ve[c], edah[c]))
            dqh[c], e_dqh[c], dkh[c], e_dkh[c] = hg.dq, hg.e_dq, hg.dk, hg.e_dk
            dvh[c], e_dvh[c], a_h[c], e_ah[c] = hg.dv, hg.e_dv, hg.o, hg.e_o
            row_ok[c], all_ok[c] = hg.row_ok, hg.all_ok
    # rows of empty attention: zero output and zero dQ (uniform: output mean of V)
    dead = (empty & ~uniform).reshape(NH, L)
    a_h = np.where(dead[..., None], 0.0, a_h)
    e_ah = np.where(dead[..., None], 0.0, e_ah)
    row_ok = row_ok & np.all(np.isfinite(a_h) & np.isfinite(e_ah), axis=-1)
    # GQA: kv-head gradients summed over their query heads, (H1) for the float sum
    rep = H // Hkv
    if rep > 1:
        def red(x: Arr, ex: Arr) -> tuple[Arr, Arr]:
            x5 = x.reshape(N, Hkv, rep, S, hd)
            return x5.sum(axis=2).reshape(N * Hkv, S, hd), (
                ex.reshape(N, Hkv, rep, S, hd).sum(axis=2)
                + gamma(rep) * np.abs(x5).sum(axis=2)).reshape(N * Hkv, S, hd) * UP
        dkh, e_dkh = red(dkh, e_dkh)
        dvh, e_dvh = red(dvh, e_dvh)
    dq_, e_dq_ = _merge(dqh, N, H, L, hd), _merge(e_dqh, N, H, L, hd)
    dk_, e_dk_ = _merge(dkh, N, Hkv, S, hd), _merge(e_dkh, N, Hkv, S, hd)
    dv_, e_dv_ = _merge(dvh, N, Hkv, S, hd), _merge(e_dvh, N, Hkv, S, hd)
    a_, e_a_ = _merge(a_h, N, H, L, hd), _merge(e_ah, N, H, L, hd)
    gq = _linear_grads(dq_, e_dq_, xq, w["wq"])
    gk = _linear_grads(dk_, e_dk_, xk, w["wk"])
    gv = _linear_grads(dv_, e_dv_, xv, w["wv"])
    # dW_o = Σ Gᵀ A with A ± e_A;  db_o = Σ G (exact inputs)
    rows_ = N * L
    gf, af, eaf = dout.reshape(rows_, E_out), a_.reshape(rows_, E), e_a_.reshape(rows_, E)
    dwo = gf.T @ af
    e_dwo = (mm_up(np.abs(gf).T, eaf + gamma(max(rows_, 1)) * np.abs(af)) + rows_ * ETA) * UP + FLOOR
    dbo = gf.sum(axis=0)
    e_dbo = gamma(max(rows_, 1)) * np.abs(gf).sum(axis=0) / (1.0 - gamma(max(rows_, 1))) * UP + FLOOR
    return {"gq": gq, "gk": gk, "gv": gv, "dwo": dwo, "e_dwo": e_dwo, "dbo": dbo,
            "e_dbo": e_dbo, "row_ok": row_ok, "all_ok": all_ok}


def _enclosures(inp: Any, dout: Arr, g: dict[str, Any], nan_h: Arr) -> MhaGradients:
    """The gradients' Enclosures (inputs, weights, biases) with their validity and NaN
    pattern per row (``nan_h``: the rows of (N, H, L) whose softmax is NaN)."""
    xq, xk, xv, w, model = inp.xq, inp.xk, inp.xv, inp.w, inp.model
    H, Hkv, hd = inp.H, inp.Hkv, inp.hd
    N, L, _ = xq.shape
    S = xk.shape[1]
    E, Ekv, E_out = H * hd, Hkv * hd, w["wo"].shape[0]
    rep = H // Hkv
    unbatched = inp.unbatched
    seq_first = not unbatched and not inp.batch_first
    packed_given = inp.packed
    gq, gk, gv, row_ok, all_ok = g["gq"], g["gk"], g["gv"], g["row_ok"], g["all_ok"]
    dwo, e_dwo, dbo, e_dbo = g["dwo"], g["e_dwo"], g["dbo"], g["e_dbo"]
    ok_rows_q = row_ok.reshape(N, H, L).all(axis=1)                          # (N, L)
    ok_n: Arr = np.asarray(all_ok.reshape(N, H).all(axis=1) & row_ok.reshape(N, H * L).all(axis=1))
    ok_all = bool(ok_n.all())
    nan_head_any = nan_h.any(axis=(0, 2))                                     # (H,)
    nan_kv_any = nan_head_any.reshape(Hkv, rep).any(axis=1)                   # (Hkv,)
    nan_n: Arr = np.asarray(nan_h.any(axis=(1, 2)))                           # (N,)
    per_col_q = np.repeat(nan_head_any, hd)                                   # (E,)
    per_col_kv = np.repeat(nan_kv_any, hd)                                    # (Ekv,)

    problem = _MhaBackwardProblem(xq, xk, xv, w, H, Hkv, hd, model, dout)
    perm = (1, 0, 2) if seq_first else None

    def x_enc(kind: str, vals: Arr, errs: Arr, ok: Arr, nan: Arr) -> Enclosure:
        n_, ln, width = vals.shape
        shape = (ln, width) if unbatched else ((ln, n_, width) if seq_first else (n_, ln, width))
        nan = np.asarray(nan)
        return Enclosure(problem, kind, shape, vals, errs, ok & ~nan & np.isfinite(
            vals + errs).all(axis=-1), np.zeros_like(nan), nan, perm=None if unbatched else perm)

    def p_enc(kind: str, vals: Arr, errs: Arr, nan_rows: Arr, shape: tuple[int, ...],
              perm_: tuple[int, ...] | None = None) -> Enclosure:
        v3 = vals.reshape(1, vals.shape[0] if vals.ndim == 2 else 1, -1)
        e3 = errs.reshape(v3.shape)
        nr = np.asarray(nan_rows).reshape(1, v3.shape[1])
        ok = np.full((1, v3.shape[1]), ok_all) & np.isfinite(v3 + e3).all(axis=-1)
        return Enclosure(problem, kind, shape, v3, e3, ok & ~nr, np.zeros_like(nr), nr,
                         perm=perm_)

    qin = x_enc("dxq", gq[0], gq[1], ok_rows_q, np.broadcast_to(nan_h.any(axis=1), (N, L)))
    kin = x_enc("dxk", gk[0], gk[1], np.broadcast_to(ok_n[:, None], (N, S)),
                np.broadcast_to(nan_n[:, None], (N, S)))
    vin = x_enc("dxv", gv[0], gv[1], np.broadcast_to(ok_n[:, None], (N, S)),
                np.broadcast_to(nan_n[:, None], (N, S)))
    params: dict[str, Enclosure] = {}
    if packed_given:
        params["in_proj_weight"] = p_enc(
            "dwin", np.vstack([gq[2], gk[2], gv[2]]), np.vstack([gq[3], gk[3], gv[3]]),
            np.concatenate([per_col_q, per_col_kv, per_col_kv]), (E + 2 * Ekv, xq.shape[2]))
    else:
        params["q_proj_weight"] = p_enc("dwq", gq[2], gq[3], per_col_q, gq[2].shape)
        params["k_proj_weight"] = p_enc("dwk", gk[2], gk[3], per_col_kv, gk[2].shape)
        params["v_proj_weight"] = p_enc("dwv", gv[2], gv[3], per_col_kv, gv[2].shape)
    if w["bq"] is not None:
        params["in_proj_bias"] = _vector(
            problem, "dbin", np.concatenate([gq[4], gk[4], gv[4]]),
            np.concatenate([gq[5], gk[5], gv[5]]),
            np.concatenate([per_col_q, per_col_kv, per_col_kv]), ok_all)
    params["out_proj.weight"] = p_enc("dwo_t", dwo.T.copy(), e_dwo.T.copy(), per_col_q,
                                      (E_out, E), (1, 0))
    if w["bo"] is not None:
        params["out_proj.bias"] = _vector(problem, "dbo", dbo, e_dbo,
                                          np.zeros(E_out, dtype=bool), ok_all)
    return MhaGradients(qin, kin, vin, params)


def _vector(problem: Problem, kind: str, vals: Arr, errs: Arr, nan: Arr,
            ok_all: bool) -> Enclosure:
    """A bias gradient laid out as one entry per row (flat (1, n, 1)), so that its
    NaN pattern is a set of rows."""
    n = vals.shape[0]
    ok = np.full((1, n), ok_all) & ~nan[None] & np.isfinite(vals + errs)[None]
    return _ColumnEnclosure(problem, kind, (n,), vals.reshape(1, n, 1), errs.reshape(1, n, 1),
                            ok, np.zeros((1, n), bool), nan.reshape(1, n))


class _ColumnEnclosure(Enclosure):
    """An Enclosure of a vector stored as n rows of one element (row b=0, row i,
    col 0 is entry i); the problem serves it from its one-row form."""

    def __init__(self, problem: Problem, kind: str, shape: tuple[int, ...], *args: Any) -> None:
        super().__init__(_Transposed(problem), kind, shape, *args)


class _Transposed(Problem):
    def __init__(self, inner: Problem) -> None:
        self.inner = inner

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        row = self.inner.arb_rows(0, [0], prec, kind)[0]
        return [[row[i]] for i in rows]

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        row = self.inner.rational_row(0, 0, kind)
        return None if row is None else [row[i]]   # lazy: only entry i is decided

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction) -> int | None:
        return self.inner.boundary_sign(0, 0, i, kind, boundary)


def _lin(x: Arr, wm: Arr, b: Arr | None) -> Any:
    """x Wᵀ + b as an Arb matrix."""
    y = to_arb_mat(x) * to_arb_mat(wm).transpose()
    if b is not None:
        y = y + to_arb_mat(np.broadcast_to(b, (x.shape[0], wm.shape[0])))
    return y


def _cols(m: Any, lo: int, hi: int) -> Any:
    """Columns lo..hi-1 of an Arb matrix."""
    from flint import arb_mat

    return arb_mat([[m[i, c] for c in range(lo, hi)] for i in range(m.nrows())]) \
        if m.nrows() and hi > lo else arb_mat(m.nrows(), hi - lo)


def _zeros(r: int, c: int) -> list[list[Any]]:
    from flint import arb

    zero = arb(0)
    return [[zero] * c for _ in range(r)]


def _acc(tgt: list[list[Any]], m: Any) -> None:
    """tgt += m (a list of rows of Arb balls and an Arb matrix)."""
    for i in range(m.nrows()):
        for j in range(m.ncols()):
            tgt[i][j] = tgt[i][j] + m[i, j]


def _colsum(m: Any) -> Any:
    """The column sums of an Arb matrix (a 1-row matrix)."""
    from flint import arb, arb_mat

    out = arb_mat(1, m.ncols())
    for j in range(m.ncols()):
        out[0, j] = sum((m[i, j] for i in range(m.nrows())), arb(0))
    return out
