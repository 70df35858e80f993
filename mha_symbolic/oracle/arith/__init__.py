"""The oracle's shared arithmetic, below both passes: binary formats and correct
rounding (:mod:`.formats`), error-free transformations and double-double
(:mod:`.dd`), the proved exponentials (:mod:`.expo`), error-free matrix products
(:mod:`.products`), the fused loops and their numba twins (:mod:`.jit`,
:mod:`._numba_kernels`), Arb balls (:mod:`.balls`), exact ties (:mod:`.ties`) and the
constants of the error analysis (:mod:`.constants`).  Nothing here knows attention's
conventions or its variants."""
