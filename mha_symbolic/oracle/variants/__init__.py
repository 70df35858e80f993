"""The attention variants kernels ship: their exact semantics (:mod:`.semantics`),
the certified score_mod menu (:mod:`.score_mods`), lowering to plain attention and
varlen (:mod:`.forward`), their gradients (:mod:`.backward`), softcapped scores
(:mod:`.transformed`, :mod:`.transformed_backward`) and assembled enclosures
(:mod:`.views`)."""
