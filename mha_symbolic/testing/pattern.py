"""Where the failing elements of a comparison lie: the report's pattern line.

Two kinds of statement, each decided, never guessed:

1. **From the per-element verdicts alone** (:func:`describe_pattern`, on every
   comparison): for each named axis of the output (batch, head, query or key or
   token, feature) the set of indices holding a failing element, said when it is a
   strict subset — one index, a range aligned to a tile of 16/32/64/128 (the last
   tile, tile *j*), one residue modulo a tile, a head group of GQA (the query heads of
   one key/value head), one sequence of a packed varlen batch (and the positions in
   it).  "only queries 4064–4095 (the last tile of 32)" means: every failing element
   has its query index there.  It says nothing about the cause.
2. **Keys, from a diagnostic re-run** (:data:`KEY_HYPOTHESES`, plain attention
   outputs only): an output element mixes every key of its row, so a kernel wrong in
   the last key tile is wrong in *every* row, and the verdicts cannot name the keys.
   What can be decided is whether the output is, within the model tolerance, the
   attention of the same inputs over a different key set — the last tile of T left
   out, one split of a split-KV kernel left out, the last tile's zero padding
   attended, the causal mask applied per tile — evaluated in float64 as the bug
   catalogue's variants are (:mod:`.forward.bugs`: checked, not inferred).  Such a match is
   a diagnosis (a bug class with its keys in its description) and the pattern line
   names the keys.  For the gradients dk and dv the key axis *is* an axis of the
   output, and case 1 names it directly.

>>> import numpy as np
>>> bad = np.zeros((1, 2, 64, 4), bool); bad[0, 1, 32:] = True
>>> describe_pattern(bad, ("batch", "head", "query", "feature"))
'only head 1 of 2; only queries 32–63 of 64 (the last tile of 32)'
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .call import AttentionCall
from .forward.bugs import Candidate
from .forward.plain import plain_attention
from .tolerance import ErrorModel

__all__ = ["KEY_HYPOTHESES", "TILES", "axis_clause", "describe_pattern", "key_clause",
           "locate_keys", "patterned", "sequence_pattern", "with_pattern"]

#: the tile sizes a boundary is aligned to (the KV/query block sizes of real kernels)
TILES = (128, 64, 32, 16)

#: axes along a sequence (tiles and residues are named there and along features)
_SEQUENCE_AXES = ("query", "key", "token", "position", "feature")

_PLURAL = {"batch": "batches", "query": "queries", "key": "keys", "head": "heads",
           "feature": "features", "token": "tokens", "position": "positions"}


def _plural(name: str) -> str:
    base = name.rstrip("0123456789")
    return _PLURAL.get(base, base + "s") + name[len(base):]


def _span(a: int, b: int) -> str:
    return f"{a}" if a == b else f"{a}–{b}"


def _tile_note(a: int, b: int, n: int) -> str:
    """How the range a..b (inclusive) of n sits on the tiles, or ''."""
    for T in TILES:
        if n <= T:
            continue
        last = ((n - 1) // T) * T
        if a == last and b == n - 1:
            return f"the last tile of {T}"
    for T in TILES:
        if n <= T or a % T:
            continue
        if b - a + 1 == T:
            return f"tile {a // T} of {T}"
        if (b + 1) % T == 0 or b == n - 1:
            return f"tiles {a // T}–{b // T} of {T}"
    return ""


def axis_clause(name: str, fail: np.ndarray) -> str:
    """The clause for one axis, from ``fail`` (per index: holds a failing element),
    or '' when every index fails (or the axis has one index)."""
    n = int(fail.size)
    idx = np.flatnonzero(fail)
    if n <= 1 or idx.size in (0, n):
        return ""
    seq = name.rstrip("0123456789") in _SEQUENCE_AXES
    a, b = int(idx[0]), int(idx[-1])
    if idx.size == b - a + 1:                       # one contiguous range
        text = (f"only {name} {a} of {n}" if a == b
                else f"only {_plural(name)} {_span(a, b)} of {n}")
        note = _tile_note(a, b, n) if seq else ""
        return f"{text} ({note})" if note else text
    if seq:
        for T in TILES:
            if n <= T:
                continue
            res = set((idx % T).tolist())
            if len(res) == 1:
                r = res.pop()
                every = np.arange(r, n, T)
                if np.array_equal(every, idx):
                    return (f"only {_plural(name)} ≡ {r} mod {T} (row {r} of every tile "
                            f"of {T}), {idx.size} of {n}")
        ok = np.flatnonzero(~fail)
        for T in TILES:
            if n <= T or ok.size == 0:
                continue
            r = int(ok[0]) % T
            if r == int(ok[0]) and np.array_equal(np.arange(r, n, T), ok):
                return (f"every {name} but those ≡ {r} mod {T} (row {r} of every tile of "
                        f"{T} is right), {idx.size} of {n}")
    if idx.size <= 4:
        return f"only {_plural(name)} {', '.join(map(str, idx.tolist()))} of {n}"
    return f"in {idx.size} of {n} {_plural(name)}"


def _head_clause(fail: np.ndarray, rep: int) -> str:
    """Heads, read as groups of ``rep`` query heads per key/value head (GQA)."""
    n = int(fail.size)
    if rep <= 1 or n % rep or fail.all() or not fail.any():
        return axis_clause("head", fail)
    groups = fail.reshape(n // rep, rep)
    whole = groups.all(axis=1) | ~groups.any(axis=1)
    if not whole.all():
        return axis_clause("head", fail)
    g = np.flatnonzero(groups.any(axis=1))
    if g.size == 1:
        j = int(g[0])
        return (f"only head group {j} of {n // rep} (query heads {j * rep}–{j * rep + rep - 1}, "
                f"key/value head {j})")
    return f"only head groups {', '.join(map(str, g.tolist()))} of {n // rep}"


def _clauses(bad: np.ndarray, names: tuple[str, ...], rep: int) -> list[tuple[str, str]]:
    """(axis name, clause) for every axis whose failing indices are a strict subset."""
    out = []
    for ax, name in enumerate(names):
        fail = np.asarray(bad.any(axis=tuple(i for i in range(bad.ndim) if i != ax)))
        clause = _head_clause(fail, rep) if name == "head" else axis_clause(name, fail)
        if clause:
            out.append((name, clause))
    return out


def describe_pattern(bad: np.ndarray, names: tuple[str, ...], *, rep: int = 1) -> str:
    """The pattern of the mismatch mask ``bad`` over axes ``names`` ('' when nothing
    fails; "not localised: …" when every index of every axis holds a failure);
    ``rep``: query heads per key/value head (the head axis is then read by groups)."""
    bad = np.asarray(bad, bool)
    if not bad.any() or bad.ndim != len(names):
        return ""
    clauses = _clauses(bad, names, rep)
    if not clauses:
        axes = [n for n, s in zip(names, bad.shape, strict=True) if s > 1]
        return ("not localised: failing elements in every " + ", ".join(axes)
                if axes else "the only element")
    return "; ".join(c for _, c in clauses)


def sequence_pattern(bad: np.ndarray, cu_seqlens: Any, names: tuple[str, ...]) -> str:
    """The pattern of a packed varlen output (total, H, E_v) whose sequence b owns rows
    ``cu_seqlens[b]:cu_seqlens[b+1]``: which sequences fail, and where in them."""
    bad = np.asarray(bad, bool)
    cu = [int(c) for c in np.asarray(cu_seqlens).tolist()]
    if not bad.any() or len(cu) < 3 or bad.ndim != len(names) or cu[-1] != bad.shape[0]:
        return describe_pattern(bad, names)
    rows = np.asarray(bad.reshape(bad.shape[0], -1).any(axis=1))
    nseq = len(cu) - 1
    seqs = [b for b in range(nseq) if rows[cu[b]:cu[b + 1]].any()]
    rest = [c for n, c in _clauses(bad, names, 1) if n != names[0]]
    if len(seqs) == nseq:
        return describe_pattern(bad, names)
    if len(seqs) == 1:
        b = seqs[0]
        where = axis_clause("position", rows[cu[b]:cu[b + 1]])
        text = f"only sequence {b} of {nseq} (tokens {cu[b]}–{cu[b + 1] - 1})"
        if where:
            text += f", in it {where.removeprefix('only ')}"
    else:
        text = f"only sequences {', '.join(map(str, seqs))} of {nseq}"
    return "; ".join([text, *rest])


# --------------------------------------------------------------------------------------
# Keys: attention over another key set, checked


@dataclass(frozen=True)
class KeyHypothesis:
    """A key set the kernel may have used instead: ``keep(L, S, causal_keep)`` -> (L, S)
    bool of the keys it attends (before the call's own masks), or None when the
    hypothesis does not apply; ``pad``: zero keys appended and attended instead."""

    name: str
    describe: Callable[[int, int], str]
    keep: Callable[[int, int, int], Any]


def _last_tile(S: int, T: int) -> tuple[int, int] | None:
    if S <= T:
        return None
    return ((S - 1) // T) * T, S


def _hypotheses(L: int, S: int, causal: bool, align_off: int) -> list[tuple[str, str, Any, int]]:
    """(bug name, description, keep (L, S) bool or None, zero keys appended)."""
    out: list[tuple[str, str, Any, int]] = []
    seen: set[Any] = set()

    def drop(a: int, b: int) -> np.ndarray:
        k = np.ones((L, S), bool)
        k[:, a:b] = False
        return k

    for T in TILES:
        lt = _last_tile(S, T)
        if lt is not None and lt not in seen:
            seen.add(lt)
            a, b = lt
            out.append(("kv_last_tile_dropped",
                        f"keys {a}–{b - 1} (the last tile of {T}) left out", drop(a, b), 0))
    for T in TILES:
        if S > T and (0, T) not in seen:
            seen.add((0, T))
            out.append(("kv_first_tile_dropped",
                        f"keys 0–{T - 1} (the first tile of {T}) left out", drop(0, T), 0))
    for n in (2, 3, 4, 8):
        size = -(-S // n)
        if size < 16 or size >= S:
            continue
        for j in range(n):
            a, b = j * size, min(S, (j + 1) * size)
            if a >= S or (a, b) in seen:
                continue
            seen.add((a, b))
            out.append(("kv_split_dropped",
                        f"keys {a}–{b - 1} (split {j} of {n} of a split-KV kernel) left "
                        "out of the merge", drop(a, b), 0))
    for T in TILES:
        if S > T // 2 and S % T:
            pad = T - S % T
            out.append(("kv_padding_attended",
                        f"the last tile of {T} padded with {pad} zero keys and values that "
                        "are attended (score 0, value 0)", None, pad))
    if causal:
        qi = np.arange(L)[:, None] + align_off
        kj = np.arange(S)[None, :]
        for T in TILES:
            if S <= T and L <= T:
                continue
            out.append(("causal_tile_granular",
                        f"causal mask applied per key tile of {T} (query i sees keys up to "
                        "the end of its tile: the diagonal tile unmasked)",
                        kj < ((qi // T) + 1) * T, 0))
            out.append(("causal_diagonal_tile_skipped",
                        f"the diagonal key tile of {T} skipped (query i sees keys before "
                        "its tile only)", kj < (qi // T) * T, 0))
    return out


def _with_keys(x: AttentionCall, keep: np.ndarray | None, pad: int,
               causal: bool = True) -> AttentionCall:
    """``x`` attending the keys ``keep`` (and'ed with its own masks; ``causal=False``:
    ``keep`` replaces its causal mask), or with ``pad`` zero keys appended that every
    query attends (the causal mask stays on the real ones)."""
    S = x.k.shape[-2]
    m = x.attn_mask
    own = _keep_matrix(x if causal else replace(x, is_causal=False))
    if pad:
        zk = np.zeros((*x.k.shape[:-2], pad, x.k.shape[-1]))
        zv = np.zeros((*x.v.shape[:-2], pad, x.v.shape[-1]))
        allowed = np.concatenate([np.broadcast_to(own, (*own.shape[:-1], S)),
                                  np.ones((*own.shape[:-1], pad), bool)], axis=-1)
        add = None
        if m is not None and m.dtype != np.bool_:
            mm = np.asarray(m, np.float64)
            add = np.concatenate([np.broadcast_to(mm, (*mm.shape[:-1], S)),
                                  np.zeros((*mm.shape[:-1], pad))], axis=-1)
        mask = allowed if add is None else np.where(allowed, add, -np.inf)
        return replace(x, k=np.concatenate([x.k, zk], axis=-2),
                       v=np.concatenate([x.v, zv], axis=-2), attn_mask=mask, is_causal=False)
    assert keep is not None
    allowed = own & keep
    if m is not None and m.dtype != np.bool_:
        return replace(x, attn_mask=np.where(allowed, np.asarray(m, np.float64), -np.inf),
                       is_causal=False)
    return replace(x, attn_mask=allowed, is_causal=False)


def _keep_matrix(x: AttentionCall) -> np.ndarray:
    """The call's own kept keys, broadcastable to (…, L, S): its bool mask (or the
    finite entries of a float mask) and its causal mask."""
    L, S = x.q.shape[-2], x.k.shape[-2]
    keep = np.ones((L, S), bool)
    if x.is_causal:
        off = S - L if x.causal_alignment == "bottom_right" else 0
        keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    m = x.attn_mask
    if m is None:
        return keep
    mk = m if m.dtype == np.bool_ else ~np.isneginf(np.asarray(m, np.float64))
    return mk & keep


def locate_keys(actual: np.ndarray, x: AttentionCall, *, model: ErrorModel,
                safety: float, limit_scores: int = 1 << 26) -> tuple[Candidate, ...]:
    """The key hypotheses the output fits (within ``safety`` × the model tolerance of
    the float64 attention over those keys), best first; none are tried when the call
    is larger than ``limit_scores`` scores (the report then says nothing of keys)."""
    L, S = x.q.shape[-2], x.k.shape[-2]
    if S < 2 or x.dropout_mask is not None or x.q.size // max(1, x.q.shape[-1]) * S > limit_scores:
        return ()
    off = S - L if x.causal_alignment == "bottom_right" else 0
    a = np.asarray(actual, np.float64)
    found: list[Candidate] = []
    for name, text, keep, pad in _hypotheses(L, S, x.is_causal, off):
        try:
            pv = plain_attention(_with_keys(x, keep, pad, not name.startswith("causal_")))
            if pv.shape != a.shape:
                continue
            ok, ratio = pv.fits(a, model, safety)
        except (ValueError, IndexError):
            continue
        if ok:
            found.append(Candidate(name, text, ratio))
    return tuple(sorted(found, key=lambda c: c.ratio))[:1]


def key_clause(diagnoses: Any) -> str:
    """The pattern line's clause of a key hypothesis among ``diagnoses``, or ''."""
    for d in diagnoses:
        if d.bug in KEY_HYPOTHESES:
            return f"keys: the output is attention with {d.description} (checked)"
    return ""


#: the bug classes :func:`locate_keys` can name (data: name -> what it means)
KEY_HYPOTHESES: dict[str, str] = {
    "kv_last_tile_dropped": "the last key tile of T left out",
    "kv_first_tile_dropped": "the first key tile of T left out",
    "kv_split_dropped": "one split of a split-KV kernel left out of the merge",
    "kv_padding_attended": "the last key tile's zero padding attended",
    "causal_tile_granular": "the causal mask applied per key tile (diagonal tile unmasked)",
    "causal_diagonal_tile_skipped": "the diagonal key tile skipped",
}


def patterned(compare: Callable[..., Any]) -> Callable[..., Any]:
    """The decorator of a "bhsd" ``compare(actual, query, key, value, **options)``: a
    failing comparison's pattern read with the head groups of GQA (H_q / H_kv) and the
    key clause of a key diagnosis."""

    @functools.wraps(compare)
    def run(actual: Any, query: Any, key: Any, value: Any, **options: Any) -> Any:
        __tracebackhide__ = True
        comp = compare(actual, query, key, value, **options)
        if comp.passed:
            return comp
        hq, hk = (int(np.shape(x)[-3]) if len(np.shape(x)) >= 3 else 1 for x in (query, key))
        return with_pattern(comp, rep=hq // hk if hk and hq % hk == 0 else 1)

    return run


def with_pattern(comp: Any, *, rep: int = 1) -> Any:
    """``comp`` with its pattern line recomputed for ``rep`` query heads per key/value
    head, and the key clause of a key diagnosis appended."""
    if comp.passed:
        return comp
    text = describe_pattern(comp.mismatched, comp.index_names, rep=rep) or comp.pattern
    kc = key_clause(comp.diagnoses)
    return replace(comp, pattern="; ".join(t for t in (text, kc) if t))
