"""Shared test helpers (kept minimal; fixtures that several test files need live here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# tests/ mirrors the package (tests/oracle/forward/, tests/testing/, tests/textbook/, ...);
# the shared helpers (this conftest) and the reference kernels (tests/kernels/) are
# imported by name from any folder
for _p in (Path(__file__).resolve().parent, Path(__file__).resolve().parent / "kernels"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


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


class Hang(Exception):
    """Raised by :func:`time_limit` when a call runs too long."""


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Turn a hang into a failure (SIGALRM; a no-op where there is none).  Tests never
    assert times: the limit only catches a call that does not return."""
    if not hasattr(signal, "SIGALRM"):  # pragma: no cover - Windows
        yield
        return

    def _raise(*_: object) -> None:
        raise Hang(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
