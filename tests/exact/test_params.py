"""Parameter and FLOP counts against torch.nn.MultiheadAttention and hand formulas."""

from __future__ import annotations

import itertools

import pytest
import sympy as sp

from mha_symbolic.errors import SpecError
from mha_symbolic.exact.params import flop_count, parameter_count
from mha_symbolic.exact.spec import AttentionSpec


def _sym(name: str) -> sp.Symbol:
    return sp.Symbol(name, integer=True, positive=True)


# (embed_dim, num_heads, kdim, vdim)
_SIZES = [(8, 1, None, None), (8, 2, None, None), (12, 3, 5, 7), (16, 4, 16, 3),
          (6, 6, None, 11), (512, 8, None, None)]
_GRID = [(*s, bias, bkv) for s, bias, bkv in itertools.product(_SIZES, [True, False],
                                                                 [False, True])]


@pytest.mark.parametrize(("embed_dim", "num_heads", "kdim", "vdim", "bias", "add_bias_kv"), _GRID)
def test_parameter_count_matches_torch_multihead_attention(
        embed_dim: int, num_heads: int, kdim: int | None, vdim: int | None, bias: bool,
        add_bias_kv: bool) -> None:
    torch = pytest.importorskip("torch")
    module = torch.nn.MultiheadAttention(embed_dim, num_heads, bias=bias,
                                         add_bias_kv=add_bias_kv, kdim=kdim, vdim=vdim)
    expected = sum(p.numel() for p in module.parameters())
    count = parameter_count(d_model=embed_dim, heads=num_heads, kdim=kdim, vdim=vdim,
                            bias=bias, add_bias_kv=add_bias_kv)
    assert count.total == expected


@pytest.mark.parametrize(("embed_dim", "num_heads", "kdim", "vdim", "bias", "add_bias_kv"), _GRID)
def test_parameter_count_matches_the_hand_formula(
        embed_dim: int, num_heads: int, kdim: int | None, vdim: int | None, bias: bool,
        add_bias_kv: bool) -> None:
    # REFERENCES §2: E² + E·kdim + E·vdim (+3E bias) + E² (+E bias); add_bias_kv adds 2E
    e, k, v = embed_dim, kdim or embed_dim, vdim or embed_dim
    expected = e * e + e * k + e * v + e * e + (4 * e if bias else 0) + (2 * e if add_bias_kv else 0)
    count = parameter_count(d_model=e, heads=num_heads, kdim=kdim, vdim=vdim, bias=bias,
                            add_bias_kv=add_bias_kv)
    assert count.total == expected
    assert count.weights + count.biases == count.total


@pytest.mark.parametrize("d", [1, 2, 64, 512, 4096])
def test_four_d_squared(d: int) -> None:
    assert parameter_count(d_model=d, heads=1, bias=False).total == 4 * d * d
    assert parameter_count(d_model=d, heads=1, bias=True).total == 4 * d * d + 4 * d


def test_512_8_without_bias_is_1048576() -> None:
    assert parameter_count(d_model=512, heads=8, bias=False).total == 1_048_576 == 4 * 512**2


def test_symbolic_general_form_and_its_reduction() -> None:
    d, h, dk, dv = _sym("d_model"), _sym("h"), _sym("d_k"), _sym("d_v")
    total = parameter_count(d_model="d_model", heads="h", d_k="d_k", d_v="d_v", bias=False).total
    general = h * d * (2 * dk + dv) + h * dv * d
    assert sp.expand(total - general) == 0
    reduced = total.subs({dk: d / h, dv: d / h})
    assert sp.simplify(reduced - 4 * d**2) == 0


def test_symbolic_default_per_head_widths_give_4_d_squared() -> None:
    d = _sym("d")
    assert sp.simplify(parameter_count(d_model="d", heads="h", bias=False).total - 4 * d**2) == 0
    with_bias = parameter_count(d_model="d", heads="h", bias=True).total
    assert sp.simplify(with_bias - (4 * d**2 + 4 * d)) == 0


def test_gqa_and_mqa_symbolic_forms() -> None:
    d, h, g = _sym("d"), _sym("h"), _sym("g")
    gqa = parameter_count(d_model="d", heads="h", kv_heads="g", bias=False).total
    # W^Q and W^O are d×d; W^K and W^V are d × g·(d/h)
    assert sp.simplify(gqa - (2 * d**2 + 2 * d**2 * g / h)) == 0
    mqa = parameter_count(d_model="d", heads="h", kv_heads=1, bias=False).total
    assert sp.simplify(mqa - (2 * d**2 + 2 * d**2 / h)) == 0


@pytest.mark.parametrize(("d", "h", "g", "expected"), [
    (8192, 64, 8, 2 * 8192**2 + 2 * 8192 * 1024),  # a 70B-class GQA layer: k,v are 8192×1024
    (4096, 32, 8, 2 * 4096**2 + 2 * 4096 * 1024),
    (4096, 32, 1, 2 * 4096**2 + 2 * 4096 * 128),   # MQA: one 128-wide kv head
    (4096, 32, 32, 4 * 4096**2),
])
def test_gqa_numeric(d: int, h: int, g: int, expected: int) -> None:
    assert parameter_count(d_model=d, heads=h, kv_heads=g, bias=False).total == expected


def test_gqa_bias_counts() -> None:
    # biases: q h·d_k, k and v g·d_k, out d_model: 64 + 16 + 16 + 64
    assert parameter_count(d_model=64, heads=8, kv_heads=2, bias=True).biases == 160


def test_flop_count_by_hand() -> None:
    # n_q = n_k = 2, d_model = 2, h = 1, no bias, d_k = d_v = 2:
    # Q, K, V projections 2·2·2·2 = 16 each; scores 2·2·2·2 = 16; scaling 4;
    # softmax 2·(3·2 - 1) = 10; A·V 16; output projection 16: total 110
    f = flop_count(n_q=2, d_model=2, heads=1, bias=False)
    assert dict(f.parts) == {"Q projection": 16, "K projection": 16, "V projection": 16,
                             "scores Q K^T": 16, "scaling": 4, "softmax": 10,
                             "weighted sum A V": 16, "output projection": 16}
    assert f.total == 110


def test_flop_count_scores_term_is_quadratic_in_length() -> None:
    n, d = _sym("n"), _sym("d")
    f = dict(flop_count(n_q="n", d_model="d", heads="h", bias=False).parts)
    # 2·h·n·n·(d/h) = 2·n²·d
    assert sp.simplify(f["scores Q K^T"] - 2 * n**2 * d) == 0


def test_renderings() -> None:
    c = parameter_count(d_model=512, heads=8, bias=False)
    assert "1048576" in c.text() and "4·512²" in c.text()
    assert c.as_dict()["total"] == 1048576  # a JSON number (issue 14)
    assert c.latex().endswith("1048576")


def test_bad_sizes_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="d_model=10 is not divisible by heads=4"):
        parameter_count(d_model=10, heads=4)
    with pytest.raises(SpecError):
        parameter_count(d_model=8, heads=4, kv_heads=3)


def test_count_from_a_spec() -> None:
    spec = AttentionSpec(d_model=8, heads=2, bias=False)
    assert parameter_count(spec).total == 256
