"""Every optional part missing is one line and exit status 2, with nothing left behind:
matplotlib (figures), pdflatex (--pdf), torch, jax, numba, hypothesis."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from mha_symbolic.cli import main
from mha_symbolic.errors import OptionalDependencyError

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed.toml"
HINT = "figures need matplotlib: pip install 'mha-symbolic[plot]'"


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises, find_spec is None


@pytest.fixture
def no_pdflatex(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_derive_figures_without_matplotlib_is_one_line_and_leaves_nothing(
        no_matplotlib: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["derive", str(SEED), "-o", "s.tex", "--figures"]) == 2
    err = capsys.readouterr().err
    assert err == f"mha-symbolic derive: error: {HINT}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no s-figures/, no s.tex


@pytest.mark.parametrize("kind", ["collapse", "heatmap"])
def test_plot_without_matplotlib_is_one_line_and_leaves_nothing(
        kind: str, no_matplotlib: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "f.png"
    assert main(["plot", kind, "--example", "seed:G", "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"mha-symbolic plot: error: {HINT}\n"
    assert not out.exists()


def test_the_figures_library_call_without_matplotlib_names_the_extra(no_matplotlib: None,
                                                                     tmp_path: Path) -> None:
    from mha_symbolic.textbook.figures import collapse_figure

    with pytest.raises(OptionalDependencyError, match=r"^figures need matplotlib: pip install "):
        collapse_figure(tmp_path / "c.png", n_tokens=3, gap=20)
    assert list(tmp_path.iterdir()) == []


def test_derive_pdf_without_pdflatex_writes_nothing(no_pdflatex: None, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.tex"
    assert main(["derive", "--example", "seed:C", "-o", str(out), "--pdf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mha-symbolic derive: error: --pdf needs pdflatex: install a TeX system")
    assert err.count("\n") == 1 and not out.exists()


def test_prove_pdf_without_pdflatex_is_one_line(no_pdflatex: None, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.pdf"
    assert main(["prove", "--only", "1", "--pdf", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pdflatex" in err and err.count("\n") == 1 and not out.exists()


def test_torch_tensors_without_torch_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from mha_symbolic.testing.strategies import AttentionCase  # needs hypothesis only

    monkeypatch.setitem(sys.modules, "torch", None)
    c = AttentionCase.__new__(AttentionCase)  # .torch() asks for torch before anything else
    with pytest.raises(OptionalDependencyError, match=r"needs torch: pip install 'mha-symbolic\[torch\]'"):
        c.torch()


def test_jax_arrays_without_jax_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from mha_symbolic.testing import check as check_mod

    monkeypatch.setitem(sys.modules, "jax", None)
    monkeypatch.setitem(sys.modules, "jax.numpy", None)
    fn = getattr(check_mod, "_run_jax", None)
    if fn is None:
        pytest.skip("no jax runner to exercise")
    with pytest.raises(OptionalDependencyError, match=r"needs jax: pip install 'mha-symbolic\[jax\]'"):
        fn(lambda *a, **k: None, *([np.zeros((1, 1, 1, 1))] * 3), None, {}, 0)


def test_without_numba_the_oracle_runs_its_numpy_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_symbolic.oracle.arith as oracle_pkg
    from mha_symbolic.oracle.arith import jit

    # `from . import _numba_kernels` finds an imported submodule on its package first
    monkeypatch.delattr(oracle_pkg, "_numba_kernels", raising=False)
    monkeypatch.setitem(sys.modules, "numba", None)
    monkeypatch.setitem(sys.modules, "mha_symbolic.oracle.arith._numba_kernels", None)
    cache = getattr(jit._kernels, "cache_clear", None)
    if cache is None:
        pytest.skip("the kernels are not cached through functools")
    cache()
    try:
        assert jit.numba_active() is False
    finally:
        cache()


def test_the_derive_library_call_without_matplotlib_leaves_no_folder(
        no_matplotlib: None, tmp_path: Path) -> None:
    from mha_symbolic.textbook.derivation.build import derive
    from mha_symbolic.textbook.examples import load_examples

    folder = tmp_path / "figs"
    with pytest.raises(OptionalDependencyError, match="matplotlib"):
        derive(load_examples(SEED)[0], figures=folder)
    assert not folder.exists()
