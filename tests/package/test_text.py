"""Safe text for people (mha_symbolic/_text.py): control characters made visible,
echoes cut, integers of any size printed without Python's 4300-digit limit, and an
ASCII fallback for terminals that cannot show the reports' symbols."""

from __future__ import annotations

import doctest

import pytest
import sympy as sp

from mha_symbolic import _text
from mha_symbolic._text import decimal_digits, echo, expr_text, has_control, int_text, sanitize


def test_doctests() -> None:
    assert doctest.testmod(_text, optionflags=doctest.ELLIPSIS).failed == 0


@pytest.mark.parametrize("ch", ["\x1b", "\x00", "\x07", "\x7f", "\x9b", "\x85", "\u202e",
                                "\u2066", "\u2069", "\u200f", "\u2028", "\r", "\t", "\n"])
def test_every_control_character_is_made_visible(ch: str) -> None:
    out = sanitize(f"a{ch}b")
    assert ch not in out and out.startswith("a\\") and out.endswith("b")
    assert has_control(f"x{ch}") and not has_control(out)


def test_printable_unicode_is_kept() -> None:
    text = "≈ 0.6698 ✓ × − … é π √2 中文"
    assert sanitize(text) == text and not has_control(text)


def test_echo_cuts_and_quotes() -> None:
    assert echo("abc") == "'abc'"
    long = echo("x" * 500)
    assert long.endswith("…'") and len(long) == 83
    assert echo("a\\nb") == "'a\\\\nb'"  # a backslash is doubled, as repr() does


@pytest.mark.parametrize("n", [0, 9, 10, 99, 100, 10**50 - 1, 10**50, 2**1000, 10**4400 + 7],
                         ids=lambda n: f"{n.bit_length()}-bit")
def test_decimal_digits_agree_with_exact_counting(n: int) -> None:
    # independent: the length of the decimal string (python-flint prints any size)
    from flint import fmpz

    assert decimal_digits(n) == len(str(fmpz(n)))
    assert decimal_digits(-n) == decimal_digits(n)


def test_int_and_expr_text_never_call_str_on_huge_integers() -> None:
    assert int_text(10**5000) == "<an integer of 5001 digits>"
    assert int_text(-(10**5000)) == "<a negative integer of 5001 digits>"
    assert expr_text(sp.Integer(10) ** 4500) == "<a number of about 4501 digits>"
    assert expr_text(sp.sqrt(2) + sp.Integer(10) ** 4500).startswith("<an expression holding")
    assert expr_text(sp.Add(*[sp.exp(sp.sqrt(k)) for k in range(2, 200)])) == "<a long expression>"


def test_ascii_fallback_writes_symbols_as_ascii() -> None:
    name = _text.register_ascii_fallback()
    assert "✓ ✗ ≈ − × … ½".encode("ascii", name) == b"ok XX ~ - x ... \\u00bd"
    assert "✓ ×".encode("cp1252", name) == "ok ×".encode("cp1252")  # × exists in cp1252
