"""Tests of how a derivation is typeset (textbook conventions): digit grouping and
scientific notation (mha_symbolic.textbook.derivation.numbers), canonical softmax forms,
the notes grammar (derivation.notes), and the pages pdflatex makes of the seed
derivation, with and without figures.

Expected strings are written here by hand; a canonical form is checked against the
value built independently from the scores (exact SymPy equality, and mpmath at 50
digits); the pages are judged on pdflatex's log and on pdftotext's reading of the PDF.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import mpmath
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_symbolic.exact.engine import exact_attention
from mha_symbolic.textbook.derivation import derive
from mha_symbolic.textbook.derivation.notes import pieces
from mha_symbolic.textbook.derivation.numbers import (
    canonical_softmax,
    decimal_latex,
    digits_latex,
    exp_latex,
    group_digits,
    symbol_latex,
)

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "examples" / "seed.toml"
T = r"\,"  # the thin space between digit groups

# -- digit grouping and scientific notation (expected strings written by hand) -------------


@pytest.mark.parametrize(("digits", "expected"), [
    ("1048576", f"1{T}048{T}576"),
    ("262144", f"262{T}144"),
    ("32768", f"32{T}768"),
    ("1024", "1024"),  # four digits: not grouped (siunitx's group-minimum-digits = 5)
    ("12", "12"),
])
def test_integers_of_five_or_more_digits_are_grouped_in_threes(digits: str,
                                                                expected: str) -> None:
    assert group_digits(digits) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("0.6697615493…", f"0.669{T}761{T}549{T}3\\ldots"),
    ("0.7071", "0.7071"),
    ("0.70710", f"0.707{T}10"),
    ("-0.25", "-0.25"),
    ("1339.523098…", f"1339.523{T}098\\ldots"),
    # below 10^-3: scientific notation, the same digits with the point moved
    ("0.000000002061153613…", f"2.061{T}153{T}613\\ldots \\times 10^{{-9}}"),
    ("0.0000000000000126641655490940…",
     f"1.266{T}416{T}554{T}909{T}40\\ldots \\times 10^{{-14}}"),
    ("0.0001", "1 \\times 10^{-4}"),
    ("0.001", "0.001"),  # 10^-3 itself stays a decimal
    ("-0.00025", "-2.5 \\times 10^{-4}"),
    # more than seven integer digits and a fractional part: scientific notation
    ("485165195.4097902…", f"4.851{T}651{T}954{T}097{T}902\\ldots \\times 10^{{8}}"),
    ("12345678", f"12{T}345{T}678"),  # an integer stays an integer
    ("0", "0"),
])
def test_decimals_are_grouped_or_in_scientific_notation(text: str, expected: str) -> None:
    assert decimal_latex(text) == expected


def test_a_line_of_certified_digits_keeps_its_tuple_and_escapes_the_rest() -> None:
    assert digits_latex("(0.000012…, 3)") == r"(1.2\ldots \times 10^{-5},\ 3)"
    assert digits_latex("3 × 64") == r"3\times 64"
    text = digits_latex(r"1 \input{x} $")
    assert "\\input" not in text and r"\text{\textbackslash{}}" in text


def test_scientific_notation_keeps_every_certified_digit() -> None:
    # the digits of e^-20 / (2 e^-20 + 1) (Example D's w_11 = 1/(2 + e^20)) by mpmath,
    # cut after 12 significant digits: the same digits must be printed, point moved
    with mpmath.workdps(50):
        w = 1 / (2 + mpmath.e ** 20)
        digits = mpmath.nstr(w, 20, min_fixed=-30, max_fixed=30)
    text = "0." + "0" * 8 + digits.split(".")[1].lstrip("0")[:12] + "…"
    printed = decimal_latex(text)
    assert printed.endswith(r"\ldots \times 10^{-9}")
    assert printed.replace(T, "").startswith("2.06115361394")


def test_sizes_with_multi_letter_names_are_upright() -> None:
    assert symbol_latex("d_model") == r"d_{\mathrm{model}}"
    assert symbol_latex("kdim") == r"\mathrm{kdim}"
    assert symbol_latex("d_k") == "d_{k}"
    d = derive(__import__("mha_symbolic").AttentionSpec(d_model="d_model", heads="h",
                                                        kdim="kdim", bias=False),
               format="fragment")
    assert r"d_{\mathrm{model}}" in d.text and r"\mathrm{kdim}" in d.text
    assert "d_{model}" not in d.text


# -- canonical softmax forms ------------------------------------------------------------------


def _softmax(scores: list[sp.Expr], j: int) -> sp.Expr:
    """w_j built here from the scores, as the definition reads (independent of the engine)."""
    return sp.exp(scores[j]) / sp.Add(*[sp.exp(s) for s in scores])


@pytest.mark.parametrize(("scores", "j", "printed"), [
    ([-3, 1], 0, r"\frac{1}{1 + e^{4}}"),
    ([-3, 1], 1, r"\frac{e^{4}}{1 + e^{4}}"),
    ([40, 8], 1, r"\frac{1}{1 + e^{32}}"),
    ([0, 0, 20], 0, r"\frac{1}{2 + e^{20}}"),
    ([5, 1], 0, r"\frac{e^{4}}{1 + e^{4}}"),
])
def test_softmax_weights_print_in_canonical_form_equal_to_the_value(
        scores: list[int], j: int, printed: str) -> None:
    from mha_symbolic.textbook.derivation.numbers import _tex

    value = _softmax([sp.Integer(s) for s in scores], j)
    form = canonical_softmax(value)
    assert form is not None
    assert _tex(form) == printed
    assert sp.simplify(form - value) == 0  # exactly the same number
    with mpmath.workdps(50):
        by_hand = mpmath.e ** scores[j] / mpmath.fsum(mpmath.e ** s for s in scores)
        assert abs(mpmath.mpf(sp.N(form, 50)) - by_hand) < mpmath.mpf(10) ** -45


def test_the_engines_weights_and_outputs_are_derived_in_canonical_form() -> None:
    att = exact_attention(scores=[[-3, 1]], value=[[100], [200]])
    text = derive(att, format="fragment").text
    assert r"w_{11} &= \frac{e^{-3}}{e^{-3} + e^{1}} = \frac{1}{1 + e^{4}}" in text
    assert r"\frac{100 + 200 e^{4}}{1 + e^{4}}" in text
    assert r"\left(e^{-3} + e\right)" not in text
    # and the value is the engine's, exactly: 1/(1 + e^4) - w_11 = 0
    w11 = att.heads[0].weights[0, 0]
    assert sp.simplify(1 / (1 + sp.exp(4)) - w11) == 0


def test_a_softmax_of_irrational_scores_shifts_exactly() -> None:
    s = sp.sqrt(2) / 2
    value = _softmax([sp.Integer(0), s], 0)
    form = canonical_softmax(value)
    assert form is not None and sp.simplify(form - value) == 0
    assert sp.simplify(form - 1 / (1 + sp.exp(s))) == 0


def test_exponents_share_one_notation_a_fraction_slashed_in_the_superscript() -> None:
    # e^{sqrt(2)/2} beside e^{sqrt(2)}: one notation (issue 27 item 6: exp(√2/2) and
    # e^{√2} were mixed); \exp only for an exponent still tall when slashed
    assert exp_latex(sp.Integer(20)) == "e^{20}"
    assert exp_latex(sp.Rational(1, 2)) == "e^{0.5}"
    assert exp_latex(sp.Rational(1, 3)) == "e^{1/3}"
    assert exp_latex(sp.sqrt(2) / 2) == r"e^{\sqrt{2}/2}"
    assert exp_latex(sp.sqrt(2)) == r"e^{\sqrt{2}}"
    assert exp_latex(-5 * sp.sqrt(2) / 2) == r"e^{-5 \sqrt{2}/2}"
    assert exp_latex(sp.tanh(sp.sqrt(2) / 2)).startswith(r"\exp\left(\tanh")
    text = derive(exact_attention(query=[[1, 0]], key=[[1, 0], [0, 1]]), format="fragment").text
    assert r"e^{\frac" not in text and r"\exp" not in text


def test_sympys_e_is_never_printed_for_e() -> None:
    att = exact_attention(scores=[[1, 0]], value=[[1], [2]])
    d = derive(att)
    for text in (d.latex(), d.markdown()):
        assert not re.search(r"(?<![A-Za-z\\])E(?![A-Za-z])", text.split("Checks")[0])


# -- the notes grammar -------------------------------------------------------------------------


@pytest.mark.parametrize(("note", "math"), [
    ("The page gives Q1 K1^T = [[1, 0], [0, 1]] directly",
     r"Q_{1} K_{1}^{\top} = \left[\begin{smallmatrix}1 & 0 \cr 0 & 1\end{smallmatrix}\right]"),
    ("w_j = e^2 / (3 e^2) shows three", r"w_{j} = e^{2} / (3 e^{2})"),
    ("scaled by 1/sqrt(d_k).", r"1/\sqrt{d_{k}}"),
    ("an approximation to 1e-3", "10^{-3}"),
    ("an error of 2.5e-9 here", r"2.5 \times 10^{-9}"),
    ("width d_model = 512, h = 8.", r"d_{\mathrm{model}} = 512"),
    ("the text says ≈ e^(0.707)/(e^(0.707) + e^0)", r"\approx e^{0.707}/(e^{0.707} + e^{0})"),
    ("per head: kdim", r"\mathrm{kdim}"),
])
def test_notes_math_is_typeset_from_the_grammar(note: str, math: str) -> None:
    assert math in [p for is_math, p in pieces(note) if is_math]


def test_notes_words_stay_text() -> None:
    assert pieces("Only sizes: 3 query tokens, 5 key/value tokens (decoder).") == [
        (False, "Only sizes: 3 query tokens, 5 key/value tokens (decoder).")]
    assert pieces("head 1 takes coordinates 1-2") == [(False, "head 1 takes coordinates 1–2")]


#: Every command the grammar may write; nothing else may follow a backslash.
ALLOWED = {"mathrm", "sqrt", "top", "times", "cdot", "approx", "le", "ge", "left", "right",
           "begin", "end", "cr", "exp", "log", "ln", "max", "min", "tanh", "sin", "cos",
           "text"}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab dkeEQKT_^()[],=+-*/·×≈≤0123456789.\\{}$%&#~sqrtmodel",
               max_size=60))
def test_notes_math_never_carries_the_authors_tex(note: str) -> None:
    for is_math, piece in pieces(note):
        if not is_math:
            continue
        for command in re.findall(r"\\([A-Za-z]+)", piece):
            assert command in ALLOWED, (note, piece)
        assert "$" not in piece and "%" not in piece and "#" not in piece
        assert "&" not in piece or r"\begin{smallmatrix}" in piece
        depth = 0
        for ch in piece:
            depth += (ch == "{") - (ch == "}")
            assert depth >= 0, (note, piece)
        assert depth == 0, (note, piece)
        # no double script on one base (a TeX error): two subscripts or two superscripts
        # in one run of scripts, with or without the other kind between them
        for run in re.findall(r"(?:[_^]\{[^{}]*\})+", piece):
            scripts = re.findall(r"([_^])\{", run)
            assert scripts.count("_") <= 1 and scripts.count("^") <= 1, (note, piece)


def test_hostile_notes_reach_tex_only_escaped() -> None:
    from mha_symbolic.textbook import load_examples

    ex = load_examples(text=r'''
[[example]]
name = "h"
title = "d_k = \\input{/etc/passwd} ^^5c $x$"
notes = "sqrt(\\relax) e^(\\def) [[1, \\x]] Q1_k^T %comment"
scores = [[1, 2]]
''')
    tex = derive(ex).document()
    body = tex[tex.index(r"\section*"):]
    assert r"\input" not in body.replace(r"\textbackslash{}input", "")
    assert r"\relax" not in body and r"\def" not in body
    assert re.search(r"(?<!\\)%comment", body) is None and "^^5c" not in body


# -- the pages (pdflatex) -------------------------------------------------------------------------


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (Debian: texlive-latex-base, poppler-utils)")


@pytest.fixture(scope="module")
def seed_pdfs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """The seed derivation compiled without and with figures: (pdf, log) each."""
    from mha_symbolic._latex import compile_tex
    from mha_symbolic.textbook import check_examples, load_examples

    _need("pdflatex")
    examples = load_examples(SEED)
    report = check_examples(examples)
    out: dict[str, tuple[Path, str]] = {}
    folder = tmp_path_factory.mktemp("seed-pages")
    kinds = ["plain"]
    try:
        import matplotlib  # noqa: F401

        kinds.append("figures")
    except ImportError:
        pass
    for kind in kinds:
        d = derive(examples, report=report, title="Seed",
                   figures=folder / "figs" if kind == "figures" else None,
                   relative_to=folder)
        tex = folder / f"{kind}.tex"
        tex.write_text(d.document(), encoding="utf-8")
        resources = [f.ref for ex in d.examples for f in ex.figures]
        pdf = compile_tex(tex, resources=resources, log_to=folder / f"{kind}.log")
        out[kind] = (pdf, (folder / f"{kind}.log").read_text(errors="replace"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "figures"])
def test_seed_pages_have_no_overfull_or_underfull_boxes(seed_pdfs, kind: str) -> None:
    if kind not in seed_pdfs:
        pytest.skip("matplotlib is not installed")
    _pdf, log = seed_pdfs[kind]
    bad = re.findall(r"^(?:Overfull|Underfull) \\[hv]box.*$", log, flags=re.M)
    assert not bad, bad
    assert "Float too large" not in log and "Undefined control sequence" not in log


def _pages(pdf: Path) -> list[str]:
    _need("pdftotext")
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True,
                          text=True, check=True).stdout
    return text.split("\f")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "figures"])
def test_seed_pages_carry_no_raw_ascii_math(seed_pdfs, kind: str) -> None:
    if kind not in seed_pdfs:
        pytest.skip("matplotlib is not installed")
    text = "\n".join(_pages(seed_pdfs[kind][0]))
    for raw in ("^", "_", "sqrt(", "[[", "ˆ", "1e-3", "e-0"):
        assert raw not in text, (raw, text[max(0, text.find(raw) - 80):text.find(raw) + 80])
    if kind == "plain":  # (a figure's labels are the figure's: tests/textbook/test_figures.py)
        assert re.search(r"\b\d{7,}\b", text) is None  # 1048576 is printed 1 048 576
    assert "0.00000" not in text  # very small decimals are in scientific notation


@pytest.mark.slow
def test_each_figure_is_on_the_page_of_its_caption(seed_pdfs) -> None:
    if "figures" not in seed_pdfs:
        pytest.skip("matplotlib is not installed")
    pages = _pages(seed_pdfs["figures"][0])
    # a heatmap's own text (its axis label "key", a line of its own) shares its page with
    # the "Figure n:" caption saying what it shows; a collapse figure's ("score gap")
    # with its caption too
    heat = [k for k, page in enumerate(pages)
            if any(line.strip() == "key" for line in page.splitlines())]
    assert len(heat) >= 7  # A, C, D, E, F-unscaled, F-scaled, G
    for k in heat:
        assert re.search(r"Figure \d+: Attention weights", pages[k]), k
    for k in [k for k, page in enumerate(pages) if "score gap" in page]:
        assert re.search(r"Figure \d+: Weight on the dominant token", pages[k]), k
    # no title over a caption that says the same (issue 27 item 6)
    assert not any(re.search(r"Example \S+: attention weights", p) for p in pages)


def test_seed_markdown_carries_no_raw_ascii_math() -> None:
    from mha_symbolic.textbook import load_examples

    md = derive(load_examples(SEED), format="markdown").text
    prose = re.sub(r"```math\n.*?```", "", md, flags=re.S)  # displayed math
    prose = re.sub(r"(?<!\\)\$[^$\n]+?(?<!\\)\$", "", prose)  # inline math
    for raw in ("^", "sqrt(", "[[", "ˆ", "1e-3", r"\_", "d_k"):
        assert raw not in prose, (raw, prose[max(0, prose.find(raw) - 80):prose.find(raw) + 80])
    assert "$Q_{1} K_{1}^{\\top} = " in md and "$1/\\sqrt{d_{k}}$" in md


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 7, 9, 10])
def test_random_notes_compile_with_pdflatex(tmp_path: Path, seed: int) -> None:
    """400 notes of random math-like text (the seeds that once found a TeX error:
    '\\lew', a double subscript) typeset into one document that pdflatex compiles."""
    import random

    from mha_symbolic._latex import compile_tex, textbook_document
    from mha_symbolic.textbook.derivation.markup import _note_tex

    _need("pdflatex")
    alphabet = [*"ab dkeEQKTxyzhvw_^()[],=+-*/·×≈≤≥<>0123456789. \\{}$%&#~−–",
                "sqrt(", "[[", "]]", "e^", "d_model", "kdim", "1e-3", "^(", "_1", "^T"]
    rng = random.Random(seed)
    notes = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
             for _ in range(400)]
    tex = tmp_path / "notes.tex"
    tex.write_text(textbook_document("\n\n".join(_note_tex(n) for n in notes), title="notes"))
    assert compile_tex(tex, runs=1).is_file()  # raises LatexError on any TeX error


def test_a_weight_with_a_long_run_of_nines_is_written_one_minus_its_distance() -> None:
    text = derive(exact_attention(scores=[[400, 100]]), format="fragment").text
    with mpmath.workdps(60):
        gap = 1 / (1 + mpmath.e ** 300)  # 1 - w_11, by hand
        digits = mpmath.nstr(gap, 15, strip_zeros=False)  # '5.14820022244...e-131'
    mantissa, exponent = digits.split("e")
    assert exponent == "-131"
    expected = "1 - " + mantissa[:5] + T + mantissa[5:8] + T + mantissa[8:11]
    assert expected in text  # 1 - 5.148 200 222… x 10^-131, not 130 nines
    assert "0.999" not in text


def test_a_long_weighted_sum_is_broken_over_lines() -> None:
    value = [[k, k + 1, k + 2, k + 3] for k in range(0, 32, 4)]
    text = derive(exact_attention(scores=[[0] * 8], value=value), format="fragment").text
    first = next(line for line in text.splitlines() if line.startswith(r"\mathrm{head}_{1}[1]"))
    assert first.count("w_{1") <= 4  # the eight terms are not on one line
    assert r"&\quad + w_{1" in text


def test_program_identifiers_in_notes_stay_text() -> None:
    got = pieces("num_heads = 12 and d_model = 4")
    assert (False, "num_heads ") in got  # a program's name, as the author wrote it
    assert (True, r"d_{\mathrm{model}} = 4") in got


def test_a_stack_of_per_head_weights_derives() -> None:
    from mha_symbolic.textbook import load_examples

    ex = [e for e in load_examples(ROOT / "examples" / "books" / "raschka-llm-from-scratch.toml")
          if e.name == "raschka-3.6-wrapper"]
    d = derive(ex, format="fragment")  # w_q of shape (2, 3, 2) was 'is not a number'
    assert d.examples[0].checks and r"Q_{1}" in d.text


# found by the long fuzz run: SymPy's printer ordered the factors of a gradient entry by
# evaluating its sums numerically (minutes, for entries holding masked keys' e^(−10^6))
_FUZZ_578379 = (
    '[[example]]\n'
    'name = "E0"\n'
    'query = [[-3, -2, 4], ["1/3", -1, 2], [0, "e^(1/2)", "e"]]\n'
    'key = [[3, -3, 0], ["pi/4", -2, "-2"], [-3, "2^-1", "e"]]\n'
    'value = [[-2, 4, 1], [5, 4, -3], [3, -3, 0]]\n'
    '[[example.claim]]\n'
    'quantity = "weight[2]"\n'
    'claimed = "(−38862.6996613753, -304.388, -673053.1490)"\n'
    '[[example.claim]]\n'
    'quantity = "score[1,2]"\n'
    'claimed = "≈-inf"\n'
    '[[example.claim]]\n'
    'quantity = "output[2,1]"\n'
    'claimed = "-inf"\n'
    '[[example.claim]]\n'
    'quantity = "scaled_score[1]"\n'
    'claimed = "(63.7426, 0.6643738441, -801)"\n'
    '[[example.claim]]\n'
    'quantity = "expr"\n'
    'claimed = "e^2/(1+e^2)"\n'
    'expr = "sqrt(2)"\n'
    '[[example]]\n'
    'name = "E1"\n'
    'heads = 4\n'
    'query = [["0.6698", 3, 2, 1], [-2, 5, 0, -1.25], [1, 3, 4, 2]]\n'
    'key = [[0, 4, "ln(3)", -1], ["ln(3)", 1, 5, 5]]\n'
    'value = [[-2, -2, "e", "ln(3)"], ["e", 0, 2, 0.1]]\n'
    'scale = "sqrt(3)"\n'
    'mask = [[1, 0], [0, -1e6], [-2, 0]]\n'
    'causal_alignment = "bottom_right"\n'
    'grad_output = [[2, -2, 1, "0.6698"], [3, 3, 1, -3], ["ln(3)", 5, 1, 0]]\n'
    '[[example.claim]]\n'
    'quantity = "grad_query[1,1]"\n'
    'claimed = "1"\n'
    '[[example]]\n'
    'notes = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'
    'xxxxxxxxxxxxxxxxxxxxxxxxxxxxx"\n'
    'x = [[3, 5], [0, "1/3"]]\n'
    'x_kv = [[-1, 3]]\n'
    'w_q = [[-1, "pi/4", 2], [2, "sqrt(2)", "ln(3)"]]\n'
    'w_k = [[1e-3, 4, -3], ["e", 2, "e"]]\n'
    'w_v = [[5, "sqrt(2)", -3], [5, -2, -1]]\n'
    'b_q = [[-3, 4, 4]]\n'
    'b_k = [[0, 3, 5]]\n'
    'mask_fill_stage = "scaled"\n'
    '[[example.claim]]\n'
    'quantity = "expr"\n'
    'claimed = "~0.5"\n'
    'expr = "2^-1"\n'
    '[[example.claim]]\n'
    'quantity = "weight[2,1]"\n'
    'claimed = "~≈ 1 − e^(−32)"\n'
    '[[example.claim]]\n'
    'quantity = "params.w_k"\n'
    'claimed = "~0"\n'
    'head = 1\n'
    '[[example.claim]]\n'
    'quantity = "head_output[2,1]"\n'
    'claimed = "≈ −86.94566823197438572818"\n'
    'note = "$$"\n'
    '[[example.claim]]\n'
    'quantity = "scaled_score[1,1]"\n'
    'claimed = "≈ ≈ 1 − e^(−32)"\n'
    'head = 1\n'
)


def test_a_long_product_is_printed_without_numeric_ordering() -> None:
    from conftest import time_limit

    from mha_symbolic.errors import MhaSymbolicError
    from mha_symbolic.textbook import derive, load_examples

    with time_limit(120):
        try:
            derive(load_examples(text=_FUZZ_578379)).document()
        except MhaSymbolicError as exc:  # an undecidable sign is a one-line refusal
            assert "could not decide" in str(exc)
