"""Theorem 11: the shape algebra of (cross-)attention, for symbolic sizes.

Scores are n_q x n_k, each head n_q x d_v, the output n_q x d_model (seed
page, Example H: 3 x 5 scores, 3 x 64 head, 8 * 64 = 512 after the concat).
SymPy's own MatrixSymbol checks are weak with symbolic sizes (it accepts X*X
for an L x d X, REFERENCES.md section 5), so every product here goes through
a checker that *decides* the inner sizes equal: each one is a proof step.
"""

from __future__ import annotations

import random

import sympy as sp

from mha_symbolic.exact.proof_render import book_latex
from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_precision, attention, hstack, random_arb_mat

nq, nk, dm, h, dk, dv = sp.symbols("n_q n_k d_model h d_k d_v", integer=True, positive=True)
i = sp.Symbol("i", integer=True, positive=True)

Shape = tuple[sp.Expr, sp.Expr]


def _txt(shape: Shape) -> str:
    return rf"{book_latex(shape[0])} \times {book_latex(shape[1])}"


def _matmul(d: Derivation, left: tuple[str, Shape], right: tuple[str, Shape],
            name: str) -> Shape:
    """Record that ``left @ right`` is defined (inner sizes decided equal) and its shape."""
    (lname, (a, b)), (rname, (c, e)) = left, right
    d.identity(b, c, f"inner sizes of ${lname}\\,{rname}$ agree",
               show=(rf"\mathrm{{cols}}({lname})", rf"\mathrm{{rows}}({rname}) = {book_latex(c)}"))
    d.define(rf"\mathrm{{shape}}({name})", _txt((a, e)),
             f"$({_txt((a, b))})({_txt((c, e))})$")
    return (a, e)


def derive_shapes(d: Derivation) -> dict[str, Shape]:
    """The shapes of attention's intermediates, every product checked by ``d``."""
    X, Xkv = (nq, dm), (nk, dm)
    WQ, WK, WV, WO = (dm, dk), (dm, dk), (dm, dv), (h * dv, dm)
    Q = _matmul(d, ("X", X), ("W^Q_i", WQ), "Q_i")
    K = _matmul(d, (r"X_{\mathrm{kv}}", Xkv), ("W^K_i", WK), "K_i")
    V = _matmul(d, (r"X_{\mathrm{kv}}", Xkv), ("W^V_i", WV), "V_i")
    S = _matmul(d, ("Q_i", Q), ("K_i^T", (K[1], K[0])), "Q_i K_i^T")
    d.define(r"\mathrm{shape}(A_i)", _txt(S), "row-wise softmax keeps the shape")
    head = _matmul(d, ("A_i", S), ("V_i", V), r"\mathrm{head}_i")
    d.identity(sp.Sum(dv, (i, 1, h)), h * dv, "concatenation: the heads' widths add up",
               show=(r"\mathrm{cols}(\mathrm{Concat}) = \sum_{i=1}^{h} d_v", h * dv))
    concat = (head[0], h * dv)
    out = _matmul(d, (r"\mathrm{Concat}", concat), ("W^O", WO), r"\mathrm{Concat}\,W^O")
    return {"q": Q, "k": K, "v": V, "scores": S, "weights": S, "head": head,
            "concat": concat, "output": out}


def prove() -> Derivation:
    d = Derivation()
    shapes = derive_shapes(d)
    d.identity(h * (dm / h), dm, "with $d_v = d_{\\mathrm{model}}/h$ the concatenation is "
               "$d_{\\mathrm{model}}$ wide",
               show=(r"h\, d_v", dm))
    d.conclude(rf"for all sizes, the scores are ${_txt(shapes['scores'])}$, each head "
               rf"${_txt(shapes['head'])}$, the concatenation ${_txt(shapes['concat'])}$ and "
               rf"the output ${_txt(shapes['output'])}$.")
    return d


def _same(a: sp.Expr, b: sp.Expr) -> bool:
    """Equal as expressions after matching symbols by name (the library's own symbols)."""
    a, b = sp.sympify(a), sp.sympify(b)
    names = {str(x): x for x in (nq, nk, dm, h, dk, dv)}
    b = b.xreplace({x: names.get(str(x), x) for x in b.free_symbols})
    return bool(sp.simplify(a - b) == 0)


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb + library")
    probe = Derivation()
    shapes = derive_shapes(probe)
    # the checker refuses a product whose inner sizes are not provably equal
    refused = False
    try:
        _matmul(Derivation(), ("Q_i", shapes["q"]), ("K_i", shapes["k"]), "Q_i K_i")
    except AssertionError:
        refused = True
    chk.holds(r"the checker refuses $Q_i K_i$ without the transpose ($d_k$ vs $n_k$)", refused)
    # the library's own checker (mha_symbolic.exact.shapes) must derive the same shapes
    from mha_symbolic.exact.shapes import attention_shapes

    table = attention_shapes(n_q="n_q", n_k="n_k", d_model="d_model", heads="h",
                             d_k="d_k", d_v="d_v")
    for key, (rows, cols) in shapes.items():
        got = table[key].shape
        chk.holds("mha_symbolic.exact.shapes derives the same shape, symbolically",
                  _same(rows, got.rows) and _same(cols, got.cols), f"{key}: library {got}",
                  case={"Intermediate": key})
    with arb_precision(128):
        for _ in range(4):
            sizes = {nq: rng.randint(1, 5), nk: rng.randint(1, 6), h: rng.randint(1, 3),
                     dk: rng.randint(1, 4), dv: rng.randint(1, 4), dm: rng.randint(1, 6)}
            X = random_arb_mat(rng, sizes[nq], sizes[dm])
            Xkv = random_arb_mat(rng, sizes[nk], sizes[dm])
            heads = []
            for _ in range(sizes[h]):
                Q = X * random_arb_mat(rng, sizes[dm], sizes[dk])
                K = Xkv * random_arb_mat(rng, sizes[dm], sizes[dk])
                V = Xkv * random_arb_mat(rng, sizes[dm], sizes[dv])
                heads.append(attention(Q, K, V, 1))
            scores = Q * K.transpose()
            out = hstack(heads) * random_arb_mat(rng, sizes[h] * sizes[dv], sizes[dm])
            computed = {"scores": (scores.nrows(), scores.ncols()),
                        "head": (heads[0].nrows(), heads[0].ncols()),
                        "output": (out.nrows(), out.ncols())}
            derived = {key: tuple(int(x.subs(sizes)) for x in shapes[key]) for key in computed}
            chk.holds(r"Arb: computed shapes $=$ derived shapes", computed == derived,
                      str(computed), case={book_latex(k) if k != dm else r"d_{\mathrm{model}}": v
                                           for k, v in sizes.items()})
    return chk


THEOREM = Theorem(
    name="shapes",
    title="Shape algebra of multi-head (cross-)attention",
    statement_latex=r"For query length $n_q$, key length $n_k$, width $d_{\mathrm{model}}$, "
    r"$h$ heads of widths $d_k, d_v$: $Q_i K_i^{\top}$ is $n_q \times n_k$, "
    r"$\mathrm{head}_i$ is $n_q \times d_v$, the concatenation $n_q \times h d_v$ and the "
    r"output $n_q \times d_{\mathrm{model}}$; every product is defined.",
    prove=prove,
    cross_check=cross_check,
    number=11,
)
