"""Notebook displays (mha_symbolic/_display.py and the _repr_*_ methods of
CertifiedValue, ParameterCount and the checks' results): the value and its certified
digits instead of a dataclass dump, tables, and every piece of text escaped.

Expected strings are written by hand; the certified digits of 1 − e^−32 were checked
against mpmath at 60 digits (0.999999999999987335834450905824…)."""

from __future__ import annotations

import dataclasses
import html.parser

import numpy as np
import pytest

from mha_symbolic import (
    certify,
    check_attention,
    compare_attention,
    compare_attention_backward,
    parameter_count,
)
from mha_symbolic._display import html_table, markdown_table, thin_grouped

Q = K = V = np.eye(2, dtype=np.float32)[None]
ZEROS = np.zeros((1, 2, 2), np.float32)


class _Tags(html.parser.HTMLParser):
    """The start tags of an HTML fragment."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)


def _tags(fragment: str) -> set[str]:
    p = _Tags()
    p.feed(fragment)
    return set(p.tags)


# ---------------------------------------------------------------------------------
# CertifiedValue


def test_certified_value_repr_shows_the_value_and_its_certified_digits() -> None:
    v = certify("1 - e^(-32)")
    assert repr(v) == "CertifiedValue(1 - exp(-32) = 0.99999999999998733583…)"
    assert "exact=None" not in repr(v)


@pytest.mark.parametrize(("text", "want"), [
    ("3/4", "CertifiedValue(3/4 = 0.75)"),
    ("1/3", "CertifiedValue(1/3 = 0.33333333333333333333…)"),
    ("20", "CertifiedValue(20)"),
    ("2^100", "CertifiedValue(1267650600228229401496703205376)"),
    # mpmath at 30 digits printed -9.85967654375977085670537294785e-305,
    # 2.68811714181613544841262555158e+43 and 0.0000453999297624848515355915155605: the
    # first 20 digits, cut (not rounded)
    ("-e^(-700)", "CertifiedValue(-exp(-700) = -9.8596765437597708567…e-305)"),
    ("e^100", "CertifiedValue(exp(100) = 2.6881171418161354484…e+43)"),
    ("e^(-10)", "CertifiedValue(exp(-10) = 4.5399929762484851535…e-05)"),
    ("1/100000", "CertifiedValue(1/100000 = 1e-05)"),
    ("1/1024", "CertifiedValue(1/1024 = 0.0009765625)"),
])
def test_certified_value_repr_of_exact_tiny_and_huge_values(text: str, want: str) -> None:
    assert repr(certify(text)) == want


def test_certified_value_latex_of_a_tiny_value_is_scientific() -> None:
    assert certify("e^(-10)")._repr_latex_() == (
        r"$e^{-10} = 4.539\,992\,976\,248\,485\,153\,5\ldots \times 10^{-5}$")
    assert "10<sup>−305</sup>" in certify("-e^(-700)")._repr_html_()


def test_certified_value_latex_groups_digits_and_uses_ldots() -> None:
    assert certify("1 - e^(-32)")._repr_latex_() == (
        r"$1 - e^{-32} = 0.999\,999\,999\,999\,987\,335\,83\ldots$")


def test_certified_value_html_and_markdown() -> None:
    v = certify("1 - e^(-32)")
    h = v._repr_html_()
    assert "0.999\u202f999\u202f999\u202f999\u202f987\u202f335\u202f83…" in h
    assert "<code>1 - exp(-32)</code>" in h and "every digit shown is certified" in h
    assert _tags(h) <= {"span", "code", "small"}
    assert v._repr_markdown_() == (r"$1 - e^{-32} = 0.999\,999\,999\,999\,987\,335\,83\ldots$"
                                   " (every digit shown is certified)")


# ---------------------------------------------------------------------------------
# ParameterCount


def test_parameter_count_repr_is_a_table() -> None:
    got = repr(parameter_count(d_model=2, heads=1, bias=False))
    assert got == ("ParameterCount (MHA):\n"
                   "W^Q    2 × 2   4\n"
                   "W^K    2 × 2   4\n"
                   "W^V    2 × 2   4\n"
                   "W^O    2 × 2   4\n"
                   "total         16")


def test_parameter_count_html_groups_digits_and_sets_superscripts() -> None:
    h = parameter_count(d_model=1024, heads=8)._repr_html_()
    # 1024² = 1 048 576 per projection; 4·1024² + 4·1024 = 4 198 400 in all
    assert '<td style="text-align:right">1\u202f048\u202f576</td>' in h
    assert '<td style="text-align:right">4\u202f198\u202f400</td>' in h
    assert "<td>W<sup>Q</sup></td>" in h
    assert _tags(h) <= {"table", "caption", "thead", "tbody", "tr", "th", "td", "sup", "sub"}


def test_parameter_count_symbolic_counts_read_as_mathematics() -> None:
    p = parameter_count(d_model="d_model", heads="h")
    h = p._repr_html_()
    assert "4·d<sub>model</sub>² + 4·d<sub>model</sub>" in h and "**" not in h
    md = p._repr_markdown_()
    assert md.splitlines()[:3] == ["| part | shape | count |", "| --- | --- | --- |",
                                   r"| W^Q | d\_model × d\_model | d\_model² |"]
    assert md.splitlines()[-1] == r"| total |  | 4·d\_model² + 4·d\_model |"


def test_parameter_count_names_are_validated_before_any_display() -> None:
    # sizes are symbol names of ASCII letters, digits and _: nothing that HTML reads
    from mha_symbolic import SpecError

    with pytest.raises(SpecError, match="is neither a positive integer nor a symbol name"):
        parameter_count(d_model="<script>", heads=1)


# ---------------------------------------------------------------------------------
# The checks' results


def test_attention_comparison_repr_is_its_summary_not_a_dump() -> None:
    comp = compare_attention(ZEROS, Q, K, V)
    assert repr(comp) == f"<AttentionComparison: {comp.summary()}>"
    assert "mismatched=array" not in repr(comp) and "n_nonfinite=" not in repr(comp)
    assert str(comp) == comp.report()


def test_attention_comparison_html_is_a_table_with_the_report_folded() -> None:
    comp = compare_attention(ZEROS, Q, K, V)
    h = comp._repr_html_()
    assert _tags(h) <= {"div", "p", "strong", "table", "thead", "tbody", "tr", "th", "td",
                        "details", "summary", "pre"}
    assert "<td>mismatched elements</td><td>4 / 4 (100.0%)</td>" in h
    assert "<td>verdict</td><td>FAILED</td>" in h


def test_displays_escape_every_text() -> None:
    comp = dataclasses.replace(compare_attention(ZEROS, Q, K, V),
                               title="<script>alert(1)</script> [x](javascript:1) |",
                               notes=("<img src=x onerror=alert(1)>\x1b[31m",))
    h = comp._repr_html_()
    assert "<script" not in h and "<img" not in h and "\x1b" not in h
    assert _tags(h) <= {"div", "p", "strong", "table", "thead", "tbody", "tr", "th", "td",
                        "details", "summary", "pre"}
    md = comp._repr_markdown_()
    assert "<script>" not in md and "[x](" not in md and "\x1b" not in md
    assert "\x1b" not in repr(comp)


def test_backward_comparison_shows_one_row_per_gradient() -> None:
    do = np.array([[[1.0, 2.0], [3.0, 4.0]]], np.float32)
    comp = compare_attention_backward(ZEROS, ZEROS, ZEROS, Q, K, V, do)
    assert repr(comp).startswith("<BackwardComparison: attention gradients are not close")
    header, rows = comp.table()
    assert header == ("gradient", "verdict", "mismatched", "worst error / tolerance")
    assert [r[0] for r in rows[:3]] == ["grad_query (dq)", "grad_key (dk)", "grad_value (dv)"]
    assert "<th>gradient</th>" in comp._repr_html_()


def test_attention_check_repr_and_table() -> None:
    res = check_attention(lambda q, k, v: 0 * q, Q, K, V, raise_on_failure=False)
    assert repr(res).startswith("<AttentionCheck: attention kernel FAILED (numpy): ")
    assert res.table()[1][0][0] == "output"


# ---------------------------------------------------------------------------------
# The helpers


@pytest.mark.parametrize(("n", "want"), [(0, "0"), (1024, "1024"), (10240, "10\u202f240"),
                                         (1048576, "1\u202f048\u202f576"),
                                         (-4198400, "-4\u202f198\u202f400")])
def test_thin_grouped_follows_si_style(n: int, want: str) -> None:
    assert thin_grouped(n) == want


def test_tables_escape_cells() -> None:
    assert html_table(("a",), [("<b>&",)]) == (
        "<table><thead><tr><th>a</th></tr></thead><tbody><tr><td>&lt;b&gt;&amp;</td></tr>"
        "</tbody></table>")
    assert markdown_table(("a",), [("x|y",)]).splitlines()[-1] == r"| x\|y |"


@pytest.mark.parametrize("module", ["mha_symbolic._display", "mha_symbolic.exact.certified_display"])
def test_doctests(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0


def test_an_undecided_value_shows_its_arb_ball_not_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    from mha_symbolic import PrecisionError
    from mha_symbolic.exact.certified import CertifiedValue

    def undecided(self, significant: int = 20, *, max_bits: int | None = None) -> str:
        raise PrecisionError("undecided")

    monkeypatch.setattr(CertifiedValue, "digits", undecided)
    v = certify("1 - e^(-32)")
    text = repr(v)
    assert text.startswith("CertifiedValue(1 - exp(-32) ∈ [0.99999999999998733583")
    assert "+/-" in text and "…" not in text
    assert r"\in \text{[0.99999999999998733583" in v._repr_latex_()
    assert "not yet decided" in v._repr_html_()
