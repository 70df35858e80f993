"""Certified multi-head attention blocks (``torch.nn.MultiheadAttention``
conventions): :func:`reference_mha`, with exact (unrounded) intermediate
projections.

The three tiers of :func:`.reference_attention` carry through the projections:
tier 1 bounds the float64 projections (:func:`.fast.proj_fast`) and feeds them
with radii to :func:`.fast.tier1_block`; tier 2 computes the projections in
double-double from exact slice products (:func:`proj_dd`) and runs
:func:`.dd_attention.tier2_block` with those radii; tier 3 computes the
projections exactly in Arb.  Exact ties are decided through the projections by
:mod:`.ties` (the heads' ratios over a common denominator).
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..._validate import door, shown
from ...errors import ShapeError, SpecError
from ..arith import ties
from ..arith.balls import Prec, _exp_range, scale_arb, to_arb_mat
from ..arith.constants import CHUNK_ELEMS, ETA, FLOOR, UP, U, gamma
from ..arith.dd import dd_add_d, pow2
from ..arith.products import beta_for, exact_product, norm_up, row_exponents, slice_rows
from ..conventions import POLICIES, ScoreModel, dd_scale, masked_rows_of, read_mask
from ..enclosure import Enclosure, Problem
from ..inputs import as_exact_array, to_float64, validate_finite
from ..progress import Progress, expected_seconds
from .arb import attention_rows
from .dd import KVdd, tier2_block
from .fast import KV, proj_fast, tier1_block

__all__ = ["reference_mha"]

Array = np.ndarray[Any, Any]


# ---- exact projections --------------------------------------------------------------

def proj_dd(x: Array, w: Array, b: Array | None, x_lo: Array | None = None,
            x_err: Array | None = None) -> tuple[Array, Array, Array, bool]:
    """y = (x + x_lo ± x_err) wᵀ + b as a double-double (hi, lo) with an elementwise
    bound err (n × m), and whether the scalings were exact (else the caller hands
    the rows on).  x rows and w rows are scaled by powers of two to |·| < 1 and cut
    into slices (exact products, :func:`.exact_scores.exact_product`); x_lo goes
    through a plain product; x_err adds fl(x_err |w|ᵀ)/(1 - gamma_d) + d·ETA; the
    bias is added by TwoSum (error <= u(u|y| + |lo|))."""
    n, d = x.shape
    m = w.shape[0]
    if d == 0 or n == 0 or m == 0:
        hi = np.zeros((n, m)) + (b if b is not None else 0.0)
        return hi, np.zeros((n, m)), np.zeros((n, m)), True
    ex = row_exponents(x)
    ew = row_exponents(w)
    okx = (ex >= -1022) & (ex <= 1023)
    okw = (ew >= -1022) & (ew <= 1023)
    px = pow2(np.where(okx, -ex, 0))
    pw = pow2(np.where(okw, -ew, 0))
    # in the operands' own layout (a transposed operand stays transposed: it is sliced
    # in place and read by BLAS as a transpose, no copies)
    x2 = x * px[:, None]
    w2 = w * pw[:, None]
    exact = bool(okx.all() and okw.all() and np.array_equal(x2 / px[:, None], x)
                 and np.array_equal(w2 / pw[:, None], w))
    beta = beta_for(d)
    xs = slice_rows(x2, beta, 5, np.zeros(n, dtype=np.int64))
    ws = slice_rows(w2, beta, 5, np.zeros(m, dtype=np.int64))
    plain = None
    pb = None
    if x_lo is not None:
        xl2 = x_lo * px[:, None]
        # the low words are scaled exactly too (a subnormal result would lose bits)
        exact = exact and bool(np.array_equal(xl2 / px[:, None], x_lo))
        plain = [(xl2, w2)]
        pb = [(norm_up(xl2), norm_up(w2))]
    prod = exact_product(xs, ws, 112, plain, pb)
    scale = pow2(np.where(okx, ex, 0))[:, None] * pow2(np.where(okw, ew, 0))[None, :]
    hi = prod.hi * scale
    lo = prod.lo * scale
    err = prod.err() * scale + 4 * ETA  # scaling back may underflow: <= ETA/2 per word
    if x_err is not None:
        gd = gamma(d)
        err += (x_err @ np.abs(w).T + d * ETA) / (1 - gd)
    if b is not None:
        # dd + double: error <= u(u|fl(hi + b)| + |lo|) <= u(u(|hi| + |b|)(1 + u) + |lo|)
        err += U * (U * (np.abs(hi) + np.abs(b)) * 1.01 + np.abs(lo)) + ETA
        hi, lo = dd_add_d(hi, lo, np.broadcast_to(b, hi.shape))
    return hi, lo, err * UP, exact


def affine_prec(x: Array, w: Array, b: Array | None) -> tuple[int, int, int]:
    """(prec, top, bottom): every entry of x wᵀ + b is a multiple of 2**bottom below
    2**top in magnitude, so ``prec = top - bottom + 8`` bits hold it exactly."""

    tx, bx = _exp_range(x)
    tw, bw = _exp_range(w)
    top = tx + tw + max(x.shape[-1], 1).bit_length() + 1
    bottom = bx + bw
    if b is not None and np.any(b != 0):
        tb, bb = _exp_range(b)
        top = max(top, tb) + 1
        bottom = min(bottom, bb)
    return top - bottom + 8, top, bottom


def int_affine(x: Array, w: Array, b: Array | None) -> tuple[Array, int]:
    """x wᵀ + b exactly as (object array of Python ints, exponent)."""
    from flint import fmpz_mat

    xi, ex = ties.int_matrix(x)
    wi, ew = ties.int_matrix(w)
    n, m = x.shape[0], w.shape[0]
    if x.shape[1] and n and m:
        prod = fmpz_mat(xi.tolist()) * fmpz_mat(wi.tolist()).transpose()
        vals = np.array([int(t) for t in prod.entries()], dtype=object).reshape(n, m)
    else:
        vals = np.zeros((n, m), dtype=object)
        vals[...] = 0
    e = ex + ew
    if b is not None and np.any(b != 0):
        bi, eb = ties.int_matrix(b[None, :])
        e2 = min(e, eb)
        vals = vals * (1 << (e - e2)) + bi * (1 << (eb - e2))
        e = e2
    return vals, e


def int_dot(a: Array, bt: Array) -> Array:
    """a @ btᵀ for object arrays of Python ints (fmpz_mat when large)."""
    from flint import fmpz_mat

    n, m = a.shape[0], bt.shape[0]
    if a.shape[1] == 0 or n == 0 or m == 0:
        out = np.empty((n, m), dtype=object)
        out[...] = 0
        return out
    prod = fmpz_mat(a.tolist()) * fmpz_mat(bt.tolist()).transpose()
    return np.array([int(t) for t in prod.entries()], dtype=object).reshape(n, m)


# ---- the problem ------------------------------------------------------------------------

class _MhaProblem(Problem):
    """Exact composition: projections, per-head attention, output projection."""

    def __init__(self, xq: Array, xk: Array, xv: Array, w: dict[str, Any], H: int, Hkv: int,
                 hd: int, model: ScoreModel, masked_rows: str) -> None:
        self.xq, self.xk, self.xv = xq, xk, xv
        self.w = w
        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.model = model  # batch (N, H)
        self.masked_rows = masked_rows
        self.cs = dd_scale(None, hd)
        self._kv2: OrderedDict[int, list[KVdd]] = OrderedDict()
        self._arb: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._ints: OrderedDict[int, Any] = OrderedDict()

    def _c(self, b: int, h: int) -> int:
        return b * self.H + h

    def _empty_zero(self, b: int, h: int, rows: Array) -> Array:
        """Rows of head h that are fully masked and take the value 0 (policy zero)."""
        policy = masked_rows_of(self.masked_rows, self.model.empty_rows(), self.model.S,
                                check=False)
        return np.asarray(policy.zero[self._c(b, h)][rows])

    # ---- tier 2
    def _kv_dd(self, b: int) -> list[KVdd]:
        if b in self._kv2:
            return self._kv2[b]
        w, hd = self.w, self.hd
        kh, kl, ke, okk = proj_dd(self.xk[b], w["wk"], w["bk"])
        vh, vl, ve, okv = proj_dd(self.xv[b], w["wv"], w["bv"])
        out = []
        for h in range(self.Hkv):
            sl = slice(h * hd, (h + 1) * hd)
            kr = norm_up(ke[:, sl])
            vr = np.max(ve[:, sl], axis=0) if ve.shape[0] else np.zeros(hd)
            kv = KVdd(np.ascontiguousarray(kh[:, sl]), np.ascontiguousarray(vh[:, sl]),
                      np.ascontiguousarray(kl[:, sl]), np.ascontiguousarray(vl[:, sl]),
                      kr, vr * UP)
            kv.ok = kv.ok and okk and okv
            out.append(kv)
        self._kv2[b] = out
        if len(self._kv2) > 2:
            self._kv2.popitem(last=False)
        return out

    def refine(self, b: int, rows: Array, kind: str) -> tuple[Array, Array, Array, Array]:
        w, hd, H = self.w, self.hd, self.H
        kvs = self._kv_dd(b)
        S = self.xk.shape[1]
        E = H * hd
        r = rows.size
        step = max(1, CHUNK_ELEMS // max(1, S))
        ah = np.zeros((r, E))
        al = np.zeros((r, E))
        ae = np.zeros((r, E))
        ok = np.ones(r, dtype=bool)
        qh, ql, qe, okq = proj_dd(self.xq[b][rows], w["wq"], w["bq"])
        if not okq:
            ok[:] = False
        rep = H // self.Hkv
        for h in range(H):
            sl = slice(h * hd, (h + 1) * hd)
            qr = norm_up(qe[:, sl])
            zero = self._empty_zero(b, h, rows)
            for s0 in range(0, r, step):
                sel = slice(s0, min(r, s0 + step))
                blk = self.model.block(self._c(b, h), rows[sel])
                res = tier2_block(np.ascontiguousarray(qh[sel, sl]), np.ascontiguousarray(ql[sel, sl]),
                                  qr[sel], kvs[h // rep], blk, self.cs, None, "output")
                z = zero[sel]
                ah[sel, sl] = np.where(z[:, None], 0.0, res.hi)
                al[sel, sl] = np.where(z[:, None], 0.0, res.lo)
                ae[sel, sl] = np.where(z[:, None], 0.0, res.err)
                ok[sel] &= res.ok | z
        oh, ol, oe, oko = proj_dd(ah, w["wo"], w["bo"], x_lo=al, x_err=ae)
        if not oko:
            ok[:] = False
        ok &= np.all(np.isfinite(oh) & np.isfinite(oe), axis=-1)
        return oh, ol, oe * UP + FLOOR, ok

    # ---- tier 3
    def _exact_arb(self, b: int, which: str) -> tuple[Any, int, int]:
        """(arb_mat of the exact projection of xk/xv[b], top, bottom)."""
        key = (b, 0 if which == "k" else 1)
        if key in self._arb:
            return self._arb[key]
        x = self.xk[b] if which == "k" else self.xv[b]
        wm, bias = (self.w["wk"], self.w["bk"]) if which == "k" else (self.w["wv"], self.w["bv"])
        prec, top, bottom = affine_prec(x, wm, bias)
        with Prec(prec):
            m = to_arb_mat(x) * to_arb_mat(wm).transpose()
            if bias is not None:
                m = m + to_arb_mat(np.broadcast_to(bias, (x.shape[0], wm.shape[0])))
        self._arb[key] = (m, top, bottom)
        if len(self._arb) > 4:
            self._arb.popitem(last=False)
        return self._arb[key]

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import arb, arb_mat

        w, hd, H = self.w, self.hd, self.H
        S = self.xk.shape[1]
        r = len(rows)
        km, ktop, kbot = self._exact_arb(b, "k")
        vm, _, _ = self._exact_arb(b, "v")
        xq = self.xq[b][rows]
        pq, qtop, qbot = affine_prec(xq, w["wq"], w["bq"])
        with Prec(pq):
            qm = to_arb_mat(xq) * to_arb_mat(w["wq"]).transpose()
            if w["bq"] is not None:
                qm = qm + to_arb_mat(np.broadcast_to(w["bq"], (r, w["wq"].shape[0])))
        g_prec = (qtop + ktop + hd.bit_length() + 1) - (qbot + kbot) + 8
        rep = H // self.Hkv
        a_rows: list[list[Any]] = [[] for _ in range(r)]
        zero = arb(0)
        for h in range(H):
            sl = list(range(h * hd, (h + 1) * hd))
            hk = h // rep
            ksl = list(range(hk * hd, (hk + 1) * hd))
            with Prec(g_prec):
                qh = arb_mat([[qm[i, j] for j in sl] for i in range(r)]) if hd else arb_mat(r, 0)
                kh = arb_mat([[km[j, l] for l in ksl] for j in range(S)]) if hd and S else \
                    arb_mat(S, 0)
                vh = arb_mat([[vm[j, l] for l in ksl] for j in range(S)]) if hd and S else \
                    arb_mat(S, hd)
                if hd and S and r:
                    ents = (qh * kh.transpose()).entries()
                    g_rows = [ents[i * S:(i + 1) * S] for i in range(r)]
                else:
                    g_rows = [[zero] * S for _ in range(r)]
            zero_rows = self._empty_zero(b, h, np.asarray(rows))
            live = [n_ for n_ in range(r) if not zero_rows[n_]]
            out_h = [[zero] * hd for _ in range(r)]
            if live and S:
                blk = self.model.block(self._c(b, h), np.asarray(rows)[live])
                got = attention_rows([g_rows[n_] for n_ in live], vh, g_prec, None, hd, blk, None,
                                     "output", prec)
                for n_, row in zip(live, got, strict=True):
                    out_h[n_] = row
            for i in range(r):
                a_rows[i].extend(out_h[i])
        E_out = w["wo"].shape[0]
        cols = list(range(E_out)) if cols is None else cols
        with Prec(prec):
            am = arb_mat(a_rows) if r and a_rows[0] else arb_mat(r, 0)
            wo = to_arb_mat(w["wo"][cols])
            om = am * wo.transpose() if am.ncols() else arb_mat(r, len(cols))
            if w["bo"] is not None:
                om = om + to_arb_mat(np.broadcast_to(w["bo"][cols], (r, len(cols))))
            n_c = len(cols)
            ents = om.entries()
        return [ents[i * n_c:(i + 1) * n_c] for i in range(r)]

    # ---- exact ties
    def _exact_ints(self, b: int) -> dict[str, Any]:
        if b in self._ints:
            return self._ints[b]
        w = self.w
        k, ek = int_affine(self.xk[b], w["wk"], w["bk"])
        v, ev = int_affine(self.xv[b], w["wv"], w["bv"])
        wo, ewo = ties.int_matrix(w["wo"])
        d = {"k": k, "ek": ek, "v": v, "ev": ev, "wo": wo, "ewo": ewo}
        self._ints[b] = d
        if len(self._ints) > 2:
            self._ints.popitem(last=False)
        return d

    def _head_polys(self, b: int, i: int, col: int, boundary_shift: Fraction | None = None
                    ) -> list[tuple[ties.Poly, ties.Poly]] | None:
        """Per head (N_h, D_h) as polynomials over the exact score keys, for output
        column ``col``: D_h = Σ_g n_g e^{a_g}, N_h = Σ_g C_hg e^{a_g} with
        C_hg = Σ_{j∈g} ⟨v_hj, wo[col, head h]⟩.  Heads whose row is fully masked under
        masked_rows="zero" contribute nothing."""
        w, hd, H = self.w, self.hd, self.H
        ex = self._exact_ints(b)
        q, eq = int_affine(self.xq[b][[i]], w["wq"], w["bq"])
        c_rat = None
        rt = math.isqrt(hd) if hd else 0
        if hd == 0:
            c_rat = Fraction(0)
        elif rt * rt == hd:
            c_rat = Fraction(1, rt)
        rep = H // self.Hkv
        out = []
        S = self.xk.shape[1]
        for h in range(H):
            c = self._c(b, h)
            blk = self.model.block(c, np.array([i]))
            allowed = np.ones(S, dtype=bool) if blk.allowed is None else blk.allowed[0]
            idx = np.flatnonzero(allowed).tolist()
            if not idx:
                continue  # zero policy: the head adds 0
            hk = h // rep
            qs = q[0, h * hd:(h + 1) * hd]
            ks = ex["k"][:, hk * hd:(hk + 1) * hd]
            vs = ex["v"][:, hk * hd:(hk + 1) * hd]
            wos = ex["wo"][col, h * hd:(h + 1) * hd]
            uniform = blk.uniform is not None and bool(blk.uniform[0])
            if uniform or hd == 0:
                keys = {j: Fraction(0) if c_rat is not None else (Fraction(0), Fraction(0))
                        for j in idx}
            else:
                g = ks.dot(qs) if hd else np.zeros(S, dtype=object)
                madd = blk.madd[0] if blk.madd is not None else None
                keys = {j: ties.score_key(ties.to_fraction(int(g[j]), eq + ex["ek"]),
                                          Fraction(float(madd[j])) if madd is not None
                                          else Fraction(0), c_rat) for j in idx}
            cv = vs.dot(wos) if hd else np.zeros(S, dtype=object)
            e_c = ex["ev"] + ex["ewo"]
            groups = ties.group((j, keys[j]) for j in idx)
            N: ties.Poly = {}
            D: ties.Poly = {}
            for key, js in groups.items():
                N[key] = ties.to_fraction(int(sum(cv[j] for j in js)), e_c)
                D[key] = Fraction(len(js))
            out.append((N, D))
        return out

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        E_out = self.w["wo"].shape[0]
        bo = self.w["bo"]
        res: list[Fraction | None] = []
        for col in range(E_out):
            heads = self._head_polys(b, i, col)
            base = Fraction(float(bo[col])) if bo is not None else Fraction(0)
            if heads is None:
                res.append(None)
                continue
            # every head rational on its own (one mean per head): the sum is rational
            total = Fraction(0)
            simple = True
            for N, D in heads:
                means = {N[k] / D[k] for k in D}
                if len(means) != 1:
                    simple = False
                    break
                total += next(iter(means))
            if simple:
                res.append(base + total)
                continue
            exp = ties.mha_expand(heads)
            if exp is None:
                res.append(None)
                continue
            R = ties.mha_rational(*exp)
            res.append(None if R is None else base + R)
        return res

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction) -> int | None:
        """sign(O - T) = sign(P - (T - b_o) Q) with Σ_h N_h/D_h = P/Q, Q > 0."""
        heads = self._head_polys(b, i, col)
        if heads is None:
            return None
        bo = self.w["bo"]
        shift = boundary - (Fraction(float(bo[col])) if bo is not None else Fraction(0))
        if not heads:
            return (shift < 0) - (shift > 0)
        exp = ties.mha_expand(heads)
        if exp is None:
            return None
        P, Q = exp
        diff = dict(P)
        for k, v in Q.items():
            diff[k] = diff.get(k, Fraction(0)) - shift * v
        hd = self.hd
        return ties.sign_of_sum(list(diff.items()), lambda: _scale_ball(hd))


def _scale_ball(hd: int) -> Any:
    return scale_arb(None, hd)


def _get(module: Any, name: str) -> Any:
    val = getattr(module, name, None)
    if val is None:
        return None
    return as_exact_array(val, f"module.{name}")


def _sdpa_form(a: Array, name: str) -> Array:
    """A torch MultiheadAttention mask in SDPA form: bool True = masked out becomes
    True = takes part; a float mask is checked and kept (added to the scores)."""
    if a.dtype == bool:
        return ~a
    validate_finite(a, name, allow_neg_inf=True)
    return to_float64(a)


@dataclass
class MhaInputs:
    """A multi-head block's inputs, read exactly and checked (:func:`mha_inputs`):
    xq (N, L, E_q), xk (N, S, kdim), xv (N, S, vdim) batch-first float64; the
    weights ``w`` ("wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo"; biases may be
    None); heads; the score model over (N, H) in SDPA form; the output layout."""

    xq: Array
    xk: Array
    xv: Array
    w: dict[str, Any]
    H: int
    Hkv: int
    hd: int
    model: ScoreModel
    masked_rows: str
    unbatched: bool
    batch_first: bool
    packed: bool

    @property
    def out_shape(self) -> tuple[int, ...]:
        N, L = self.xq.shape[:2]
        E_out = self.w["wo"].shape[0]
        if self.unbatched:
            return (L, E_out)
        return (N, L, E_out) if self.batch_first else (L, N, E_out)


def _module_args(module: Any) -> tuple[Any, ...]:
    """A torch ``nn.MultiheadAttention``'s heads, layout and weights, read exactly:
    (num_heads, batch_first, in_proj_weight, q/k/v_proj_weight, in_proj_bias,
    out_proj_weight, out_proj_bias)."""
    if not all(hasattr(module, a) for a in ("num_heads", "out_proj", "in_proj_weight")):
        raise SpecError(f"module={shown(module)}: expected a torch nn.MultiheadAttention")
    if getattr(module, "bias_k", None) is not None or getattr(module, "add_zero_attn", False):
        raise SpecError("module uses add_bias_kv or add_zero_attn, which reference_mha "
                        "does not model")
    ob = getattr(module.out_proj, "bias", None)
    return (int(module.num_heads), bool(getattr(module, "batch_first", False)),
            _get(module, "in_proj_weight"), _get(module, "q_proj_weight"),
            _get(module, "k_proj_weight"), _get(module, "v_proj_weight"),
            _get(module, "in_proj_bias"),
            as_exact_array(module.out_proj.weight, "module.out_proj.weight"),
            None if ob is None else as_exact_array(ob, "module.out_proj.bias"))


def _float_input(x: Any, name: str) -> Array:
    """An input or weight of the block read exactly as float64, finite, not bool."""
    a = as_exact_array(x, name)
    if a.dtype == bool:
        raise SpecError(f"{name}.dtype=bool: expected a float array")
    validate_finite(a, name)
    return to_float64(a)


def _weights(in_proj_weight: Any, in_proj_bias: Any, q_proj_weight: Any,
             k_proj_weight: Any, v_proj_weight: Any, out_proj_weight: Any,
             out_proj_bias: Any, H: int, Hkv: int, Eq: int, kdim: int,
             vdim: int) -> tuple[dict[str, Any], int]:
    """The block's weights read exactly and checked against the inputs' sizes:
    ({"wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo"}, head dim)."""
    if in_proj_weight is not None:
        wi = _float_input(in_proj_weight, "in_proj_weight")
        if wi.ndim != 2 or wi.shape[0] % 3 or Hkv != H:
            raise ShapeError(f"in_proj_weight.shape={wi.shape}: expected (3E, E) "
                             "(GQA needs separate q/k/v_proj_weight)")
        E = wi.shape[0] // 3
        wq, wk, wv = wi[:E], wi[E:2 * E], wi[2 * E:]
    else:
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise SpecError("pass in_proj_weight or all of q_proj_weight, k_proj_weight, "
                            "v_proj_weight")
        wq = _float_input(q_proj_weight, "q_proj_weight")
        wk = _float_input(k_proj_weight, "k_proj_weight")
        wv = _float_input(v_proj_weight, "v_proj_weight")
        E = wq.shape[0]
    if E % H:
        raise ShapeError(f"embed_dim={E} is not divisible by num_heads={H}")
    hd = E // H
    Ekv = Hkv * hd
    for name, wmat, rows_, cols_ in (("q_proj_weight", wq, E, Eq),
                                     ("k_proj_weight", wk, Ekv, kdim),
                                     ("v_proj_weight", wv, Ekv, vdim)):
        if wmat.shape != (rows_, cols_):
            raise ShapeError(f"{name}.shape={wmat.shape} does not match the inputs: expected "
                             f"({rows_}, {cols_}) (E={E}, num_heads={H}, num_kv_heads={Hkv})")
    bq = bk = bv = None
    if in_proj_bias is not None:
        bi = _float_input(in_proj_bias, "in_proj_bias")
        if bi.shape != (E + 2 * Ekv,):
            raise ShapeError(f"in_proj_bias.shape={bi.shape}: expected ({E + 2 * Ekv},)")
        bq, bk, bv = bi[:E], bi[E:E + Ekv], bi[E + Ekv:]
    wo = _float_input(out_proj_weight, "out_proj_weight")
    if wo.ndim != 2 or wo.shape[1] != E:
        raise ShapeError(f"out_proj_weight.shape={wo.shape}: expected (E_out, {E})")
    E_out = wo.shape[0]
    bo = None
    if out_proj_bias is not None:
        bo = _float_input(out_proj_bias, "out_proj_bias")
        if bo.shape != (E_out,):
            raise ShapeError(f"out_proj_bias.shape={bo.shape}: expected ({E_out},)")
    return {"wq": wq, "wk": wk, "wv": wv, "bq": bq, "bk": bk, "bv": bv, "wo": wo,
            "bo": bo}, hd


def _sdpa_masks(key_padding_mask: Any, attn_mask: Any, N: int, H: int, L: int, S: int,
                unbatched: bool) -> tuple[Array, ...]:
    """torch MHA's masks (bool True = masked out) in SDPA form over the batch (N, H)."""
    masks: list[Array] = []
    if key_padding_mask is not None:
        a = read_mask(key_padding_mask, "key_padding_mask")
        kp_shape = (S,) if unbatched else (N, S)
        if a.shape != kp_shape:
            raise ShapeError(f"key_padding_mask.shape={a.shape}: expected {kp_shape} "
                             "(batch, S)")
        masks.append(_sdpa_form(a.reshape(N, 1, 1, S), "key_padding_mask"))
    if attn_mask is not None:
        a = read_mask(attn_mask, "attn_mask")
        if a.shape == (L, S):
            a = a.reshape(1, 1, L, S)
        elif a.shape == (N * H, L, S):
            a = a.reshape(N, H, L, S)  # torch layout: index n*num_heads + h
        else:
            raise ShapeError(f"attn_mask.shape={a.shape}: expected ({L}, {S}) or "
                             f"({N * H}, {L}, {S}) (batch*num_heads, L, S)")
        masks.append(_sdpa_form(a, "attn_mask"))
    floats = sum(m.dtype != bool for m in masks)
    if floats > 1:
        # two float masks: their float sum need not be exact; refuse (pass one combined)
        raise SpecError("key_padding_mask and attn_mask are both float masks; pass one "
                        "combined float mask (or bool masks) so the sum stays exact")
    return tuple(masks)


def mha_inputs(
    query: Any, key: Any, value: Any, *,
    num_heads: int | None = None,
    in_proj_weight: Any = None, in_proj_bias: Any = None,
    q_proj_weight: Any = None, k_proj_weight: Any = None, v_proj_weight: Any = None,
    out_proj_weight: Any = None, out_proj_bias: Any = None,
    num_kv_heads: int | None = None,
    key_padding_mask: Any = None, attn_mask: Any = None, is_causal: bool = False,
    batch_first: bool = False, masked_rows: str = "zero", module: Any = None,
) -> MhaInputs:
    """The arguments of :func:`reference_mha` read and checked (shared with
    :func:`..backward.reference_mha_backward`); ``masked_rows="error"`` raises here."""
    if masked_rows not in POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {POLICIES}")
    if module is not None:
        (num_heads, batch_first, in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight,
         in_proj_bias, out_proj_weight, out_proj_bias) = _module_args(module)
    if num_heads is None or isinstance(num_heads, bool) or int(num_heads) < 1:
        raise SpecError(f"num_heads={num_heads!r}: expected a positive integer")
    H = int(num_heads)
    Hkv = H if num_kv_heads is None else int(num_kv_heads)
    if Hkv < 1 or H % Hkv:
        raise SpecError(f"num_kv_heads={num_kv_heads!r}: expected a positive divisor of "
                        f"num_heads={H}")
    if out_proj_weight is None:
        raise SpecError("out_proj_weight is required (or pass module=)")

    xq, xk, xv = (_float_input(x, n) for x, n in ((query, "query"), (key, "key"),
                                                   (value, "value")))
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
    w, hd = _weights(in_proj_weight, in_proj_bias, q_proj_weight, k_proj_weight,
                     v_proj_weight, out_proj_weight, out_proj_bias, H, Hkv, Eq,
                     xk.shape[2], xv.shape[2])
    masks = _sdpa_masks(key_padding_mask, attn_mask, N, H, L, S, unbatched)
    model = ScoreModel((N, H), L, S, masks=masks, is_causal=is_causal,
                       policy=masked_rows)
    empty = model.empty_rows().reshape(N, H, L)
    # the policy's one reading ("error" raises here, naming (batch, head, row))
    masked_rows_of(masked_rows, empty.reshape(N * H, L), S, (N, H),
                   what="key_padding_mask/attn_mask/is_causal")

    return MhaInputs(xq, xk, xv, w, H, Hkv, hd, model, masked_rows, unbatched, batch_first,
                     in_proj_weight is not None)


def _tier1_heads(inp: MhaInputs, zero_empty: Array) -> tuple[Array, Array, Array]:
    """Tier 1 of the block: the projections with their bounds, then attention per
    (batch, head, block of rows); the heads' outputs (N, L, E), their error bounds
    and the rows tier 1 decided.  Rows the policy zeroes give 0 with error 0."""
    xq, xk, xv, w, model = inp.xq, inp.xk, inp.xv, inp.w, inp.model
    H, Hkv, hd = inp.H, inp.Hkv, inp.hd
    N, L, _ = xq.shape
    S = xk.shape[1]
    E = H * hd
    q_t, q_e = proj_fast(xq, w["wq"], w["bq"])
    k_t, k_e = proj_fast(xk, w["wk"], w["bk"])
    v_t, v_e = proj_fast(xv, w["wv"], w["bv"])
    c_f = 1.0 / math.sqrt(hd) if hd else 0.0
    rho_c = 2.01 * U * c_f * UP + (ETA if hd else 0.0)
    a_t = np.zeros((N, L, E))
    a_e = np.zeros((N, L, E))
    ok = np.ones((N, L), dtype=bool)
    rep = H // Hkv
    if not (L and S):
        return a_t, a_e, ok
    step = max(1, CHUNK_ELEMS // S)
    for n in range(N):
        kvs = []
        for hk in range(Hkv):
            sl = slice(hk * hd, (hk + 1) * hd)
            kvs.append(KV(np.ascontiguousarray(k_t[n][:, sl]),
                          np.ascontiguousarray(v_t[n][:, sl]),
                          norm_up(k_e[n][:, sl]),
                          (np.max(v_e[n][:, sl], axis=0) if S else np.zeros(hd)) * UP))
        for h in range(H):
            sl = slice(h * hd, (h + 1) * hd)
            qr_all = norm_up(q_e[n][:, sl])
            for i0 in range(0, L, step):
                i1 = min(L, i0 + step)
                blk = model.block(n * H + h, slice(i0, i1))
                res = tier1_block(np.ascontiguousarray(q_t[n][i0:i1, sl]), qr_all[i0:i1],
                                  kvs[h // rep], blk, c_f, rho_c)
                em = zero_empty[n, h, i0:i1]
                a_t[n, i0:i1, sl] = np.where(em[:, None], 0.0, res.y)
                a_e[n, i0:i1, sl] = np.where(em[:, None], 0.0, res.err)
                ok[n, i0:i1] &= res.ok | em
    return a_t, a_e, ok


def _out_projection(a_t: Array, a_e: Array, wo: Array, bo: Array | None
                    ) -> tuple[Array, Array]:
    """The output projection a Woᵀ + bo in float64 with its error bound (from the heads'
    bounds ``a_e`` and the projection's own rounding)."""
    E = a_t.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        o_t = a_t @ wo.T
        abs_wo = np.abs(wo)
        o_e = a_e @ abs_wo.T + gamma(max(E, 1)) * (np.abs(a_t) @ abs_wo.T) + E * ETA
        o_e = o_e / (1 - gamma(max(E, 1)))
        if bo is not None:
            o_t = o_t + bo
            o_e = o_e + U * np.abs(o_t) + ETA
        o_e = o_e * UP + FLOOR
    return o_t, o_e


@functools.partial(door, quiet=True)
def reference_mha(
    query: Any, key: Any, value: Any, *,
    num_heads: int | None = None,
    in_proj_weight: Any = None, in_proj_bias: Any = None,
    q_proj_weight: Any = None, k_proj_weight: Any = None, v_proj_weight: Any = None,
    out_proj_weight: Any = None, out_proj_bias: Any = None,
    num_kv_heads: int | None = None,
    key_padding_mask: Any = None, attn_mask: Any = None, is_causal: bool = False,
    batch_first: bool = False, masked_rows: str = "zero", module: Any = None,
    progress: bool | None = None,
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
    or float (added to the scores; -inf = masked out); integer masks are refused.
    ``is_causal=True`` applies the top-left causal mask (key j <= query i) in
    addition.  Scale 1/sqrt(E/num_heads), exactly.  Every intermediate (projections,
    attention) is an exact real number: the result encloses the exact composition
    of the exact inputs.  ``masked_rows``: "zero" (a fully masked head adds 0),
    "nan", "error" or "uniform" (uniform weights over all keys).

    >>> import numpy as np
    >>> x = np.ones((2, 4))
    >>> r = reference_mha(x, x, x, num_heads=2, in_proj_weight=np.concatenate([np.eye(4)] * 3),
    ...                   out_proj_weight=np.eye(4))
    >>> r.rounded("float32").tolist()
    [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    """
    inp = mha_inputs(query, key, value, num_heads=num_heads, in_proj_weight=in_proj_weight,
                     in_proj_bias=in_proj_bias, q_proj_weight=q_proj_weight,
                     k_proj_weight=k_proj_weight, v_proj_weight=v_proj_weight,
                     out_proj_weight=out_proj_weight, out_proj_bias=out_proj_bias,
                     num_kv_heads=num_kv_heads, key_padding_mask=key_padding_mask,
                     attn_mask=attn_mask, is_causal=is_causal, batch_first=batch_first,
                     masked_rows=masked_rows, module=module)
    xq, xk, xv, w, model = inp.xq, inp.xk, inp.xv, inp.w, inp.model
    H, Hkv, hd = inp.H, inp.Hkv, inp.hd
    wo, bo = w["wo"], w["bo"]
    unbatched, batch_first = inp.unbatched, inp.batch_first
    N, L, _ = xq.shape
    S = xk.shape[1]
    E_out = wo.shape[0]
    policy = masked_rows_of(masked_rows, model.empty_rows(), S, check=False)
    zero_empty = policy.zero.reshape(N, H, L)
    prog = Progress(progress, expected_seconds(N * H * L * S * max(1, 2 * hd // 64), "tier1"))
    # ---- tier 1: projections with bounds, attention per (batch, head, row block)
    a_t, a_e, ok = _tier1_heads(inp, zero_empty)
    o_t, o_e = _out_projection(a_t, a_e, wo, bo)
    ok &= np.all(np.isfinite(o_t) & np.isfinite(o_e), axis=-1)
    nan_rows: Array = np.asarray(policy.nan.reshape(N, H, L).any(axis=1))
    ok &= ~nan_rows
    zero_rows = np.zeros((N, L), dtype=bool)
    problem = _MhaProblem(xq, xk, xv, w, H, Hkv, hd, model, masked_rows)
    pr = prog if prog.enabled else Progress(progress, expected_seconds(N * H * L * S, "tier2"))
    if unbatched:
        return Enclosure(problem, "output", (L, E_out), o_t, o_e, ok, zero_rows, nan_rows,
                         progress=pr)
    if batch_first:
        return Enclosure(problem, "output", (N, L, E_out), o_t, o_e, ok, zero_rows, nan_rows,
                         progress=pr)
    return Enclosure(problem, "output", (L, N, E_out), o_t, o_e, ok, zero_rows, nan_rows,
                     perm=(1, 0, 2), progress=pr)
