"""How a certified value shows its digits: scientific notation for very small or
large values, digits grouped in threes (siunitx-style), LaTeX.  Every digit kept is
one of the certified digits it is given; none is added or rounded.

>>> scientific("-0.0000098596…")
('-9.8596…', -6)
>>> grouped("0.99999999999998733583…", " ")
'0.999 999 999 999 987 335 83…'
"""

from __future__ import annotations

__all__ = ["grouped", "latex_digits", "latex_escape", "scientific"]


def scientific(text: str) -> tuple[str, int] | None:
    """Positional certified digits (``-0.000…0098596…``) as (mantissa, exponent)
    (``-9.8596…``, −305) when the exponent is below −4 or at least 21; None otherwise
    (or for zero).  Every digit kept is one of those shown."""
    sign = "-" if text.startswith("-") else ""
    more = text.endswith("…")
    body = text[len(sign):].removesuffix("…")
    head, _, tail = body.partition(".")
    digits = head + tail
    first = next((i for i, ch in enumerate(digits) if ch != "0"), None)
    if first is None:
        return None
    exp = len(head) - 1 - first
    if -4 <= exp < 21:
        return None
    sig = digits[first:]
    if len(sig) > 20:                  # a long integer part: its first 20 digits
        sig, more = sig[:20], more or sig[20:].strip("0") != ""
    if not more:
        sig = sig.rstrip("0") or "0"
    mant = sig[0] + ("." + sig[1:] if len(sig) > 1 else "")
    return sign + mant + ("…" if more else ""), exp


def grouped(text: str, sep: str) -> str:
    """Decimal digits in groups of three on both sides of the point (siunitx-style):
    ``0.99999999999998733583…`` → ``0.999 999 999 999 987 335 83…``."""
    head, point, tail = text.partition(".")
    sign = head[:1] if head[:1] == "-" else ""
    head = head[len(sign):]
    ell = "…" if tail.endswith("…") else ""
    tail = tail.removesuffix("…")
    if len(head) > 4 and head.isdigit():
        head = sep.join(head[max(i - 3, 0):i] for i in range(len(head), 0, -3)[::-1])
    if len(tail) > 4:
        tail = sep.join(tail[i:i + 3] for i in range(0, len(tail), 3))
    return sign + head + point + tail + ell


def latex_digits(text: str) -> str:
    r"""Certified digits for LaTeX: grouped with ``\,``, ``…`` as ``\ldots``."""
    return grouped(text, r"\,").replace("…", r"\ldots")


def latex_escape(text: str) -> str:
    from .._latex import latex_escape

    return latex_escape(text)
