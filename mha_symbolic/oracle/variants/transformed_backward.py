"""Certified gradients of attention whose scores pass through a softcap (or carry a
bias that is not a double): the hooks that let the backward's three tiers
(:mod:`.backward`) run on the transformed scores of :mod:`.transformed`.

The scores are s_ij = T(c·q_i·k_j) on the kept keys (T the pipeline: softcaps
C·tanh(·/C), exact biases, the float mask), so with P = softmax(s) the gradients are
those of plain attention in the scores, dS = P ∘ (dP − D), and the chain rule through
T gives the gradient of the scaled dot products

    dS⁰_ij = Φ_ij dS_ij,   Φ_ij = ∂s_ij/∂(c q_i·k_j) = Π_caps sech²(x_ij),

x the argument s/C of each cap (the derivative of C·tanh(s/C) is sech²(s/C));
dQ = c·dS⁰ K, dK = c·dS⁰ᵀ Q, dV = Pᵀ dO, and the gradients of the biases and of
the mask are linear functionals of dS itself (:mod:`.backward.functionals`).  A sink
is one more key with k = 0, v = 0 and score σ (its Φ is 1, its k row is 0).

Per tier (docs/gradients.md §11):

1. the weights: the forward's proved float64 scores s~ with a per-row bound δ
   (:func:`.transformed._float_scores`), the plain tier 1 on the scores s~ (exact
   doubles), then |P(s) − P(s~)| <= (e^{2δ} − 1) P(s~) (the perturbation lemma of
   :mod:`.transformed`); Φ with its bound from :func:`.transformed.sech2_proved`;
2. the double-double scores and Φ of :meth:`.transformed.TransformedProblem.scores_dd`;
3. Arb balls of the weights and of Φ (:meth:`.transformed.TransformedProblem.arb_weights_factor`);
4. exact decisions: the scores are transcendental, so exponentials and factors are
   independent *symbols* (:class:`TransformedField`): an element whose expansion is
   identically 0, or rational, is decided exactly (sound whatever relations the
   symbols have); otherwise Arb decides its side of a boundary, and a value exactly
   on a boundary that is not such an identity raises PrecisionError — never guessed.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ..arith.constants import UP
from ..backward.exact import ExactProblem, ExactRow, Key, QField
from ..conventions import Block
from ..forward.fast import KV, Tier1, tier1_block
from .transformed import Cap, TransformedProblem, _float_scores

__all__ = ["TransformHooks", "TransformedField"]

Arr = np.ndarray[Any, Any]


class TransformHooks:
    """The hooks of :func:`.backward.api.backward_enclosures` for a transformed problem
    ``tp`` (flat problems as the backward's, keys without the sink; the backward's k
    and v carry one more zero row when there are sinks)."""

    def __init__(self, tp: TransformedProblem, c_f: float, rho_c: float,
                 extra: Arr | None = None) -> None:
        # extra (B, L): tp's q, k are float approximations whose dot products err by at
        # most this per row (rotary's rotated q̃', k̃': _float_scores' step 1)
        self.tp, self.c_f, self.rho_c, self.extra = tp, c_f, rho_c, extra
        self.S = tp.k.shape[1]
        self._t1: dict[tuple[int, int, int], tuple[Arr, Arr]] = {}
        self._t2: dict[tuple[int, bytes], tuple[dict[int, int], tuple[Arr, ...]]] = {}
        self._kv: tuple[int, KV] | None = None

    # ---- exact arithmetic
    def field(self, fld: QField) -> TransformedField:
        return TransformedField(fld.c_rat, fld.E, self.tp)

    def exact(self, e: int, fld: Any, *args: Any) -> ExactProblem:
        return TransformedExactProblem(self.tp, e, fld, *args)

    # ---- tier 1
    def _values(self, e: int) -> KV:
        if self._kv is None or self._kv[0] != e:
            v = self.tp.v[e]
            if self.tp.sinks is not None:
                v = np.concatenate([v, np.zeros((1, v.shape[1]))], axis=0)
            self._kv = (e, KV(np.zeros((v.shape[0], 0)), np.ascontiguousarray(v)))
        return self._kv[1]

    def tier1(self, e: int) -> tuple[Any, Any]:
        tp = self.tp

        def weights(i0: int, i1: int, blk: Block) -> Tier1:
            """P of rows i0:i1 within a proved bound: the plain tier 1 on the scores s~
            (zero-width q and k, s~ as the additive mask), then the lemma's e^{2δ}."""
            r = i1 - i0
            al = np.asarray(tp.allowed[e][i0:i1], dtype=bool)
            madd = None if tp.madd is None else tp.madd[e][i0:i1][None]
            with np.errstate(over="ignore", invalid="ignore"):
                s, delta, phi, e_phi = _float_scores(
                    tp.q[e][i0:i1][None], tp.k[e][None], al[None], madd, tp.ops, tp.geo,
                    range(e, e + 1), self.c_f, self.rho_c, rows=slice(i0, i1),
                    want_factor=True,
                    extra=None if self.extra is None else self.extra[e][i0:i1][None])
            s, delta, phi, e_phi = s[0], delta[0], phi[0], e_phi[0]
            s = np.where(al, s, 0.0)
            if tp.uniform is not None:
                uni = np.asarray(tp.uniform[e][i0:i1])
                s[uni] = 0.0
                delta = np.where(uni, 0.0, delta)
            if tp.sinks is not None:
                s = np.concatenate([s, np.full((r, 1), float(tp.sinks[e]))], axis=1)
                phi = np.concatenate([phi, np.ones((r, 1))], axis=1)
                e_phi = np.concatenate([e_phi, np.zeros((r, 1))], axis=1)
            self._t1[(e, i0, i1)] = (np.where(np.isfinite(phi), phi, 0.0),
                                     np.where(np.isfinite(e_phi), e_phi, np.inf))
            res = tier1_block(np.zeros((r, 0)), None, self._values(e),
                              Block(blk.allowed, np.ascontiguousarray(s), None, blk.uniform),
                              0.0, 0.0, want_weights=True, want_abs=True)
            assert res.p is not None and res.err_p is not None and res.a_up is not None
            with np.errstate(over="ignore", invalid="ignore"):
                # (e^δ - 1)e^δ <= δ(1 + δ)(1 + 2δ); e^{2δ} - 1 <= 2δ(1 + 2δ)
                fy = (delta * (1.0 + delta) * (1.0 + 2.0 * delta) * UP)[:, None]
                fp = (2.0 * delta * (1.0 + 2.0 * delta) * UP)[:, None]
                err_y = (res.err + fy * (res.a_up + np.abs(res.y) + res.err)) * UP
                err_p = (res.err_p + fp * (res.p + res.err_p)) * UP
            ok = (res.ok & (delta <= 2.0**-10) & np.all(np.isfinite(err_p), axis=-1)
                  & np.all(np.isfinite(phi) & np.isfinite(e_phi), axis=-1))
            return Tier1(res.y, err_y, ok, res.p, err_p)

        def factor(i0: int, i1: int) -> tuple[Arr, Arr] | None:
            return self._t1.pop((e, i0, i1), None)

        return weights, factor

    # ---- tier 2
    def tier2(self, e: int) -> tuple[Any, Any]:
        tp = self.tp

        def scores(rows: Arr, keys: Arr | None, m: Arr | None) -> Any:
            sc, fac = tp.scores_dd(e, rows, keys, m, want_factor=True)
            assert fac is not None
            kb = b"" if keys is None else np.asarray(keys, dtype=np.int64).tobytes()
            pos = {int(i): n for n, i in enumerate(rows.tolist())}
            if any(key[0] != e for key in self._t2):   # one problem's factors at a time
                self._t2.clear()
            self._t2[(e, kb)] = (pos, fac)
            return sc

        def factor(rows: Arr, keys: Arr | None) -> tuple[Arr, Arr, Arr]:
            """Φ of the scores computed last for these rows (the statistics pass asks
            for the weights first): rows and keys picked from the cached block —
            the same numbers — else computed."""
            kb = b"" if keys is None else np.asarray(keys, dtype=np.int64).tobytes()
            for key_bytes, cols in ((kb, None), (b"", keys)):
                got = self._t2.get((e, key_bytes))
                if got is not None and all(int(i) in got[0] for i in rows.tolist()):
                    idx = np.array([got[0][int(i)] for i in rows.tolist()], dtype=np.int64)
                    if cols is None:
                        return got[1][0][idx], got[1][1][idx], got[1][2][idx]
                    sel = np.ix_(idx, np.asarray(cols, dtype=np.int64))
                    return got[1][0][sel], got[1][1][sel], got[1][2][sel]
            _, fac = tp.scores_dd(e, rows, keys, None, want_factor=True)
            assert fac is not None
            return fac[0], fac[1], fac[2]

        return scores, factor

    # ---- tier 3
    def arb(self, e: int, rows: list[int], prec: int) -> tuple[list[list[Any]], list[list[Any]]]:
        return self.tp.arb_weights_factor(e, rows, prec)


# --------------------------------------------------------------------------------------
# Exact decisions: exponentials and sech² factors as symbols


class TransformedField(QField):
    """Q(c) coefficients (as :class:`.backward.exact.QField`) with exponent keys
    (r, monomial): the value e^r·Π sym^power, r a rational exponent and the monomial a
    sorted tuple of (symbol, power), where a symbol is e^{s} for a transformed score s
    (identified by the exact data fixing it: q·k, the biases, the mask entry) or a
    factor Φ (sech² at each cap's argument).  Scores that are exactly rational (a sink's
    σ, a score with q·k = 0 when every cap precedes every bias) are rational exponents,
    so equal values meet.  Equal data give equal values, so merging equal keys is
    sound; distinct symbols are *not* claimed independent — a nonzero expansion is
    decided in Arb (:meth:`key_arb` gives the logarithm of a key's value as a ball),
    never as a tie."""

    def __init__(self, c_rat: Fraction | None, E: int, tp: TransformedProblem) -> None:
        super().__init__(c_rat, E)
        self.tp = tp
        self._syms: list[tuple[Any, ...]] = []
        self._ids: dict[tuple[Any, ...], int] = {}

    def sym(self, ident: tuple[Any, ...]) -> Key:
        n = self._ids.get(ident)
        if n is None:
            n = len(self._syms)
            self._syms.append(ident)
            self._ids[ident] = n
        return (Fraction(0), ((n, 1),))

    @staticmethod
    def rational(r: Fraction) -> Key:
        return (Fraction(r), ())

    def key_add(self, x: Key, y: Key) -> Key:
        acc = dict(x[1])
        for sy, p in y[1]:
            acc[sy] = acc.get(sy, 0) + p
        return (x[0] + y[0], tuple(sorted((sy, p) for sy, p in acc.items() if p)))

    def key_sub(self, x: Key, y: Key) -> Key:
        return self.key_add(x, (-y[0], tuple((sy, -p) for sy, p in y[1])))

    def key_zero(self) -> Key:
        return (Fraction(0), ())

    def key_float(self, x: Key) -> float:
        from flint import arb

        return float(self.key_arb(x, arb(0) if self.E == 0 else arb(self.E).rsqrt()).mid())

    def key_arb(self, x: Key, c_arb: Any) -> Any:
        """log of the key's value at the current precision (a ball)."""
        from flint import arb, fmpq

        total = arb(fmpq(x[0].numerator, x[0].denominator))
        for sy, p in x[1]:
            total += self._log_value(self._syms[sy], c_arb) * p
        return total

    def _log_value(self, ident: tuple[Any, ...], c: Any) -> Any:
        from flint import arb, fmpq

        kind = ident[0]
        g, biases = ident[1], list(ident[2])
        s = c * arb(fmpq(g.numerator, g.denominator))
        if kind == "w":
            return self.tp._pipeline(s, biases, ident[3])
        # "phi": Σ over the caps of log sech²(x) = -2 log cosh(x), x the cap's argument
        it = iter(biases)
        lf = arb(0)
        for op in self.tp.ops:
            if isinstance(op, Cap):
                cc = arb(op.C)
                x = s / cc
                lf -= 2 * x.cosh().log()
                s = cc * x.tanh()
            else:
                bv = next(it)
                s = s + arb(fmpq(bv.numerator, bv.denominator))
        return lf


class TransformedExactProblem(ExactProblem):
    """One problem of a transformed score in exact arithmetic: the keys of a row are
    the symbols of their scores (:class:`TransformedField`), the factor Φ of a key the
    symbol of its sech² product (1 when every cap's argument is exactly 0)."""

    def __init__(self, tp: TransformedProblem, e: int, fld: Any, *args: Any) -> None:
        super().__init__(fld, *args)
        self.fld: TransformedField = fld
        self.tp, self.e = tp, e
        self.S_real = tp.k.shape[1]
        ops = tp.ops
        first_bias = next((n for n, op in enumerate(ops) if not isinstance(op, Cap)), len(ops))
        # every cap before every bias: at q·k = 0 each cap's argument is exactly 0
        self._zero_is_one = all(not isinstance(op, Cap) for op in ops[first_bias:])

    def _ident(self, i: int, j: int) -> tuple[Fraction, tuple[Fraction, ...]]:
        return self.q.dot(i, self.k, j), tuple(self.tp._biases(self.e, i, j))

    def row(self, i: int) -> ExactRow:
        got = self._rows.get(i)
        if got is not None:
            return got
        fld = self.fld
        keys: dict[int, Key] = {}
        dp: dict[int, Fraction] = {}
        keep = None if self.keep is None else self.keep[i]
        uni = bool(self.uniform[i])
        for j in np.flatnonzero(self.allowed[i]).tolist():
            if j >= self.S_real:
                keys[j] = fld.rational(Fraction(float(self.tp.sinks[self.e])))
            elif uni:
                keys[j] = fld.key_zero()
            else:
                g, biases = self._ident(i, j)
                m = self.tp._m(self.e, i, j)
                if g == 0 and self._zero_is_one:  # every cap maps 0 to 0: rational
                    keys[j] = fld.rational(sum(biases, Fraction(0)) + m)
                else:
                    keys[j] = fld.sym(("w", g, biases, m))
            dp[j] = (Fraction(0) if keep is not None and not keep[j]
                     else self.f * self.do.dot(i, self.v, j))
        row = ExactRow(keys, dp)
        self._rows[i] = row
        return row

    def phi(self, i: int, j: int) -> Key | None:
        if j >= self.S_real or not any(isinstance(op, Cap) for op in self.tp.ops):
            return None
        g, biases = self._ident(i, j)
        if g == 0 and self._zero_is_one:
            return None
        return self.fld.sym(("phi", g, biases))
