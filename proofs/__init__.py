"""Machine-checked proofs of the closed forms of attention (issue 5).

One module per theorem, ``tNN_<name>.py``, each defining
``THEOREM = mha_symbolic.exact.prove.Theorem(...)``.  ``mha-symbolic prove`` (or
:func:`mha_symbolic.exact.prove.run_proofs`) loads them by file path, from
``mha_symbolic/proofs`` in an installed wheel or from this directory in a
source checkout.  ``_common.py`` holds the symbols and the Arb helpers they
share.
"""
