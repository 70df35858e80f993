"""Theorem 12: the parameter count of multi-head attention, and its GQA/MQA forms.

Seed page, Example I: 3 * 8 * (512 * 64) + 512 * 512 = 1048576 = 4 * 512^2.
In general (weights; biases in parentheses)

    h d_model d_k + h kdim d_k + h vdim d_v + h d_v d_model   (+ 2 h d_k + h d_v + d_model)

which is h d_model (2 d_k + d_v) + h d_v d_model when kdim = vdim = d_model, and
4 d_model^2 (+ 4 d_model) when d_k = d_v = d_model/h: torch.nn.MultiheadAttention's
E^2 + E kdim + E vdim (+ 3E) + E^2 (+ E) (REFERENCES.md section 2).  With g
key/value heads (GQA; g = 1 is MQA) the K and V projections shrink by g/h.
"""

from __future__ import annotations

import random
from typing import Any

import sympy as sp

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

h, g, dm, dk, dv, kdim, vdim = sp.symbols("h g d_model d_k d_v kdim vdim",
                                             integer=True, positive=True)
a, b, i = sp.symbols("a b i", integer=True, positive=True)
rr, cc = sp.symbols("r c", integer=True, positive=True)


def entries(rows: sp.Expr, cols: sp.Expr) -> sp.Expr:
    """Number of entries of a rows x cols matrix, as a double sum of 1."""
    return sp.Sum(sp.Sum(1, (b, 1, cols)), (a, 1, rows))


def prove() -> Derivation:
    d = Derivation()
    d.identity(entries(rr, cc), rr * cc, "an $r \\times c$ matrix has $rc$ entries")
    per_head = entries(dm, dk) + entries(kdim, dk) + entries(vdim, dv)
    d.identity(sp.Sum(per_head, (i, 1, h)), h * (dm * dk + kdim * dk + vdim * dv),
               "$W^Q_i, W^K_i, W^V_i$ for each of the $h$ heads",
               show=(r"\sum_{i=1}^{h} \bigl(|W^Q_i| + |W^K_i| + |W^V_i|\bigr)",
                     h * (dm * dk + kdim * dk + vdim * dv)))
    d.identity(entries(h * dv, dm), h * dv * dm, "$W^O$ is $h d_v \\times d_{\\mathrm{model}}$",
               show=(r"|W^O|", h * dv * dm))
    weights = h * (dm * dk + kdim * dk + vdim * dv) + h * dv * dm
    biases = 2 * h * dk + h * dv + dm
    d.define(r"N_W", weights, "all weights")
    d.define(r"N_b", biases, "biases of $Q, K, V$ ($h d_k, h d_k, h d_v$) and of the output")
    self_attn = weights.subs({kdim: dm, vdim: dm})
    d.identity(self_attn, h * dm * (2 * dk + dv) + h * dv * dm, "kdim = vdim = $d_{\\mathrm{model}}$",
               show=(r"N_W\big|_{\mathrm{kdim} = \mathrm{vdim} = d_{\mathrm{model}}}",
                     h * dm * (2 * dk + dv) + h * dv * dm))
    std = {dk: dm / h, dv: dm / h}
    d.identity(self_attn.subs(std), 4 * dm**2, "$d_k = d_v = d_{\\mathrm{model}}/h$",
               show=(r"N_W\big|_{d_k = d_v = d_{\mathrm{model}}/h}", 4 * dm**2))
    d.identity(biases.subs(std), 4 * dm, "biases", show=(r"N_b", 4 * dm))
    # torch's E^2 + E kdim + E vdim + 3E + E^2 + E with E = embed_dim = d_model
    torch_formula = dm**2 + dm * kdim + dm * vdim + 3 * dm + dm**2 + dm
    d.identity((weights + biases).subs(std), torch_formula,
               "torch.nn.MultiheadAttention: $E^2 + E\\,\\mathrm{kdim} + "
               "E\\,\\mathrm{vdim} + 3E + E^2 + E$ with $E = d_{\\mathrm{model}}$",
               show=(r"N_W + N_b\big|_{d_k = d_v = d_{\mathrm{model}}/h}", torch_formula))
    gqa = dm * h * dk + kdim * g * dk + vdim * g * dv + h * dv * dm
    d.define(r"N_W^{\mathrm{GQA}}", gqa, "$g$ key/value heads shared by the $h$ query heads")
    gqa_std = gqa.subs({kdim: dm, vdim: dm}).subs(std)
    d.identity(gqa_std, 2 * dm**2 + 2 * dm**2 * g / h, "GQA, $d_k = d_v = d_{\\mathrm{model}}/h$",
               show=(r"N_W^{\mathrm{GQA}}", 2 * dm**2 + 2 * dm**2 * g / h))
    d.identity(gqa_std.subs(g, 1), 2 * dm**2 + 2 * dm**2 / h, "MQA: $g = 1$",
               show=(r"N_W^{\mathrm{MQA}}", 2 * dm**2 + 2 * dm**2 / h))
    d.identity(gqa_std.subs(g, h), 4 * dm**2, "$g = h$ is MHA",
               show=(r"N_W^{\mathrm{GQA}}\big|_{g = h}", 4 * dm**2))
    ex_i = 3 * 8 * (512 * 64) + 512 * 512
    d.identity(sp.Integer(ex_i), 4 * 512**2, "Example I: $d_{\\mathrm{model}} = 512$, $h = 8$",
               show=(r"3 \cdot 8 \cdot (512 \cdot 64) + 512^2", sp.Integer(2) ** 20))
    d.conclude(r"one attention block has $h\,d_{\mathrm{model}}(2d_k + d_v) + h\,d_v\,"
               r"d_{\mathrm{model}}$ weights (self-attention) plus $2hd_k + hd_v + "
               r"d_{\mathrm{model}}$ biases; with $d_k = d_v = d_{\mathrm{model}}/h$ that is "
               r"$4d_{\mathrm{model}}^2 + 4d_{\mathrm{model}}$, with $g$ key/value heads "
               r"$2d_{\mathrm{model}}^2(1 + g/h)$ weights.")
    return d


def _count_by_construction(d_model: int, heads: int, kv: int, d_k: int, d_v: int,
                           kd: int, vd: int, bias: bool) -> int:
    """Build every parameter tensor as nested lists and count the entries."""
    def mat(r: int, c: int) -> list[list[int]]:
        return [[0] * c for _ in range(r)]

    tensors = [mat(d_model, d_k) for _ in range(heads)]  # W^Q_i
    tensors += [mat(kd, d_k) for _ in range(kv)]  # W^K_j
    tensors += [mat(vd, d_v) for _ in range(kv)]  # W^V_j
    tensors.append(mat(heads * d_v, d_model))  # W^O
    if bias:
        tensors += [mat(1, heads * d_k), mat(1, kv * d_k), mat(1, kv * d_v), mat(1, d_model)]
    return sum(len(row) for t in tensors for row in t)


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("exact + torch")
    chk.agree(r"entries counted one by one $= 4 \cdot 512^2$ (no bias)",
              _count_by_construction(512, 8, 8, 64, 64, 512, 512, False), 1048576,
              case={"Example": "I"})
    from mha_symbolic.exact.params import parameter_count

    torch: Any = None
    try:
        import torch
    except ImportError:
        chk.kind = "exact"
    torch_claim = (r"torch.nn.MultiheadAttention has $4d_{\mathrm{model}}^2$ "
                   r"($+ 4d_{\mathrm{model}}$ with bias) parameters")
    torch_random = "torch.nn.MultiheadAttention agrees"
    if torch is None:
        reason = "torch is not installed"
        chk.skip(torch_claim, reason, case={"Example": "I"})
        chk.skip(torch_random, reason)
    else:
        for bias in (True, False):
            got = sum(p.numel() for p in torch.nn.MultiheadAttention(512, 8, bias=bias)
                      .parameters())
            chk.agree(torch_claim, got, 4 * 512**2 + (4 * 512 if bias else 0),
                      case={"Example": "I", "Bias": "yes" if bias else "no"})
    for _ in range(4):
        heads = rng.randint(1, 6)
        kv = rng.choice([x for x in range(1, heads + 1) if heads % x == 0])
        width = rng.randint(1, 6)
        d_model = heads * width
        kd, vd = rng.randint(1, 20), rng.randint(1, 20)
        bias = rng.random() < 0.5
        built = _count_by_construction(d_model, heads, kv, width, width, kd, vd, bias)
        weights = heads * (d_model * width) + kd * kv * width + vd * kv * width \
            + heads * width * d_model
        biases = (heads * width + 2 * kv * width + d_model) if bias else 0
        cs = {r"d_{\mathrm{model}}": d_model, "h": heads, "g": kv, r"\mathrm{kdim}": kd,
              r"\mathrm{vdim}": vd, "Bias": "yes" if bias else "no"}
        chk.agree(r"entries counted one by one $=$ the formula", built, weights + biases,
                  case=cs)
        lib = parameter_count(d_model=d_model, heads=heads, kv_heads=kv, kdim=kd, vdim=vd,
                              bias=bias).total
        chk.agree("mha_symbolic.exact.params agrees", int(lib), built, case=cs)
        if torch is not None and kv == heads:
            mha = torch.nn.MultiheadAttention(d_model, heads, bias=bias, kdim=kd, vdim=vd)
            got = sum(p.numel() for p in mha.parameters())
            chk.agree(torch_random, got, built, case=cs)
    sym = sp.sympify(parameter_count(d_model="d_model", heads="h", kv_heads="g",
                                     bias=False).total)
    names = {str(x): x for x in (dm, h, g)}
    sym = sym.xreplace({x: names.get(str(x), x) for x in sym.free_symbols})
    chk.holds("mha_symbolic.exact.params, symbolic GQA: "
              r"$2d_{\mathrm{model}}^2(1 + g/h)$",
              sp.simplify(sym - (2 * dm**2 + 2 * dm**2 * g / h)) == 0, str(sym))
    return chk


THEOREM = Theorem(
    name="params",
    title=r"Parameter count: $4d_{\mathrm{model}}^2$, and the GQA/MQA forms",
    statement_latex=r"A multi-head attention block has $h\,d_{\mathrm{model}}d_k + "
    r"h\,\mathrm{kdim}\,d_k + h\,\mathrm{vdim}\,d_v + h\,d_v\,d_{\mathrm{model}}$ weights and "
    r"$2hd_k + hd_v + d_{\mathrm{model}}$ biases; for self-attention with $d_k = d_v = "
    r"d_{\mathrm{model}}/h$ this is $4d_{\mathrm{model}}^2 + 4d_{\mathrm{model}}$, as in "
    r"\texttt{torch.nn.MultiheadAttention}; with $g$ key/value heads the weights are "
    r"$2d_{\mathrm{model}}^2(1 + g/h)$.",
    prove=prove,
    cross_check=cross_check,
    number=12,
)
