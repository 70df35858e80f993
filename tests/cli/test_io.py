"""Reading untrusted input with the limit applied first, and output paths checked
before any work (mha_symbolic/_io.py)."""

from __future__ import annotations

import doctest
import io
import os
from pathlib import Path

import pytest
from conftest import time_limit

from mha_symbolic import _io
from mha_symbolic._io import output_path, read_bounded, write_output
from mha_symbolic.errors import ExampleFileError


def test_doctests() -> None:
    assert doctest.testmod(_io, optionflags=doctest.ELLIPSIS).failed == 0


def test_size_is_checked_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "big"
    with open(f, "wb") as out:
        out.truncate(10**9)  # sparse
    opened: list[str] = []
    real_open = open

    real_os_open = os.open

    def spy(path: object, *args: object, **kwargs: object) -> object:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    def os_spy(path: object, *args: object, **kwargs: object) -> int:
        opened.append(str(path))
        return real_os_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("builtins.open", spy)
    monkeypatch.setattr(os, "open", os_spy)
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    assert read_bounded(small, 100) == b"abc" and str(small) in opened  # the spies see opens
    with pytest.raises(ExampleFileError, match="larger than 100 bytes"):
        read_bounded(f, 100)
    assert str(f) not in opened  # refused from the size alone


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: os.mkfifo(p), "not a regular file"),
])
def test_what_is_not_a_regular_file_is_named(tmp_path: Path, make: object, message: str) -> None:
    p = tmp_path / "x"
    make(p)  # type: ignore[operator]
    with pytest.raises(ExampleFileError, match=message):
        read_bounded(p, 100)


def test_stdin_is_bounded_too() -> None:
    assert read_bounded("-", 3, stdin=io.BytesIO(b"abc")) == b"abc"
    with pytest.raises(ExampleFileError, match="<stdin>: larger than 3 bytes"):
        read_bounded("-", 3, stdin=io.BytesIO(b"abcd"))


def test_output_path_refuses_what_a_user_never_means(tmp_path: Path) -> None:
    src = tmp_path / "in.toml"
    src.write_text("x")
    assert output_path(None) is None and output_path("-") is None
    with pytest.raises(ExampleFileError, match="empty file name"):
        output_path("")
    with pytest.raises(ExampleFileError, match="is a directory"):
        output_path(str(tmp_path))
    with pytest.raises(ExampleFileError, match="does not exist"):
        output_path(str(tmp_path / "missing" / "out.tex"))
    with pytest.raises(ExampleFileError, match="refusing to overwrite"):
        output_path(str(src), inputs=[str(src)])
    assert output_path(str(tmp_path / "new.tex"), inputs=[str(src)]) == tmp_path / "new.tex"


def test_write_errors_name_the_file() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with pytest.raises(OSError) as info:
        write_output(Path("/dev/full"), "x" * 100_000)
    assert info.value.filename == "/dev/full" and "No space" in str(info.value.strerror)


@pytest.mark.parametrize("name", ["a\x00b", "\ud800", "x\udbff.toml"])
def test_names_no_file_can_have_are_one_line_errors(name: str, tmp_path: Path) -> None:
    # found by the long fuzz run: pathlib raised ValueError / UnicodeEncodeError
    with pytest.raises(ExampleFileError, match="not a valid file name"):
        read_bounded(name, 100)
    with pytest.raises(ExampleFileError, match="not a valid file name"):
        output_path(name, inputs=[name])


def test_the_command_line_refuses_such_names_with_exit_2(tmp_path: Path) -> None:
    from mha_symbolic.cli import main

    assert main(["check", "\ud800"]) == 2
    assert main(["derive", "examples/seed.toml", "-o", "a\x00b"]) == 2
    assert main(["prove", "--only", "uniform", "--latex", "\ud800"]) == 2


def test_a_file_swapped_for_a_pipe_after_stat_is_refused_without_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the name passes stat() as a regular file, then turns out to be a FIFO with no writer:
    # open() must not wait for one (O_NONBLOCK), and fstat() of what was opened decides
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real_stat = Path.stat
    regular = os.stat_result((0o100644, 0, 0, 1, 0, 0, 10, 0, 0, 0))
    monkeypatch.setattr(Path, "stat", lambda self, **kw: regular if self == fifo
                        else real_stat(self, **kw))
    with time_limit(30), pytest.raises(ExampleFileError, match="not a regular file"):
        read_bounded(fifo, 100)
