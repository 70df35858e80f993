"""The forward pass, one file per tier (method): :mod:`.fast` (float64 with a proved
bound), :mod:`.dd` (double-double by blocks), :mod:`.rows` (double-double by rows),
:mod:`.arb` (ball arithmetic), the plain certified SDPA that drives them
(:mod:`.attention`) and the multi-head block (:mod:`.mha`)."""
