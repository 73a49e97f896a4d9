"""The support-ticket example's story, for its end-to-end tests in either language.

Crash the agent after its N-th effect, run it again until it answers (a person
settling between runs what only a person can), then count: each effect once in the
ledger (examples/ledger.py's format, which the TypeScript example writes too).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from approvals.decisions import mark_effect_done, release_effect
from runs.models import Effect, Run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import ledger  # noqa: E402

CRASHED, NEEDS_PERSON = 137, 3
LEDGER_KIND = {"send_reply": "reply", "import_dataset": "import", "send_campaign": "campaign"}

# (command, operator) -> (exit code, output): one run of the agent to its end.
Drive = Callable[[list[str], object], tuple[int, str]]


def in_the_ledger(ledger_path: Path, effect: Effect) -> bool:
    """Whether the provider (the ledger) shows the effect, by its own identity of it."""
    kind = LEDGER_KIND[effect.tool]
    identity = {
        "reply": effect.args.get("message_id"),
        "import": effect.key,
        "campaign": effect.args.get("campaign_id"),
    }[kind]
    return ledger.find(ledger_path, kind, identity) is not None


def settle_unknowns(operator, ledger_path: Path) -> None:
    """A person looks each unknown effect up at the provider (the ledger) and decides."""
    for effect in Effect.objects.filter(status="unknown"):
        kind = LEDGER_KIND[effect.tool]
        if in_the_ledger(ledger_path, effect):
            mark_effect_done(
                operator, effect.id, args_hash=effect.args_hash, note=f"found in the {kind} log"
            )
        else:
            release_effect(
                operator, effect.id, args_hash=effect.args_hash, note=f"not in the {kind} log"
            )


def crash_then_answer(
    drive: Drive, command: list[str], operator, ledger_path: Path, crash_after: int, *, told: str
) -> list[str]:
    """Crash after the ``crash_after``-th effect, then run again until answered.

    Checks that the effect caught between doing and reporting settled the right way:
    the reply and the import through their lookup, at once; the campaign, which has
    none, by a person after a run that stopped for one (its output says ``told``).
    Returns every run's output.
    """
    code, output = drive([*command, "--crash-after", str(crash_after)], operator)
    assert code == CRASHED, output
    assert len(ledger.entries(ledger_path)) == crash_after  # it did them, then died
    crashed_kind = ledger.entries(ledger_path)[-1]["kind"]

    outputs, codes = [output], []
    for _ in range(3):  # run again until answered, deciding between runs as a person
        code, output = drive(command, operator)
        outputs.append(output)
        codes.append(code)
        if code != NEEDS_PERSON:
            break
        settle_unknowns(operator, ledger_path)
    assert code == 0, "\n---\n".join(outputs)

    crashed = Effect.objects.get(tool=next(t for t, k in LEDGER_KIND.items() if k == crashed_kind))
    if crashed_kind == "campaign":
        assert codes[0] == NEEDS_PERSON and told in outputs[1]
        assert crashed.decision["verb"] == "marked_done"
    else:
        assert codes == [0]
        assert crashed.decision["verb"] == "reconciled"
    return outputs


def assert_each_effect_once(
    drive: Drive, command: list[str], operator, ledger_path: Path, counter: list[str]
) -> None:
    """Each effect once in the ledger (``counter``, the example's own counting command,
    says so too); the run completed on a later attempt, its effects all done; and
    running the agent once more changes nothing."""
    counts = ledger.counts(ledger_path)
    assert sorted(kind for kind, _ in counts) == ["campaign", "import", "reply"]
    assert set(counts.values()) == {1}, counts
    counted = subprocess.run(
        [*counter, str(ledger_path)], capture_output=True, text=True, check=False
    )
    assert counted.returncode == 0 and "duplicates: 0" in counted.stdout, counted.stdout

    run = Run.objects.get(run_key="ticket-4812")
    assert run.status == "completed" and run.current_attempt >= 2
    assert sorted(Effect.objects.values_list("status", flat=True)) == ["done"] * 3

    code, output = drive(command, operator)
    assert code == 0 and "already answered" in output
    assert ledger.counts(ledger_path) == counts
