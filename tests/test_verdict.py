"""The restart verdict (runs/verdict.py) and the operator's override (product.md)."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import read, send, start

from approvals.decisions import (
    allow_restart,
    approve_effect,
    mark_effect_done,
    reject_effect,
)
from runs.errors import RestartBlocked
from runs.lifecycle import finish_run
from runs.models import Attempt, AuditEvent, EffectStatus, Run
from runs.outcomes import claim_effect, complete_effect
from runs.verdict import blocked_runs_filter, restart_verdict, restart_verdicts

pytestmark = pytest.mark.django_db


def _stopped(agent, policy="keyed", **kwargs):
    run = start(agent, restart_policy=policy, **kwargs).run
    return run


def _fail(agent, run, attempt=1):
    finish_run(agent, run.pk, attempt=attempt, outcome="failed")
    run.refresh_from_db()
    return run


def test_a_run_with_an_empty_journal_is_safe_under_every_automatic_policy(agent):
    for policy in ("keyed", "blunt"):
        run = start(agent, f"empty-{policy}", restart_policy=policy).run

        verdict = restart_verdict(run)

        assert (verdict.safe, verdict.blocking, verdict.policy) == (True, [], policy)


def test_reads_never_block_a_keyed_restart(agent):
    run = start(agent).run
    read(agent, run)

    assert restart_verdict(run).safe is True
    _fail(agent, run)
    assert start(agent).attempt.number == 2


def test_the_blunt_policy_blocks_on_any_recorded_call_reads_included(agent):
    run = start(agent, restart_policy="blunt").run
    call = read(agent, run).call

    verdict = restart_verdict(run)

    assert verdict.safe is False
    assert verdict.blocking[0]["reason"] == "recorded_call"
    assert verdict.blocking[0]["call_id"] == str(call.pk)


def test_the_manual_policy_never_restarts_automatically(agent):
    run = start(agent, restart_policy="manual").run

    verdict = restart_verdict(run)

    assert verdict.safe is False
    assert [b["reason"] for b in verdict.blocking] == ["manual_policy"]


def test_keyed_effects_never_block_whatever_their_status(agent, operator):
    run = start(agent).run
    done = send(agent, run, key="k:done").effect
    complete_effect(agent, done.pk, run_id=run.pk, attempt=1, outcome="done")
    failed = send(agent, run, key="k:failed").effect
    complete_effect(agent, failed.pk, run_id=run.pk, attempt=1, outcome="failed")
    send(agent, run, key="k:awaiting", needs_approval=True)
    rejected = send(agent, run, key="k:rejected", needs_approval=True).effect
    reject_effect(operator, rejected.pk, args_hash=rejected.args_hash, note="no")
    send(agent, run, key="k:unknown")
    run = _fail(agent, run)  # k:unknown was in flight: now unknown

    verdict = restart_verdict(run)

    assert verdict.safe is True
    assert [n["reason"] for n in verdict.notes] == [
        "done",
        "failed",
        "awaiting_approval",
        "rejected",
        "unknown_outcome",
    ]


def test_an_expired_effect_is_a_note_that_it_stays_blocked(agent):
    t0 = timezone.now()
    run = start(agent, heartbeat_timeout=3600, now=t0).run
    effect = send(agent, run, needs_approval=True, approval_ttl=60, now=t0).effect
    send(agent, run, now=t0 + timedelta(minutes=5))  # the replay records the expiry

    verdict = restart_verdict(run)

    assert verdict.safe is True
    assert verdict.notes == [
        {
            "reason": "expired",
            "effect_id": str(effect.pk),
            "tool": "send_email",
            "message": (
                "send_email (outlook:message:1) is expired: it stays blocked unless revised."
            ),
        }
    ]


def test_an_unkeyed_effect_that_was_started_blocks_a_keyed_restart(agent):
    run = start(agent).run
    effect = send(agent, run, key=None).effect

    verdict = restart_verdict(run)

    assert verdict.safe is False
    assert verdict.blocking[0]["reason"] == "unkeyed_effect"
    assert verdict.blocking[0]["effect_id"] == str(effect.pk)


def test_an_unkeyed_effect_that_never_started_does_not_block(agent):
    run = start(agent).run
    effect = send(agent, run, key=None, needs_approval=True).effect

    verdict = restart_verdict(run)

    # Only a started unkeyed effect could run twice.
    assert verdict.safe is True
    assert verdict.notes[0]["effect_id"] == str(effect.pk)


def test_no_decision_on_the_effect_removes_an_unkeyed_block(agent, operator):
    run = start(agent).run
    effect = send(agent, run, key=None).effect
    run = _fail(agent, run)
    effect.refresh_from_db()

    mark_effect_done(operator, effect.pk, args_hash=effect.args_hash, note="it was sent")

    assert restart_verdict(run).safe is False
    with pytest.raises(RestartBlocked):
        start(agent)


def test_a_keyed_unknown_effect_lets_the_run_restart_and_holds_it_for_review(agent):
    run = start(agent).run
    effect = send(agent, run).effect

    restarted = start(agent, supersede=1)

    assert restarted.attempt.number == 2
    assert restarted.verdict.notes[0]["reason"] == "unknown_outcome"
    replay = send(agent, run, attempt=2)
    assert replay.action == "review"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


def test_a_refused_restart_answers_the_verdict_and_keeps_the_run_stopped(agent):
    run = start(agent, restart_policy="blunt").run
    read(agent, run)
    run = _fail(agent, run)

    with pytest.raises(RestartBlocked) as caught:
        start(agent)

    assert caught.value.details["verdict"]["blocking"][0]["reason"] == "recorded_call"
    run.refresh_from_db()
    assert (run.status, run.current_attempt) == ("failed", 1)


def test_an_operator_override_admits_exactly_one_attempt(agent, operator):
    run = start(agent, restart_policy="manual").run
    run = _fail(agent, run)
    allow_restart(operator, run.pk, note="checked the mailbox")
    run.refresh_from_db()
    assert restart_verdict(run).override["by"] == "olivia"

    restarted = start(agent)

    assert restarted.attempt.started_by == "operator:olivia"
    assert "checked the mailbox" in restarted.attempt.reason
    # The attempt keeps the verdict it was admitted under, override included.
    assert restarted.attempt.verdict_at_start["override"]["note"] == "checked the mailbox"
    run.refresh_from_db()
    assert run.override_at is None
    assert restarted.verdict.override is None
    # Consumed: the next restart is refused again.
    finish_run(agent, run.pk, attempt=2, outcome="failed")
    with pytest.raises(RestartBlocked):
        start(agent)
    assert Attempt.objects.filter(run=run).count() == 2


def test_an_override_lets_a_superseding_start_through(agent, operator):
    run = start(agent).run
    send(agent, run, key=None)
    with pytest.raises(RestartBlocked):
        start(agent, supersede=1)
    allow_restart(operator, run.pk, note="the unkeyed call was a no-op")

    restarted = start(agent, supersede=1)

    assert restarted.attempt.number == 2
    assert AuditEvent.objects.filter(run=run, verb="restart_allowed").count() == 1


def test_the_verdict_notes_an_approved_effect_will_execute(agent, operator):
    run = start(agent).run
    effect = send(agent, run, needs_approval=True).effect
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    assert restart_verdict(Run.objects.get(pk=run.pk)).notes[0]["reason"] == "approved"


# --- The column the console filters on (Run.verdict_blocked) ---------------------------


def _blocked_by_column_and_by_rules(run) -> tuple[bool, bool, bool]:
    """The kept column, the SQL definition, and the verdict itself, for one run."""
    run.refresh_from_db()
    by_rules = Run.objects.filter(blocked_runs_filter(), pk=run.pk).exists()
    return run.verdict_blocked, by_rules, bool(restart_verdict(run).blocking)


def test_the_verdict_column_follows_every_blocking_rule_as_it_becomes_true(agent, operator):
    manual = start(agent, "manual", restart_policy="manual").run
    blunt = start(agent, "blunt", restart_policy="blunt").run
    keyed = start(agent, "keyed").run
    waiting = start(agent, "waiting").run
    for run in (blunt, keyed, waiting):
        assert _blocked_by_column_and_by_rules(run) == (False, False, False)
    assert _blocked_by_column_and_by_rules(manual) == (True, True, True)

    read(agent, blunt)  # any recorded call blocks a blunt run
    send(agent, keyed)  # a keyed effect never blocks
    unkeyed = send(agent, waiting, key=None, needs_approval=True).effect  # not started
    assert _blocked_by_column_and_by_rules(blunt) == (True, True, True)
    assert _blocked_by_column_and_by_rules(keyed) == (False, False, False)
    assert _blocked_by_column_and_by_rules(waiting) == (False, False, False)

    send(agent, keyed, key=None)  # an unkeyed effect, started at once
    assert _blocked_by_column_and_by_rules(keyed) == (True, True, True)

    # Approved, then claimed by the run that recorded it: now it has started.
    approve_effect(operator, unkeyed.pk, args_hash=unkeyed.args_hash)
    assert _blocked_by_column_and_by_rules(waiting) == (False, False, False)
    claim_effect(agent, unkeyed.pk, run_id=waiting.pk, attempt=1)
    assert _blocked_by_column_and_by_rules(waiting) == (True, True, True)


def test_the_migration_sets_the_verdict_column_from_the_journal(agent):
    from django.apps import apps

    migration = importlib.import_module("runs.migrations.0009_run_verdict_blocked")
    blocked = start(agent, "blunt", restart_policy="blunt").run
    read(agent, blocked)
    safe = start(agent, "keyed").run
    send(agent, safe)
    Run.objects.update(verdict_blocked=False)  # as the column was added

    migration.mark_blocked_runs(apps, None)

    assert set(Run.objects.filter(verdict_blocked=True).values_list("run_key", flat=True)) == {
        "blunt"
    }


def test_mark_blocked_runs_marks_what_an_old_release_left_unmarked(agent):
    from io import StringIO

    from django.core.management import call_command

    blunt = start(agent, "blunt", restart_policy="blunt").run
    keyed = start(agent, "keyed").run
    safe = start(agent, "safe").run
    read(agent, blunt)
    send(agent, keyed, key=None)  # an unkeyed effect, started at once
    send(agent, safe)
    # As a web process of the release before migration 0009 leaves them: the calls
    # recorded, the column not kept.
    Run.objects.filter(pk__in=[blunt.pk, keyed.pk]).update(verdict_blocked=False)

    def run_command(*flags) -> tuple[str, str]:
        out, err = StringIO(), StringIO()
        call_command("mark_blocked_runs", *flags, stdout=out, stderr=err)
        return out.getvalue().strip(), err.getvalue().strip()

    assert run_command("--dry-run") == (
        "2 run(s) to mark as blocked (dry run: nothing changed).",
        "",
    )
    assert not Run.objects.filter(verdict_blocked=True).exists()

    assert run_command() == ("Marked 2 run(s) as blocked.", "")
    assert set(Run.objects.filter(verdict_blocked=True).values_list("run_key", flat=True)) == {
        "blunt",
        "keyed",
    }
    assert run_command() == ("Marked 0 run(s) as blocked.", "")

    # A column set without a reason is a bug: reported, not changed.
    Run.objects.filter(pk=safe.pk).update(verdict_blocked=True)
    out, err = run_command()
    assert out == "Marked 0 run(s) as blocked."
    assert err.startswith("1 run(s) are marked blocked although their journal has no")
    assert Run.objects.get(pk=safe.pk).verdict_blocked


def test_the_sweeps_batch_verdicts_are_the_per_run_verdicts(agent, operator):
    # restart_verdicts reads rows as tuples, restart_verdict as models: the same rules.
    keyed = start(agent, "keyed").run
    send(agent, keyed, key="k-1")
    send(agent, keyed, key=None)  # started unkeyed: blocks
    send(agent, keyed, key="k-2", tool="refund", needs_approval=True)
    read(agent, keyed)
    waiting = start(agent, "waiting").run
    send(agent, waiting, key=None, needs_approval=True)  # unkeyed, never started: no block
    blunt = start(agent, "blunt", restart_policy="blunt").run
    read(agent, blunt)
    send(agent, blunt, key="b-1")
    send(agent, blunt, key="b-1")  # a replay: a second call to the same effect
    manual = start(agent, "manual", restart_policy="manual").run
    send(agent, manual, key="m-1")
    empty = start(agent, "empty").run
    shared = start(agent, "shared").run
    send(agent, shared, key="k-1")  # another run's effect: a note for both
    runs = [keyed, blunt, manual, empty, shared, waiting]

    batch = restart_verdicts(runs)

    for run in runs:
        assert batch[run.pk].as_dict() == restart_verdict(run).as_dict(), run.run_key
    assert [b["reason"] for b in batch[blunt.pk].blocking] == ["recorded_call"] * 3
    assert batch[keyed.pk].blocking[0]["reason"] == "unkeyed_effect"
    assert len(batch[keyed.pk].notes) == 2
    assert batch[waiting.pk].safe is True


def test_the_queue_shows_every_blocking_reason_and_only_the_notes_a_person_acts_on(agent, operator):
    # A blunt run's recorded calls are one line with their count, not one line each.
    blunt = start(agent, "queue-blunt", restart_policy="blunt").run
    read(agent, blunt)
    send(agent, blunt, key="blunt:1")
    assert restart_verdict(blunt).for_queue() == {
        "blocking": ["2 call(s) recorded: the blunt policy blocks any recorded call."],
        "notes": [],
    }

    # A keyed run: the started unkeyed effect's message blocks; of its notes only the
    # unknown outcome shows (an approved effect that will execute asks nothing).
    keyed = start(agent, "queue-keyed").run
    unkeyed = send(agent, keyed, key=None, tool="fax").effect
    waiting = send(agent, keyed, key="approve:1", tool="wire", needs_approval=True).effect
    approve_effect(operator, waiting.pk, args_hash=waiting.args_hash)
    send(agent, keyed, key="unknown:1", tool="mail")
    keyed = _fail(agent, keyed)  # in flight when it failed: its outcome is unknown

    verdict = restart_verdict(keyed)
    unknown_notes = [n["message"] for n in verdict.notes if n["reason"] == "unknown_outcome"]
    assert len(verdict.notes) > len(unknown_notes) == 1
    assert verdict.for_queue() == {
        "blocking": [verdict.blocking[0]["message"]],
        "notes": unknown_notes,
    }
    assert verdict.blocking[0]["effect_id"] == str(unkeyed.pk)

    # A manual run's one reason is its policy; no call line when it recorded none.
    manual = start(agent, "queue-manual", restart_policy="manual").run
    assert restart_verdict(manual).for_queue() == {
        "blocking": ["The run's restart policy is manual: a person always decides."],
        "notes": [],
    }
