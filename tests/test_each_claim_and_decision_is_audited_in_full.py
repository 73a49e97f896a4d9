"""Each claim and each decision on a run leaves an audit event that says it all.

The audit log is the journal's account of who did what, when, to which run and
attempt, from which status to which, and why (runs/audit.py). ``make mutate``
showed that for some verbs the tests read only the verb: a ``claimed`` event
without its run or attempt, a ``restart_allowed`` without its attempt, statuses
or note, a ``marked_done`` without its result all passed. And ``abandon`` left a
run handed back (``restart_ready``) or its waiting override in place unseen.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lifecycle_helpers import send, start

from approvals.decisions import (
    abandon_run,
    allow_restart,
    approve_effect,
    mark_effect_done,
    reject_effect,
    release_effect,
)
from runs.lifecycle import finish_run
from runs.models import AuditEvent, Run, RunStatus
from runs.sweep import sweep

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _event(verb, **filters) -> AuditEvent:
    return AuditEvent.objects.get(verb=verb, **filters)


def test_a_claim_of_an_approved_effect_is_audited_with_the_run_and_attempt_that_claimed(
    agent, operator
):
    run = start(agent, now=T0).run
    effect = send(agent, run, needs_approval=True, now=T0).effect
    approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=T0)
    start(agent, supersede=1, now=T0)  # attempt 2 replays the call and claims it

    assert send(agent, run, attempt=2, needs_approval=True, now=T0).action == "execute"

    claimed = _event("claimed", effect=effect)
    assert (claimed.run_id, claimed.attempt_number) == (run.pk, 2)
    assert (claimed.old_status, claimed.new_status) == ("approved", "in_flight")
    assert claimed.actor == "agent:support-bot" and claimed.at == T0


def _interrupted(agent) -> Run:
    run = start(agent, heartbeat_timeout=5, restart_policy="manual", now=T0).run
    sweep(now=T0 + timedelta(seconds=6))
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED and not run.restart_ready
    return run


def test_allow_restart_is_audited_with_the_attempt_the_statuses_and_the_note(agent, operator):
    run = _interrupted(agent)
    now = T0 + timedelta(minutes=1)

    allow_restart(operator, run.pk, note="checked the mailbox by hand", now=now)

    allowed = _event("restart_allowed", run=run)
    assert (allowed.actor, allowed.attempt_number, allowed.at) == ("olivia", 1, now)
    assert (allowed.old_status, allowed.new_status) == ("interrupted", "interrupted")
    assert allowed.note == "checked the mailbox by hand"


def test_marked_done_is_audited_with_the_result_a_person_gave(agent, operator):
    run = start(agent).run
    effect = send(agent, run).effect
    start(agent, supersede=1)  # its attempt stopped: unknown
    effect.refresh_from_db()

    mark_effect_done(
        operator, effect.pk, args_hash=effect.args_hash, note="sent", result={"id": "m-1"}
    )

    done = _event("marked_done", effect=effect)
    assert done.data == {"result": {"id": "m-1"}} and done.note == "sent"


@pytest.mark.parametrize("ended", ["interrupted and handed back", "failed with an override"])
def test_an_abandoned_run_is_no_longer_handed_back_and_its_override_is_gone(agent, operator, ended):
    if ended == "interrupted and handed back":
        run = start(agent, heartbeat_timeout=5, now=T0).run
        sweep(now=T0 + timedelta(seconds=6))  # safe and keyed: handed back
    else:
        run = start(agent, now=T0).run
        finish_run(agent, run.pk, attempt=1, outcome="failed", error="boom", now=T0)
        allow_restart(operator, run.pk, note="try again", now=T0)
    run.refresh_from_db()
    assert run.restart_ready

    abandon_run(operator, run.pk, note="given up", now=T0 + timedelta(minutes=1))

    run.refresh_from_db()
    assert run.status == RunStatus.ABANDONED
    assert run.restart_ready is False
    assert (run.override_by, run.override_at, run.override_note) == (None, None, "")


@pytest.mark.parametrize("decide", [release_effect, mark_effect_done])
def test_a_release_or_mark_done_records_its_decision_and_note_in_full(agent, operator, decide):
    run = start(agent, now=T0).run
    effect = send(agent, run, now=T0).effect
    start(agent, supersede=1, now=T0)  # its attempt stopped: unknown
    effect.refresh_from_db()
    now = T0 + timedelta(minutes=1)

    decide(operator, effect.pk, args_hash=effect.args_hash, note="checked the outbox", now=now)

    effect.refresh_from_db()
    verb = "released" if decide is release_effect else "marked_done"
    assert effect.decision == {
        "verb": verb,
        "by": "olivia",
        "at": now.isoformat(),
        "note": "checked the outbox",
        "args_hash": effect.args_hash,
        "final": False,
    }
    event = _event(verb, effect=effect)
    assert (event.actor, event.at, event.note) == ("olivia", now, "checked the outbox")


@pytest.mark.parametrize("final", [False, True])
def test_a_rejection_records_its_decision_and_whether_it_is_final(agent, operator, final):
    run = start(agent, now=T0).run
    effect = send(agent, run, needs_approval=True, now=T0).effect

    reject_effect(
        operator, effect.pk, args_hash=effect.args_hash, note="not to them", final=final, now=T0
    )

    effect.refresh_from_db()
    assert effect.decision == {
        "verb": "rejected",
        "by": "olivia",
        "at": T0.isoformat(),
        "note": "not to them",
        "args_hash": effect.args_hash,
        "final": final,
    }
    assert _event("rejected", effect=effect).data == {"final": final}
