"""Shared test helpers (kept minimal; fixtures that several test files need live here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mha_symbolic ARGV`` in a fresh interpreter (the package need not be
    installed: the repository root is put on PYTHONPATH)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "mha_symbolic", *argv],
        capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, env=env,
    )


@pytest.fixture
def cli():
    """The command line in a subprocess: ``cli("params", "--d-model", "8")``."""
    return run_cli
