"""The sweep as a plain function, with the clock moved by ``now=`` (no sleeps)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from approvals.models import Notification
from runs import sweep as sweep_module
from runs.calls import record_call
from runs.lifecycle import start_run
from runs.models import AuditEvent, EffectStatus, RestartHandoff, Run, RunStatus, TaskState
from runs.sweep import sweep

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def queued(monkeypatch):
    """The hand-offs queued to the broker, instead of a broker."""
    calls: list[tuple] = []
    monkeypatch.setattr(
        "runs.handoff.enqueue_handoff",
        lambda run_id, attempt, **kw: calls.append((run_id, attempt)),
    )
    return calls


def _call_in_flight(agent, run, key="mail:1"):
    return record_call(
        agent,
        run.pk,
        attempt=run.current_attempt,
        tool="send_mail",
        kind="effect",
        args={"to": "a@example.com"},
        key=key,
        key_source="intent",
        now=T0,
    ).effect


@pytest.mark.django_db(transaction=True)
def test_a_stale_run_is_interrupted_and_its_in_flight_effect_becomes_unknown(agent, queued):
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    effect = _call_in_flight(agent, run)

    report = sweep(now=later(6))

    assert report.interrupted == [str(run.pk)]
    run.refresh_from_db()
    effect.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    assert effect.status == EffectStatus.UNKNOWN
    # No restart URL: a safe keyed run is marked ready, and nothing is queued.
    assert run.restart_ready is True
    assert queued == []


@pytest.mark.django_db
def test_a_run_within_its_heartbeat_timeout_is_left_alone(agent, queued):
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run

    report = sweep(now=later(4.9))

    assert report.interrupted == []
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING


@pytest.mark.django_db(transaction=True)
def test_a_safe_run_with_a_restart_url_gets_a_handoff_row_queued_after_commit(agent, queued):
    run = start_run(
        agent, "job-1", heartbeat_timeout=5, restart_url="http://runtime.test/restart", now=T0
    ).run

    report = sweep(now=later(6))

    assert report.restart_ready == [str(run.pk)]
    handoff = RestartHandoff.objects.get(run=run)
    assert (handoff.attempt, handoff.status) == (2, "pending")
    # Queued on commit, for the attempt to start next.
    assert queued == [(str(run.pk), 2)]


def _interrupt(path: str, run, now: datetime) -> sweep_module.SweepReport:
    """One sweep of ``run`` by the set-based batch (what ``sweep`` runs first), or by
    the one-run-at-a-time path (what it falls back to when a batch fails)."""
    if path == "batch":
        return sweep(now=now)
    report = sweep_module.SweepReport()
    sweep_module.interrupt_stale_run(run.pk, now, report)
    return report


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["batch", "one_run"])
def test_the_sweep_counts_its_hand_backs_and_past_the_cap_a_person_decides(
    agent, queued, settings, path
):
    """product.md: automatic restarts are capped per run; past the cap the run waits
    for a person instead of looping. The sweep alone reaches the cap: each time the
    run falls silent it is handed back, and its runtime starts it again."""
    settings.STARTSAFE = {**settings.STARTSAFE, "AUTO_RESTART_CAP": 2}
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    now = T0
    for hand_back in (1, 2):
        now += timedelta(seconds=6)  # silent past its heartbeat timeout

        report = _interrupt(path, run, now)

        assert report.restart_ready == [str(run.pk)], hand_back
        restarted = start_run(agent, "job-1", now=now + timedelta(seconds=1))
        assert (restarted.attempt.number, restarted.attempt.started_by) == (hand_back + 1, "auto")
        now += timedelta(seconds=1)

    report = _interrupt(path, run, now + timedelta(seconds=6))

    assert (report.restart_ready, report.needs_person) == ([], [str(run.pk)])
    run.refresh_from_db()
    assert (run.status, run.restart_ready) == (RunStatus.INTERRUPTED, False)
    assert AuditEvent.objects.filter(run=run, verb="restart_ready").count() == 2
    event = AuditEvent.objects.get(run=run, verb="needs_person")
    assert event.note == "automatic restarts capped"
    # Operators hear of it: the outbox row was written with the event.
    assert Notification.objects.filter(kind="needs_person", run=run).count() == 1
    # The cap limits the hand-backs only: the agent's own start still goes through.
    assert start_run(agent, "job-1").attempt.started_by == "agent"


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["batch", "one_run"])
def test_an_agents_own_restarts_do_not_count_toward_the_cap(agent, queued, settings, path):
    """api.md: the cap limits only the hand-backs; an agent's own start (here, a
    supersede of its silent attempt) is decided by the verdict alone."""
    settings.STARTSAFE = {**settings.STARTSAFE, "AUTO_RESTART_CAP": 1}
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    for attempt in (1, 2, 3):
        start_run(agent, "job-1", supersede=attempt, now=later(attempt))

    report = _interrupt(path, run, later(3 + 6))

    assert report.restart_ready == [str(run.pk)]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["batch", "one_run"])
def test_a_manual_policy_run_is_never_handed_back(agent, queued, path):
    run = start_run(
        agent,
        "job-1",
        heartbeat_timeout=5,
        restart_policy="manual",
        restart_url="http://runtime.test/restart",
        now=T0,
    ).run

    report = _interrupt(path, run, later(6))

    assert report.needs_person == [str(run.pk)]
    assert not RestartHandoff.objects.exists()
    # Operators are told why: the policy, not a verdict that a decision could change.
    assert AuditEvent.objects.get(run=run, verb="needs_person").note == "manual policy"


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["batch", "one_run"])
def test_a_run_is_interrupted_only_once_its_deadline_has_passed(agent, queued, path):
    """Each unit re-checks its row under lock: at exactly ``stale_at`` the run is still
    within its heartbeat timeout."""
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run

    assert _interrupt(path, run, later(5)).interrupted == []
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    assert _interrupt(path, run, later(5.001)).interrupted == [str(run.pk)]


@pytest.mark.django_db
def test_an_effect_times_out_only_once_its_timeout_has_passed(agent, queued):
    run = start_run(agent, "job-1", heartbeat_timeout=600, now=T0).run
    effect = record_call(
        agent, run.pk, attempt=1, tool="charge", kind="effect", args={"cents": 1},
        key="charge:1", key_source="intent", timeout=30, now=T0,
    ).effect  # fmt: skip
    report = sweep_module.SweepReport()

    assert sweep_module.time_out_effect(effect.pk, later(30), report) is False
    assert sweep_module.time_out_effect(effect.pk, later(30.001), report) is True
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


@pytest.mark.django_db
def test_an_effect_past_its_timeout_becomes_unknown_while_its_run_goes_on(agent, queued):
    run = start_run(agent, "job-1", heartbeat_timeout=600, now=T0).run
    effect = record_call(
        agent,
        run.pk,
        attempt=1,
        tool="charge",
        kind="effect",
        args={"cents": 100},
        key="charge:1",
        key_source="intent",
        timeout=30,
        now=T0,
    ).effect

    assert sweep(now=later(29)).timed_out == []
    report = sweep(now=later(31))

    assert report.timed_out == [str(effect.pk)]
    effect.refresh_from_db()
    run.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN
    assert run.status == RunStatus.RUNNING


@pytest.mark.django_db
def test_an_approval_expires_at_its_deadline_and_not_before(agent, queued):
    run = start_run(agent, "job-1", heartbeat_timeout=3600, now=T0).run
    effect = record_call(
        agent,
        run.pk,
        attempt=1,
        tool="refund",
        kind="effect",
        args={"cents": 100},
        key="refund:1",
        key_source="intent",
        needs_approval=True,
        approval_ttl=120,
        now=T0,
    ).effect

    assert sweep(now=later(119)).expired == []
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL

    report = sweep(now=later(120))

    assert report.expired == [str(effect.pk)]
    effect.refresh_from_db()
    assert effect.status == EffectStatus.EXPIRED
    assert effect.decision["verb"] == "expired"


@pytest.mark.django_db
def test_sweeping_twice_changes_nothing_the_second_time(agent, queued):
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    sweep(now=later(6))
    events = AuditEvent.objects.filter(run=run).count()

    report = sweep(now=later(7))

    assert report.interrupted == [] and report.errors == []
    assert AuditEvent.objects.filter(run=run).count() == events


@pytest.mark.django_db
def test_a_broken_run_is_logged_pushed_back_and_does_not_stop_the_others(
    agent, other_agent, queued, monkeypatch
):
    broken = start_run(agent, "job-broken", heartbeat_timeout=5, now=T0).run
    fine = start_run(other_agent, "job-fine", heartbeat_timeout=5, now=later(0.5)).run
    real = sweep_module.interrupt_stale_run

    def interrupt(run_id, now, report):
        if str(run_id) == str(broken.pk):
            raise RuntimeError("a bad row")
        return real(run_id, now, report)

    monkeypatch.setattr(sweep_module, "interrupt_stale_run", interrupt)

    # The set-based batch fails as a whole on a bad row (here: made to fail), and the
    # sweep falls back to one run at a time, where the bad row is isolated.
    def batch(run_ids, now, report):
        raise RuntimeError("a bad row in the batch")

    monkeypatch.setattr(sweep_module, "interrupt_stale_runs", batch)

    report = sweep(now=later(6))

    assert report.interrupted == [str(fine.pk)]
    assert len(report.errors) == 1 and "a bad row" in report.errors[0]
    broken.refresh_from_db()
    # Pushed back: the next sweeps skip it instead of failing on it each time.
    assert broken.status == RunStatus.RUNNING
    assert broken.stale_at > later(6)
    assert TaskState.objects.get(name="sweep").errors_total == 1


@pytest.mark.django_db
def test_each_sweep_records_its_duration_for_the_metrics(agent, queued):
    sweep(now=later(1))
    sweep(now=later(2))

    state = TaskState.objects.get(name="sweep")
    assert state.runs_total == 2
    assert state.last_started_at == later(2)
    assert state.last_duration >= 0


@pytest.mark.django_db
def test_the_management_command_runs_the_same_sweep(agent, queued, capsys):
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    Run.objects.filter(pk=run.pk).update(stale_at=T0)  # stale by now, whatever the clock

    call_command("sweep")

    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    assert "1 run(s) interrupted" in capsys.readouterr().out


def test_the_schedule_runs_the_sweep_and_notifications_from_settings(settings):
    from startsafe.celery import app

    schedule = app.conf.beat_schedule
    assert schedule["sweep"]["task"] == "runs.tasks.sweep"
    assert schedule["sweep"]["schedule"] == settings.STARTSAFE["SWEEP_INTERVAL"]
    assert schedule["notify"]["task"] == "approvals.tasks.notify"


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_stale_runs_writes_every_audit_event_and_logs_each(agent, queued, caplog):
    """40 stale runs with an effect in flight: 160 events, over the COPY threshold."""
    from runs.audit import COPY_FROM

    runs = [start_run(agent, f"batch-{i}", heartbeat_timeout=5, now=T0).run for i in range(40)]
    effects = [_call_in_flight(agent, run, key=f"mail:{i}") for i, run in enumerate(runs)]
    before = AuditEvent.objects.count()

    caplog.clear()
    with caplog.at_level("INFO", logger="startsafe.events"):
        report = sweep(now=later(6))

    assert sorted(report.interrupted) == sorted(str(run.pk) for run in runs)
    written = AuditEvent.objects.count() - before
    assert written == 4 * len(runs) >= COPY_FROM
    for run, effect in zip(runs, effects, strict=True):
        verbs = set(AuditEvent.objects.filter(run=run).values_list("verb", flat=True))
        assert {"attempt_interrupted", "run_interrupted", "restart_ready"} <= verbs
        unknown = AuditEvent.objects.get(effect=effect, verb="outcome_unknown")
        assert (unknown.old_status, unknown.new_status) == ("in_flight", "unknown")
        assert unknown.at == later(6)
    ready = AuditEvent.objects.get(run=runs[0], verb="restart_ready")
    assert ready.data["verdict"]["safe"] is True and ready.actor == "system"
    logged = [r for r in caplog.records if r.name == "startsafe.events"]
    assert len(logged) == written
