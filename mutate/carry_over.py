"""``python -m mutate.carry_over``: keep mutmut's verdicts when tests were only added.

mutmut stores, beside its verdicts, a fingerprint of ``pytest_add_cli_args_test_selection``
(mutants/mutmut-stats.json) and resets every verdict when the list changes: a run from
scratch, an hour and a half on this machine. But a test file added to the list cannot
revive a mutant that the tests already listed killed. So before a resumed run
(``make mutate MUTATE_RESUME=1``), when the new list holds every file of the list the
verdicts were reached with, this module gives mutmut's stats the new list's fingerprint:
the verdicts stand, mutmut finds the added tests ("new tests", their coverage is
collected), and the resumed run tries every mutant not killed against them. When a file
was removed or an option changed, it does nothing and mutmut starts afresh, as it should.

The list a run used is written to ``mutants/test-selection.json`` (``--record``, at the
end of every ``make mutate``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mutmut.configuration import config

STATS = Path("mutants/mutmut-stats.json")
RECORDED = Path("mutants/test-selection.json")


def record() -> None:
    RECORDED.write_text(json.dumps(config().pytest_add_cli_args_test_selection, indent=1))


def carry_over() -> str:
    """What it did, in a line."""
    if not (STATS.exists() and RECORDED.exists()):
        return "no earlier run recorded: mutmut decides"
    old = json.loads(RECORDED.read_text())
    new = config().pytest_add_cli_args_test_selection
    if old == new:
        return "the test selection is unchanged"
    if not set(old) <= set(new):
        gone = ", ".join(sorted(set(old) - set(new)))
        return f"tests left the selection ({gone}): mutmut starts afresh"
    stats = json.loads(STATS.read_text())
    stats["config_fingerprint"]["test_selection"] = config().config_fingerprint()["test_selection"]
    STATS.write_text(json.dumps(stats))
    record()
    added = ", ".join(sorted(set(new) - set(old)))
    return f"tests only added ({added}): the verdicts stand, survivors meet the new tests"


def main() -> int:
    if sys.argv[1:] == ["--record"]:
        record()
        return 0
    print(f"mutate.carry_over: {carry_over()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
