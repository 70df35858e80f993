"""The blocks the tolerance model of :mod:`.model` is computed with: row moments of
weight matrices against the values (one matmul on stacked columns), row maxima over
the allowed keys, tie counts, the scaled keys and values a head's chunks share
(:class:`HeadCache`, :class:`KeyRange`), power-of-two exponents; the result type
:class:`Bound` and a variant's :class:`ScoreExtras`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..tolerance import FloatFormat
from . import model_jit as jit

__all__ = ["Bound", "HeadCache", "KeyRange", "ScoreExtras"]


# --------------------------------------------------------------------------------------
# What the bound of :mod:`.model` returns, and what a variant adds to its scores


@dataclass(frozen=True)
class Bound:
    """The tolerance of a chunk: ``tol`` (R, Ev) float64, finite; ``vacuous`` (R, Ev)
    bool: elements for which the model gives no meaningful bound."""

    tol: np.ndarray
    vacuous: np.ndarray


@dataclass(frozen=True)
class ScoreExtras:
    """What a variant kernel does to the scores beyond ``c q·k_j`` (built by
    :mod:`.tolerance_variants`).

    ``scores`` (R, S): the final exact scores in float64 (softcaps, biases, a float
    mask, a sink's logit in its column), replacing ``t_j + m_j`` for the weights;
    ``ind`` (R, S): the worst-case bound of the variant's own independent roundings
    per key, ``var`` the sum of their squared bounds; ``d_eval`` (R, S): the float64
    evaluation error of ``scores`` beyond that of ``c q·k_j``; ``centred``: whether the
    shared errors may be measured from the row's top key (false behind a softcap:
    ``C tanh(·/C)`` is 1-Lipschitz, so a shared relative error δ of t_j moves the final
    score by at most |δ t_j|, but not by a common shift); ``scale_roundings``: the
    roundings of the scale shared by the row (3 with FP8 descale factors multiplied
    into it); ``final_roundings``: extra roundings of the output in u_a (1 for the
    v_descale product)."""

    scores: np.ndarray
    ind: np.ndarray | float = 0.0
    var: np.ndarray | float = 0.0
    d_eval: np.ndarray | float = 0.0
    centred: bool = True
    scale_roundings: int = 1
    final_roundings: int = 0


# --------------------------------------------------------------------------------------
# Helpers on (R, S) weight matrices against (S, Ev) values


def _pow2_exponent(a: np.ndarray) -> int:
    """e with max|a| < 2^e (0 for an empty or all-zero array)."""
    m = float(np.max(np.abs(a), initial=0.0))
    return int(math.frexp(m)[1]) if m > 0 and math.isfinite(m) else 0


@dataclass
class _Moments:
    """Row sums of a weight matrix a ≥ 0 against the effective values ã = κ v of a
    chunk: ``sa`` = Σ_j a_j, ``ab`` = Σ_j a_j |ã_j|, ``li`` = Σ_j a_j ã_j, ``sq`` =
    Σ_j a_j ã_j² (each (R, Ev); None when not needed), S the number of keys."""

    sa: np.ndarray
    ab: np.ndarray | None
    li: np.ndarray | None
    sq: np.ndarray | None
    S: int

    def without(self, w: np.ndarray, v_row: np.ndarray) -> _Moments:
        """The moments with one term per row removed (weight ``w`` (R, 1), effective
        value ``v_row`` (R, Ev)); the subtraction's float64 error, ≤ 2^-52 of the
        terms, is added back as slack so that the result stays an upper bound."""
        slack = 2.0**-51

        def sub(m: np.ndarray | None, t: np.ndarray) -> np.ndarray | None:
            return None if m is None else np.maximum(m - t, 0.0) + slack * np.abs(m)

        return _Moments(np.maximum(self.sa - w, 0.0) + slack * self.sa,
                        sub(self.ab, w * np.abs(v_row)),
                        None if self.li is None else self.li - w * v_row,
                        sub(self.sq, w * v_row * v_row), self.S)

    def quad(self, c: np.ndarray) -> np.ndarray:
        """Σ_j a_j (ã_j − c)², by expansion Σaã² − 2cΣaã + c²Σa; the float64 evaluation
        errs by ≤ γ_{S+3}(2^-53)(Σaã² + 2|c|Σa|ã| + c²Σa) ≤ 2γ_{S+3}(2^-53)(Σaã² + c²Σa)
        (2|c||ã| ≤ ã² + c²), added as slack."""
        assert self.sq is not None and self.li is not None
        c2 = c * c
        q = self.sq - 2.0 * c * self.li + c2 * self.sa
        return np.asarray(np.maximum(q, 0.0) + (self.S + 4) * 2.0**-51 * (self.sq + c2 * self.sa))

    def absdev(self, c: np.ndarray) -> np.ndarray:
        """A bound on Σ_j a_j |ã_j − c| (c any centre per row and column): the smaller
        of Σ a|ã| + |c| Σ a and sqrt(Σ a · Σ a (ã − c)²) (Cauchy–Schwarz)."""
        assert self.ab is not None
        opt1 = self.ab + np.abs(c) * self.sa
        opt2 = np.sqrt(self.sa * self.quad(c)) * (1.0 + 2.0**-40)
        return np.asarray(np.minimum(opt1, opt2))


class _Values:
    """The (S, Ev) values of a chunk, scaled by 2^-ev, with the row multipliers κ
    (dropout): the moments of a weight matrix by one matmul on stacked columns
    [|v|, v, v²] (two with dropout: a∘κ against [|v|, v], a∘κ² against v²)."""

    def __init__(self, v: np.ndarray, kappa: np.ndarray | None, n_terms: int | None = None
                 ) -> None:
        self.v = v
        self.kappa = kappa
        self.Ev = v.shape[1]
        self.av = np.abs(v)
        self.v2 = v * v
        self.rhs = np.concatenate([self.av, v, self.v2], axis=1)
        # the key count S of the moments' slack (:meth:`_Moments.quad`): the head's,
        # also for a chunk restricted to a range of its keys (the same formula)
        self.n_terms = n_terms

    def keys(self, j0: int, j1: int, kappa: np.ndarray | None) -> _Values:
        """The values of the keys ``j0:j1`` (views of these rows, no copy), the slack
        still counting every key of the head."""
        sub = object.__new__(_Values)
        sub.v, sub.av, sub.v2, sub.rhs = (a[j0:j1] for a in (self.v, self.av, self.v2,
                                                             self.rhs))
        sub.kappa, sub.Ev = kappa, self.Ev
        sub.n_terms = self.v.shape[0] if self.n_terms is None else self.n_terms
        return sub

    def moments(self, a: np.ndarray, *, ab: bool = True, li: bool = True,
                sq: bool = True) -> _Moments:
        Ev, S = self.Ev, a.shape[-1] if self.n_terms is None else self.n_terms
        sa = np.sum(a, axis=-1, keepdims=True)
        parts: list[np.ndarray | None] = [None, None, None]
        want = [ab, li, sq]
        if self.kappa is None:
            lo, hi = want.index(True), 3 - want[::-1].index(True)
            m = a @ self.rhs[:, lo * Ev:hi * Ev]
            for i in range(lo, hi):
                parts[i] = m[:, (i - lo) * Ev:(i - lo + 1) * Ev]
        else:
            if ab or li:
                m = (a * self.kappa) @ self.rhs[:, :2 * Ev]
                parts[0], parts[1] = m[:, :Ev], m[:, Ev:]
            if sq:
                parts[2] = (a * (self.kappa * self.kappa)) @ self.v2
        ab_m, li_m, sq_m = (p if w else None for p, w in zip(parts, want, strict=True))
        return _Moments(sa, ab_m, li_m, sq_m, S)


class HeadCache:
    """What the chunks of one head share: the scaled keys k̄ = 2^-ek k and |k̄|, the
    scaled values v̄ and their stacked moment columns (:class:`_Values`).  Built by the
    first chunk of a head and reused by the next ones while they pass the very same
    ``k`` and ``v`` arrays (checked by identity; :meth:`Plain.bound` makes one per
    head, so nothing is mutated in between).  The values are those a fresh
    computation gives: the same operations on the same arrays."""

    def __init__(self) -> None:
        self._k: np.ndarray | None = None
        self._v: np.ndarray | None = None
        self._keys: tuple[int, np.ndarray, np.ndarray] | None = None
        self._vals: tuple[int, np.ndarray, _Values] | None = None

    def keys(self, k: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """(ek, k̄, |k̄|)."""
        if self._keys is None or self._k is not k:
            ek = _pow2_exponent(k)
            kb = np.ldexp(k, -ek)
            self._k, self._keys = k, (ek, kb, np.abs(kb))
        return self._keys

    def values(self, v: np.ndarray) -> tuple[int, np.ndarray, _Values]:
        """(ev, v̄, the moments' right-hand side of v̄ without dropout)."""
        if self._vals is None or self._v is not v:
            ev = _pow2_exponent(v)
            vb = np.ldexp(v, -ev)
            self._v, self._vals = v, (ev, vb, _Values(vb, None))
        return self._vals


class KeyRange:
    """A :class:`HeadCache` seen through the keys ``j0:j1`` (a chunk whose other keys
    are masked in every row, issue 29): the head's scaled keys and values, their
    exponents taken over the whole head, sliced; the moments' slack counts the head's
    keys.  So every value of the bound is the unrestricted one, up to the float64
    summation order of sums that lose only exact zeros."""

    def __init__(self, head: HeadCache, k: np.ndarray, v: np.ndarray, j0: int, j1: int
                 ) -> None:
        self.head, self.k, self.v, self.j0, self.j1 = head, k, v, j0, j1

    def keys(self, k: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        ek, kb, akb = self.head.keys(self.k)
        return ek, kb[self.j0:self.j1], akb[self.j0:self.j1]

    def values(self, v: np.ndarray) -> tuple[int, np.ndarray, _Values]:
        ev, vb, vals = self.head.values(self.v)
        return ev, vb[self.j0:self.j1], vals.keys(self.j0, self.j1, None)


def _rowmax(a: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """max over the allowed keys of each row, (R, 1); 0 for a row without one."""
    a = np.broadcast_to(a, allowed.shape)
    if allowed.shape[-1] == 0:
        return np.zeros((allowed.shape[0], 1))
    return np.asarray(np.max(np.where(allowed, a, 0.0), axis=-1, keepdims=True))


def _tie_counts(s: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """N_ij: how many allowed keys of row i have exactly the score s_ij (1 if unique).
    Rows are sorted once; only rows holding a repeated score are counted."""
    R, S = s.shape
    out = np.ones((R, S))
    if S <= 1 or R == 0:
        return out
    if jit.tie_counts(s, allowed, out):
        return out              # the same counts, by a hash table per row (no sort)
    key = np.where(allowed, s, np.nan)             # masked keys: NaN, never equal
    srt = np.sort(key, axis=1)
    dup_rows = np.flatnonzero(np.any(srt[:, 1:] == srt[:, :-1], axis=1))
    if dup_rows.size == 0:
        return out
    kd = key[dup_rows]
    order = np.argsort(kd, axis=1)
    sd = np.take_along_axis(kd, order, axis=1)
    new = np.ones(sd.shape, dtype=bool)
    new[:, 1:] = ~(sd[:, 1:] == sd[:, :-1])
    run = np.cumsum(new, axis=1) - 1                # run id within the row
    n = sd.shape[0]
    flat = run + (np.arange(n) * S)[:, None]
    counts = np.bincount(flat.ravel(), minlength=n * S).reshape(n, S)
    n_sorted = np.take_along_axis(counts, run, axis=1).astype(np.float64)
    sub = np.empty((n, S))
    np.put_along_axis(sub, order, n_sorted, axis=1)
    out[dup_rows] = np.where(allowed[dup_rows], sub, 1.0)
    return out


def _scale_is_exact(c: float, fmt: FloatFormat) -> bool:
    """Is c a value of ``fmt`` (so that holding it in ``fmt`` loses nothing)?"""
    if c == 0.0 or not math.isfinite(c):
        return True
    m, e = math.frexp(abs(c))
    mant = int(math.ldexp(m, 53))
    bits = 53 - ((mant & -mant).bit_length() - 1)   # significant bits of c
    return bits <= fmt.p and fmt.emin - fmt.p + 1 <= e - 1 <= fmt.emax


def _is_pow2(c: float) -> bool:
    return c != 0.0 and math.isfinite(c) and math.frexp(abs(c))[0] == 0.5
