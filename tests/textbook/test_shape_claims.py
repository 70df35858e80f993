"""Shape claims read in the layout the text uses (issue 25): heads-first without a batch
axis, 1-D shapes, bias shapes, permuted views, and `ambiguous` when readings disagree.

The expected sizes are worked out by hand in each test (d_k = d_model / heads)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mha_symbolic.textbook import check_examples

#: Raschka-style sizes: 6 tokens, d_model 72, 3 heads, so d_k = 24.
HEADER = """
[[example]]
name = "e"
n_q = 6
d_model = 72
heads = 3
"""


def one(claim: str, header: str = HEADER):
    report = check_examples(header + "[[example.claim]]\n" + claim)
    assert len(report.records) == 1
    return report.records[0], report


def test_heads_first_shape_without_batch_is_ambiguous_not_wrong() -> None:
    # the case: heads × tokens × d_k = 3 × 6 × 24 printed without a batch axis
    r, report = one('quantity = "shape.k"\nclaimed = "torch.Size([3, 6, 24])"\n',
                    HEADER + "batch = 1\n")
    assert r.verdict == "ambiguous" and not r.ok
    assert "heads × rows × columns = 3 × 6 × 24 (holds)" in (r.detail or "")
    assert "batch × rows × columns = 1 × 6 × 24 (wrong)" in (r.detail or "")
    assert report.exit_status == 4            # ambiguous never exits 1
    assert report.summary()["wrong"] == 0


def test_axes_decide_the_reading() -> None:
    r, _ = one('quantity = "shape.k"\nclaimed = "torch.Size([3, 6, 24])"\n'
               'axes = "heads × rows × columns"\n')
    assert r.verdict == "exact" and r.exact == "3 × 6 × 24"
    r, _ = one('quantity = "shape.k"\nclaimed = "torch.Size([1, 6, 24])"\n'
               'axes = ["heads", "rows", "columns"]\n')
    assert r.verdict == "wrong"


def test_per_head_transposed_keys() -> None:
    # keys.transpose(1, 2) per head: heads × d_k × tokens = 3 × 24 × 6
    r, _ = one('quantity = "shape.k"\nclaimed = "torch.Size([3, 24, 6])"\n'
               'axes = "heads columns rows"\n')
    assert r.verdict == "exact"
    r, _ = one('quantity = "shape.k"\nclaimed = "torch.Size([3, 24, 6])"\n')
    assert r.verdict == "wrong" and "transposed" in (r.diagnosis or "")
    # (the batch is a free symbol here: only the heads reading swapped gives 3 × 24 × 6)
    assert 'axes = "heads × columns × rows"' in (r.diagnosis or "")


def test_view_before_transpose_is_a_second_four_axis_reading() -> None:
    # .view(b, n, h, d_k): 1 × 6 × 3 × 24; after .transpose(1, 2): 1 × 3 × 6 × 24
    r, _ = one('quantity = "shape.q"\nclaimed = "torch.Size([1, 6, 3, 24])"\n', HEADER + "batch = 1\n")
    assert r.verdict == "ambiguous"
    r, _ = one('quantity = "shape.q"\nclaimed = "torch.Size([1, 6, 3, 24])"\n'
               'axes = "batch rows heads columns"\n', HEADER + "batch = 1\n")
    assert r.verdict == "exact"
    r, _ = one('quantity = "shape.q"\nclaimed = "torch.Size([1, 3, 6, 24])"\n', HEADER + "batch = 1\n")
    # batch × heads × rows × columns holds; batch × rows × heads × columns (1 × 6 × 3 × 24)
    # does not: the readings disagree
    assert r.verdict == "ambiguous"


@pytest.mark.parametrize(("quantity", "claimed", "verdict"), [
    ("shape.b_q", "torch.Size([72])", "exact"),     # nn.Linear(72, 72) bias: 72
    ("shape.b_o", "torch.Size([72])", "exact"),
    ("shape.b_qkv", "torch.Size([216])", "exact"),  # 3 · 72
    ("shape.b_q", "torch.Size([24])", "wrong"),     # one head's width, not the Linear's
    ("shape.q[2]", "torch.Size([24])", "exact"),    # one token's query in one head: d_k
    ("shape.x[1]", "(72,)", "exact"),               # one token's embedding
    ("shape.scores[2]", "[6]", "exact"),            # one query's scores over 6 keys
    ("shape.scores[2]", "[7]", "wrong"),
])
def test_one_dimensional_shapes(quantity: str, claimed: str, verdict: str) -> None:
    r, _ = one(f'quantity = "{quantity}"\nclaimed = "{claimed}"\n')
    assert r.verdict == verdict, r


def test_one_size_for_a_matrix_is_unreadable_with_a_hint() -> None:
    r, report = one('quantity = "shape.q"\nclaimed = "torch.Size([24])"\n')
    assert r.verdict == "unreadable" and "shape.NAME[i]" in (r.error or "")
    assert report.exit_status == 2


def test_single_head_three_sizes_is_batch_first() -> None:
    header = "[[example]]\nname = \"e\"\nn_q = 4\nd_model = 8\nheads = 1\nbatch = 2\n"
    r, _ = one('quantity = "shape.head"\nclaimed = "(2, 4, 8)"\n', header)
    assert r.verdict == "exact"


def test_agreeing_readings_say_so() -> None:
    header = HEADER + "batch = 3\n"   # batch 3 and 3 heads: both readings give 3 × 6 × 24
    r, _ = one('quantity = "shape.k"\nclaimed = "torch.Size([3, 6, 24])"\n', header)
    assert r.verdict == "exact" and "every reading agrees" in (r.detail or "")


@pytest.mark.parametrize("axes", ['"heads × rows"', '"rows columns rows"', '"tokens rows"', "3"])
def test_bad_axes_are_unreadable(axes: str) -> None:
    r, _ = one(f'quantity = "shape.k"\nclaimed = "torch.Size([3, 6, 24])"\naxes = {axes}\n')
    assert r.verdict == "unreadable" and "axes" in (r.error or "")


def test_cli_exit_status_for_ambiguous(tmp_path) -> None:
    f = tmp_path / "a.toml"
    f.write_text(HEADER + 'batch = 1\n[[example.claim]]\nquantity = "shape.k"\n'
                 'claimed = "torch.Size([3, 6, 24])"\n', encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "mha_symbolic", "check", str(f)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 4, out.stderr
    assert "ambiguous" in out.stdout and "Traceback" not in out.stderr
