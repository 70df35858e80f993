"""The package surface: a light import, resolvable public names, the doctests of the
foundation modules."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mha_symbolic
from mha_symbolic import errors

REPO_ROOT = Path(__file__).resolve().parents[2]

FOUNDATION = ["exact.grammar", "exact.certified", "exact.spec", "exact.shapes", "exact.params",
              "exact.engine", "errors", "cli"]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT, env=env)


def test_import_is_light() -> None:
    r = _python(
        "import json, sys, mha_symbolic, mha_symbolic.cli, mha_symbolic.errors\n"
        "mha_symbolic.cli.build_parser()\n"
        "heavy = ['sympy', 'mpmath', 'flint', 'torch', 'jax', 'matplotlib', 'numpy']\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))"
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def test_help_does_not_import_heavy_modules() -> None:
    r = _python(
        "import json, sys\n"
        "from mha_symbolic.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps([m for m in ('sympy', 'mpmath', 'flint') if m in sys.modules]))"
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_lazy_export_loads_on_first_use() -> None:
    r = _python(
        "import sys, mha_symbolic\n"
        "assert 'sympy' not in sys.modules\n"
        "print(mha_symbolic.parameter_count(d_model=512, heads=8, bias=False).total)"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1048576"


def test_all_is_sorted_and_names_the_exports() -> None:
    assert mha_symbolic.__all__ == sorted(mha_symbolic.__all__)
    assert set(mha_symbolic.__all__) == set(mha_symbolic._EXPORTS)
    assert set(dir(mha_symbolic)) >= set(mha_symbolic.__all__)


def _module_exists(module: str) -> bool:
    return importlib.util.find_spec(f"mha_symbolic.{module}") is not None


@pytest.mark.parametrize("name", mha_symbolic.__all__)
def test_every_public_name_resolves(name: str) -> None:
    module = mha_symbolic._EXPORTS[name]
    if not _module_exists(module):
        pytest.skip(f"mha_symbolic.{module} is not written yet")
    value = mha_symbolic.__getattr__(name)  # the PEP 562 resolver itself
    assert value is getattr(importlib.import_module(f"mha_symbolic.{module}"), name)


def test_no_public_name_is_shadowed_by_a_submodule() -> None:
    # Importing a submodule binds it as a package attribute; a public function with the
    # same name as its module would then be replaced by the module (bug P1, fixed by
    # naming the modules certified.py and derivation.py).
    modules = {p.stem for p in (REPO_ROOT / "mha_symbolic").glob("*.py")}
    assert not set(mha_symbolic.__all__) & modules


def test_function_survives_importing_its_module() -> None:
    r = _python(
        "import mha_symbolic\n"
        "from mha_symbolic.exact.certified import to_arb  # binds mha_symbolic.exact.certified\n"
        "import mha_symbolic.textbook.derivation\n"
        "print(mha_symbolic.certify('1/3').digits(5), callable(mha_symbolic.derive))"
    )
    assert r.returncode == 0, r.stderr[-300:]
    assert r.stdout.strip() == "0.33333… True"


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        mha_symbolic.no_such_name  # noqa: B018


def test_error_hierarchy() -> None:
    root = errors.MhaSymbolicError
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, root)
    value_errors = ["SpecError", "ShapeError", "ParseError", "ExampleFileError", "ClaimError",
                    "InputValueError"]
    for name in value_errors:
        assert issubclass(getattr(errors, name), ValueError), name
    assert issubclass(errors.PrecisionError, ArithmeticError)
    for name in ("ProofError", "AttentionMismatchError"):
        assert issubclass(getattr(errors, name), AssertionError), name
    assert issubclass(errors.OptionalDependencyError, ImportError)


def test_optional_dependency_error_gives_an_install_hint() -> None:
    e = errors.OptionalDependencyError("torch", "the torch oracle", extra="torch")
    assert "pip install 'mha-symbolic[torch]'" in str(e)
    assert e.package == "torch" and e.feature == "the torch oracle"
    assert "pip install matplotlib" in str(errors.OptionalDependencyError("matplotlib", "plots"))


@pytest.mark.parametrize("module", FOUNDATION)
def test_doctests_of_foundation_modules(module: str) -> None:
    mod = importlib.import_module(f"mha_symbolic.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_package_doctest() -> None:
    result = doctest.testmod(mha_symbolic)
    assert result.failed == 0 and result.attempted > 0


def test_version_is_consistent_with_pyproject() -> None:
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'version = "{mha_symbolic.__version__}"' in text
