"""CI tests what the README promises: its test command, verbatim, in a bare venv
without TeX before anything optional is installed; then the full suite."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _readme_test_command() -> str:
    m = re.search(r"# 2\. install, and run the tests\n(.+)\n", README)
    assert m is not None, "the README's second command is not where it was"
    return m.group(1).strip()


def test_ci_runs_the_readme_command_before_installing_anything_optional() -> None:
    command = _readme_test_command()
    assert command.endswith(".venv/bin/python -m pytest")
    first = CI.index(command)
    for optional in ("torch==", "matplotlib", "jax==", "numba==", "apt-get install"):
        later = [m.start() for m in re.finditer(re.escape(optional), CI)
                 if not CI[:m.start()].rstrip().endswith("#")]
        installs = [i for i in later if "pip install" in CI[CI.rfind("\n", 0, i):i]
                    or optional == "apt-get install"]
        assert installs and min(installs) > first, optional


def test_ci_hides_tex_from_the_bare_stage() -> None:
    stage1 = CI[:CI.index(_readme_test_command())]
    assert "pdflatex" in stage1 and 'PATH="$NOTEX"' in stage1
    # the stage checks it stayed bare
    assert "stage 1 was not bare" in CI
