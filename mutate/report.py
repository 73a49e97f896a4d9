"""``python -m mutate.report``: mutmut's results as a report, and the score's floor.

Reads what ``mutmut run`` left in ``mutants/`` and writes ``var/mutate/report.txt``:
killed/total per module, then every mutant not killed with its diff, each marked
either with the reason docs/guarantees.md gives for it ("Mutation testing",
its survivors table) or as NOT JUDGED: a one-line bug the tests let through that
nobody has looked at yet. Prints the summary; exits 1 when the score is under
``MUTATE_MIN_SCORE`` percent (default 90) or a survivor is not judged.
``--not-killed`` only prints the names of the mutants not killed, ``--markdown`` the
score table of docs/guarantees.md.

Killed: a selected test failed (or ran past its timeout: in make test too, a run
that never ends fails). Not killed: "survived" (every test that reaches the
function passed), "no tests" (no selected test reaches the function at all) and
"suspicious" (the run ended in an unexpected way).
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import libcst as cst
from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import (
    get_diff_for_mutant,
    read_functions_from_index,
    read_mutant_function,
    read_mutants_module,
    read_original_function,
)
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import walk_mutatable_files

REPORT = Path("var/mutate/report.txt")
GUARANTEES = Path("docs/guarantees.md")
KILLED = {"killed", "timeout", "caught by type check"}
UNFINISHED = {"not checked", "check was interrupted by user"}
NOT_JUDGED = "NOT JUDGED: a gap in the tests until shown otherwise"
# A row of the survivors table in docs/guarantees.md: | `name`, `name` | change | reason |
JUDGED_ROW = re.compile(
    r"^\|(?P<names>[^|]*__mutmut_\d+`[^|]*)\|[^|]*\|\s*(?P<reason>.+?)\s*\|\s*$"
)
NAME = re.compile(r"`([\w.]+__mutmut_\d+)`")


# Kinds of change judged harmless wherever they are (docs/guarantees.md says why);
# every other survivor is judged by name there.
KINDS = {
    "message": "an error's message text (its code and details are the contract)",
    "log": "anything inside a logger call: a log line's text or fields, for people",
}


def _error_classes() -> set[str]:
    tree = ast.parse(Path("runs/errors.py").read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def _functions(name: str, path: str) -> tuple[ast.AST, ast.AST]:
    functions = read_functions_from_index(name, path)
    if functions is None:
        module = read_mutants_module(path)
        functions = (read_original_function(module, name), read_mutant_function(module, name))
    return tuple(ast.parse(cst.Module([function]).code) for function in functions)


def _change(a, b, parents=()):
    """Where two trees first differ: (the nodes above it, the old part, the new part)."""
    if type(a) is not type(b):
        return parents, a, b
    if isinstance(a, list):
        if len(a) != len(b):
            return parents, a, b
        for x, y in zip(a, b, strict=True):
            if site := _change(x, y, parents):
                return site
        return None
    if isinstance(a, ast.AST):
        for field in a._fields:
            if site := _change(getattr(a, field, None), getattr(b, field, None), (*parents, a)):
                return site
        return None
    return None if a == b else (parents, a, b)


def _is_logger_call(node) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "logger"
    )


def kind_of(name: str, path: str, errors: set[str]) -> str | None:
    """ "message" or "log" when the mutant changes only such a text, else None."""
    site = _change(*_functions(name, path))
    if site is None:
        return None
    parents, old, new = site
    if any(_is_logger_call(node) for node in parents):
        return "log"
    if isinstance(old, str) and parents and isinstance(parents[-1], ast.Constant):
        text, parents = parents[-1], parents[:-1]
    elif isinstance(old, ast.Constant | ast.JoinedStr) and not isinstance(new, list):
        text = old
    else:
        return None
    if not isinstance(text, ast.JoinedStr) and not isinstance(text.value, str):
        return None
    call = parents[-1] if parents else None
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id in errors
        and call.args
        and call.args[0] is text
    ):
        return "message"
    return None


def judged_survivors(text: str) -> dict[str, str]:
    """Mutant name -> the reason docs/guarantees.md gives for letting it survive."""
    return {
        name: m["reason"]
        for line in text.splitlines()
        if (m := JUDGED_ROW.match(line))
        for name in NAME.findall(m["names"])
    }


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
    errors = _error_classes()
    for path, by_name in results.items():
        for name, status in sorted(by_name.items(), key=lambda item: _natural(item[0])):
            if status in KILLED or status in UNFINISHED:
                continue
            reason = judged.get(name)
            if reason is None and (kind := kind_of(name, path, errors)):
                reason = f"{kind}: {KINDS[kind]}"
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
    if sys.argv[1:] == ["--not-killed"]:
        # For make mutate MUTATE_RESUME=1: mutmut re-tests a mutant only when named.
        for by_name in results.values():
            print("\n".join(n for n, s in by_name.items() if s not in KILLED | UNFINISHED))
        return 0
    if sys.argv[1:] == ["--markdown"]:
        # The score table of docs/guarantees.md, "Mutation testing".
        print("| module | killed | total | score |\n| --- | ---: | ---: | ---: |")
        every = []
        for path, by_name in results.items():
            killed, total = score(by_name.values())
            every += by_name.values()
            print(f"| `{path}` | {killed:,} | {total:,} | {_pct(killed, total)} |")
        killed, total = score(every)
        print(f"| all | {killed:,} | {total:,} | {_pct(killed, total)} |")
        return 0
    if not any(results.values()):
        print("No mutmut results in mutants/: run `make mutate` first.")
        return 2
    judged = judged_survivors(GUARANTEES.read_text(encoding="utf-8"))
    text, killed, total, not_judged = render(results, judged, now=datetime.now(UTC))
    unfinished = sum(s in UNFINISHED for by_name in results.values() for s in by_name.values())
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text, encoding="utf-8")
    print(text.split("\n\n", 2)[1])
    print(f"\nEvery mutant not killed, with its diff: {REPORT}")
    failed = False
    if unfinished:
        print(f"{unfinished} mutants not checked: the run was stopped (MUTATE_RESUME=1 goes on).")
        failed = True
    if 100 * killed / total < floor:
        print(f"The score is under MUTATE_MIN_SCORE={floor:g}%.")
        failed = True
    survivors = {n for by_name in results.values() for n, s in by_name.items() if s not in KILLED}
    gaps = sorted(n for n, reason in judged.items() if reason.startswith("GAP") and n in survivors)
    if gaps:
        print(f"{len(gaps)} known gaps, listed in {GUARANTEES} with the test that will kill them.")
    if stale := sorted(set(judged) - survivors):
        print(f"{len(stale)} judged in {GUARANTEES} are killed now or renamed: {', '.join(stale)}")
    if not_judged:
        print(
            f"{len(not_judged)} not killed and not judged in {GUARANTEES} (first: {not_judged[0]}):"
            " write the test that kills it, or say there why it is harmless."
        )
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
