"""Tests of the proof machinery (mha_symbolic/prove.py) and of the theorems in proofs/.

Every theorem must hold; deliberately false statements, fed through the same
machinery, must come out FAILED with a message that names the step.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import sympy as sp
from flint import arb, fmpq

from mha_symbolic import cli as cli_module
from mha_symbolic._latex import compile_tex, pdflatex_path
from mha_symbolic.errors import MhaSymbolicError, ProofError
from mha_symbolic.exact import prove as pv
from mha_symbolic.exact.prove import (
    CrossCheck,
    Derivation,
    ProofResult,
    Theorem,
    load_theorems,
    proofs_dir,
    run_proofs,
    run_theorem,
)

N = sp.Symbol("n", integer=True, positive=True)
J = sp.Symbol("j", integer=True, positive=True)
I = sp.Symbol("i", integer=True, positive=True)
C = sp.Symbol("c", real=True)
S = sp.IndexedBase("s", real=True)

EXPECTED = ["uniform", "convex", "shift", "onehot", "temperature", "scale", "jacobian",
            "single_token", "permutation", "masking", "shapes", "params", "stacked", "backward"]


@pytest.fixture(scope="module")
def results() -> list[ProofResult]:
    """Every theorem, run once for the whole module (about 15 s)."""
    return run_proofs()


def _no_check(rng: random.Random) -> CrossCheck:
    return CrossCheck("none")


def _theorem(prove, cross_check=_no_check, name: str = "false") -> Theorem:
    return Theorem(name=name, title="A false statement", statement_latex="false",
                   prove=prove, cross_check=cross_check, number=99)


# --- the real theorems ---------------------------------------------------------


def test_all_theorems_are_found_in_order() -> None:
    theorems = load_theorems()
    assert [t.name for t in theorems] == EXPECTED
    assert [t.number for t in theorems] == list(range(1, len(EXPECTED) + 1))


def test_proofs_dir_is_the_repository_proofs_folder() -> None:
    assert proofs_dir() == Path(__file__).resolve().parents[2] / "proofs"


@pytest.mark.parametrize("name", EXPECTED)
def test_theorem_holds(results: list[ProofResult], name: str) -> None:
    result = next(r for r in results if r.name == name)
    assert result.status == "proved", result.message
    assert result.ok
    assert result.steps, "a proof without steps"
    assert any(s.machine_checked for s in result.steps)
    assert result.checks and any(c.status == "ok" for c in result.checks)
    assert all(c.status in ("ok", "note", "skipped") for c in result.checks)
    assert result.method.startswith("symbolic (all sizes) + ")


def test_stated_facts_are_counted_and_marked(results: list[ProofResult]) -> None:
    for r in results:
        assert r.facts == sum(1 for s in r.steps if s.kind == "fact")
        for s in r.steps:
            if s.kind == "fact":
                assert not s.machine_checked and "not machine-checked" in s.decided_by


def test_theorems_load_from_a_copied_directory(tmp_path: Path) -> None:
    # what an installed wheel does: the modules are loaded by file path
    copy = tmp_path / "proofs"
    shutil.copytree(proofs_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert [t.name for t in load_theorems(copy)] == EXPECTED
    assert [t.name for t in load_theorems()] == EXPECTED  # and back again


def test_only_selects_by_name_number_and_tag() -> None:
    got = run_proofs(only=["uniform", "8", "t10"])
    assert [r.name for r in got] == ["uniform", "single_token", "masking"]
    assert run_proofs(only="shift")[0].name == "shift"


def test_only_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(MhaSymbolicError, match=r"only='nope' names no theorem; known: uniform"):
        run_proofs(only=["nope"])


# --- false statements through the same machinery --------------------------------


def test_false_uniform_weight_one_over_n_plus_one_fails() -> None:
    def prove() -> Derivation:
        d = Derivation()
        w = sp.exp(C) / sp.Sum(sp.exp(C), (J, 1, N))
        d.identity(w, 1 / (N + 1), "equal scores give 1/(n+1)")
        return d

    r = run_theorem(_theorem(prove))
    assert r.status == "FAILED" and not r.ok
    assert "step 1 (equal scores give 1/(n+1))" in r.message
    assert "simplify(lhs - rhs)" in r.message and "not 0" in r.message


def test_false_shift_invariance_under_multiplication_fails() -> None:
    def prove() -> Derivation:
        d = Derivation()
        scaled = sp.exp(C * S[I]) / sp.Sum(sp.exp(C * S[J]), (J, 1, N))
        plain = sp.exp(S[I]) / sp.Sum(sp.exp(S[J]), (J, 1, N))
        d.identity(scaled, plain, "multiplying the scores changes nothing")
        return d

    r = run_theorem(_theorem(prove))
    assert r.status == "FAILED"
    assert "multiplying the scores changes nothing" in r.message


def test_failure_after_true_steps_reports_the_right_step_number() -> None:
    def prove() -> Derivation:
        d = Derivation()
        d.identity(sp.Sum(1, (J, 1, N)), N, "n ones")
        d.identity(sp.Sum(1, (J, 1, N)), N + 1, "n + 1 ones")
        return d

    r = run_theorem(_theorem(prove))
    assert r.status == "FAILED" and r.message.startswith("step 2 (n + 1 ones)")
    assert [s.reason for s in r.steps] == ["n ones"]  # the steps that held, not the false one


def test_false_inequality_fails() -> None:
    x = sp.Symbol("x", nonnegative=True)

    def prove() -> Derivation:
        d = Derivation()
        d.inequality(x, "<=", x / (1 + x), "x <= x/(1 + x)")
        return d

    r = run_theorem(_theorem(prove))
    assert r.status == "FAILED" and "could not decide" in r.message


def test_undecidable_sign_fails() -> None:
    def prove() -> Derivation:
        d = Derivation()
        d.sign(S[I], ">", "a real score is positive")
        return d

    assert "could not decide" in run_theorem(_theorem(prove)).message


def test_false_limit_fails() -> None:
    beta, g = sp.Symbol("beta", positive=True), sp.Symbol("g", positive=True)

    def prove() -> Derivation:
        d = Derivation()
        d.limit(sp.exp(-beta * g), beta, sp.oo, 1, "e^(-beta g) -> 1")
        return d

    r = run_theorem(_theorem(prove))
    assert r.status == "FAILED" and "is 0, not 1" in r.message


def test_false_numeric_cross_check_fails() -> None:
    # a correct derivation whose numerical claim is false: 1/(n+1) for equal scores
    def prove() -> Derivation:
        d = Derivation()
        d.identity(sp.exp(C) / sp.Sum(sp.exp(C), (J, 1, N)), 1 / N, "uniform")
        return d

    def cross_check(rng: random.Random) -> CrossCheck:
        chk = CrossCheck("Arb")
        e = arb(2).exp()
        chk.agree("n=3: w = 1/4", e / (3 * e), fmpq(1, 4))
        return chk

    r = run_theorem(_theorem(prove, cross_check))
    assert r.status == "FAILED"
    assert r.message.startswith("cross-check 1 (n=3: w = 1/4)") and "excludes 0" in r.message
    assert r.checks and not r.checks[-1].ok


def test_cross_check_refuses_a_ball_too_wide_to_decide() -> None:
    chk = CrossCheck("Arb")
    with pytest.raises(ProofError, match="wider than 2\\^-90"):
        chk.agree("wide", arb(1, 1e-10), 1)


def test_uncertain_arb_comparison_is_not_a_pass() -> None:
    chk = CrossCheck("Arb")
    with pytest.raises(ProofError, match="does not hold"):
        chk.holds("1/3 <= 1/3 with Arb", bool(arb(1) / 3 <= arb(1) / 3))


def test_proof_code_that_crashes_is_an_error_not_a_pass() -> None:
    def prove() -> Derivation:
        raise ZeroDivisionError("boom")

    r = run_theorem(_theorem(prove))
    assert r.status == "ERROR" and r.message == "ZeroDivisionError: boom"


def test_prove_must_return_a_derivation() -> None:
    r = run_theorem(_theorem(lambda: 42))
    assert r.status == "FAILED" and "not a Derivation" in r.message


# --- the decision procedure -------------------------------------------------------


def test_sums_with_different_dummy_indices_are_identified() -> None:
    # the pitfall of REFERENCES.md section 5: Sum_i f(i) / Sum_j f(j) is 1
    d = Derivation()
    ratio = sp.Sum(sp.exp(S[I]), (I, 1, N)) / sp.Sum(sp.exp(S[J]), (J, 1, N))
    d.identity(ratio, 1, "rename the bound index")
    assert d.steps[0].kind == "identity"


def test_sums_with_different_ranges_are_not_identified() -> None:
    d = Derivation()
    ratio = sp.Sum(sp.exp(S[I]), (I, 1, N)) / sp.Sum(sp.exp(S[J]), (J, 2, N))
    with pytest.raises(ProofError):
        d.identity(ratio, 1, "different ranges")


def test_explicit_matrix_identity_is_checked_entrywise() -> None:
    d = Derivation()
    a = sp.Symbol("a")
    d.identity(sp.Matrix([[a, 1]]) * 2, sp.Matrix([[2 * a, 2]]), "scale")
    with pytest.raises(ProofError, match="shapes"):
        d.identity(sp.Matrix([[a, 1]]), sp.Matrix([[a], [1]]), "transpose is not equal")


def test_method_is_honest_about_instance_scopes() -> None:
    def prove() -> Derivation:
        d = Derivation()
        d.identity(sp.Integer(2) + 2, 4, "an instance", scope="n = 2")
        return d

    assert run_theorem(_theorem(prove)).method == "symbolic for n = 2 + none check"


# --- command line and LaTeX ----------------------------------------------------------


def test_cli_prove_prints_the_table_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["prove", "--only", "uniform", "--only", "shift"]) == 0
    out = capsys.readouterr().out
    assert "theorem" in out and "method" in out and "status" in out and "time" in out
    assert "uniform" in out and "proved" in out and "2 of 2 theorems hold" in out


def test_cli_prove_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["prove", "--only", "masking", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    (entry,) = data["results"]
    assert entry["name"] == "masking" and entry["status"] == "proved"
    assert entry["steps"][0]["decided_by"] and entry["checks"][0]["ok"] is True


def test_cli_prove_exits_1_when_a_theorem_fails(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    def prove() -> Derivation:
        d = Derivation()
        d.identity(sp.Sum(1, (J, 1, N)), N + 1, "n + 1 ones")
        return d

    monkeypatch.setattr(pv, "load_theorems", lambda directory=None: [_theorem(prove)])
    assert cli_module.main(["prove"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "theorem 99 (false): step 1 (n + 1 ones)" in out
    assert "The theorem does not hold" in out


def test_cli_prove_unknown_theorem_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["prove", "--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names no theorem" in err


def test_latex_files_are_written(tmp_path: Path) -> None:
    run_proofs(only=["uniform", "shapes"], latex_dir=tmp_path / "tex")
    names = sorted(p.name for p in (tmp_path / "tex").iterdir())
    assert names == ["proofs.tex", "t01_uniform.tex", "t11_shapes.tex"]
    text = (tmp_path / "tex" / "proofs.tex").read_text()
    assert "\\begin{align*}" in text and "[SymPy]" in text and "\\end{document}" in text


def test_latex_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(MhaSymbolicError, match="is not a directory"):
        run_proofs(only=["uniform"], latex_dir=f)


@pytest.mark.skipif(pdflatex_path() is None, reason="pdflatex is not installed")
def test_latex_of_every_proof_compiles(results: list[ProofResult], tmp_path: Path) -> None:
    # a failed result is rendered too: its message must survive LaTeX escaping
    def prove() -> Derivation:
        d = Derivation()
        d.identity(sp.Sum(1, (J, 1, N)), N + 1, "n + 1 ones & 50% of $x_1$")
        return d

    failed = run_theorem(_theorem(prove))
    master = pv.write_latex([*results, failed], tmp_path)
    pdf = compile_tex(master, runs=1)  # no cross-references: one run is enough
    assert pdf.read_bytes()[:5] == b"%PDF-"


def test_a_broken_theorem_module_is_named(tmp_path: Path) -> None:
    copy = tmp_path / "proofs"
    shutil.copytree(proofs_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "t14_broken.py").write_text("THEOREM = undefined_name\n")
    try:
        with pytest.raises(MhaSymbolicError, match=r"t14_broken\.py failed to load: NameError"):
            load_theorems(copy)
    finally:
        load_theorems()  # leave the real package loaded for the other tests


def test_prove_subprocess_writes_latex_and_exits_0(cli, tmp_path: Path) -> None:
    proc = cli("prove", "--only", "single_token", "--latex", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "The theorem holds" in proc.stdout
    assert (tmp_path / "proofs.tex").is_file() and (tmp_path / "t08_single_token.tex").is_file()


# --- issue 16: what a textbook author and a notebook user see ------------------------


def test_skipped_check_is_labelled_skipped_never_ok() -> None:
    def cross_check(rng: random.Random) -> CrossCheck:
        chk = CrossCheck("Arb")
        chk.agree("$1 = 1$", 1, 1)
        chk.skip("torch agrees", "torch is not installed")
        return chk

    def prove() -> Derivation:
        d = Derivation()
        d.identity(sp.Sum(1, (J, 1, N)), N, "n ones")
        return d

    r = run_theorem(_theorem(prove, cross_check))
    skipped = [c for c in r.checks if c.status == "skipped"]
    assert len(skipped) == 1 and not skipped[0].ok and r.skipped_checks == 1
    row = next(line for line in str(r).splitlines() if "torch agrees" in line)
    assert "skipped: torch is not installed" in row and "holds" not in row
    tex = r.latex()
    assert r"\textit{skipped}: torch is not installed" in tex
    assert "skipped" in pv.ProofReport([r]).__str__()  # the summary row says so too


def test_params_without_torch_shows_the_torch_check_as_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_torch(name: str, *args: object, **kw: object) -> object:
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    (r,) = run_proofs(only=["params"])
    assert r.ok
    torch_checks = [c for c in r.checks if "torch" in c.what]
    assert torch_checks and all(c.status == "skipped" for c in torch_checks)
    assert all("torch is not installed" in c.detail for c in torch_checks)
    assert not any(c.ok for c in torch_checks)


def test_cross_checks_are_grouped_into_one_row_per_claim(results: list[ProofResult]) -> None:
    from mha_symbolic.exact.proof_render import check_groups

    onehot = next(r for r in results if r.name == "onehot")
    groups = check_groups(onehot.checks)
    assert len(groups) == 7 < len(onehot.checks)  # 3 for Example D, 4 claims x 9 cases
    gap_form = next(g for g in groups if g.what.startswith("$w_1 = 1/(1 +"))
    assert len(gap_form.records) == 9
    keys = [k for k, _ in gap_form.ranges()]
    assert keys == ["n", r"\gamma"]
    tex = onehot.latex()
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"\item[ok]" not in tex


def test_certified_bound_exponent_is_never_too_small() -> None:
    # |difference| < 10^k must hold for the k printed; checked against exact arithmetic
    from fractions import Fraction

    from mha_symbolic.exact.proof_checks import _decimal_exponent_above

    for num, den in ((1, 3), (1, 1000), (999, 1000), (1, 10**60), (7, 10**57), (10**5, 1)):
        k = _decimal_exponent_above(arb(fmpq(num, den)))
        assert Fraction(num, den) < Fraction(10) ** k
        assert Fraction(num, den) >= Fraction(10) ** (k - 1)  # and it is the least such k


def test_theorem_four_uses_the_documented_notation(results: list[ProofResult]) -> None:
    onehot = next(r for r in results if r.name == "onehot")
    import re

    shown = " ".join(f"{s.lhs} {s.rhs}" for s in onehot.steps)  # the mathematics shown
    for stray in (r"\sigma", r"s_{\max}", r"\mathrm{max}"):
        assert stray not in shown, stray
    for letter in ("N", "m"):  # as a symbol of its own, not inside a word or command
        assert not re.search(rf"(?<![A-Za-z\\]){letter}(?![A-Za-z])", shown), letter
    assert r"\sum_{j=2}^{n}" in shown and r"\hat{s}" in shown
    defined = [s.lhs for s in onehot.steps if s.kind == "definition"]
    assert r"\hat{s}" in defined and r"\gamma" in defined  # every symbol defined


def test_book_latex_conventions() -> None:
    from mha_symbolic.exact.proof_render import book_latex

    dm, x = sp.Symbol("d_model"), sp.Symbol("x")
    assert book_latex(dm) == r"d_{\mathrm{model}}"
    assert book_latex(sp.Symbol("kdim")) == r"\operatorname{kdim}{}"  # {}: a + after it is binary
    assert book_latex(sp.Symbol("s_max")) == r"s_{\max}"
    assert book_latex(sp.exp(x / 2)) == r"\exp\left(\frac{x}{2}\right)"
    assert book_latex(sp.exp(-x)) == "e^{- x}"
    assert book_latex(sp.Integer(1048576)) == r"1\,048\,576"
    assert book_latex(sp.Integer(4096)) == "4096"


def test_notation_is_defined_once_in_the_document(results: list[ProofResult]) -> None:
    doc = pv.proofs_latex(results)
    assert doc.count(r"\section*{Notation}") == 1
    assert r"\usepackage{booktabs}" in doc
    assert "d_{model}" not in doc  # multi-letter subscripts upright everywhere
    assert r"\textasciicircum" not in doc  # no raw ASCII math (x^2) in typeset text


def test_repr_shows_a_table_not_a_dataclass_dump(results: list[ProofResult]) -> None:
    report = pv.ProofReport(results)
    text = str(report)
    assert text.splitlines()[0].split()[:3] == ["#", "theorem", "status"]
    assert "14 of 14 theorems hold" in text
    assert "ProofResult(" not in repr(report) and "steps=(" not in repr(report)
    md = report._repr_markdown_()
    assert md.startswith("| # | theorem | status |") and "onehot" in md
    html_ = report._repr_html_()
    assert html_.startswith("<table>") and "<td>onehot</td>" in html_
    one = results[3]
    assert "claim checked" in str(one) and "cases" in str(one)
    assert "<table>" in one._repr_html_() and "| claim checked |" in one._repr_markdown_()


def test_an_empty_report_prints_an_empty_table() -> None:
    report = pv.ProofReport()
    assert str(report).splitlines()[-1] == "0 of 0 theorems hold"
    assert "<tbody></tbody>" in report._repr_html_()


def test_repr_escapes_hostile_text() -> None:
    def prove() -> Derivation:
        raise ProofError("<script>alert(1)</script> | \x1b[31m")

    r = run_theorem(_theorem(prove, name="x<b>y"))
    html_ = r._repr_html_() + pv.ProofReport([r])._repr_html_()
    assert "<script>" not in html_ and "&lt;script&gt;" in html_ and "<b>y" not in html_
    md = pv.ProofReport([r])._repr_markdown_()
    assert "<b>" not in md
    assert "\x1b" not in str(r)


def test_results_stream_one_by_one_through_the_callback() -> None:
    seen: list[tuple[str, int]] = []
    calls = iter(range(100))

    def on_result(r: ProofResult) -> None:
        seen.append((r.name, next(calls)))

    import mha_symbolic.exact.prove as mod

    ran: list[str] = []
    real = mod.run_theorem

    def spy(theorem: Theorem, **kw: object) -> ProofResult:
        # the previous theorem's callback has fired before the next theorem starts
        assert len(seen) == len(ran), (seen, ran)
        ran.append(theorem.name)
        return real(theorem, **kw)  # type: ignore[arg-type]

    mod.run_theorem = spy  # type: ignore[assignment]
    try:
        report = run_proofs(only=["uniform", "shift", "masking"], on_result=on_result)
    finally:
        mod.run_theorem = real  # type: ignore[assignment]
    assert [name for name, _ in seen] == ["uniform", "shift", "masking"] == [r.name for r in report]


def test_cli_prove_prints_each_row_as_the_theorem_finishes(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    printed_before: list[str] = []
    real = pv.run_theorem

    def spy(theorem: Theorem, **kw: object) -> ProofResult:
        printed_before.append(capsys.readouterr().out)  # what was printed before this one
        return real(theorem, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(pv, "run_theorem", spy)
    assert cli_module.main(["prove", "--only", "uniform", "--only", "shift"]) == 0
    assert "theorem" in printed_before[0] and "uniform" not in printed_before[0]
    assert printed_before[1].lstrip().startswith("1") and "uniform" in printed_before[1]


def test_prove_help_lists_the_theorem_names_and_examples(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_module.main(["prove", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in EXPECTED:
        assert name in out
    assert "examples:" in out and "mha-symbolic prove --pdf proofs.pdf" in out


def test_prove_only_unknown_name_lists_the_choices_and_echoes_safely(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["prove", "--only", "nope\x1b[2J"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err
    assert "names no theorem" in err and ", ".join(EXPECTED) in err


def test_prove_pdf_bad_path_is_refused_before_any_proof(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(pv, "run_theorem", lambda *a, **k: pytest.fail("a proof ran"))
    assert cli_module.main(["prove", "--pdf", str(tmp_path / "no" / "such" / "x.pdf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert cli_module.main(["prove", "--pdf", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert cli_module.main(["prove", "--pdf", "-"]) == 2
    assert "cannot go to standard output" in capsys.readouterr().err
    assert cli_module.main(["prove", "--pdf", "a\x00b.pdf"]) == 2
    assert "not a valid file name" in capsys.readouterr().err


def test_prove_pdf_without_pdflatex_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import mha_symbolic._latex as lx

    monkeypatch.setattr(lx, "pdflatex_path", lambda: None)
    monkeypatch.setattr(pv, "run_theorem", lambda *a, **k: pytest.fail("a proof ran"))
    assert cli_module.main(["prove", "--pdf", str(tmp_path / "p.pdf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pdflatex" in err and not (tmp_path / "p.pdf").exists()


@pytest.mark.skipif(pdflatex_path() is None, reason="pdflatex is not installed")
def test_prove_pdf_writes_a_pdf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "proofs.pdf"
    assert cli_module.main(["prove", "--only", "uniform", "--pdf", str(target)]) == 0
    assert target.read_bytes()[:5] == b"%PDF-"
    assert "PDF written to" in capsys.readouterr().out


@pytest.mark.skipif(pdflatex_path() is None, reason="pdflatex is not installed")
def test_proofs_pdf_has_no_overfull_or_underfull_box(results: list[ProofResult],
                                                     tmp_path: Path) -> None:
    master = pv.write_latex(results, tmp_path)
    log = tmp_path / "proofs.log"
    compile_tex(master, runs=1, log_to=log)
    text = log.read_text(errors="replace")
    bad = [line for line in text.splitlines() if "Overfull" in line or "Underfull" in line]
    assert bad == []


def test_theorem_6_names_the_second_moment_it_sums() -> None:
    # issue 27 item 6: the proofs page showed the double sum bare, without E[X^2] = ...
    (scale,) = [t for t in load_theorems() if t.name == "scale"]
    steps = scale.prove().steps
    (step,) = [s for s in steps if r"\delta" in s.reason]
    assert step.lhs == r"\mathbb{E}\left[X^2\right]"
    total, _, closed = step.rhs.partition(" = ")
    assert total.startswith(r"\sum") and r"\delta" in total and closed.startswith("d_{k}^{2}")
    assert not any(s.lhs.startswith(r"\sum_{\substack") for s in steps)
