"""Rotary position embeddings (RoPE) fused into attention, as FlashAttention's
``flash_attn_with_kvcache(rotary_cos=, rotary_sin=, rotary_interleaved=)`` and
HF transformers / GPT-NeoX / GPT-J apply them: q and k are rotated before the scores.

**Exact semantics.**  With r = ``rotary_dim`` (even, r <= E; default the tables'
2·width, or E), the pairs of dimensions (a_m, b_m), m = 0 … r/2 - 1, are
``(m, m + r/2)`` (``rotary_interleaved=False``: GPT-NeoX's half split, HF's
``rotate_half``) or ``(2m, 2m + 1)`` (True: GPT-J's interleaved pairs).  A vector x at
position p becomes x' with, for every pair,

    x'_a = x_a cos θ_{p,m} - x_b sin θ_{p,m},    x'_b = x_b cos θ_{p,m} + x_a sin θ_{p,m},

and x'_e = x_e for e >= r.  The angles:

* tables (``rotary_cos``, ``rotary_sin``, shape (seqlen_ro, r/2), as FlashAttention
  takes them): cos θ_{p,m} = rotary_cos[p, m] and sin θ_{p,m} = rotary_sin[p, m],
  *these values* taken as exact numbers (no transcendental: x' is exact rational);
* ``rotary_base`` = β (with ``rotary_position_scale`` = λ, linear position
  interpolation, default 1): θ_{p,m} = (p / λ) · β^(-2m/r) exactly; cos and sin
  through Arb (certified).

Positions: key j is at position j; query i of L at position off_b + i, off_b = S - L
(the query rows are the last rows, FlashAttention's decode), or with the ``kv_cache``
variant off_b = cache_seqlens[b] - L (the queries are the newest rows of each
sequence: FlashAttention rotates q "at indices cache_seqlens, cache_seqlens + 1, …"
of its pre-append lengths, which are ours minus L).  Then the scores are
s_ij = c · q'_i · k'_j and everything else is as without rotary.

**Reference.**  The scores are no longer products of doubles, so the call takes the
transformed-score path (:mod:`.transformed`): float64 rotated q̃', k̃' with proved
per-element bounds (:meth:`Rotation.float_rotate`; in the base mode each table entry
is Arb's cos/sin converted to a double, within one ulp plus Arb's radius), the
score bound widened by Σ_e (e_q|k̃'| + |q̃'|e_k + e_q e_k) (:meth:`Rotation.float_chunk`),
the perturbation lemma, and the Arb fallback (:class:`RotaryProblem`): q', k' as balls
at the working precision, precision raised until every rounding is decided.  There is
no double-double tier for rotary (undecided rows go to Arb directly).

**Error model** (testing side, :func:`error_terms`, the ``error`` hook): see its
docstring.  Gradients: :mod:`.rotary_backward` (the ``backward`` hook).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import InputValueError, ShapeError, SpecError
from ..arith.balls import Prec
from ..arith.constants import ETA, UP, gamma
from .protocol import BugClass, Variant, VariantOptions, lengths_differ, own_query_offsets, register
from .rotary_backward import rotary_backward
from .rotary_tables import fp32_running_tables, fp32_tables, head_dim_tables, low_tables, round_to
from .semantics import Geometry, float_array
from .transformed import TransformedProblem

__all__ = ["ROTARY", "KernelRotation", "RotarySpec", "Rotation", "error_terms",
           "rotate_emulated", "rotate_plain", "rotation_of"]

_KEYWORDS = ("rotary_cos", "rotary_sin", "rotary_interleaved", "rotary_dim", "rotary_base",
             "rotary_position_scale")
#: Largest rotary_base and position scale accepted (angles stay meaningful doubles).
MAX_BASE = 2.0**40
MAX_SCALE = 2.0**20
#: Largest position (query or key) a rotary call may reach.
MAX_POSITION = 1 << 24
#: The base mode's float64 tables, by (base, scale, positions, r) (a few kept).
_TABLES: dict[tuple[Any, ...], tuple[np.ndarray[Any, Any], ...]] = {}


@dataclass(frozen=True, eq=False)
class RotarySpec:
    """Validated rotary options (tables exact float64 copies, or base and scale)."""

    cos: np.ndarray[Any, Any] | None
    sin: np.ndarray[Any, Any] | None
    interleaved: bool
    dim: int | None
    base: float | None
    scale: float

    @property
    def tables(self) -> bool:
        return self.cos is not None

    def rdim(self, E: int) -> int:
        """r for head dim E (validated)."""
        r = self.dim
        if r is None:
            r = 2 * self.cos.shape[1] if self.cos is not None else E - E % 2
        if r > E:
            raise ShapeError(f"rotary_dim={r} exceeds the head dim E={E} (only the first "
                             "rotary_dim dimensions rotate)")
        return r

    def pairs(self, r: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        m = np.arange(r // 2)
        if self.interleaved:
            return 2 * m, 2 * m + 1
        return m, m + r // 2

    # -- the angles --------------------------------------------------------------
    def float_tables(self, npos: int, r: int) -> tuple[np.ndarray[Any, Any], ...]:
        """(ĉ, ŝ, e_c, e_s), each (npos, r/2) float64, with |ĉ - cos θ| <= e_c and
        |ŝ - sin θ| <= e_s for positions 0 … npos - 1.  Tables: the values themselves
        (e = 0).  Base mode: Arb's sin_cos at 96 bits, the midpoint converted to a
        double (float(): within one ulp whatever its rounding direction, and an ulp of a
        double x is <= 2^-52|x| + 2^-1074): |ĉ - c| <= rad + 2^-52|ĉ| + 2^-1074, the
        radius read upward (× UP)."""
        if self.cos is not None and self.sin is not None:
            c, s = self.cos[:npos], self.sin[:npos]
            z = np.zeros_like(c)
            return c, s, z, z
        key = (self.base, self.scale, npos, r)
        if key not in _TABLES:
            from flint import arb

            c = np.empty((npos, r // 2))
            s = np.empty((npos, r // 2))
            ec = np.empty((npos, r // 2))
            es = np.empty((npos, r // 2))
            with Prec(96):
                for m, f in enumerate(self._freqs(r)):
                    for p in range(npos):
                        sb, cb = (arb(p) * f).sin_cos()
                        c[p, m], s[p, m] = float(cb.mid()), float(sb.mid())
                        ec[p, m] = float(cb.rad()) * UP
                        es[p, m] = float(sb.rad()) * UP
            ec = (ec + 2.0**-52 * np.abs(c) + ETA) * UP
            es = (es + 2.0**-52 * np.abs(s) + ETA) * UP
            if len(_TABLES) > 8:
                _TABLES.clear()
            _TABLES[key] = (c, s, ec, es)
        return _TABLES[key]

    def _freqs(self, r: int) -> list[Any]:
        """β^(-2m/r) / λ as balls at the current precision (call inside Prec)."""
        from flint import arb, fmpq

        assert self.base is not None
        b = arb(self.base)
        lam = arb(self.scale)
        return [(b ** arb(fmpq(-2 * m, r))) / lam for m in range(r // 2)]

    def arb_angles(self, positions: list[int], r: int, prec: int
                   ) -> dict[int, tuple[list[Any], list[Any]]]:
        """{p: (cos balls, sin balls) over m} at ``prec`` (call inside Prec(prec))."""
        from flint import arb

        out: dict[int, tuple[list[Any], list[Any]]] = {}
        if self.cos is not None and self.sin is not None:
            for p in positions:
                out[p] = ([arb(float(x)) for x in self.cos[p, : r // 2]],
                          [arb(float(x)) for x in self.sin[p, : r // 2]])
            return out
        freqs = self._freqs(r)
        for p in positions:
            cs = [(arb(p) * f).sin_cos() for f in freqs]
            out[p] = ([x[1] for x in cs], [x[0] for x in cs])
        return out


# --------------------------------------------------------------------------------------
# parsing


def _real(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        raise SpecError(f"{name}={x!r}: expected a real number")
    return float(x)


def _parse(rotary_cos: Any = None, rotary_sin: Any = None, rotary_interleaved: Any = None,
           rotary_dim: Any = None, rotary_base: Any = None,
           rotary_position_scale: Any = None) -> dict[str, Any]:
    if rotary_interleaved is not None and not isinstance(rotary_interleaved, (bool, np.bool_)):
        raise SpecError(f"rotary_interleaved={rotary_interleaved!r}: expected True (GPT-J "
                        "pairs 2m, 2m+1) or False (GPT-NeoX halves m, m + r/2)")
    tables = rotary_cos is not None or rotary_sin is not None
    if not tables and rotary_base is None:
        if rotary_dim is not None or rotary_position_scale is not None:
            raise SpecError("rotary_dim/rotary_position_scale need the angles: pass "
                            "rotary_cos and rotary_sin, or rotary_base")
        return {}  # rotary_interleaved alone: no rotary (FlashAttention ignores it too)
    if tables and rotary_base is not None:
        raise SpecError("pass either rotary_cos/rotary_sin (tables) or rotary_base "
                        "(angles p·base^(-2m/r)), not both")
    dim = None
    if rotary_dim is not None:
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, (int, np.integer)):
            raise SpecError(f"rotary_dim={rotary_dim!r}: expected an even integer > 0")
        dim = int(rotary_dim)
        if dim <= 0 or dim % 2:
            raise InputValueError(f"rotary_dim={dim}: expected an even integer > 0 "
                                  "(dimensions rotate in pairs)")
    cos = sin = None
    base = None
    scale = 1.0
    if tables:
        if rotary_cos is None or rotary_sin is None:
            raise SpecError("rotary_cos and rotary_sin go together: pass both")
        if rotary_position_scale is not None:
            raise SpecError("rotary_position_scale applies to rotary_base; with tables, "
                            "scale the angles in the tables")
        cos, sin = float_array(rotary_cos, "rotary_cos"), float_array(rotary_sin, "rotary_sin")
        if cos.ndim != 2 or cos.shape != sin.shape or cos.shape[1] == 0:
            raise ShapeError(f"rotary_cos.shape={cos.shape}, rotary_sin.shape={sin.shape}: "
                             "expected the same shape (seqlen_ro, rotary_dim / 2)")
        if dim is not None and dim != 2 * cos.shape[1]:
            raise ShapeError(f"rotary_dim={dim} does not match rotary_cos.shape={cos.shape}: "
                             f"the tables hold rotary_dim / 2 = {cos.shape[1]} columns")
    else:
        base = _real(rotary_base, "rotary_base")
        if not math.isfinite(base) or base <= 0 or base > MAX_BASE:
            raise InputValueError(f"rotary_base={rotary_base!r}: expected a finite number "
                                  f"in (0, {MAX_BASE:g}] (e.g. 10000.0)")
        if rotary_position_scale is not None:
            scale = _real(rotary_position_scale, "rotary_position_scale")
            if not math.isfinite(scale) or scale <= 0 or scale > MAX_SCALE:
                raise InputValueError(f"rotary_position_scale={rotary_position_scale!r}: "
                                      f"expected a finite number in (0, {MAX_SCALE:g}] "
                                      "(positions are divided by it)")
    spec = RotarySpec(cos, sin, bool(rotary_interleaved) if rotary_interleaved is not None
                      else False, dim, base, scale)
    return {"rotary": spec}


# --------------------------------------------------------------------------------------
# one call's rotation


def query_offsets(opts: VariantOptions, geo: Geometry) -> np.ndarray[Any, Any]:
    """off per outer batch element (n_outer,), or (1,) when all share it: a variant's
    own positions (the KV cache's), else the bottom-right alignment S - L."""
    own = own_query_offsets(opts, geo)
    return own if own is not None else np.array([geo.S - geo.L], dtype=np.int64)


class Rotation:
    """The rotation of one call: r, the pairs, positions of every flat problem's
    queries (B, L) and of the keys (S,)."""

    def __init__(self, spec: RotarySpec, geo: Geometry, E: int,
                 offsets: np.ndarray[Any, Any]) -> None:
        self.spec, self.geo, self.E = spec, geo, E
        self.r = spec.rdim(E)
        self.ia, self.ib = spec.pairs(self.r)
        off = offsets
        if off.size and int(off.min()) < 0:
            raise InputValueError(
                f"rotary: query positions would be negative (offset {int(off.min())}): the "
                f"L={geo.L} queries are the last L positions of the S={geo.S} keys (or of "
                "cache_seqlens), so S (or every cache_seqlens) must be >= L")
        self.offsets = off
        top = max(geo.S, int(off.max(initial=0)) + geo.L)
        if top > MAX_POSITION:
            raise InputValueError(f"rotary: positions up to {top - 1} exceed "
                                  f"{MAX_POSITION - 1}")
        if spec.cos is not None and spec.cos.shape[0] < top:
            raise ShapeError(f"rotary_cos.shape={spec.cos.shape}: the tables need at least "
                             f"{top} rows (positions 0 … {top - 1}; FlashAttention: seqlen_ro "
                             ">= seqlen_k)")
        self.npos = top

    def q_positions(self, flat: range | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """(len(flat), L) positions of the queries of flat problems ``flat``."""
        fs = np.asarray(flat, dtype=np.int64)
        off = self.offsets if self.offsets.size == 1 else self.offsets[fs // self.geo.heads]
        return np.broadcast_to(off, fs.shape)[:, None] + np.arange(self.geo.L)[None, :]

    def k_positions(self) -> np.ndarray[Any, Any]:
        return np.arange(self.geo.S)

    def flat(self, q: np.ndarray[Any, Any], k: np.ndarray[Any, Any]) -> tuple[Any, ...]:
        """q, k (*lead, n, E) broadcast to the call's batch and flat (B, n, E), with the
        positions of their rows (B, L) and (B, S)."""
        g, E = self.geo, self.E
        q0 = np.broadcast_to(q, (*g.batch, g.L, E)).reshape(g.B, g.L, E)
        k0 = np.broadcast_to(k, (*g.batch, g.S, E)).reshape(g.B, g.S, E)
        return (q0, k0, self.q_positions(range(g.B)),
                np.broadcast_to(self.k_positions(), (g.B, g.S)))

    # -- float64 ---------------------------------------------------------------
    def float_rotate(self, x: np.ndarray[Any, Any], pos: np.ndarray[Any, Any],
                     tables: tuple[np.ndarray[Any, Any], ...] | None = None,
                     ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(x̃', e) with |x̃' - x'| <= e elementwise, x (..., n, E), pos (..., n).
        Per pair: fl(fl(x_a ĉ) - fl(x_b ŝ)) errs from x_a ĉ - x_b ŝ by <=
        γ2(|x_a ĉ| + |x_b ŝ|) + 3η/2, and x_a ĉ - x_b ŝ from x'_a by <= |x_a| e_c +
        |x_b| e_s.  ``tables``: (ĉ, ŝ, e_c, e_s) to use instead (the testing side)."""
        c, s, ec, es = tables if tables is not None else self.spec.float_tables(
            self.npos, self.r)
        cp, sp, ecp, esp = c[pos], s[pos], ec[pos], es[pos]
        xa, xb = x[..., self.ia], x[..., self.ib]
        out = np.array(x, dtype=np.float64, copy=True)
        err = np.zeros_like(out)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            pa, pb = xa * cp, xb * sp
            qa, qb = xb * cp, xa * sp
            out[..., self.ia] = pa - pb
            out[..., self.ib] = qa + qb
            g2 = gamma(2)
            err[..., self.ia] = (np.abs(xa) * ecp + np.abs(xb) * esp
                                 + g2 * (np.abs(pa) + np.abs(pb)) + 2 * ETA) * UP
            err[..., self.ib] = (np.abs(xb) * ecp + np.abs(xa) * esp
                                 + g2 * (np.abs(qa) + np.abs(qb)) + 2 * ETA) * UP
        return out, err

    def float_chunk(self, q: np.ndarray[Any, Any], k: np.ndarray[Any, Any], flat: range,
                    allowed: np.ndarray[Any, Any]
                    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(q̃' (C, L, E), k̃' (C, S, E), extra (C, L)): extra >= max over the kept keys of
        |q'_i·k'_j - q̃'_i·k̃'_j| <= Σ_e (e_q|k̃'| + |q̃'|e_k + e_q e_k), the three
        nonnegative matmuls computed in float64 (each within γ_E of its exact value,
        plus E·η) and inflated by (1 + 2γ_E)."""
        qr, eq = self.float_rotate(q, self.q_positions(flat))
        kr, ek = self.float_rotate(k, np.broadcast_to(self.k_positions(), k.shape[:-1]))
        E = q.shape[-1]
        # contiguous transposes: numpy's stacked matmul takes BLAS on them
        akT = np.ascontiguousarray(np.swapaxes(np.abs(kr), -1, -2))
        ekT = np.ascontiguousarray(np.swapaxes(ek, -1, -2))
        with np.errstate(over="ignore", invalid="ignore"):
            d = eq @ akT + np.abs(qr) @ ekT + eq @ ekT
            d = (d * (1.0 + 2.0 * gamma(max(E, 1))) + 3 * E * ETA) * UP
        d = np.where(allowed, d, 0.0)
        return qr, kr, np.max(d, axis=-1, initial=0.0)

    def problem(self, *args: Any) -> RotaryProblem:
        return RotaryProblem(*args, rotation=self)


# --------------------------------------------------------------------------------------
# the Arb tier


class RotaryProblem(TransformedProblem):
    """:class:`.transformed.TransformedProblem` with q, k rotated (module docstring):
    the dot products from rotated balls, no double-double tier, ties grouped by what
    fixes a rotated score."""

    def __init__(self, *args: Any, rotation: Rotation) -> None:
        super().__init__(*args)
        self.rot = rotation
        self._kr: dict[tuple[int, int], Any] = {}

    def refine(self, b: int, rows: np.ndarray[Any, Any], kind: str) -> None:
        return None  # no double-double tier: Arb decides

    def _rot_rows(self, x: np.ndarray[Any, Any], pos: list[int], prec: int) -> Any:
        """x (n, E) rotated at positions ``pos`` as an arb_mat (call inside Prec)."""
        from flint import arb, arb_mat

        ang = self.rot.spec.arb_angles(sorted(set(pos)), self.rot.r, prec)
        ia, ib = self.rot.ia.tolist(), self.rot.ib.tolist()
        rows = []
        for xr, p in zip(x, pos, strict=True):
            row = [arb(float(t)) for t in xr]
            cs, sn = ang[p]
            for m, (a, bb) in enumerate(zip(ia, ib, strict=True)):
                xa, xb = row[a], row[bb]
                row[a] = xa * cs[m] - xb * sn[m]
                row[bb] = xb * cs[m] + xa * sn[m]
            rows.append(row)
        return arb_mat(rows) if rows and rows[0] else arb_mat(len(rows), x.shape[1])

    def _dot_rows(self, b: int, rows: list[int], prec: int) -> list[list[Any]]:
        S, E = self.k.shape[1], self.k.shape[2]
        from flint import arb

        if not (E and S and rows):
            return [[arb(0)] * S for _ in rows]
        if (b, prec) not in self._kr:
            if len(self._kr) >= 16:  # a few problems' rotated keys (Ziv revisits them)
                self._kr.pop(next(iter(self._kr)))
            self._kr[(b, prec)] = self._rot_rows(self.k[b], list(range(S)), prec).transpose()
        kmT = self._kr[(b, prec)]
        pq = self.rot.q_positions(np.array([b]))[0]
        qm = self._rot_rows(np.asarray(self.q[b][rows]), [int(pq[i]) for i in rows], prec)
        ents = (qm * kmT).entries()
        return [ents[n * S:(n + 1) * S] for n in range(len(rows))]

    def _ident_score(self, b: int, i: int, ident: Any, js: list[int], c: Any) -> Any:
        """The score of a group from its first key (every key of it has this score)."""
        g = self._dot_rows(b, [i], _cur_prec())[0][js[0]]
        _, biases, m = ident
        return self._pipeline(c * g, list(biases), m)

    def _groups(self, b: int, i: int) -> dict[Any, list[int]]:
        """Kept keys of row (b, i) grouped so that equal keys of a group have equal
        scores: tables — the exact rational q'_i·k'_j (x' is rational); base mode —
        (q·k on the unrotated dims, and (j, k_j's rotated part) unless that part is 0),
        as a key's rotated contribution depends on its position."""
        key = (b, i)
        if key in self._groups_cache or (self.uniform is not None and self.uniform[b, i]):
            return super()._groups(b, i)
        r = self.rot.r
        pi = int(self.rot.q_positions(np.array([b]))[0][i])
        q = [Fraction(float(x)) for x in self.q[b][i]]
        spec = self.rot.spec
        tables = spec.cos is not None and spec.sin is not None
        if tables:
            q = _rot_fraction(q, pi, spec, self.rot)
        groups: dict[Any, list[int]] = {}
        for j in np.flatnonzero(self.allowed[b, i]).tolist():
            kj = [Fraction(float(x)) for x in self.k[b][j]]
            if tables:
                kj = _rot_fraction(kj, j, spec, self.rot)
                gid: Any = sum((a * x for a, x in zip(q, kj, strict=True)), Fraction(0))
            else:
                rot_part = tuple(kj[:r])
                gu = sum((a * x for a, x in zip(q[r:], kj[r:], strict=True)), Fraction(0))
                gid = (gu, (j, rot_part) if any(rot_part) else None)
            ident = (gid, tuple(self._biases(b, i, j)), self._m(b, i, j))
            groups.setdefault(ident, []).append(j)
        if self.sinks is not None:
            groups[("sink",)] = [-1]
        if len(self._groups_cache) > 4096:
            self._groups_cache.clear()
        self._groups_cache[key] = groups
        return groups


def _cur_prec() -> int:
    from flint import ctx

    return int(ctx.prec)


def _rot_fraction(x: list[Fraction], p: int, spec: RotarySpec, rot: Rotation) -> list[Fraction]:
    assert spec.cos is not None and spec.sin is not None
    out = list(x)
    for m, (a, b) in enumerate(zip(rot.ia.tolist(), rot.ib.tolist(), strict=True)):
        c, s = Fraction(float(spec.cos[p, m])), Fraction(float(spec.sin[p, m]))
        out[a] = x[a] * c - x[b] * s
        out[b] = x[b] * c + x[a] * s
    return out


# --------------------------------------------------------------------------------------
# the hooks


def rotation_of(opts: VariantOptions, geo: Geometry, E: int) -> Rotation:
    """The rotation of a call (validated against its shapes)."""
    return Rotation(opts.rotary, geo, E, query_offsets(opts, geo))


class KernelRotation:
    """A kernel's rotation errors (:func:`error_terms`' model: tables ĉ, ŝ, the angles'
    error in fp32 for ``rotary_base``, the rotation in u_r = max(u, u_a), the store in
    u), for the testing side: :meth:`bounds` of each rotated element."""

    def __init__(self, rot: Rotation, model: Any) -> None:
        self.rot = rot
        self.u, ua = model.u, model.ua
        self.ur = max(self.u, ua)
        spec = rot.spec
        self.c, self.s, _, _ = spec.float_tables(rot.npos, rot.r)
        r = rot.r
        m = np.arange(r // 2)
        if spec.tables:
            self.ang = np.zeros((rot.npos, r // 2))
            self.t_store = 0.0
        else:
            assert spec.base is not None
            freq = (spec.base ** (-2.0 * m / r)) / spec.scale
            x = 2.0 * m / r
            x_err = np.abs(x.astype(np.float32).astype(np.float64) - x)  # the exponent's rounding
            extra = 2.0 if spec.scale != 1.0 else 0.0
            ln_b = abs(math.log(spec.base))
            # inv_freq by a power per pair (HF, FlashAttention, vLLM, Meta's llama)
            rel_pow = ln_b * x_err + (6.0 + extra) * ua
            # or by a running product θ_m = θ_{m-1}·β^(-2/r) (llama.cpp's ggml: theta *=
            # theta_scale): pair m carries m roundings and m copies of the ratio's error
            x1 = 2.0 / r
            x1_err = abs(float(np.float32(x1)) - x1)
            rel_prod = m * (ln_b * x1_err + 3.0 * ua) + (2.0 + extra) * ua
            rel = np.maximum(rel_pow, rel_prod)
            theta = np.arange(rot.npos)[:, None] * freq[None, :]
            self.ang = rel[None, :] * theta + 2.0 * ua
            self.t_store = self.u

    def bounds(self, x0: np.ndarray[Any, Any], xr: np.ndarray[Any, Any],
               pos: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(roundings, angles): the bound on each element of xr = R x0 (or of Rᵀ x0:
        the same magnitudes) a kernel computes, split in its two kinds."""
        rot, u, ur, t_store = self.rot, self.u, self.ur, self.t_store
        xa, xb = np.abs(x0[..., rot.ia]), np.abs(x0[..., rot.ib])
        cp, sp, ap = np.abs(self.c[pos]), np.abs(self.s[pos]), self.ang[pos]
        rnd = u * np.abs(xr)
        angle = np.zeros_like(rnd)
        tq = xa * cp + xb * sp
        rnd[..., rot.ia] += t_store * tq + 2.02 * ur * tq
        angle[..., rot.ia] = ap * (xa + xb)
        tk = xb * cp + xa * sp
        rnd[..., rot.ib] += t_store * tk + 2.02 * ur * tk
        angle[..., rot.ib] = ap * (xa + xb)
        return rnd, angle


def error_terms(opts: VariantOptions, vp: Any, b: int, rows: slice, model: Any
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The kernel's rotation errors as a bound on each score's error (rows, S): the
    ``error`` hook of the testing side's model (docs/variants.md, "Rotary embeddings").

    A kernel rotates q and k in a unit u_r = max(u, u_a) (FlashAttention's kernels in
    fp32, HF's ``q * cos + rotate_half(q) * sin`` in the input dtype), from tables ĉ, ŝ
    and stores q', k' in the input dtype (u).  Per pair (a, b) at angle θ:

    * tables given (``rotary_cos``/``rotary_sin``): ĉ = cos θ exactly;
    * ``rotary_base``: the kernel builds ``inv_freq = 1 / base ** (2m/r)`` and
      ``θ̂ = fl(pos · inv_freq)`` in fp32 (HF, FlashAttention's RotaryEmbedding): the
      exponent x = 2m/r rounds to x̂ (exact when r is a power of 2), which moves the
      power by |ln β|·|x̂ - x| relative; pow is within 2 ulps (4u_a), the reciprocal and
      the product pos·inv_freq round once each (the position is exact below 2^24), the
      position scale adds two roundings (pos/λ): |θ̂ - θ| <= (|ln β||x̂ - x| + (6 [+2])u_a)|θ|
      (to first order; large at long positions — it is what real fp32 RoPE does, not a
      bug).  Or it builds θ̂_m by a running product θ_m = θ_{m-1}·fl(β^(-2/r)) from
      θ_0 = pos (llama.cpp's ggml ``theta *= theta_scale``): m roundings and m copies of
      the ratio's error, |θ̂ - θ| <= (m(|ln β||x̂₁ - x₁| + 3u_a) + (2 [+2])u_a)|θ| with
      x₁ = 2/r; the model takes the larger of the two.  cos/sin in fp32 err by <= 2u_a
      absolute, and the tables are
      stored in the input dtype (u relative: HF's ``cos.to(x.dtype)``).  So
      |ĉ - c| <= |θ̂ - θ| + 2u_a + u(|c| + ...), likewise ŝ.
    * rotation: |x̂'_a - x'_a| <= |x_a||ĉ - c| + |x_b||ŝ - s| + γ2(u_r)(|x_a ĉ| + |x_b ŝ|),
      then the store u|x'_a|.

    The score error is |c|·(Δq·|k'| + |q'|·Δk + Δq·Δk) per (i, j) (the worst case),
    inflated by 1.05 for the second-order terms dropped above.  Its variance for the
    probabilistic model: the roundings of the E elements as independent terms
    (Σ_e (c Δq_e k'_e)² + (c q'_e Δk_e)²), the angle errors — shared along a
    frequency — and the products Δq·Δk as one coherent term (their sum squared).  Under
    the probabilistic model the per-score bound returned is min(worst case, λσ), as the
    model reads roundings (Higham & Mary); under "worst_case" the worst case."""
    rot: Rotation = vp.rotation
    q0 = vp.rotation_inputs[0][b][rows]
    k0 = vp.rotation_inputs[1][b]
    qr = vp.rotation_outputs[0][b][rows]
    kr = vp.rotation_outputs[1][b]
    pq = rot.q_positions(np.array([b]))[0][rows]
    pk = rot.k_positions()
    kernel = KernelRotation(rot, model)
    (rq, aq), (rk, ak) = kernel.bounds(q0, qr, pq), kernel.bounds(k0, kr, pk)
    dq, dk = rq + aq, rk + ak
    cc = abs(float(vp.scale))
    aqr, akr = np.abs(qr), np.abs(kr)
    with np.errstate(over="ignore", invalid="ignore"):
        term = cc * (dq @ akr.T + aqr @ dk.T + dq @ dk.T) * 1.05
        # variance: each element's rounding an independent term of the dot product
        # (the probabilistic model's reading of roundings, as the plain dot product's);
        # the angle errors of one frequency m are shared by its pair (a, b) and by q
        # and k (inv_freq): with A_m = Σ_{e in pair m} |Δq_e||k'_e|, B_m likewise,
        # (A_m + B_m)² <= 2(A_m² + B_m²) <= 4 Σ_e (...)², independent across m
        a2 = (aq * aq) @ (akr * akr).T + (aqr * aqr) @ (ak * ak).T
        var = (cc * 1.05) ** 2 * ((rq * rq) @ (akr * akr).T + (aqr * aqr) @ (rk * rk).T
                                  + 4.0 * a2)
        second = cc * (dq @ dk.T) * 1.05
        var = var + second * second
    if getattr(model, "kind", "") == "probabilistic":
        # the per-score bound the second-order terms use: λσ when smaller than the worst
        # case (the model's reading of roundings; λ is set for the check's events)
        term = np.minimum(term, float(model.lam) * np.sqrt(var))
    return term, var


def _bug_rotation(opts: VariantOptions, geo: Geometry, E: int, *,
                  interleaved_swapped: bool = False, no_offset: bool = False,
                  all_dims: bool = False, angles_dtype: str | None = None,
                  freqs_over_head_dim: bool = False, sign_flipped: bool = False
                  ) -> tuple[Rotation, list[Any] | None, float]:
    """(rotation, tables, sign) of a kernel with the catalogue's bugs (docs/variants.md),
    for :func:`rotate_plain` and :func:`rotate_emulated`: where the bug changes the
    angles, its own tables [(ĉ, ŝ), …] as kernels build them (cos and sin in float64,
    then in float32, before their rounding; the first is the float64 evaluation's), sign
    -1 for a rotation by −θ."""
    spec: RotarySpec = opts.rotary
    if interleaved_swapped:
        spec = RotarySpec(spec.cos, spec.sin, not spec.interleaved, spec.dim, spec.base,
                          spec.scale)
    if all_dims:
        spec = RotarySpec(spec.cos, spec.sin, spec.interleaved, E - E % 2, spec.base,
                          spec.scale)
    offsets = query_offsets(opts, geo)
    if no_offset:
        offsets = np.zeros_like(offsets)
    rot = Rotation(spec, geo, E, offsets)
    tables = None
    if angles_dtype is not None:
        tables = [low_tables(spec, rot.npos, rot.r, angles_dtype, f32)
                  for f32 in (False, True)]
    if freqs_over_head_dim:
        tables = [head_dim_tables(spec, rot.npos, rot.r, E, f32) for f32 in (False, True)]
    return rot, tables, -1.0 if sign_flipped else 1.0


def rotate_plain(opts: VariantOptions, geo: Geometry, q: np.ndarray[Any, Any],
                 k: np.ndarray[Any, Any], **switches: Any
                 ) -> tuple[Rotation, tuple[Any, ...]]:
    """The ``rotate_plain`` hook, the float64 rotation of the testing side
    (:func:`mha_symbolic.testing.forward.bugs_variants.plain_variant`): q, k
    (*lead, n, E) rotated as the exact semantics say (angles from the oracle's tables,
    within 2^-52), or as a buggy kernel does (``switches``: :func:`_bug_rotation`'s,
    docs/variants.md's catalogue).  Returns the rotation and (q0, k0, q', k'), each
    flat (B, n, E)."""
    rot, own, sign = _bug_rotation(opts, geo, q.shape[-1], **switches)
    q0, k0, qpos, kpos = rot.flat(q, k)
    tables = None
    if own is not None:
        z = np.zeros_like(own[0][0])
        tables = (own[0][0], sign * own[0][1], z, z)
    elif sign < 0:
        c, s, ec, es = rot.spec.float_tables(rot.npos, rot.r)
        tables = (c, -s, ec, es)
    qr, _ = rot.float_rotate(q0, qpos, tables)
    kr, _ = rot.float_rotate(k0, kpos, tables)
    return rot, (q0, k0, qr, kr)


def rotate_emulated(opts: VariantOptions, geo: Geometry, q: np.ndarray[Any, Any],
                    k: np.ndarray[Any, Any], fmt: str, **switches: Any
                    ) -> list[tuple[str, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """The ``rotate_emulated`` hook: q, k (*lead, n, E) rotated as *correct* kernels
    storing in ``fmt`` rotate them, for the testing side's dtype level
    (:mod:`mha_symbolic.testing.forward.emulated`): HF transformers'
    ``q * cos + rotate_half(q) * sin`` in ``fmt`` (tables cast to it, every product and
    sum rounded to it), and FlashAttention's rotary kernel (Llama's complex product
    too): the rotation in float32, q' and k' stored in ``fmt``.  Angles in float32 (HF's
    ``LlamaRotaryEmbedding``), or the tables given; in base mode also llama.cpp's angles
    by a running product (:func:`_fp32_running_tables`), rotated in float32.  Returns [(name, q', k')], each
    (*lead, n, E) float64 (one entry when the two coincide, ``fmt`` float32).

    ``switches`` (:func:`_bug_rotation`'s): these kernels with a bug of the catalogue
    (the level a kernel implementing it is judged at: the diagnosis); a bug with tables
    of its own is rotated with each way of building them (cos in float64 or float32
    before a 16-bit rounding moves single entries by a 16-bit ulp)."""
    E = q.shape[-1]
    rot, own, sign = _bug_rotation(opts, geo, E, **switches)
    spec = rot.spec
    recipes = [("", fp32_tables(spec, rot.npos, rot.r))] if own is None else [
        (f", tables {i + 1}", (t[0], t[1])) for i, t in enumerate(own)]
    c32, s32 = recipes[0][1]

    def rnd(x: np.ndarray[Any, Any], dt: str) -> np.ndarray[Any, Any]:
        return np.asarray(x, np.float64) if dt == "float64" else round_to(x, dt)

    def rotate(x: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], dt: str, store: str,
               tables: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] = (c32, s32)
               ) -> np.ndarray[Any, Any]:
        c, s = rnd(tables[0], dt)[pos], sign * rnd(tables[1], dt)[pos]
        xa, xb = x[..., rot.ia], x[..., rot.ib]
        out = np.array(x, dtype=np.float64, copy=True)
        with np.errstate(over="ignore", invalid="ignore"):
            out[..., rot.ia] = rnd(rnd(xa * c, dt) - rnd(xb * s, dt), dt)
            out[..., rot.ib] = rnd(rnd(xb * c, dt) + rnd(xa * s, dt), dt)
        return rnd(out, store)

    lead = geo.batch
    q0, k0, qpos, kpos = rot.flat(q, k)
    styles = [("rotation in float32, stored", "float32")]
    if fmt not in ("float32", "float64"):
        styles.insert(0, (f"rotation in {fmt} (HF)", fmt))
    out = []
    for tag, tab in recipes:
        for name, dt in styles:
            qr = rotate(q0, qpos, dt, fmt, tab).reshape(*lead, geo.L, E)
            kr = rotate(k0, kpos, dt, fmt, tab).reshape(*lead, geo.S, E)
            out.append((name + tag, qr, kr))
    if not spec.tables and own is None:
        # llama.cpp's angles (a running product), the rotation in float32
        run = fp32_running_tables(spec, rot.npos, rot.r)
        qr = rotate(q0, qpos, "float32", fmt, run).reshape(*lead, geo.L, E)
        kr = rotate(k0, kpos, "float32", fmt, run).reshape(*lead, geo.S, E)
        out.append(("angles by a running product (llama.cpp), rotation in float32", qr, kr))
    return out


def _backward(opts: VariantOptions, prep: Any, grad_output: Any, **common: Any
              ) -> dict[str, Any]:
    """The ``backward`` hook: :func:`.rotary_backward.rotary_backward`."""
    rot = rotation_of(opts, prep.geo, int(prep.q64.shape[-1]))
    return rotary_backward(rot, opts, prep, grad_output, **common)


def _rot(x: Any) -> bool:
    return x.opts.rotary is not None


def _rot_offset(x: Any) -> bool:
    return _rot(x) and (any(v.own_positions is not None for v in x.opts.active())
                        or lengths_differ(x))


def _rot_partial(x: Any) -> bool:
    sp = x.opts.rotary
    return (sp is not None and not sp.tables and sp.dim is not None
            and sp.dim < x.q.shape[-1] - x.q.shape[-1] % 2)


def _switch(**changes: Any) -> Any:
    return lambda x: {"rotate_changes": changes}


# the keywords of rotate_plain, reached through plain_variant's rotate_changes
_BUGS = (
    BugClass("rotary_interleaved_swapped", "rotary pairs of the other convention "
             "(GPT-J interleaved 2m, 2m+1 vs GPT-NeoX halves m, m + r/2)", _rot,
             _switch(interleaved_swapped=True)),
    BugClass("rotary_positions_not_offset", "rotary: queries rotated at positions "
             "0 … L-1, not offset by the cache (cache_seqlens - L) or by S - L",
             _rot_offset, _switch(no_offset=True)),
    BugClass("rotary_angles_bf16", "rotary cos/sin computed in bfloat16 (angles "
             "pos·inv_freq, or the tables, in bf16)", _rot, _switch(angles_dtype="bfloat16")),
    BugClass("rotary_angles_fp16", "rotary cos/sin computed in float16 (angles "
             "pos·inv_freq, or the tables, in fp16)", _rot, _switch(angles_dtype="float16")),
    BugClass("rotary_dim_ignored", "rotary_dim ignored: every dimension rotated "
             "(pairs and inv_freq over the head dim)", _rot_partial, _switch(all_dims=True)),
    BugClass("rotary_inv_freq_head_dim", "rotary: the first rotary_dim dims rotated, "
             "but inv_freq built over the head dim (pos·base^(-2m/head_dim), not "
             "base^(-2m/rotary_dim); transformers#48652)", _rot_partial,
             _switch(freqs_over_head_dim=True)),
    BugClass("rotary_on_v", "rotary applied to v as well as q and k (v rotated at the "
             "key positions)", _rot, _switch(on_v=True)),
    BugClass("rotary_sign_flipped", "rotary sine with the wrong sign (rotate_half "
             "returning (x2, -x1)): q and k rotated by -θ", _rot, _switch(sign_flipped=True)),
)

ROTARY = register(Variant(
    name="rotary", keywords=_KEYWORDS, fields={"rotary": None}, parse=_parse,
    summary="rotary embeddings: q, k rotated by position (tables or base), FlashAttention/"
            "HF conventions", transcendental=lambda opts: opts.rotary is not None,
    rotate=rotation_of, rotate_plain=rotate_plain, rotate_emulated=rotate_emulated,
    error=error_terms, backward=_backward,
    bugs=_BUGS))
