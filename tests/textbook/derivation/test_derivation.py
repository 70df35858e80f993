"""Tests of mha_symbolic.textbook.derivation: step-by-step derivations in LaTeX and Markdown.

Expected numbers come from independent computations (mpmath at 50 digits, or
hand-derived closed forms written here), never from the module under test.
"""

from __future__ import annotations

import dataclasses
import re
from decimal import Decimal
from pathlib import Path

import mpmath
import pytest
import sympy as sp

from mha_symbolic.cli import main
from mha_symbolic.errors import SpecError
from mha_symbolic.exact.engine import exact_attention
from mha_symbolic.textbook.derivation import Derivation, derive

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "examples" / "seed.toml"
SEED_DOC = ROOT / "docs" / "seed-derivation.md"
# The command that writes docs/seed-derivation.md (docs/derivations.md shows it too).
SEED_DOC_ARGS = ["derive", "examples/seed.toml", "--format", "markdown",
                 "-o", "docs/seed-derivation.md"]


def truncated(x: mpmath.mpf, significant: int) -> str:
    """The first ``significant`` digits of x > 0, cut (not rounded), as a decimal string."""
    with mpmath.workdps(60):
        text = mpmath.nstr(x, 50, strip_zeros=False, min_fixed=-30, max_fixed=30)
    d = Decimal(text)
    exponent = d.adjusted()
    places = max(significant - 1 - exponent, 0)
    q = Decimal(1).scaleb(-places)
    return str(d.quantize(q, rounding="ROUND_DOWN"))


def grouped(text: str) -> str:
    """A decimal with its digits grouped as siunitx groups them (written here, by hand):
    a run of five or more digits in threes by a thin space, from the decimal point."""
    whole, dot, frac = text.partition(".")

    def run(s: str, from_left: bool) -> str:
        if len(s) < 5:
            return s
        if from_left:
            return "\\,".join(s[i:i + 3] for i in range(0, len(s), 3))
        return run(s[::-1], True)[::-1].replace(",\\", "\\,")

    return run(whole, False) + dot + run(frac, True)


def softmax_mp(row: list[mpmath.mpf]) -> list[mpmath.mpf]:
    with mpmath.workdps(60):
        exps = [mpmath.e ** x for x in row]
        total = mpmath.fsum(exps)
        return [x / total for x in exps]


@pytest.fixture(scope="module")
def seed_examples() -> list:
    from mha_symbolic.textbook import load_examples

    return load_examples(SEED)


@pytest.fixture(scope="module")
def seed_report(seed_examples: list):
    from mha_symbolic.textbook import check_examples

    return check_examples(seed_examples)


@pytest.fixture(scope="module")
def seed_derivation(seed_examples: list, seed_report) -> Derivation:
    return derive(seed_examples, report=seed_report, title="Seed")


# -- numbers: certified digits, checked against mpmath --------------------------------------


def test_single_head_weights_show_certified_digits_of_the_exact_softmax() -> None:
    att = exact_attention(query=[[1, 0], [0, 1]], key=[[1, 0], [0, 1]], value=[[2, 0], [0, 4]])
    text = derive(att, format="fragment").text
    with mpmath.workdps(60):
        s = 1 / mpmath.sqrt(2)  # scaled diagonal score, by hand: 1/sqrt(d_k), d_k = 2
        w11, w12 = softmax_mp([s, mpmath.mpf(0)])
    # a tall exponent slashed in the superscript, not e^{\frac{\sqrt{2}}{2}}
    assert r"w_{11} &= \frac{e^{\sqrt{2}/2}}" in text
    assert grouped(truncated(w11, 10)) + r"\ldots" in text
    assert grouped(truncated(w12, 10)) + r"\ldots" in text
    # the head output row 1 = w11 (2, 0) + w12 (0, 4), by hand
    with mpmath.workdps(60):
        out = (2 * w11, 4 * w12)
    assert grouped(truncated(out[0], 10)) + r"\ldots" in text
    assert grouped(truncated(out[1], 10)) + r"\ldots" in text


def test_example_g_every_weight_matches_an_independent_softmax(seed_derivation) -> None:
    g = next(e for e in seed_derivation.examples if e.name == "G")
    scores = ["3.0", "0.5", "0.2", "1.0", "0.3", "0.6"]
    with mpmath.workdps(60):
        expected = softmax_mp([mpmath.mpf(x) for x in scores])
    text = Derivation((g,), format="fragment").latex()
    found = re.findall(r"w_\{1(\d)\} &= \\frac\{[^&]*?= ([0-9.\\,]+)\\ldots", text)
    assert [int(j) for j, _ in found] == [1, 2, 3, 4, 5, 6]
    for (j, digits), w in zip(found, expected, strict=True):
        assert digits == grouped(truncated(w, 10)), f"w_1{j}"
    # the shared denominator D_1 = sum of exponentials, by hand
    with mpmath.workdps(60):
        denom = mpmath.fsum(mpmath.e ** mpmath.mpf(x) for x in scores)
    assert grouped(truncated(denom, 10)) + r"\ldots" in text


def test_a_value_just_below_one_shows_digits_past_its_nines(seed_derivation) -> None:
    f = next(e for e in seed_derivation.examples if e.name == "F-unscaled")
    text = Derivation((f,), format="fragment").latex()
    with mpmath.workdps(60):
        w1 = 1 / (1 + mpmath.e ** -32)  # e^40/(e^40 + e^8), by hand
    # 13 nines after the point, then 8733...: ten digits would print only nines
    assert truncated(w1, 17) == "0.99999999999998733"
    assert r"0.999\,999\,999\,999\,987\,33\ldots" in text


def test_terminating_rationals_print_as_the_same_exact_decimal() -> None:
    att = exact_attention(scores=[["0.5", "1.25"]], scale=1)
    text = derive(att, format="fragment").text
    assert r"\begin{bmatrix}0.5 & 1.25\end{bmatrix}" in text
    assert r"e^{0.5}" in text and r"e^{1.25}" in text


def test_claims_carry_the_checkers_certified_digits_verbatim(seed_derivation, seed_report) -> None:
    lines = [c for e in seed_derivation.examples for c in e.claims]
    assert len(lines) == len(seed_report.records) > 50
    for line, record in zip(lines, seed_report.records, strict=True):
        assert line.exact_digits == record.exact
        assert line.ok == record.ok
        assert line.claimed == record.claimed
    md = seed_derivation.markdown()
    for record in seed_report.records:
        # the same digits, grouped in threes (or shifted into scientific notation)
        plain = re.sub(r"\\,|\.", "", md)
        for number in re.findall(r"\d+(?:\.\d+)?", record.exact):
            digits = number.replace(".", "").lstrip("0") or "0"
            assert digits[:6] in plain, record.exact


def test_wrong_claims_show_verdict_correct_answer_and_diagnosis(seed_derivation) -> None:
    a = next(e for e in seed_derivation.examples if e.name == "A")
    wrong = [c for c in a.claims if not c.ok]
    # Example A prints (1.3396, 1.3208) for head row 1; the exact row is
    # 2w/(1+..) = (1.33952..., 1.32095...) by hand, so 4 places give (1.3395, 1.3210).
    row1 = next(c for c in wrong if c.claimed == "(1.3396, 1.3208)")
    assert "(1.3395, 1.3210)" in row1.verdict
    assert "premature rounding" in row1.diagnosis
    text = Derivation((a,), format="fragment").latex()
    assert r"\item[$\times$] \textbf{Head outputs of row 1}" in text


# -- checks are computed ---------------------------------------------------------------------


def _names(checks) -> dict[str, bool]:
    return {c.name: c.ok for c in checks}


def test_checks_hold_for_every_seed_example(seed_derivation) -> None:
    for ex in seed_derivation.examples:
        assert ex.checks, ex.name
        assert all(c.ok for c in ex.checks), (ex.name, [c for c in ex.checks if not c.ok])
    a = next(e for e in seed_derivation.examples if e.name == "A")
    assert _names(a.checks) == {"weights positive": True, "rows sum to 1": True,
                                "outputs within the values": True, "shapes agree": True}


def _corrupt(att, **head_changes):
    head = dataclasses.replace(att.heads[0], **head_changes)
    return dataclasses.replace(att, heads=(head,))


def test_checks_fail_when_a_row_does_not_sum_to_one() -> None:
    att = exact_attention(scores=[[1, 2]], value=[[10], [20]])
    bad = sp.Matrix([[sp.Rational(1, 2), sp.Rational(1, 3)]])
    ex = derive(_corrupt(att, weights=bad)).examples[0]
    assert _names(ex.checks)["rows sum to 1"] is False
    assert _names(ex.checks)["weights positive"] is True


def test_checks_fail_for_a_negative_weight_and_an_output_outside_the_values() -> None:
    att = exact_attention(scores=[[1, 2]], value=[[10], [20]])
    bad_w = sp.Matrix([[sp.Rational(-1, 2), sp.Rational(3, 2)]])
    bad_out = sp.Matrix([[25]])  # outside [10, 20]
    ex = derive(_corrupt(att, weights=bad_w, output=bad_out)).examples[0]
    names = _names(ex.checks)
    assert names["weights positive"] is False
    assert names["rows sum to 1"] is True  # -1/2 + 3/2 = 1: the sum alone cannot tell
    assert names["outputs within the values"] is False


def test_checks_fail_when_shapes_disagree() -> None:
    att = exact_attention(scores=[[1, 2]], value=[[10], [20]])
    ex = derive(_corrupt(att, output=sp.Matrix([[15, 15]]))).examples[0]
    assert _names(ex.checks)["shapes agree"] is False


def test_symbolic_scores_derive_without_digits_and_leave_positivity_undecided() -> None:
    a = sp.Symbol("a", real=True)
    ex = derive(exact_attention(scores=[[a, 0]])).examples[0]
    text = Derivation((ex,), format="fragment").latex()
    assert r"\ldots" not in text
    names = _names(ex.checks)
    assert names["rows sum to 1"] is True
    assert names["weights positive"] is False  # not certified: honest, not assumed


def test_masked_weights_are_derived_as_exact_zeros() -> None:
    att = exact_attention(scores=[[1, 2], [3, 4]], value=[[1], [2]], mask="causal")
    ex = derive(att).examples[0]
    text = Derivation((ex,), format="fragment").latex()
    assert r"w_{12} &= 0 \quad (\text{masked})" in text
    assert all(c.ok for c in ex.checks)
    assert "1 masked weights exactly $0$" in next(
        c.detail for c in ex.checks if c.name == "weights positive")


# -- dimension-only examples -------------------------------------------------------------------


def test_cross_attention_shapes_are_derived_by_the_shape_algebra(seed_derivation) -> None:
    h = next(e for e in seed_derivation.examples if e.name == "H")
    text = Derivation((h,), format="fragment").latex()
    # by hand: d_k = 512/8 = 64; (3 x 64)(64 x 5) = 3 x 5; (3 x 5)(5 x 64) = 3 x 64
    assert r"\left(3 \times 64\right) \cdot \left(64 \times 5\right) = 3 \times 5" in text
    assert r"\left(3 \times 5\right) \cdot \left(5 \times 64\right) = 3 \times 64" in text
    assert _names(h.checks) == {"shapes agree": True, "heads rebuild d_model": True}


def test_parameter_count_is_the_sum_of_the_parts(seed_derivation) -> None:
    i = next(e for e in seed_derivation.examples if e.name == "I")
    text = Derivation((i,), format="fragment").latex()
    # by hand: 512 * 64 = 32768 per head; 8 heads: 262144 per matrix; 4 matrices: 2^20
    assert r"8 \times \left(512 \times 64\right) = 8 \times 32\,768 = 262\,144" in text
    # the parts in a booktabs table whose total row is the sum
    assert r"\toprule" in text and r"\bottomrule" in text
    assert "Total &  & $1\\,048\\,576$ \\\\" in text
    assert "2^{20}" in text
    assert all(c.ok for c in i.checks)


def test_a_spec_with_symbolic_sizes_derives_a_symbolic_count() -> None:
    from mha_symbolic.exact.spec import AttentionSpec

    d = derive(AttentionSpec(d_model="d", heads="h", bias=False), format="fragment")
    assert "4 d^{2}" in d.text


# -- formats -----------------------------------------------------------------------------------


def test_tex_is_a_complete_ascii_document_with_amsmath_only(seed_derivation) -> None:
    tex = seed_derivation.document()
    assert tex.startswith("\\documentclass")
    assert "\\usepackage{amsmath}" in tex and tex.rstrip().endswith("\\end{document}")
    packages = set(re.findall(r"\\usepackage(?:\[[^]]*\])?\{([^}]*)\}", tex))
    assert packages <= {"amsmath", "amssymb", "booktabs"}
    # a display may break between its equations, never inside one (rows joined by \\*)
    assert "\\allowdisplaybreaks[1]" in tex and " \\\\*\n&= " in tex
    bad = sorted({c for c in tex if ord(c) > 127})
    assert not bad, f"non-ASCII characters would break pdflatex: {bad}"


def test_fragment_has_no_preamble_and_markdown_uses_math_blocks(seed_derivation) -> None:
    frag = dataclasses.replace(seed_derivation, format="fragment").text
    assert "\\documentclass" not in frag and "\\section*{Example A" in frag
    md = dataclasses.replace(seed_derivation, format="markdown").text
    assert md.startswith("# Seed")
    assert "```math\n\\begin{aligned}" in md
    assert "$Q_i K_i^{\\top}$" in md  # inline math stays $...$
    assert "\\section" not in md


def test_dollar_markdown_puts_every_double_backslash_at_a_line_end(seed_derivation) -> None:
    md = seed_derivation.markdown(math="dollars")
    assert "```math" not in md
    blocks = re.findall(r"^\$\$\n(.*?)\n\$\$$", md, flags=re.S | re.M)
    assert blocks
    for block in blocks:
        for line in block.splitlines():
            assert "\\\\" not in line.rstrip().removesuffix("\\\\"), line


def test_repr_latex_is_math_mode_for_jupyter() -> None:
    d = derive(exact_attention(scores=[[0, 0, 20]], value=[[10], [20], [30]]))
    r = d._repr_latex_()
    assert r.startswith("$$\\begin{aligned}") and r.endswith("\\end{aligned}$$")
    assert "\\section" not in r
    assert d._repr_markdown_().startswith("# ")


def test_user_text_is_escaped_for_latex() -> None:
    from mha_symbolic.textbook import load_examples

    ex = load_examples(text='''
[[example]]
name = "x_1"
title = "50% & more: {braces} #1 ≈ ∞ ✓"
notes = "Costs $5 – not d_k^2."
scores = [[1, 2]]
''')
    tex = derive(ex).document()
    assert r"50\% \& more: \{braces\} \#$1 \approx$" in tex
    title = tex[tex.index(r"\section*{"):].splitlines()[0]
    for command in (r"\approx", r"\infty", r"\checkmark"):
        assert command in title
    # the note's math is typeset from the notes grammar; the rest escaped
    assert r"Costs \$5 -- not $d_{k}^{2}$." in tex
    assert all(ord(c) < 128 for c in tex)


GQA_TOML = """
[[example]]
name = "GQA"
title = "Four query heads, two key/value heads, causal mask, biases"
heads = 4
kv_heads = 2
mask = "causal"
x = [[1, 0, 2, 1], [0, 1, 1, 0], [1, 1, 0, 0]]
w_q = [[1, 0, 0, 1, 0, 0, 1, 0], [0, 1, 0, 0, 1, 0, 0, 1], [1, 0, 1, 0, 0, 1, 0, 0],
       [0, 0, 0, 1, 1, 0, 1, 0]]
w_k = [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]]
w_v = [[2, 0, 1, 0], [0, 2, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]]
b_q = [0, 0, 0, 0, 1, 1, 1, 1]
w_o = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0],
       [0, 0, 1, 0], [0, 0, 0, 1]]

[[example]]
name = "wide"
title = "Eight keys: matrices in blocks of columns"
scale = "0.5"
scores = [[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1], [0, 0, 0, 0, 0, 0, 0, 0],
          [1, 0, 1, 0, 1, 0, 1, 0]]
value = [[1], [2], [3], [4], [5], [6], [7], [8]]
"""


def test_gqa_with_mask_and_biases_derives_and_checks() -> None:
    from mha_symbolic.textbook import load_examples

    d = derive(load_examples(text=GQA_TOML), format="fragment")
    gqa = d.examples[0]
    assert all(c.ok for c in gqa.checks)
    text = d.text
    assert r"\lceil i / 2 \rceil" in text  # 1-based: heads 1, 2 use key/value head 1
    assert r"Q &= X W^{Q} + b^{Q}" in text
    assert r"w^{(1)}_{12} &= 0 \quad (\text{masked})" in text
    assert r"A_{1}\,[\text{columns } 1\text{--}" in text  # 4 x 8 weights, too wide at once


@pytest.mark.slow
@pytest.mark.parametrize("which", ["seed", "gqa"])
def test_derivation_compiles_with_pdflatex(tmp_path: Path, seed_derivation, which) -> None:
    from mha_symbolic._latex import compile_tex, pdflatex_path
    from mha_symbolic.textbook import load_examples

    if pdflatex_path() is None:
        pytest.skip("pdflatex is not installed (Debian: texlive-latex-base, "
                    "texlive-latex-recommended)")
    d = seed_derivation if which == "seed" else derive(load_examples(text=GQA_TOML))
    tex = tmp_path / f"{which}.tex"
    tex.write_text(d.document(), encoding="utf-8")
    pdf = compile_tex(tex, log_to=tmp_path / f"{which}.log")  # raises on any LaTeX error
    assert pdf.read_bytes()[:5] == b"%PDF-"
    log = (tmp_path / f"{which}.log").read_text(errors="replace")
    assert "Overfull \\hbox" not in log  # nothing runs into the margin
    assert "Undefined control sequence" not in log


# -- API and CLI errors ------------------------------------------------------------------------


def test_bad_arguments_are_one_line_spec_errors() -> None:
    with pytest.raises(SpecError, match="format='pdf' must be one of"):
        derive(exact_attention(scores=[[1]]), format="pdf")
    with pytest.raises(SpecError, match="derive\\(\\) takes a WorkedExample"):
        derive(42)
    with pytest.raises(SpecError, match="empty list"):
        derive([])


def test_cli_writes_markdown_for_one_example(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["derive", str(SEED), "--format", "markdown", "--only", "D"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "## Example D" in out and "## Example C" not in out
    assert "e^{20}" in out


def test_cli_rejects_an_unknown_example_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["derive", str(SEED), "--only", "Z"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "no example named 'Z'" in err


def test_cli_pdf_needs_an_output_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["derive", str(SEED), "--pdf"]) == 2
    assert "--pdf needs -o OUT" in capsys.readouterr().err


def test_committed_seed_derivation_is_what_the_command_writes(tmp_path: Path,
                                                             monkeypatch) -> None:
    assert SEED_DOC.is_file(), "run: mha-symbolic " + " ".join(SEED_DOC_ARGS)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "seed-derivation.md"
    args = [*SEED_DOC_ARGS[:-1], str(out)]
    assert main(args) == 0
    assert out.read_text(encoding="utf-8") == SEED_DOC.read_text(encoding="utf-8"), (
        "docs/seed-derivation.md is stale: regenerate it with mha-symbolic "
        + " ".join(SEED_DOC_ARGS))


@pytest.mark.parametrize(("policy", "shown"), [("zero", "0,\\ 0"), ("nan", "\\text{NaN},\\ \\text{NaN}")])
def test_a_fully_masked_row_follows_the_stated_policy(policy: str, shown: str) -> None:
    att = exact_attention(scores=[[1, 2], [3, 4]], value=[[1, 5], [2, 6]],
                          mask=[[False, False], [True, True]], masked_rows=policy)
    ex = derive(att).examples[0]
    text = Derivation((ex,), format="fragment").latex()
    assert rf"\mathrm{{head}}_{{1}}[1] &= \left({shown}\right) \quad (\text{{every key masked}})" in text
    assert all(c.ok for c in ex.checks)
    assert f"1 fully masked rows get weights `{policy}' by policy" in text


def test_a_symbolic_matrix_too_long_to_print_is_named_not_printed() -> None:
    # symbolic entries have no certified digits: the exact form is all there is, and
    # printing it walks every weight's tree (its row's denominator each time): bounded by
    # EXACT_MATRIX_CHARS.  12 × 12 weights of 12-term denominators pass it, 5 × 5 do not
    # (25 weights: more than are derived one per line, so the matrix is printed).
    from mha_symbolic.textbook.derivation.model import EXACT_MATRIX_CHARS

    def symbols(n: int) -> list[list[sp.Symbol]]:
        return [[sp.Symbol(f"s_{i}_{j}") for j in range(n)] for i in range(n)]

    big = derive(exact_attention(scores=symbols(12))).latex()
    assert "exact form too long to print" in big and len(big) < 4 * EXACT_MATRIX_CHARS
    small = derive(exact_attention(scores=symbols(5))).latex()
    assert "too long to print" not in small
    assert re.search(r"A_\{1\} &= \\begin\{bmatrix\}\\frac\{e\^\{s_\{\\text\{0\\_0\}\}\}\}", small)
