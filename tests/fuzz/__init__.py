"""Fuzzing mha-symbolic with hostile input (issue 15).

* :mod:`.generators` — the input generators, written once against a tiny ``Source``
  interface and driven either by hypothesis (the quick run in the normal test suite,
  with shrinking) or by a seeded PRNG (the long run: a million inputs, reproducible by
  index);
* :mod:`.properties` — what must hold for every input: only the package's own
  errors, one short line per error, no control character in any report, no TeX
  command from a file in LaTeX output, no file written outside the output folder;
* :mod:`.long` — the long run, ``python -m tests.fuzz.long --inputs 1000000``;
* :mod:`.atheris_parsers` — coverage-guided fuzzing of the two parsers with atheris.
"""
