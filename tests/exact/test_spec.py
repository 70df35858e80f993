"""AttentionSpec: defaults, conventions, and one clear SpecError per bad specification."""

from __future__ import annotations

import pytest
import sympy as sp

from mha_symbolic.errors import MhaSymbolicError, SpecError
from mha_symbolic.exact.spec import AttentionSpec, dim


def test_defaults_follow_the_stated_conventions() -> None:
    s = AttentionSpec(n_q=3, d_model=512, heads=8)
    assert (s.n_k, s.kv_heads, s.d_k, s.d_v, s.kdim, s.vdim) == (3, 8, 64, 64, 512, 512)
    assert s.kind == "MHA" and not s.is_cross
    assert s.scale is None and s.masked_rows == "zero" and s.causal_alignment == "top_left"
    assert sp.simplify(s.resolved_scale() - sp.Rational(1, 8)) == 0  # 1/sqrt(64)


def test_cross_attention_is_recognised() -> None:
    assert AttentionSpec(n_q=3, n_k=5, d_model=512, heads=8).is_cross
    assert AttentionSpec(n_q=3, d_model=8, kdim=4).is_cross
    assert AttentionSpec(n_q=3, d_model=8, vdim=4).is_cross


@pytest.mark.parametrize(("heads", "kv", "kind", "mapping"), [
    (8, 8, "MHA", list(range(8))),
    (8, 2, "GQA", [0, 0, 0, 0, 1, 1, 1, 1]),  # repeat_interleave, not tile [0,1,0,1,...]
    (8, 4, "GQA", [0, 0, 1, 1, 2, 2, 3, 3]),
    (8, 1, "MQA", [0] * 8),
])
def test_kind_and_kv_head_mapping(heads: int, kv: int, kind: str, mapping: list[int]) -> None:
    s = AttentionSpec(d_model=64, heads=heads, kv_heads=kv)
    assert s.kind == kind
    assert s.group_size == heads // kv
    assert [s.kv_head_of(g) for g in range(heads)] == mapping


def test_scale_zero_is_zero_not_default() -> None:
    assert AttentionSpec(d_model=4, heads=1, scale=0).resolved_scale() == 0
    assert AttentionSpec(d_model=4, heads=1, scale=1).resolved_scale() == 1


def test_causal_alignments() -> None:
    tl = AttentionSpec(n_q=2, n_k=3, d_model=2, mask="causal")
    br = AttentionSpec(n_q=2, n_k=3, d_model=2, mask="causal", causal_alignment="bottom_right")
    keep = lambda s: [[s.takes_part(i, j) for j in range(3)] for i in range(2)]  # noqa: E731
    assert keep(tl) == [[True, False, False], [True, True, False]]
    assert keep(br) == [[True, True, False], [True, True, True]]


def test_boolean_and_additive_masks() -> None:
    b = AttentionSpec(n_q=1, n_k=2, d_model=2, mask=[[True, False]])
    assert b.takes_part(0, 0) and not b.takes_part(0, 1)
    assert b.additive_mask is None
    a = AttentionSpec(n_q=1, n_k=2, d_model=2, mask=[[0, -1]])
    assert a.additive_mask == [[0, -1]]


def test_symbolic_sizes() -> None:
    s = AttentionSpec(d_model="d", heads="h", kv_heads="g")
    d, h, g = (sp.Symbol(n, integer=True, positive=True) for n in "dhg")
    assert s.d_k == d / h and s.group_size == h / g
    assert dim("n", "n_q") == sp.Symbol("n", integer=True, positive=True)
    assert dim("12", "n_q") == 12


@pytest.mark.parametrize(("kwargs", "pattern"), [
    (dict(d_model=10, heads=4), r"d_model=10 is not divisible by heads=4"),
    (dict(d_model=12, heads=4, kv_heads=3), r"heads=4 is not a multiple of kv_heads=3"),
    (dict(d_model=12, heads=2, kv_heads=4), r"kv_heads=4 is larger than heads=2"),
    (dict(d_model=12, heads=0), r"heads=0 must be a positive integer"),
    (dict(d_model=12, heads=-2), r"heads=-2"),
    (dict(d_model=12, heads="-1"), r"heads='-1'"),
    (dict(d_model=12, heads=2.0), r"heads=2.0"),
    (dict(d_model=12, heads=True), r"heads=True"),
    (dict(d_model="x y"), r"d_model='x y'"),
    (dict(d_model=10**10), r"d_model=10000000000 is larger than the limit"),
    (dict(d_model=12, masked_rows="zeros"), r"masked_rows='zeros' must be one of"),
    (dict(d_model=12, causal_alignment="bottom"), r"causal_alignment='bottom'"),
    (dict(d_model=12, mask="causl"), r"mask='causl'"),
    (dict(n_q=2, n_k=2, d_model=2, mask=[[True, True]]), r"mask has 1 rows but n_q=2"),
    (dict(n_q=1, n_k=2, d_model=2, mask=[[True]]), r"mask row 0 has 1 entries but n_k=2"),
    (dict(n_q=1, n_k=1, d_model=2, mask=5), r"mask"),
])
def test_bad_specification_gives_one_clear_line(kwargs: dict, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern) as info:
        AttentionSpec(**kwargs)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_default_scale_needs_d_k() -> None:
    with pytest.raises(SpecError, match="d_k"):
        AttentionSpec(n_q=2).resolved_scale()


@pytest.mark.parametrize("text", ["2" * 5000, "\u00b2"])
def test_unreadable_size_string_is_a_spec_error(text: str) -> None:
    with pytest.raises(MhaSymbolicError):
        AttentionSpec(d_model=6, heads=text)


def test_numpy_mask_is_accepted() -> None:
    np = pytest.importorskip("numpy")
    s = AttentionSpec(n_q=2, n_k=2, d_model=2, mask=np.array([[True, False], [True, True]]))
    # numpy's bool_ is not a Python bool: the False entry must still remove the key
    assert s.takes_part(1, 1) and not s.takes_part(0, 1)
    assert s.additive_mask is None
