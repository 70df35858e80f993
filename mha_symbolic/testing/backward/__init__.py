"""Verdicts on gradients: the backward error model (:mod:`.model`), the bug
catalogue (:mod:`.bugs`) and the comparisons (:mod:`.compare`, :mod:`.mha`)."""
