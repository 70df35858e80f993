"""Issue 30 (the fuzz's ``bounded`` class, seed 71 #2131 …): the diagnosis "the printed
values are what another input X′ gives" moved ``0.6698^(99999 + π)`` from the values
into the keys, where SymPy's e^x expanded it into a 400,000-digit rational (48 CPU s
for one claim).  Such an alternative is skipped now; the verdict is unchanged and
ordinary alternatives are still tried.  Expected values come from mpmath and integer
arithmetic, never from the code under test."""

from __future__ import annotations

import math
from typing import Any

import mpmath
import pytest
import sympy as sp

from mha_symbolic.exact.grammar import MAX_POWER_DIGITS
from mha_symbolic.textbook import check_examples, load_examples
from mha_symbolic.textbook.alternatives import costly_power


def test_costly_power_follows_the_grammars_bound_on_an_exact_power() -> None:
    b = sp.Rational(3349, 5000)
    # 5000^99999 has about 370,000 digits, 5000^1000 has 3,700: the grammar's bound
    # on an exact a^n is MAX_POWER_DIGITS (20,000)
    assert math.floor(99999 * math.log10(5000)) + 1 > MAX_POWER_DIGITS
    assert len(str(5000**1000)) <= MAX_POWER_DIGITS
    assert costly_power(b ** (99999 + sp.pi))
    assert costly_power(3 + 2 * b ** (99999 - sp.E))
    assert not costly_power(b ** (1000 + sp.pi))
    assert not costly_power(sp.sqrt(2) + b ** sp.Rational(7, 2))
    # (1 + √2)^5361 expands into 5362 terms of growing coefficients (cost 5362 · 5361)
    assert costly_power((1 + sp.sqrt(2)) ** (5364 - sp.E))
    assert not costly_power((1 + sp.sqrt(2)) ** (64 - sp.E))
    assert not costly_power(sp.exp(-sp.Integer(10) ** 6))  # e^x is not a power a^y
    assert not costly_power(sp.Rational(1, 3))


def _huge_key(kwargs: dict[str, Any]) -> bool:
    """Whether an engine call got the huge power as a key entry (its text or its
    SymPy form: the exponent 99999 ± c)."""
    key = kwargs.get("key")
    return isinstance(key, list) and any("99999" in str(e) for row in key for e in row)


@pytest.mark.parametrize("power", ["0.6698^(99999 + pi)", "0.6698^(99999 - e)"])
def test_a_huge_power_is_refused_before_sympy_expands_it(power: str) -> None:
    # the fuzz's bounded-2131 / bounded-29531 input.  Typed in the keys, SymPy expanded
    # it inside exp() (74.6 CPU s); as a value, the diagnosis moved it into the keys.
    # Now the grammar refuses it at load, and the engine refuses the same SymPy value.
    import time

    from mha_symbolic.errors import InputValueError, MhaSymbolicError
    from mha_symbolic.exact.engine import exact_attention

    for where in ("key", "value"):
        other = "value" if where == "key" else "key"
        text = (f'[[example]]\nquery = [["2^-1", -2], ["ln(3)", 5]]\n{where} = [["{power}", -2]]\n'
                f'{other} = [["ln(3)", 1e-3]]\n[[example.claim]]\n'
                'quantity = "output[1,1]"\nclaimed = "1.2e3"\n')
        t = time.process_time()
        with pytest.raises(MhaSymbolicError, match=r"about \d+ digits"):
            check_examples(load_examples(text=text))
        assert time.process_time() - t < 30
    b = sp.Rational(3349, 5000)
    x = b ** (99999 + sp.pi) if "+" in power else b ** (99999 - sp.E)
    with pytest.raises(InputValueError, match="integer part"):
        exact_attention(query=[[1, 2]], key=[[x, -2]], value=[[1, 2]])
    # mpmath: the value is below 10^-17000 (why a claim of 1.2e3 about it is wrong)
    with mpmath.workdps(30):   # (never mp.dps = …: other test modules set it at import)
        assert mpmath.log10(mpmath.mpf("0.6698") ** (99999 + mpmath.pi)) < -17000


def test_the_diagnosis_still_names_an_alternative_holding_a_moderate_power() -> None:
    # the printout is what the values in place of the keys give; a = 0.6698^(2 + π)
    with mpmath.workdps(40):
        a = (mpmath.mpf(3349) / 5000) ** (2 + mpmath.pi)
        s1, s2 = (a * 1 + 1 * 2) / mpmath.sqrt(2), (3 * 1 + 0 * 2) / mpmath.sqrt(2)
        out = (mpmath.exp(s1) * a + mpmath.exp(s2) * 3) / (mpmath.exp(s1) + mpmath.exp(s2))
        # the shown input gives another value: keys (0.5, 1) and (2, 0)
        t1, t2 = (0.5 + 2) / mpmath.sqrt(2), 2 / mpmath.sqrt(2)
        shown = (mpmath.exp(t1) * a + mpmath.exp(t2) * 3) / (mpmath.exp(t1) + mpmath.exp(t2))
        printed = mpmath.nstr(out, 6)
        assert mpmath.nstr(shown, 6) != printed
    text = ('[[example]]\nquery = [[1, 2]]\nkey = [["0.5", 1], [2, 0]]\n'
            'value = [["0.6698^(2 + pi)", 1], [3, 0]]\n[[example.claim]]\n'
            f'quantity = "output[1,1]"\nclaimed = "{printed}"\n')
    report = check_examples(load_examples(text=text)).text()
    assert "wrong" in report
    assert "the printed values are what another input gives: value in place of key" in report
