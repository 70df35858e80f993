"""Exact decisions for gradient elements on (or absurdly near) a rounding boundary.

Ziv's loop never settles on a value that sits exactly on a rounding boundary, so
an undecided element is decided here, in exact arithmetic, by the argument of the
forward pass (docs/oracle.md §4) carried through the backward formulas.

**The structure of a gradient element.**  Take one row i of one problem (one
batch and head) and group its allowed keys by exact score: group g has score
a_g (an algebraic number: c·(q_i·k_j) + M_ij with exact dyadic inputs and c
rational or 1/sqrt(E)), n_g keys, and w_g = e^{a_g}; Z = Σ_g n_g w_g.  Then
P_ij = w_{g(j)}/Z, D_i = Σ_g w_g P_g/Z with P_g = Σ_{j∈g} dP_ij, and::

    dS_ij  = e^{a_{g(j)}} Σ_g (n_g dP_ij − P_g) e^{a_g} / Z²
    dQ_il  = c Σ_{g,h} (KP_gl n_h − K_gl P_h) e^{a_g + a_h} / Z²      (K_gl = Σ_{j∈g} k_jl,
                                                                       KP_gl = Σ_{j∈g} k_jl dP_ij)
    dK_jl  = c Σ_rows q_il dS_ij,    dV_jl = Σ_rows f·keep_ij dO_il w_{g(j)} / Z,
    d(mask)_ij = Σ over broadcast copies of dS_ij.

So every element is y = R + Σ_r N_r / Z_r^{d_r}: a constant R (rows whose allowed
scores are all equal contribute rationals, as do uniform rows) plus *row terms*,
each an exponential polynomial N_r (coefficients in Q(c)) over a power d_r ∈ {1, 2}
of its row's Z_r.

**Deciding y = T exactly.**  Shift each row's exponents so its smallest is 0
(softmax is shift-invariant; N/Z^d = N e^{−ds}/(Z e^{−s})^d); rows whose shifted
Z_r agree (and d agrees) are one *class* and their numerators add (this is how
mirrored rows cancel: e^a/(e^a + e^b) + e^b/(e^a + e^b) = 1).  Classes with a
single exponent are rational and join R.  With the classes C_1 … C_m left,

    y − T = F / Π_k Z_k^{d_k},   F = (R − T) Π_k Z_k^{d_k} + Σ_k N_k Π_{k'≠k} Z_{k'}^{d_{k'}},

and Π Z > 0, so sign(y − T) = sign(F).  F expands to Σ_α β_α e^α with distinct
algebraic exponents α and algebraic coefficients β_α.  By the
Lindemann–Weierstrass theorem (Baker's form: e^{α_1}, …, e^{α_n} are linearly
independent over the algebraic numbers for distinct algebraic α_i), F = 0 iff
every β_α = 0 — an exact test in rational arithmetic (β_α = a + b·c with c
irrational is 0 iff a = b = 0).  Otherwise each term β_α e^{α − A} is a ball of
full relative accuracy however small e^{α − A} is, and the sign of their sum is
decided in Arb at raised precision (a nonzero F is decided eventually; the
precision is capped at 2**16 bits like the forward).

**What is not decided.**  The expansion of F has up to Π_k |Z_k|^{d_k} terms.
Beyond :data:`TERM_BUDGET` terms (several classes of rows with many distinct
scores, all meeting at one element) the tie cannot be decided here and
:class:`~mha_symbolic.errors.PrecisionError` is raised naming the element; this
needs a gradient element within about 2**-250 of a rounding boundary, which
random or measured data do not produce.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import PrecisionError
from ..arith.balls import Prec
from ..arith.ties import sign_of_sum

__all__ = ["TERM_BUDGET", "Accumulator", "ExactDecisions", "ExactProblem", "IntMatrix", "QField",
           "decide_sign", "exact_value"]

TERM_BUDGET = 200_000  # most terms an expansion of F may have before giving up
MAX_SIGN_PREC = 1 << 16

Key = Any  # a Fraction (rational scale) or a pair (g, M) meaning c·g + M
Coef = tuple[Fraction, Fraction]  # a + b·c
Poly = dict[Key, Coef]

_ZERO = Fraction(0)


class QField:
    """Arithmetic in Q(c) for the scale c: with c rational (``E=None``) every
    coefficient is (a, 0); with c = 1/sqrt(E) irrational, (a, b) means a + b·c and
    c² = 1/E."""

    def __init__(self, c_rat: Fraction | None, E: int) -> None:
        self.c_rat = c_rat
        self.E = E

    @property
    def irrational(self) -> bool:
        return self.c_rat is None

    def c(self) -> Coef:
        """c itself."""
        return (self.c_rat, _ZERO) if self.c_rat is not None else (_ZERO, Fraction(1))

    def mul(self, x: Coef, y: Coef) -> Coef:
        a, b = x
        a2, b2 = y
        if self.c_rat is not None:
            return (a * a2, _ZERO)
        return (a * a2 + b * b2 / self.E, a * b2 + b * a2)

    def key_add(self, x: Key, y: Key) -> Key:
        return x + y if self.c_rat is not None else (x[0] + y[0], x[1] + y[1])

    def key_sub(self, x: Key, y: Key) -> Key:
        return x - y if self.c_rat is not None else (x[0] - y[0], x[1] - y[1])

    def key_zero(self) -> Key:
        return _ZERO if self.c_rat is not None else (_ZERO, _ZERO)

    def key_float(self, x: Key) -> float:
        if self.c_rat is not None:
            return float(x)
        return float(x[0]) / math.sqrt(self.E) + float(x[1])

    def key_arb(self, x: Key, c_arb: Any) -> Any:
        from flint import arb, fmpq

        if self.c_rat is not None:
            return arb(fmpq(x.numerator, x.denominator))
        g, m = x
        return c_arb * arb(fmpq(g.numerator, g.denominator)) + arb(fmpq(m.numerator, m.denominator))


def _is_zero(x: Coef) -> bool:
    return x[0] == 0 and x[1] == 0


def _add_into(p: Poly, key: Key, val: Coef) -> None:
    if _is_zero(val):
        return
    old = p.get(key)
    if old is None:
        p[key] = val
        return
    s = (old[0] + val[0], old[1] + val[1])
    if _is_zero(s):
        del p[key]
    else:
        p[key] = s


def _poly_mul(fld: QField, x: Poly, y: Poly) -> Poly:
    out: Poly = {}
    for kx, cx in x.items():
        for ky, cy in y.items():
            _add_into(out, fld.key_add(kx, ky), fld.mul(cx, cy))
    return out


class ExactRow:
    """One row of one problem in exact arithmetic: score groups and dP.

    ``keys[j]`` the exact score key of allowed key j; ``groups`` key -> list of j;
    ``dp[j]`` = f·keep_ij·(dO_i·v_j) as a Fraction (allowed keys only)."""

    def __init__(self, keys: dict[int, Key], dp: dict[int, Fraction]) -> None:
        self.keys = keys
        self.dp = dp
        self.groups: dict[Key, list[int]] = {}
        for j, kk in keys.items():
            self.groups.setdefault(kk, []).append(j)
        self.z: dict[Key, int] = {kk: len(js) for kk, js in self.groups.items()}
        self.pg: dict[Key, Fraction] = {kk: sum((dp[j] for j in js), _ZERO)
                                         for kk, js in self.groups.items()}

    def ds_numerator(self, j: int) -> dict[Key, Fraction]:
        """e^{a_{g(j)}} Σ_g (n_g dP_ij − P_g) e^{a_g}, rational coefficients, keys summed
        later by the caller (returned unshifted: key a_g, to be added to a_{g(j)})."""
        dpj = self.dp[j]
        return {kk: self.z[kk] * dpj - self.pg[kk] for kk in self.groups}


class _Term:
    """N / Z^d for one row (N over the row's exponents, already combined)."""

    __slots__ = ("d", "n", "z")

    def __init__(self, n: Poly, z: dict[Key, int], d: int) -> None:
        self.n, self.z, self.d = n, z, d


class Decomposition:
    """y = const + Σ_classes N_C / Z_C^{d_C}, every class irrational (several
    exponents) with a nonzero numerator."""

    def __init__(self, fld: QField, const: Coef, classes: list[_Term]) -> None:
        self.fld, self.const, self.classes = fld, const, classes


def decompose(fld: QField, const: Coef, terms: list[_Term]) -> Decomposition:
    """Canonical classes of the row terms (see the module docstring)."""
    classes: dict[Any, _Term] = {}
    for t in terms:
        if not t.n:
            continue
        s = min(t.z)  # lexicographic for pairs: any canonical choice will do
        z2 = {fld.key_sub(kk, s): n for kk, n in t.z.items()}
        shift = s
        for _ in range(t.d - 1):
            shift = fld.key_add(shift, s)
        n2: Poly = {fld.key_sub(kk, shift): cf for kk, cf in t.n.items()}
        ck = (t.d, tuple(sorted(z2.items())))
        cur = classes.get(ck)
        if cur is None:
            classes[ck] = _Term(n2, z2, t.d)
        else:
            for kk, cf in n2.items():
                _add_into(cur.n, kk, cf)
    left: list[_Term] = []
    a, b = const
    for t in classes.values():
        if not t.n:
            continue
        if len(t.z) == 1 and all(kk == fld.key_zero() for kk in t.n):
            # one exponent (0 after the shift): a rational class, N/n^d (with the plain
            # scores N's exponents are then all 0; a transformed problem's numerator can
            # carry other factors, e.g. a softcap's sech², and stays a class)
            (n_only,) = t.z.values()
            den = Fraction(n_only) ** t.d
            for cf in t.n.values():  # every exponent is 0 here
                a += cf[0] / den
                b += cf[1] / den
            continue
        ratio = _ratio_to_power(fld, t)
        if ratio is not None:
            # N = r·Z^d: the class is the constant r (mirrored rows: e^a/Z + e^b/Z = 1)
            a += ratio[0]
            b += ratio[1]
            continue
        left.append(t)
    return Decomposition(fld, (a, b), left)


def _ratio_to_power(fld: QField, t: _Term) -> Coef | None:
    """r with N = r·Z^d exactly (Z has rational coefficients), or None."""
    zp: Poly = {kk: (Fraction(n), _ZERO) for kk, n in t.z.items()}
    acc = zp
    for _ in range(t.d - 1):
        if len(acc) * len(zp) > TERM_BUDGET:
            return None
        acc = _poly_mul(fld, acc, zp)
    if set(acc) != set(t.n):
        return None
    k0 = next(iter(acc))
    z0 = acc[k0][0]
    r = (t.n[k0][0] / z0, t.n[k0][1] / z0)
    for kk, cf in acc.items():
        if t.n[kk] != (r[0] * cf[0], r[1] * cf[0]):
            return None
    return r


def exact_value(dec: Decomposition) -> Fraction | None:
    """The element exactly when it is rational, else None."""
    if dec.classes or dec.const[1] != 0:
        return None
    return dec.const[0]


def _expand(dec: Decomposition, boundary: Fraction, what: Callable[[], str]) -> Poly:
    fld = dec.fld
    powers: list[Poly] = []
    size = 1
    for t in dec.classes:
        zp: Poly = {kk: (Fraction(n), _ZERO) for kk, n in t.z.items()}
        acc = zp
        for _ in range(t.d - 1):
            acc = _poly_mul(fld, acc, zp)
        powers.append(acc)
        size *= max(len(acc), len(t.n))
        if size > TERM_BUDGET:
            raise PrecisionError(
                f"cannot decide whether {what()} lies exactly on the rounding boundary "
                f"{boundary}: it is within 2**-250 of it and combines "
                f"{len(dec.classes)} classes of softmax rows with different score sets, "
                f"whose exact test needs more than {TERM_BUDGET} terms (see "
                "docs/gradients.md §7)")
    one: Poly = {fld.key_zero(): (Fraction(1), _ZERO)}
    total: Poly = {}
    r_minus_t = (dec.const[0] - boundary, dec.const[1])
    if not _is_zero(r_minus_t):
        prod = one
        for pw in powers:
            prod = _poly_mul(fld, prod, pw)
        for kk, cf in prod.items():
            _add_into(total, kk, fld.mul(cf, r_minus_t))
    for idx, t in enumerate(dec.classes):
        prod = dict(t.n)
        for jdx, pw in enumerate(powers):
            if jdx != idx:
                prod = _poly_mul(fld, prod, pw)
        for kk, cf in prod.items():
            _add_into(total, kk, cf)
    return total


#: working precision (bits) of the dominant-term rule: the log-magnitudes it compares
#: are exact key differences (up to ~1e300) evaluated to 2**-192 relative
DOMINANT_PREC = 192


def _coef_ball(cf: Coef, c: Any) -> Any:
    from flint import arb, fmpq

    a, b = cf
    ball = arb(fmpq(a.numerator, a.denominator))
    return ball + c * arb(fmpq(b.numerator, b.denominator)) if b != 0 else ball


def _dominant_sign(dec: Decomposition, boundary: Fraction, c_arb: Callable[[], Any]
                   ) -> int | None:
    """sign(y − boundary) when one term outweighs all the others, without expanding F
    (issue 30: gradients of e^(−1e200) whose expansion took minutes); None otherwise.

    y − T = (R − T) + Σ_C Σ_α β_α e^α / Z_C^d, each term of known sign (Z_C > 0):
    with a_C a largest exponent of Z_C (certified in Arb), n_top its count and n_C
    all of Z_C's, n_top e^{a_C} <= Z_C <= n_C e^{a_C}, so

        log|term| ∈ [log|β| + (α − d a_C) − d log n_C,  log|β| + (α − d a_C) − d log n_top]

    with α − d a_C an exact key (evaluated in Arb).  If the largest term's lower end
    exceeds log(m − 1) + the others' largest upper end (m terms), it outweighs
    their sum and the sign is its β's."""
    from flint import arb

    fld = dec.fld
    with Prec(DOMINANT_PREC):
        c = c_arb()
        spans: list[tuple[Any, Any, Any]] = []   # (log lower, log upper, β ball)
        r = (dec.const[0] - boundary, dec.const[1])
        if not _is_zero(r):
            b = _coef_ball(r, c)
            lg = abs(b).log() if not b.contains(0) else None
            spans.append((lg, abs(b).upper().log() if lg is None else lg, b))
        for t in dec.classes:
            top = max(t.z, key=lambda kk: float(fld.key_arb(kk, c).mid()))
            if any(kk != top and not fld.key_arb(fld.key_sub(kk, top), c) <= 0 for kk in t.z):
                return None   # a largest exponent not certified
            shift = fld.key_zero()
            for _ in range(t.d):
                shift = fld.key_add(shift, top)
            log_lo = t.d * arb(sum(t.z.values())).log()
            log_hi = t.d * arb(t.z[top]).log()
            for kk, cf in t.n.items():
                if _is_zero(cf):
                    continue
                b = _coef_ball(cf, c)
                x = fld.key_arb(fld.key_sub(kk, shift), c)
                lg = None if b.contains(0) else abs(b).log() + x - log_lo
                spans.append((lg, abs(b).upper().log() + x - log_hi, b))
        if not spans:
            return 0
        dom = max(range(len(spans)), key=lambda i: float(spans[i][1].mid()))
        lo, _, b = spans[dom]
        if lo is None:
            return None
        if len(spans) == 1:
            return 1 if b > 0 else -1
        others_hi = max((s[1] for i, s in enumerate(spans) if i != dom),
                        key=lambda a: float(a.upper()))
        if lo > others_hi.upper() + arb(len(spans) - 1).log():
            return 1 if b > 0 else -1
    return None


def decide_sign(dec: Decomposition, boundary: Fraction, c_arb: Callable[[], Any],
                what: Callable[[], str]) -> int | None:
    """sign(y − boundary) exactly: 0 on a tie, ±1 otherwise, None when Arb cannot
    separate the sum from 0 within 2**16 bits (a nonzero F, so never a tie).  First
    the dominant-term rule (:func:`_dominant_sign`, no expansion); else the sign of
    F = Σ β_α e^α, the forward's exponential-sum sign (:func:`..ties.sign_of_sum`),
    with keys and coefficients in Q(c)."""
    quick = _dominant_sign(dec, boundary, c_arb)
    if quick is not None:
        return quick
    fld = dec.fld
    f_poly = _expand(dec, boundary, what)
    if not f_poly:
        return 0

    return sign_of_sum(list(f_poly.items()), c_arb, key_ball=fld.key_arb, coef_ball=_coef_ball,
                       max_prec=MAX_SIGN_PREC)


# --------------------------------------------------------------------------------------
# One attention problem in exact arithmetic, and the row terms of its gradient elements


class IntMatrix:
    """An exact matrix as Python integers times one power of two: rows[i][j]·2**-shift."""

    def __init__(self, rows: list[list[int]], shift: int) -> None:
        self.rows, self.shift = rows, shift

    @staticmethod
    def of_doubles(arr: Any) -> IntMatrix:
        """Every double is an integer multiple of 2**-1074."""
        rows = []
        for row in arr.tolist():
            r = []
            for x in row:
                n, d = float(x).as_integer_ratio()
                r.append(n * ((1 << 1074) // d))
            rows.append(r)
        return IntMatrix(rows, 1074)

    def frac(self, i: int, j: int) -> Fraction:
        return Fraction(self.rows[i][j], 1 << self.shift)

    def dot(self, i: int, other: IntMatrix, j: int) -> Fraction:
        """Row i of self · row j of other, exactly."""
        tot = sum(a * b for a, b in zip(self.rows[i], other.rows[j], strict=True))
        return Fraction(tot, 1 << (self.shift + other.shift))


class Accumulator:
    """A gradient element being assembled: a constant plus row terms.  Terms of the
    same row (same Z and power) are merged as they come: one numerator per row."""

    def __init__(self, fld: QField) -> None:
        self.fld = fld
        self.const: Coef = (_ZERO, _ZERO)
        self._rows: dict[Any, _Term] = {}

    def add_const(self, x: Coef) -> None:
        self.const = (self.const[0] + x[0], self.const[1] + x[1])

    def add(self, row_key: Any, n: Poly, z: dict[Key, int], d: int) -> None:
        cur = self._rows.get((row_key, d))
        if cur is None:
            self._rows[(row_key, d)] = _Term(dict(n), z, d)
            return
        for kk, cf in n.items():
            _add_into(cur.n, kk, cf)

    def decomposition(self) -> Decomposition:
        return decompose(self.fld, self.const, list(self._rows.values()))


class ExactProblem:
    """One attention problem (one batch and head) in exact arithmetic: q (L×E),
    k (S×E), v (S×Ev), do (L×Ev) as :class:`IntMatrix`; allowed (L×S) bool; madd
    (L×S) float additive mask or None; keep (L×S) dropout keep-mask or None; f the
    exact dropout factor; uniform (L,) rows of weight 1/S.  The ``add_*`` methods
    add ``wt`` times one element of a gradient (or of the output) to an
    :class:`Accumulator`, as row terms N/Z^d (module docstring)."""

    def __init__(self, fld: QField, q: IntMatrix, k: IntMatrix, v: IntMatrix, do: IntMatrix,
                 allowed: Any, madd: Any, keep: Any, f: Fraction, uniform: Any) -> None:
        self.fld = fld
        self.q, self.k, self.v, self.do = q, k, v, do
        self.allowed, self.madd, self.keep, self.f, self.uniform = allowed, madd, keep, f, uniform
        self.S = allowed.shape[1]
        self._rows: dict[int, ExactRow] = {}

    def row(self, i: int) -> ExactRow:
        got = self._rows.get(i)
        if got is not None:
            return got
        c_rat = self.fld.c_rat
        keys: dict[int, Key] = {}
        dp: dict[int, Fraction] = {}
        madd = None if self.madd is None else self.madd[i]
        keep = None if self.keep is None else self.keep[i]
        for j in np.flatnonzero(self.allowed[i]).tolist():
            g = self.q.dot(i, self.k, j)
            mj = Fraction(float(madd[j])) if madd is not None else _ZERO
            keys[j] = c_rat * g + mj if c_rat is not None else (g, mj)
            dp[j] = _ZERO if keep is not None and not keep[j] else self.f * self.do.dot(i, self.v, j)
        row = ExactRow(keys, dp)
        self._rows[i] = row
        return row

    def _live(self, i: int) -> bool:
        return bool(self.allowed[i].any()) and not bool(self.uniform[i])

    def phi(self, i: int, j: int) -> Key | None:
        """The factor ∂s_ij/∂(c q_i·k_j) as an exponent key, None when it is 1 (plain
        scores; a transformed problem's softcap gives sech² of its argument)."""
        return None

    def add_dq(self, acc: Accumulator, i: int, col: int, wt: Coef) -> None:
        """dQ_il = c Σ_{g,h} Φ_g (KP_gl n_h − K_gl P_h) e^{a_g + a_h} / Z² (Φ_g = 1 for
        plain scores: the factor of :meth:`phi`, equal on a group)."""
        if not self._live(i) or _is_zero(wt):
            return
        fld = self.fld
        row = self.row(i)
        scale = fld.mul(fld.c(), wt)
        kg = {a: sum((self.k.frac(j, col) for j in js), _ZERO) for a, js in row.groups.items()}
        kpg = {a: sum((self.k.frac(j, col) * row.dp[j] for j in js), _ZERO)
               for a, js in row.groups.items()}
        n: Poly = {}
        for a, ja in row.groups.items():
            ph = self.phi(i, ja[0])
            for h, jh in row.groups.items():
                val = kpg[a] * len(jh) - kg[a] * row.pg[h]
                if val:
                    key = fld.key_add(a, h)
                    _add_into(n, key if ph is None else fld.key_add(key, ph),
                              fld.mul(scale, (val, _ZERO)))
        acc.add((id(self), i), n, row.z, 2)

    def add_ds(self, acc: Accumulator, i: int, j: int, wt: Coef, factor: bool = False) -> None:
        """dS_ij = e^{a_j} Σ_g (n_g dP_ij − P_g) e^{a_g} / Z² (times Φ_ij with ``factor``:
        the gradient of the scores before the transform, as dQ and dK use it)."""
        if not self._live(i) or not self.allowed[i][j] or _is_zero(wt):
            return
        fld = self.fld
        row = self.row(i)
        aj = row.keys[j]
        ph = self.phi(i, j) if factor else None
        if ph is not None:
            aj = fld.key_add(aj, ph)
        n: Poly = {}
        for a, val in row.ds_numerator(j).items():
            if val:
                _add_into(n, fld.key_add(aj, a), fld.mul(wt, (val, _ZERO)))
        acc.add((id(self), i), n, row.z, 2)

    def add_dk(self, acc: Accumulator, j: int, col: int, wt: Coef) -> None:
        """dK_jl = c Σ_i q_il Φ_ij dS_ij."""
        fld = self.fld
        scale = fld.mul(fld.c(), wt)
        for i in range(len(self.q.rows)):
            qil = self.q.frac(i, col)
            if qil:
                self.add_ds(acc, i, j, fld.mul(scale, (qil, _ZERO)), factor=True)

    def add_dv(self, acc: Accumulator, j: int, col: int, wt: Coef) -> None:
        """dV_jl = Σ_i f keep_ij dO_il P_ij (uniform rows: P_ij = 1/S)."""
        fld = self.fld
        for i in range(len(self.do.rows)):
            if self.keep is not None and not self.keep[i][j]:
                continue
            c_ = fld.mul(wt, (self.f * self.do.frac(i, col), _ZERO))
            if _is_zero(c_):
                continue
            if self.uniform[i]:
                acc.add_const((c_[0] / self.S, c_[1] / self.S))
            elif self.allowed[i][j]:
                row = self.row(i)
                acc.add((id(self), i), {row.keys[j]: c_}, row.z, 1)

    def add_out(self, acc: Accumulator, i: int, col: int, wt: Coef) -> None:
        """The forward output o_il = Σ_j f keep_ij P_ij v_jl."""
        fld = self.fld
        if _is_zero(wt):
            return
        kp = None if self.keep is None else self.keep[i]
        if self.uniform[i]:
            for j in range(self.S):
                if kp is None or kp[j]:
                    c_ = fld.mul(wt, (self.f * self.v.frac(j, col) / self.S, _ZERO))
                    acc.add_const(c_)
            return
        if not self.allowed[i].any():
            return
        row = self.row(i)
        n: Poly = {}
        for j, kk in row.keys.items():
            if kp is not None and not kp[j]:
                continue
            _add_into(n, kk, fld.mul(wt, (self.f * self.v.frac(j, col), _ZERO)))
        acc.add((id(self), i), n, row.z, 1)


class ExactDecisions:
    """The exact side of an :class:`~.enclosure.Problem` whose elements decompose into
    row terms: subclasses give ``_decomposition``, ``_n_cols``, ``_describe`` and
    ``scale_arb``; this gives ``rational_row`` and ``boundary_sign``."""

    def _decomposition(self, kind: str, b: int, r: int, col: int) -> Decomposition:
        raise NotImplementedError

    def _n_cols(self, kind: str) -> int:
        raise NotImplementedError

    def _describe(self, kind: str, b: int, i: int, col: int) -> str:
        raise NotImplementedError

    def scale_arb(self) -> Any:
        raise NotImplementedError

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        return _LazyRow(self._n_cols(kind),
                        lambda col: exact_value(self._decomposition(kind, b, i, col)))

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction) -> int | None:
        dec = self._decomposition(kind, b, i, col)
        return decide_sign(dec, boundary, self.scale_arb,
                           lambda: self._describe(kind, b, i, col))


class _LazyRow(list[Any]):
    """A row of exact values computed column by column when asked for (the rounding
    asks only for its undecided columns; each costs a decomposition)."""

    def __init__(self, n: int, value: Callable[[int], Fraction | None]) -> None:
        super().__init__()
        self._n, self._value = n, value
        self._cache: dict[int, Fraction | None] = {}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, col: Any) -> Any:
        if not isinstance(col, int):
            return [self[c] for c in range(self._n)[col]]
        if col < 0:
            col += self._n
        if not 0 <= col < self._n:
            raise IndexError(col)
        if col not in self._cache:
            self._cache[col] = self._value(col)
        return self._cache[col]

    def __iter__(self) -> Any:
        return (self[c] for c in range(self._n))
