"""Rotary embeddings' certified gradients (issue 24, item 3): the oracle's correctly
rounded float64 gradients against an independent mpmath evaluation at 50 digits (the
rotation with mpmath's cos/sin, attention and its gradient by the textbook formulas,
then Rᵀ), the structural zeros, and the refusals."""

from __future__ import annotations

from typing import Any

import mpmath as mp
import numpy as np
import pytest

import mha_symbolic as ms

RNG = np.random.default_rng(2405)
DPS = 50


def _pairs(r: int, interleaved: bool) -> list[tuple[int, int]]:
    if interleaved:
        return [(2 * m, 2 * m + 1) for m in range(r // 2)]
    return [(m, m + r // 2) for m in range(r // 2)]


def _angles(p: int, r: int, base: float | None, scale_pos: float, cos: Any, sin: Any
            ) -> list[tuple[Any, Any]]:
    out = []
    for m in range(r // 2):
        if base is not None:
            th = mp.mpf(p) / mp.mpf(scale_pos) * mp.power(mp.mpf(base), mp.mpf(-2 * m) / r)
            out.append((mp.cos(th), mp.sin(th)))
        else:
            out.append((mp.mpf(float(cos[p, m])), mp.mpf(float(sin[p, m]))))
    return out


def _rotate(x: list[Any], ang: list[tuple[Any, Any]], pairs: list[tuple[int, int]],
            sign: int) -> list[Any]:
    """x rotated by sign·θ per pair (sign -1: Rᵀ)."""
    out = list(x)
    for (c, s), (a, b) in zip(ang, pairs, strict=True):
        s = sign * s
        out[a] = x[a] * c - x[b] * s
        out[b] = x[b] * c + x[a] * s
    return out


def _rnd(rows: list[list[Any]]) -> np.ndarray:
    """mpf values rounded once to float64 (to nearest, ties to even; normal range)."""
    out = np.array([[float(x) for x in row] for row in rows], dtype=np.float64)
    return out.reshape(len(rows), -1)


def mp_rotary_grads(q: Any, k: Any, v: Any, do: Any, **kw: Any
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`mp_grads` rounded to float64."""
    with mp.workdps(DPS):
        return tuple(_rnd(x) for x in mp_grads(q, k, v, do, **kw))  # type: ignore[return-value]


def mp_grads(q: Any, k: Any, v: Any, do: Any, *, base: float | None = None,
             scale_pos: float = 1.0, cos: Any = None, sin: Any = None,
             interleaved: bool = False, rotary_dim: int | None = None,
             q_offset: int | None = None, keep: Any = None, madd: Any = None,
             want_ds: bool = False, softcap: float | None = None, sink: float | None = None,
             alibi: float | None = None) -> tuple[list[list[Any]], ...]:
    """dq, dk, dv (and dS with ``want_ds``) of one head (L, E), (S, E), (S, Ev), (L, Ev)
    as mpf values at DPS, ``madd`` (L, S) added to the scores:
    dV = Pᵀ dO, dP = dO Vᵀ, dS = P∘(dP − rowsum(dP∘P)), dQ' = c dS K', dK' = c dSᵀ Q',
    then dQ = Rᵀ dQ', dK = Rᵀ dK' (queries at q_offset + i, default S - L; keys at j).
    ``softcap`` C: s = C·tanh(s⁰/C) and dS⁰ = dS·(1 − tanh²(s⁰/C)) for dQ', dK' (dS the
    capped scores' gradient); ``alibi`` a slope: −slope·|j − i| added (after the cap);
    ``sink`` σ: e^σ joins each row's denominator, and the last item returned is then
    d_sink = Σ_i P_i,sink·(0 − D_i)."""
    with mp.workdps(DPS):
        L, E = q.shape
        S, Ev = v.shape
        r = rotary_dim if rotary_dim is not None else (2 * cos.shape[1] if cos is not None
                                                        else E - E % 2)
        pairs = _pairs(r, interleaved)
        off = S - L if q_offset is None else q_offset
        f = [[mp.mpf(float(t)) for t in row] for row in q]
        g = [[mp.mpf(float(t)) for t in row] for row in k]
        V = [[mp.mpf(float(t)) for t in row] for row in v]
        dO = [[mp.mpf(float(t)) for t in row] for row in do]
        qa = [_angles(off + i, r, base, scale_pos, cos, sin) for i in range(L)]
        ka = [_angles(j, r, base, scale_pos, cos, sin) for j in range(S)]
        Q = [_rotate(f[i], qa[i], pairs, 1) for i in range(L)]
        K = [_rotate(g[j], ka[j], pairs, 1) for j in range(S)]
        c = 1 / mp.sqrt(E)
        P = [[mp.mpf(0)] * S for _ in range(L)]
        phi = [[mp.mpf(1)] * S for _ in range(L)]
        p_sink = [mp.mpf(0)] * L
        for i in range(L):
            js = [j for j in range(S) if keep is None or keep[i][j]]
            if not js and sink is None:
                continue
            sc = {}
            for j in js:
                s0 = c * mp.fsum(a * b for a, b in zip(Q[i], K[j], strict=True))
                if softcap is not None:
                    t = mp.tanh(s0 / softcap)
                    s0, phi[i][j] = softcap * t, 1 - t * t
                if alibi is not None:
                    s0 -= mp.mpf(alibi) * abs(j - i)
                sc[j] = s0 + (0 if madd is None else mp.mpf(float(madd[i][j])))
            top = max([*sc.values(), *([] if sink is None else [mp.mpf(sink)])])
            w = {j: mp.exp(sc[j] - top) for j in js}
            ws = mp.mpf(0) if sink is None else mp.exp(mp.mpf(sink) - top)
            d = mp.fsum(w.values()) + ws
            for j in js:
                P[i][j] = w[j] / d
            p_sink[i] = ws / d
        dv = [[mp.fsum(P[i][j] * dO[i][e] for i in range(L)) for e in range(Ev)]
              for j in range(S)]
        dP = [[mp.fsum(dO[i][e] * V[j][e] for e in range(Ev)) for j in range(S)]
              for i in range(L)]
        dS, d_sink = [], mp.mpf(0)
        for i in range(L):
            D = mp.fsum(dP[i][j] * P[i][j] for j in range(S))
            dS.append([P[i][j] * (dP[i][j] - D) for j in range(S)])
            d_sink += p_sink[i] * (0 - D)
        ds0 = [[dS[i][j] * phi[i][j] for j in range(S)] for i in range(L)]
        dq_r = [[c * mp.fsum(ds0[i][j] * K[j][e] for j in range(S)) for e in range(E)]
                for i in range(L)]
        dk_r = [[c * mp.fsum(ds0[i][j] * Q[i][e] for i in range(L)) for e in range(E)]
                for j in range(S)]
        dq = [_rotate(dq_r[i], qa[i], pairs, -1) for i in range(L)]
        dk = [_rotate(dk_r[j], ka[j], pairs, -1) for j in range(S)]
        out: tuple[Any, ...] = (dq, dk, dv, dS) if want_ds else (dq, dk, dv)
        return (*out, [[d_sink]]) if sink is not None else out


def _data(L: int, S: int, E: int, dtype: type = np.float32) -> tuple[np.ndarray, ...]:
    return tuple(RNG.standard_normal(shape).astype(dtype)
                 for shape in ((L, E), (S, E), (S, E), (L, E)))


CASES = [
    # (L, S, E, keywords of reference_attention_backward, keywords of the mpmath loop)
    (3, 5, 6, {"rotary_base": 10000.0}, {"base": 10000.0}),
    (3, 5, 6, {"rotary_base": 10000.0, "rotary_interleaved": True},
     {"base": 10000.0, "interleaved": True}),
    (2, 6, 8, {"rotary_base": 500.0, "rotary_dim": 4}, {"base": 500.0, "rotary_dim": 4}),
    (2, 5, 6, {"rotary_base": 10000.0, "rotary_dim": 4, "rotary_interleaved": True,
               "rotary_position_scale": 4.0},
     {"base": 10000.0, "rotary_dim": 4, "interleaved": True, "scale_pos": 4.0}),
    (1, 7, 4, {"rotary_base": 10.0}, {"base": 10.0}),       # decode: one query at 6
]


@pytest.mark.parametrize("L,S,E,kw,ref_kw", CASES)
def test_rotary_gradients_round_as_an_independent_mpmath_evaluation(L, S, E, kw, ref_kw):
    # mpmath at 50 digits (~166 bits) rounded once to float64: the oracle's rounded()
    # is correctly rounded, so the two agree unless the exact value lies within
    # 2^-160 relative of a rounding boundary (not at these random inputs): equality
    # (float64 rounding mostly needs the Arb tier: tier 1's bounds are a few ulps wide)
    q, k, v, do = _data(L, S, E)
    g = ms.reference_attention_backward(q, k, v, do, **kw)
    want = mp_rotary_grads(q, k, v, do, **ref_kw)
    for enc, exp_ in zip(g, want, strict=True):
        assert np.array_equal(enc.rounded("float64"), exp_)


@pytest.mark.parametrize("L,S,E,kw,ref_kw", CASES)
def test_rotary_gradients_tier1_bounds_hold_the_mpmath_values(L, S, E, kw, ref_kw):
    # the float64 bounds of tier 1 (before any rounding refines a row) contain the
    # 50-digit values, and float32 rounding (decided by tier 1 almost everywhere)
    # agrees with mpmath's value rounded once to 24 bits
    q, k, v, do = _data(L, S, E)
    g = ms.reference_attention_backward(q, k, v, do, **kw)
    lows = [(enc.lower.copy(), enc.upper.copy()) for enc in g]
    with mp.workdps(DPS):
        exact = mp_grads(q, k, v, do, **ref_kw)
        for (lo, hi), rows, enc in zip(lows, exact, g, strict=True):
            for i, row in enumerate(rows):
                for e, x in enumerate(row):
                    assert mp.mpf(float(lo[i, e])) <= x <= mp.mpf(float(hi[i, e]))
            f32 = np.array([[_r24(x) for x in row]
                            for row in rows], dtype=np.float32).reshape(len(rows), -1)
            assert np.array_equal(enc.rounded("float32"), f32)


def _r24(x: Any) -> float:
    with mp.workprec(24):
        return float(+x)


def test_rotary_gradients_with_tables_causal_and_gqa_sum_the_heads():
    L, S, E, H, Hkv = 3, 5, 4, 4, 2
    cos = RNG.uniform(-1, 1, (S, E // 2))
    sin = RNG.uniform(-1, 1, (S, E // 2))
    q = RNG.standard_normal((1, H, L, E)).astype(np.float32)
    k, v = (RNG.standard_normal((1, Hkv, S, E)).astype(np.float32) for _ in range(2))
    do = RNG.standard_normal((1, H, L, E)).astype(np.float32)
    g = ms.reference_attention_backward(q, k, v, do, rotary_cos=cos, rotary_sin=sin,
                                        is_causal=True, enable_gqa=True,
                                        causal_alignment="bottom_right")
    keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + (S - L)
    dq, dk, dv = (enc.rounded("float64") for enc in g)
    rep = H // Hkv
    with mp.workdps(DPS):
        per = [mp_grads(q[0, h], k[0, h // rep], v[0, h // rep], do[0, h], cos=cos, sin=sin,
                        keep=keep) for h in range(H)]
        for h in range(H):
            assert np.array_equal(dq[0, h], _rnd(per[h][0]))
        # a kv head's dk, dv: the sum over its query heads (exact in mpmath, one rounding)
        for kv in range(Hkv):
            for n, got in ((1, dk), (2, dv)):
                tot = [[mp.fsum(per[h][n][j][e] for h in range(kv * rep, (kv + 1) * rep))
                        for e in range(E)] for j in range(S)]
                assert np.array_equal(got[0, kv], _rnd(tot))


def test_rotary_structural_zeros_are_exact():
    # one query, causal top-left: the first row sees one key (P = 1, dS = 0); equal value
    # rows make dS = 0 for every row; a zero grad_output row too
    q, k, v, do = _data(3, 4, 4, np.float64)
    g = ms.reference_attention_backward(q, k, v, do, rotary_base=100.0, is_causal=True)
    assert g.dq.exact((0, 0)) == 0 and g.dq.rounded()[0].tolist() == [0.0] * 4
    v_eq = np.broadcast_to(v[:1], v.shape).copy()
    g2 = ms.reference_attention_backward(q, k, v_eq, do, rotary_base=100.0)
    assert not np.any(g2.dq.rounded()) and not np.any(g2.dk.rounded())
    assert not np.any(np.signbit(g2.dq.rounded()))
    do0 = do.copy()
    do0[1] = 0.0
    g3 = ms.reference_attention_backward(q, k, v, do0, rotary_base=100.0)
    assert g3.dq.rounded()[1].tolist() == [0.0] * 4
    g4 = ms.reference_attention_backward(q, k, v, do, rotary_base=100.0, scale=0.0)
    assert not np.any(g4.dq.rounded()) and not np.any(g4.dk.rounded())


def test_rotary_gradients_with_a_float_mask_and_its_gradient():
    # an additive float mask (exact doubles, -inf entries off) and d_attn_mask = dS
    q, k, v, do = _data(3, 5, 4)
    madd = RNG.standard_normal((3, 5)).astype(np.float32)
    madd[0, 4] = -np.inf
    g = ms.reference_attention_backward(q, k, v, do, rotary_base=300.0, attn_mask=madd)
    keep = madd != -np.inf
    with mp.workdps(DPS):
        want = mp_grads(q, k, v, do, base=300.0, keep=keep,
                        madd=np.where(keep, madd, 0.0), want_ds=True)
        for enc, rows in zip((g.dq, g.dk, g.dv, g.d_attn_mask), want, strict=True):
            assert np.array_equal(enc.rounded("float64"), _rnd(rows))
    assert g.d_attn_mask.rounded()[0, 4] == 0.0


def test_rotary_mask_gradient_broadcast_over_rows_with_a_zero_grad_output_row():
    # a (1, S) mask: d_attn_mask sums dS over the rows; row 1 has dO = 0, so dS = 0 there
    # exactly (its Arb balls are exact zeros, not balls around 0)
    q, k, v, do = _data(3, 5, 4, np.float64)
    do[1] = 0.0
    madd = RNG.standard_normal((1, 5))
    g = ms.reference_attention_backward(q, k, v, do, rotary_base=300.0, attn_mask=madd)
    with mp.workdps(DPS):
        ds = mp_grads(q, k, v, do, base=300.0, madd=np.broadcast_to(madd, (3, 5)),
                      want_ds=True)[3]
        want = _rnd([[mp.fsum(ds[i][j] for i in range(3)) for j in range(5)]])
    assert np.array_equal(g.d_attn_mask.rounded("float64"), want)
    assert g.dq.rounded()[1].tolist() == [0.0] * 4


PIPELINES = [
    # (L, S, E, keywords of reference_attention_backward, of the mpmath loop): Gemma-2
    # (rotary + softcap), gpt-oss (rotary + sinks, causal), ALiBi + rotary (L = S)
    (3, 5, 6, {"rotary_base": 10000.0, "softcap": 2.0}, {"base": 10000.0, "softcap": 2.0}),
    (2, 5, 6, {"rotary_base": 500.0, "rotary_dim": 4, "rotary_interleaved": True,
               "softcap": 1.5, "is_causal": True, "causal_alignment": "bottom_right"},
     {"base": 500.0, "rotary_dim": 4, "interleaved": True, "softcap": 1.5, "causal": True}),
    (3, 5, 6, {"rotary_base": 10000.0, "sinks": np.array([0.75])},
     {"base": 10000.0, "sink": 0.75}),
    (3, 6, 4, {"rotary_base": 10000.0, "sinks": np.array([-0.5]), "is_causal": True,
               "causal_alignment": "bottom_right", "softcap": 3.0},
     {"base": 10000.0, "sink": -0.5, "causal": True, "softcap": 3.0}),
    (4, 4, 6, {"rotary_base": 10000.0, "alibi_slopes": np.array([0.25])},
     {"base": 10000.0, "alibi": 0.25}),
]


@pytest.mark.parametrize("L,S,E,kw,ref_kw", PIPELINES)
def test_rotary_gradients_with_softcap_sinks_alibi_round_as_mpmath(L, S, E, kw, ref_kw):
    # the reference's float64 rounding (Arb tier) equals the 50-digit mpmath loop
    # rounded once, and float32 too; the sink logit's gradient as well
    q, k, v, do = (x[None] for x in _data(L, S, E))
    ref_kw = dict(ref_kw)
    if ref_kw.pop("causal", False):   # bottom-right: query i sees keys j <= i + S - L
        ref_kw["keep"] = [[j <= i + S - L for j in range(S)] for i in range(L)]
    g = ms.reference_attention_backward(q, k, v, do, **kw)
    with mp.workdps(DPS):
        exact = mp_grads(q[0], k[0], v[0], do[0], **ref_kw)
    for enc, rows in zip(g, exact[:3], strict=True):
        assert np.array_equal(enc.rounded("float64")[0], _rnd(rows))
        f32 = np.array([[_r24(x) for x in row] for row in rows], dtype=np.float32)
        assert np.array_equal(enc.rounded("float32")[0], f32.reshape(len(rows), -1))
    if "sink" in ref_kw:
        assert g.d_sinks.rounded("float64").tolist() == [float(exact[3][0][0])]


def test_rotary_gradients_with_a_relative_bias_table_round_as_mpmath():
    # a score_mod table (T5-style relative bias, W = 2): the bias table[clip(j - i, -2, 2)
    # + 2] added to the rotated scores; its gradient d_score_mod the table's functional
    q, k, v, do = (x[None] for x in _data(3, 6, 4))
    table = np.array([[0.5, -0.25, 0.0, 0.125, -1.0]])
    mod = ms.relative_bias_score_mod(table)
    g = ms.reference_attention_backward(q, k, v, do, rotary_base=100.0, score_mod=mod)
    bias = [[table[0, min(max(j - i, -2), 2) + 2] for j in range(6)] for i in range(3)]
    with mp.workdps(DPS):
        dq, dk, dv, ds = mp_grads(q[0], k[0], v[0], do[0], base=100.0, madd=bias,
                                  q_offset=3, want_ds=True)
        dt = [mp.fsum(ds[i][j] for i in range(3) for j in range(6)
                      if min(max(j - i, -2), 2) + 2 == t) for t in range(5)]
    for enc, rows in zip(g, (dq, dk, dv), strict=True):
        assert np.array_equal(enc.rounded("float64")[0], _rnd(rows))
    assert np.array_equal(g.d_score_mod[0].rounded("float64"), _rnd([dt]))


def test_rotary_gradients_with_softcap_differ_from_the_uncapped_ones():
    # not vacuous: the cap changes every gradient the scores reach
    q, k, v, do = (x[None] for x in _data(3, 5, 6))
    capped = ms.reference_attention_backward(q, k, v, do, rotary_base=10.0, softcap=1.0)
    plain = ms.reference_attention_backward(q, k, v, do, rotary_base=10.0)
    assert not np.any(capped.dq.rounded() == plain.dq.rounded())


def test_a_variant_backward_hook_replaces_the_plain_backward_in_the_door():
    # the protocol's ``backward`` hook, generic: a test variant whose hook hands the
    # call's prepared inputs to the plain backward (and counts its calls)
    from mha_symbolic.oracle.backward.attention import backward_enclosures
    from mha_symbolic.oracle.variants import protocol

    calls = []

    def hook(opts, prep, grad_output, **common):
        calls.append(common["enable_gqa"])
        return backward_enclosures(prep.q64, prep.k64, prep.v64, grad_output,
                                   attn_mask=prep.keep, scale=common["scale"],
                                   masked_rows=common["masked_rows"])

    protocol.register(protocol.Variant(
        name="backward_hook_test", keywords=("hooked",), fields={"hooked": None},
        parse=lambda hooked=None: {} if hooked is None else {"hooked": True},
        summary="test", backward=hook))
    try:
        q, k, v, do = _data(3, 4, 4)
        got = ms.reference_attention_backward(q, k, v, do, hooked=True)
        want = ms.reference_attention_backward(q, k, v, do)
        assert calls == [False]
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a.rounded("float32"), b.rounded("float32"))
    finally:
        protocol.unregister("backward_hook_test")
