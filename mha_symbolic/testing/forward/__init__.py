"""Verdicts on the forward pass: the error model (:mod:`.model`, its variants'
terms in :mod:`.model_variants`), the dtype level (:mod:`.emulated`,
:mod:`.levels`, :mod:`.precision_bugs`), the bug catalogues (:mod:`.plain`,
:mod:`.bugs`, :mod:`.bugs_variants`) and the comparisons (:mod:`.compare`,
:mod:`.variants`, :mod:`.mha`)."""
