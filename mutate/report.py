"""``python -m mutate.report``: mutmut's results as a report, and the score's floor.

Reads what ``mutmut run`` left in ``mutants/`` and writes ``var/mutate/report.txt``:
killed/total per module, then every mutant not killed with its diff, each marked
either with the reason docs/guarantees.md gives for it ("Mutation testing",
its survivors table) or as NOT JUDGED: a one-line bug the tests let through that
nobody has looked at yet. Prints the summary; exits 1 when the score is under
``MUTATE_MIN_SCORE`` percent (default 90) or a survivor is not judged.

Killed: a selected test failed (or ran past its timeout: in make test too, a run
that never ends fails). Not killed: "survived" (every test that reaches the
function passed), "no tests" (no selected test reaches the function at all) and
"suspicious" (the run ended in an unexpected way).
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import walk_mutatable_files

REPORT = Path("var/mutate/report.txt")
GUARANTEES = Path("docs/guarantees.md")
KILLED = {"killed", "timeout", "caught by type check"}
NOT_JUDGED = "NOT JUDGED: a gap in the tests until shown otherwise"
# A row of the survivors table in docs/guarantees.md: | `runs.calls.x_f__mutmut_3` | ... |
JUDGED_ROW = re.compile(
    r"^\|\s*`(?P<name>[\w.]+__mutmut_\d+)`\s*\|.*\|\s*(?P<reason>[^|]+?)\s*\|\s*$"
)


def judged_survivors(text: str) -> dict[str, str]:
    """Mutant name -> the reason docs/guarantees.md gives for letting it survive."""
    return {m["name"]: m["reason"] for line in text.splitlines() if (m := JUDGED_ROW.match(line))}


def collect() -> dict[str, dict[str, str]]:
    """Module path -> mutant name -> status."""
    results = {}
    for path in sorted(walk_mutatable_files()):
        data = SourceFileMutationData(path=path)
        data.load()
        results[str(path)] = {
            name: status_by_exit_code[code] for name, code in data.exit_code_by_key.items()
        }
    return results


def score(statuses) -> tuple[int, int]:
    statuses = list(statuses)
    return sum(status in KILLED for status in statuses), len(statuses)


def render(results, judged, *, now: datetime) -> tuple[str, int, int, list[str]]:
    lines = [f"make mutate, {now:%Y-%m-%d %H:%M} UTC", ""]
    lines.append(f"{'module':28} {'killed':>7} {'total':>6} {'score':>7}  not killed")
    all_statuses = []
    for path, by_name in results.items():
        killed, total = score(by_name.values())
        all_statuses += by_name.values()
        others = Counter(s for s in by_name.values() if s not in KILLED)
        rest = ", ".join(f"{n} {s}" for s, n in sorted(others.items())) or "-"
        lines.append(f"{path:28} {killed:7} {total:6} {_pct(killed, total):>7}  {rest}")
    killed, total = score(all_statuses)
    lines.append(f"{'all':28} {killed:7} {total:6} {_pct(killed, total):>7}")
    lines += [
        "",
        "Mutants not killed (docs/guarantees.md, 'Mutation testing', says why each may be):",
    ]
    not_judged = []
    for path, by_name in results.items():
        for name, status in sorted(by_name.items(), key=lambda item: _natural(item[0])):
            if status in KILLED:
                continue
            reason = judged.get(name)
            if reason is None:
                not_judged.append(name)
            lines += [
                "",
                f"{name}: {status}",
                "  " + (f"judged: {reason}" if reason else NOT_JUDGED),
            ]
            lines += ["  " + line for line in get_diff_for_mutant(name, path=path).splitlines()[2:]]
    return "\n".join(lines) + "\n", killed, total, not_judged


def _pct(killed: int, total: int) -> str:
    return f"{100 * killed / total:.1f}%" if total else "-"


def _natural(name: str):
    head, _, number = name.rpartition("__mutmut_")
    return head, int(number or 0)


def main() -> int:
    floor = float(os.environ.get("MUTATE_MIN_SCORE", "90"))
    results = collect()
    if not any(results.values()):
        print("No mutmut results in mutants/: run `make mutate` first.")
        return 2
    judged = judged_survivors(GUARANTEES.read_text(encoding="utf-8"))
    text, killed, total, not_judged = render(results, judged, now=datetime.now(UTC))
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text, encoding="utf-8")
    print(text.split("\n\n", 2)[1])
    print(f"\nEvery mutant not killed, with its diff: {REPORT}")
    failed = False
    if 100 * killed / total < floor:
        print(f"The score is under MUTATE_MIN_SCORE={floor:g}%.")
        failed = True
    if not_judged:
        print(
            f"{len(not_judged)} not killed and not judged in {GUARANTEES} (first: {not_judged[0]}):"
            " write the test that kills it, or say there why it is harmless."
        )
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
