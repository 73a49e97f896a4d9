"""Starting a run, restarting it, heartbeats and finishing (runs/lifecycle.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import read, send, start

from approvals.decisions import allow_restart
from runs.errors import (
    AlreadyRunning,
    AttemptSuperseded,
    InvalidRequest,
    RestartBlocked,
    RunFinished,
)
from runs.lifecycle import finish_run, heartbeat, start_run
from runs.models import Attempt, AttemptStatus, AuditEvent, EffectStatus, Run, RunStatus
from runs.sweep import sweep

pytestmark = pytest.mark.django_db


def test_a_new_run_key_creates_the_run_and_its_first_attempt(agent):
    started = start(agent, "ticket-42", title="Reply to ticket 42")

    assert started.created is True
    assert started.attempt.number == 1
    assert started.verdict.safe is True
    run = Run.objects.get(agent=agent, run_key="ticket-42")
    assert run.status == RunStatus.RUNNING
    assert run.current_attempt == 1
    assert run.attempts.get().started_by == "agent"
    # The restart history starts with the first attempt.
    assert AuditEvent.objects.filter(run=run, verb="attempt_started").count() == 1


def test_starting_a_running_run_without_supersede_is_already_running(agent):
    started = start(agent)

    with pytest.raises(AlreadyRunning) as caught:
        start(agent)

    assert caught.value.details["attempt"] == 1
    assert "heartbeat_at" in caught.value.details
    assert Attempt.objects.filter(run=started.run).count() == 1


def test_a_supersede_that_names_another_attempt_is_already_running(agent):
    started = start(agent)

    with pytest.raises(AlreadyRunning):
        start(agent, supersede=7)

    started.run.refresh_from_db()
    assert started.run.current_attempt == 1
    assert started.run.status == RunStatus.RUNNING


def test_superseding_the_current_attempt_starts_the_next_one(agent):
    started = start(agent)

    restarted = start(agent, supersede=1, agent_version="v2")

    assert restarted.created is False
    assert restarted.attempt.number == 2
    assert restarted.attempt.agent_version == "v2"
    first = Attempt.objects.get(run=started.run, number=1)
    assert first.status == AttemptStatus.SUPERSEDED
    assert first.ended_at is not None
    started.run.refresh_from_db()
    assert (started.run.status, started.run.current_attempt) == (RunStatus.RUNNING, 2)
    # The history says why attempt 2 exists.
    assert "superseded attempt 1" in restarted.attempt.reason


def test_superseding_makes_the_effects_in_flight_of_that_attempt_unknown(agent):
    started = start(agent)
    recorded = send(agent, started.run)

    start(agent, supersede=1)

    recorded.effect.refresh_from_db()
    assert recorded.effect.status == EffectStatus.UNKNOWN
    # Rule 4: the change is in the audit log, attributed to the attempt that held it.
    event = AuditEvent.objects.get(effect=recorded.effect, verb="outcome_unknown")
    assert (event.old_status, event.new_status, event.attempt_number) == (
        "in_flight",
        "unknown",
        1,
    )


def test_a_blocked_restart_still_commits_the_supersede_and_the_unknown_effects(agent):
    started = start(agent)
    unkeyed = send(agent, started.run, key=None)

    with pytest.raises(RestartBlocked) as caught:
        start(agent, supersede=1)

    verdict = caught.value.details["verdict"]
    assert verdict["safe"] is False
    assert [b["reason"] for b in verdict["blocking"]] == ["unkeyed_effect"]
    # What the refused start did stays done: attempt 1 ended, the run is
    # interrupted, the effect it left in flight is unknown.
    started.run.refresh_from_db()
    assert started.run.status == RunStatus.INTERRUPTED
    assert started.run.current_attempt == 1
    assert Attempt.objects.get(run=started.run, number=1).status == AttemptStatus.SUPERSEDED
    unkeyed.effect.refresh_from_db()
    assert unkeyed.effect.status == EffectStatus.UNKNOWN
    assert AuditEvent.objects.filter(run=started.run, verb="attempt_superseded").exists()


def test_a_completed_run_takes_no_more_starts(agent):
    started = start(agent)
    finish_run(agent, started.run.pk, attempt=1, outcome="completed")

    with pytest.raises(RunFinished):
        start(agent)
    with pytest.raises(RunFinished):
        start(agent, supersede=5)

    assert Attempt.objects.filter(run=started.run).count() == 1


def test_restarting_a_failed_run_with_a_safe_verdict_starts_a_new_attempt(agent):
    started = start(agent)
    read(agent, started.run)
    finish_run(agent, started.run.pk, attempt=1, outcome="failed", error="rate limited")

    restarted = start(agent)

    assert restarted.attempt.number == 2
    assert restarted.attempt.reason == "restart after attempt 1 ended failed"
    assert Attempt.objects.get(run=started.run, number=1).status == AttemptStatus.FAILED


def _stopped_at_attempt_2(agent, how: str) -> Run:
    """A run whose attempt 2 stopped: ``interrupted`` (silent, found by the sweep; it
    is then handed back, ``restart_ready``) or ``failed`` (it said so)."""
    t0 = timezone.now()
    start(agent, heartbeat_timeout=30, now=t0)
    run = start(agent, supersede=1, now=t0).run
    if how == "interrupted":
        sweep(now=t0 + timedelta(seconds=31))
    else:
        finish_run(agent, run.pk, attempt=2, outcome="failed")
    run.refresh_from_db()
    assert (run.status, run.current_attempt) == (how, 2)
    return run


def _snapshot(run: Run) -> tuple:
    run.refresh_from_db()
    attempts = list(run.attempts.order_by("number").values_list("number", "status"))
    return (run.status, run.current_attempt, run.restart_ready, run.override_at, attempts)


@pytest.mark.parametrize("named", [1, 3])
@pytest.mark.parametrize("how", ["interrupted", "failed"])
def test_a_supersede_that_names_another_attempt_of_a_stopped_run_is_already_running(
    agent, how, named
):
    """api.md: ``supersede`` must equal the run's current attempt whatever its status,
    else ``409 already_running``: a stale view of the run changes nothing."""
    run = _stopped_at_attempt_2(agent, how)
    before, events = _snapshot(run), AuditEvent.objects.count()

    with pytest.raises(AlreadyRunning) as caught:
        start(agent, supersede=named)

    assert caught.value.details["attempt"] == 2
    assert caught.value.details["heartbeat_at"] == run.heartbeat_at.isoformat()
    assert _snapshot(run) == before
    assert AuditEvent.objects.count() == events


@pytest.mark.parametrize("how", ["interrupted", "failed"])
def test_a_stale_supersede_is_already_running_before_the_verdict_or_an_override(
    agent, operator, how
):
    """The stale supersede is refused first: not ``restart_blocked`` by the verdict,
    and it never consumes the override that an operator left for the next start."""
    t0 = timezone.now()
    run = start(agent, heartbeat_timeout=30, now=t0).run
    send(agent, run, key=None, now=t0)  # an unkeyed effect was started: the verdict blocks
    if how == "interrupted":
        sweep(now=t0 + timedelta(seconds=31))
    else:
        finish_run(agent, run.pk, attempt=1, outcome="failed")
    with pytest.raises(AlreadyRunning):
        start(agent, supersede=2)
    allow_restart(operator, run.pk, note="the refund was checked by hand")
    before = _snapshot(run)

    with pytest.raises(AlreadyRunning):
        start(agent, supersede=2)

    assert _snapshot(run) == before  # the override still waits for the next start
    assert start(agent, supersede=1).attempt.started_by == "operator:olivia"


@pytest.mark.parametrize("how", ["interrupted", "failed"])
def test_supersede_naming_the_current_attempt_of_a_stopped_run_changes_nothing(agent, how):
    run = _stopped_at_attempt_2(agent, how)

    restarted = start(agent, supersede=2)

    assert restarted.attempt.number == 3
    # Attempt 2 keeps the status it ended with; nothing was superseded.
    assert Attempt.objects.get(run=run, number=2).status == how
    assert not AuditEvent.objects.filter(
        run=run, attempt_number=2, verb="attempt_superseded"
    ).exists()


def test_supersede_on_a_new_run_key_is_ignored(agent):
    started = start(agent, "fresh", supersede=3)

    assert started.created is True
    assert started.attempt.number == 1


def test_a_later_start_cannot_loosen_the_run_policy(agent):
    started = start(agent, restart_policy="manual")
    finish_run(agent, started.run.pk, attempt=1, outcome="failed")

    with pytest.raises(RestartBlocked) as caught:
        start(agent, restart_policy="keyed")

    assert caught.value.details["verdict"]["policy"] == "manual"
    started.run.refresh_from_db()
    assert started.run.restart_policy == "manual"


def test_a_run_handed_back_by_the_sweep_is_restarted_by_auto(agent):
    t0 = timezone.now()
    started = start(agent, heartbeat_timeout=30, now=t0)

    sweep(now=t0 + timedelta(seconds=31))
    started.run.refresh_from_db()
    assert started.run.status == RunStatus.INTERRUPTED
    assert started.run.restart_ready is True

    restarted = start(agent, now=t0 + timedelta(seconds=40))

    assert restarted.attempt.started_by == "auto"
    restarted.run.refresh_from_db()
    assert restarted.run.restart_ready is False
    assert Attempt.objects.get(run=started.run, number=1).status == AttemptStatus.INTERRUPTED


def test_a_heartbeat_moves_the_stale_deadline(agent):
    t0 = timezone.now()
    started = start(agent, heartbeat_timeout=60, now=t0)

    run = heartbeat(agent, started.run.pk, attempt=1, now=t0 + timedelta(seconds=50))

    assert run.stale_at == t0 + timedelta(seconds=110)
    started.run.refresh_from_db()
    assert started.run.heartbeat_at == t0 + timedelta(seconds=50)


def test_a_heartbeat_from_a_superseded_attempt_is_told_to_stop(agent):
    started = start(agent)
    start(agent, supersede=1)

    with pytest.raises(AttemptSuperseded) as caught:
        heartbeat(agent, started.run.pk, attempt=1)

    assert caught.value.details["attempt"] == 2


def test_a_heartbeat_of_a_finished_run_is_run_finished(agent):
    started = start(agent)
    finish_run(agent, started.run.pk, attempt=1, outcome="completed")

    with pytest.raises(RunFinished):
        heartbeat(agent, started.run.pk, attempt=1)


def test_finishing_a_run_makes_the_effects_still_in_flight_unknown(agent):
    started = start(agent)
    recorded = send(agent, started.run)

    run = finish_run(agent, started.run.pk, attempt=1, outcome="completed")

    assert run.status == RunStatus.COMPLETED
    recorded.effect.refresh_from_db()
    assert recorded.effect.status == EffectStatus.UNKNOWN
    assert Attempt.objects.get(run=run, number=1).status == AttemptStatus.COMPLETED
    assert AuditEvent.objects.filter(run=run, verb="run_completed").count() == 1


def test_finishing_with_an_unknown_outcome_is_invalid(agent):
    started = start(agent)

    with pytest.raises(InvalidRequest):
        finish_run(agent, started.run.pk, attempt=1, outcome="abandoned")

    started.run.refresh_from_db()
    assert started.run.status == RunStatus.RUNNING


def test_another_agent_cannot_start_or_touch_a_run_it_does_not_own(agent, other_agent):
    from runs.errors import NotFound

    started = start(agent, "shared-name")

    # The same run_key is another run in the other agent's namespace.
    theirs = start_run(other_agent, "shared-name")
    assert theirs.created is True
    with pytest.raises(NotFound):
        heartbeat(other_agent, started.run.pk, attempt=1)
