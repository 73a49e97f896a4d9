"""make mutate: mutation testing of the journal's rule modules with mutmut.

mutmut (``[tool.mutmut]`` in pyproject.toml) copies the code into ``mutants/``, makes
one-line changes ("mutants") to the rule modules, learns which tests reach each
function, then, per mutant, runs only those tests, fastest first, stopping at the
first failure. A mutant whose tests still pass "survived": a one-line bug in a rule
that the suite lets through.

- ``mutate/pytest_plugin.py``: loaded into every pytest run mutmut makes; a mutant's
  run reuses the test database the first runs migrated instead of migrating again.
- ``mutate/report.py``: ``python -m mutate.report`` reads mutmut's results and writes
  ``var/mutate/report.txt`` (killed/total per module, each survivor with its diff).

What the score is and which survivors are judged harmless, with why:
docs/guarantees.md, "Mutation testing".
"""
