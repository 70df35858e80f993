"""Hypothesis strategies of adversarial attention inputs: the public path of
:mod:`mha_symbolic.testing.strategies` (importing it needs ``hypothesis``).

>>> from mha_symbolic.strategies import attention_inputs
>>> strategy = attention_inputs(dtype="bfloat16")
"""

from __future__ import annotations

from .testing.strategies import FAMILIES, AttentionCase, attention_inputs

__all__ = ["FAMILIES", "AttentionCase", "attention_inputs"]
