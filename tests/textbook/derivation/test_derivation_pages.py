"""Tests of the derivation's pages as a reader sees them (issue 27, item 6): quotes
that open, a human label for every claim kind, the file's own title, headings kept
with what they introduce, displays that break only between equations, one notation
for e^t, each head's denominators named alike and summed with equal terms collected.

Expected strings are written here by hand; the sums are checked against the terms
added by hand (SymPy equality of the values, not of the printing).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mha_symbolic._latex import smart_quotes
from mha_symbolic.exact.engine import exact_attention
from mha_symbolic.textbook.check import load_examples
from mha_symbolic.textbook.derivation import derive
from mha_symbolic.textbook.derivation.labels import quantity_label, verdict_text
from mha_symbolic.textbook.derivation.markup import _markup_tex, _note_tex
from mha_symbolic.textbook.derivation.render_latex import _joined_rows
from mha_symbolic.textbook.quantities import _DIM_NAMES, _PARAM_NAMES, _SHAPE_NAMES, MATRIX_QUANTITIES

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "examples" / "seed.toml"


@pytest.fixture(scope="module")
def seed_tex() -> str:
    return derive(load_examples(SEED), title="Seed").document()


# -- quotes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "tex"), [
    ("the 'it' row", "the `it' row"),
    ("'Scale by d_k = 2'", "`Scale by $d_{k} = 2$'"),
    ('he said "cat" twice', "he said ``cat'' twice"),
    ("don't (or 'do')", "don't (or `do')"),
])
def test_quotes_in_the_authors_text_open_and_close(text: str, tex: str) -> None:
    assert _note_tex(text) == tex


def test_a_quote_after_library_math_closes() -> None:
    # the softmax step's "the raw 'how much should $r$ listen to $j$' number"
    assert _markup_tex("raw 'how much $r$ to $j$' number") == "raw `how much $r$ to $j$' number"


def test_the_seed_document_prints_no_closing_quote_where_one_opens(seed_tex: str) -> None:
    # a ' after a space or an opening bracket is an opening quote set the wrong way
    assert not re.search(r"(?<=[\s(])'(?=\w)", seed_tex)
    assert "the `it' row" in seed_tex


def test_smart_quotes_keeps_apostrophes() -> None:
    assert smart_quotes("the heads' outputs, don't") == "the heads’ outputs, don’t"


# -- labels -----------------------------------------------------------------------------------


def _every_quantity() -> list[str]:
    out = [f"{m}[1,2]" for m in MATRIX_QUANTITIES] + [f"{m}[1]" for m in MATRIX_QUANTITIES]
    out += [*MATRIX_QUANTITIES, "weight_sum[1]", "gap[1]", "scale", "expr"]
    out += [f"shape.{n}" for n in _SHAPE_NAMES] + [f"dim.{n}" for n in _DIM_NAMES]
    return out + [f"params.{n}" for n in _PARAM_NAMES]


@pytest.mark.parametrize("quantity", _every_quantity())
def test_every_claim_kind_has_a_human_label(quantity: str) -> None:
    label = quantity_label(quantity)
    assert label, quantity
    words = re.sub(r"\$[^$]*\$", "", label)
    # no internal name: no underscore, no dotted name, no bracketed index outside math
    assert "_" not in words and "." not in words and "[" not in words, label


@pytest.mark.parametrize(("quantity", "label"), [
    ("scaled_score[1,1]", "scaled score $t_{11}$"),
    ("dim.concat_width", r"width of the concatenation, $h \cdot d_v$"),
    ("params.w_q_head", "parameters of one head's $W^{Q}_i$"),
    ("weight[1,12]", "weight $w_{1,12}$"),
    ("head_output[2]", "head outputs of row 2"),
    ("shape.q", "shape of $Q_i$"),
])
def test_labels_read_as_a_textbook_writes_them(quantity: str, label: str) -> None:
    assert quantity_label(quantity) == label


def test_an_unreadable_quantity_has_no_label() -> None:
    assert quantity_label("weight[0,1]") is None
    assert quantity_label("no such $thing$") is None


@pytest.mark.parametrize(("args", "text"), [
    (("approximation", "approximation formula", "relative error 3.5e-5"),
     "a valid approximation formula: relative error 3.5e-5"),
    (("correctly rounded", "4 decimal places", None), "correctly rounded to 4 decimal places"),
    (("correctly rounded", "units", None), "correctly rounded to a whole number"),
    (("wrong", "exact claim", None), "wrong (claimed as exact)"),
    (("exact", "shape", None), "exact"),
])
def test_verdicts_read_as_phrases(args: tuple[str, str, str | None], text: str) -> None:
    assert verdict_text(*args) == text


def test_the_seed_document_carries_no_internal_label(seed_tex: str) -> None:
    for internal in ("scaled score[1,1]", "dim.concat", "params.w", "shape.q",
                     "approximation (approximation formula)", r"\textbf{weight[1,1]}"):
        assert internal not in seed_tex, internal
    assert r"\textbf{Scaled score $t_{11}$}" in seed_tex
    assert "a valid approximation formula: relative error $3.5 \\times 10^{-5}$" in seed_tex


# -- title and contents -----------------------------------------------------------------------


def test_the_command_titles_the_document_with_the_files_title(tmp_path: Path) -> None:
    from mha_symbolic.cli import main

    out = tmp_path / "seed.tex"
    assert main(["derive", str(SEED), "-o", str(out)]) == 0
    tex = out.read_text()
    assert r"\title{Multi-head attention: worked examples (seed page)}" in tex
    assert "Derivations: seed.toml" not in tex
    # \addcontentsline has its table of contents
    assert r"\tableofcontents" in tex and r"\addcontentsline{toc}" in tex


def test_a_file_without_a_title_is_titled_by_its_name(tmp_path: Path) -> None:
    from mha_symbolic.cli import main

    src = tmp_path / "book.toml"
    src.write_text('[[example]]\nname = "A"\nscores = [[1, 2]]\nscale = 1\n')
    out = tmp_path / "book.tex"
    assert main(["derive", str(src), "-o", str(out)]) == 0
    tex = out.read_text()
    assert r"\title{Derivations: book.toml}" in tex
    # one example: no contents, so no entry for one either
    assert r"\tableofcontents" not in tex and r"\addcontentsline" not in tex


# -- page breaks ---------------------------------------------------------------------------------


def test_rows_of_one_equation_never_break_apart() -> None:
    rows = ["a &= 1", "&= 2", "b &= 3", r"&\quad + 4"]
    assert _joined_rows(rows) == "a &= 1 \\\\*\n&= 2 \\\\\nb &= 3 \\\\*\n&\\quad + 4"


def test_every_heading_of_the_document_keeps_space_for_what_follows(seed_tex: str) -> None:
    lines = seed_tex.splitlines()
    headings = [k for k, line in enumerate(lines) if line.startswith("\\subsection*")]
    assert headings
    for k in headings:
        assert re.fullmatch(r"\\needspace\{\d+\\baselineskip\}", lines[k - 1]), lines[k]
    # the table of all shapes (Example H) keeps its 13 rows with its heading
    k = next(k for k, line in enumerate(lines) if "All shapes at a glance" in line)
    assert int(re.search(r"\d+", lines[k - 1]).group(0)) >= 13 + 5


def test_the_fragment_needs_no_macro_of_the_documents_preamble() -> None:
    text = derive(exact_attention(scores=[[1, 2]], scale=1), format="fragment").text
    assert "needspace" not in text


# -- one notation; denominators named alike and collected ------------------------------------


def _causal() -> object:
    # 4 tokens, causal: row 1 keeps 1 key, row 4 keeps 4 (its denominator is named D)
    return exact_attention(scores=[[0, 0, 0, 0], [1, 1, 0, 0], [2, 0, 2, 0], [1, 1, 1, 0]],
                           scale=1, mask="causal")


def test_every_row_of_a_head_names_its_denominator_or_none_does() -> None:
    text = derive(_causal(), format="fragment").text
    for r in (1, 2, 3, 4):
        assert f"D_{{{r}}} &= " in text, r


def test_a_named_denominator_collects_equal_terms_and_writes_e0_as_1() -> None:
    text = derive(_causal(), format="fragment").text
    # row 4: e^1 + e^1 + e^1 + e^0 = 3e + 1 (by hand)
    row = next(line for line in text.splitlines() if line.startswith("D_{4} &="))
    assert row.startswith("D_{4} &= e^{1} + e^{1} + e^{1} + e^{0}")
    after = text.splitlines()[text.splitlines().index(row) + 1]
    assert re.sub(r"\s|\\\\\*?$", "", after) in ("&=1+3e", "&=3e+1")


def test_irrational_exponents_share_one_notation_in_a_derivation() -> None:
    # scores whose scaled values are sqrt(2)/2 and sqrt(2): e^{sqrt(2)/2} beside e^{sqrt(2)}
    att = exact_attention(scores=[[1, 2, 1, 2, 1]], d_k=2)
    text = derive(att, format="fragment").text
    assert r"e^{\sqrt{2}/2}" in text and r"e^{\sqrt{2}}" in text
    assert r"\exp" not in text


def test_a_named_denominator_is_not_rewritten_when_nothing_collects() -> None:
    # six different exponents (Example G): the sum is written once, then its digits
    text = derive(exact_attention(scores=[["3.0", "0.5", "0.2", "1.0", "0.3", "0.6"]], scale=1),
                  format="fragment").text
    lines = text.splitlines()
    k = next(k for k, line in enumerate(lines) if line.startswith("D_{1} &="))
    assert lines[k + 1].startswith("&\\quad +") or lines[k + 1].startswith("&= 28.845")
    assert not any(line.startswith("&= e^{") for line in lines[k:k + 3])


# -- token names -------------------------------------------------------------------------------


def _one(tokens: str) -> str:
    return f'[[example]]\nname = "A"\nscores = [[1, 2, 3]]\nscale = 1\ntokens = {tokens}\n'


def test_token_names_load_as_a_list_or_a_table() -> None:
    (ex,) = load_examples(text=_one('["a", "b", "c"]'))
    assert ex.tokens == {"key": ["a", "b", "c"]}  # one query: the list names the keys
    (ex,) = load_examples(text=_one('{ query = ["it"], key = ["cat", "", "mat"] }'))
    assert ex.tokens == {"query": ["it"], "key": ["cat", "", "mat"]}


@pytest.mark.parametrize(("tokens", "message"), [
    ('["a", "b"]', "2 names for the keys; the example has 3 keys"),
    ('{ query = ["x", "y"] }', "2 names for the queries; the example has 1 query"),
    ("[1, 2, 3]", "tokens must be an array of strings"),
    ('{ keys = ["a"] }', "tokens takes query and key"),
])
def test_token_names_that_do_not_fit_are_one_line_errors(tokens: str, message: str) -> None:
    from mha_symbolic.errors import ExampleFileError

    with pytest.raises(ExampleFileError, match=message):
        load_examples(text=_one(tokens))


def test_an_equation_taller_than_a_page_may_still_break() -> None:
    rows = ["a &= 1", *[r"&\quad + 1"] * 60]
    joined = _joined_rows(rows)
    assert joined.count("\\\\\n") == 2  # a break allowed after 24 and 48 held rows
    assert joined.count("\\\\*\n") == 58


def test_a_long_display_is_one_environment_that_breaks_only_between_equations() -> None:
    # 6 keys x 6 queries: a long softmax display (each weight its own equation)
    att = exact_attention(scores=[[r * c % 5 for c in range(6)] for r in range(4)], scale=1)
    text = derive(att, format="fragment").text
    softmax = text[text.index("Softmax, row by row"):text.index("subsection*{Checks}")]
    assert softmax.count(r"\begin{align*}") == 1
    lines = softmax.splitlines()
    held = [k for k, line in enumerate(lines) if line.startswith("&")]
    assert held  # the named denominators D_r run over a second line and their digits
    for k in held:
        assert lines[k - 1].endswith("\\\\*"), lines[k - 1]
