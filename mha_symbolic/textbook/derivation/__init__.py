"""Step-by-step derivations of worked examples, as LaTeX or Markdown.

A derivation walks through one attention computation the way a textbook's
worked example does (the seed page is the model): the scores ``Q_i K_i^T``,
the scaling by ``1/sqrt(d_k)``, the softmax row by row, the weighted sum of
the values, the split into heads, the concatenation and ``W^O``; for shape
questions the shape algebra, for counts the sum of the parts.  Each step shows

* the symbolic form (``w_{rj} = e^{t_{rj}} / Σ_j' e^{t_{rj'}}``),
* the exact value where it is short (printed by SymPy's LaTeX printer, which
  places the parentheses; terminating rationals such as 1/2 print as ``0.5``,
  which is the same exact number),
* the decimal value with its *certified* digits
  (:meth:`~mha_symbolic.exact.certified.CertifiedValue.digits`: every printed digit is
  a digit of the exact value, ``…`` marks that more follow),
* and a one-line reason ("why this step").

Each example ends with its checks, *computed* here (weights positive: certified
signs; rows sum to 1: exact SymPy identity; outputs inside the coordinatewise
hull of the values: certified comparisons; shapes agree: the shape checker),
and, when the example states claims, the checker's verdict beside each claim.

Three formats: ``"tex"`` (a complete document that compiles with pdflatex,
amsmath and amssymb only, plus graphicx when figures are included),
``"fragment"`` (the body, for pasting into a book) and ``"markdown"``
(``$...$`` inline math and fenced ``math`` blocks, which GitHub renders;
``Derivation.markdown(math="dollars")`` writes ``$$...$$`` instead).

>>> from mha_symbolic.exact.engine import exact_attention
>>> att = exact_attention(scores=[[0, 0, 20]], value=[[10], [20], [30]])
>>> d = derive(att, format="markdown")
>>> [c.name for c in d.examples[0].checks]
['weights positive', 'rows sum to 1', 'outputs within the values', 'shapes agree']
>>> d.ok
True

The package's modules, one method each: :mod:`.model` (the format-neutral document:
steps, displays, checks, claims), :mod:`.numbers` (exact values and certified digits as
LaTeX: digit grouping, scientific notation, canonical softmax forms), :mod:`.matrices`,
:mod:`.attention` (the forward steps), :mod:`.variants`, :mod:`.backward`,
:mod:`.checks`, :mod:`.dimensions` (shape algebra and parameter counts), :mod:`.claims`,
:mod:`.notes` (the example's notes: their math typeset from a small safe grammar),
:mod:`.markup`, :mod:`.render_latex`, :mod:`.render_markdown` and :mod:`.build`
(:func:`derive` and the command).
"""

from __future__ import annotations

from .build import cli_derive, derive
from .model import Check, ClaimLine, Derivation, Display, ExampleDerivation, Figure, Paragraph, Step, Table

__all__ = [
    "Check",
    "ClaimLine",
    "Derivation",
    "Display",
    "ExampleDerivation",
    "Figure",
    "Paragraph",
    "Step",
    "Table",
    "cli_derive",
    "derive",
]

