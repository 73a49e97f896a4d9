"""What the sweep tells people (its report, its log lines) and what it leaves alone.

Written for the mutants ``make mutate`` found alive in runs/sweep.py: a broken row's
error and log line naming the wrong kind or row, the batch failure's warning, the
summary's counts, and pre-filters that, dropped, would make every sweep lock healthy
rows (a heartbeating run, an effect within its timeout, an approval within its
deadline) and spin on a batch another transaction holds.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from lifecycle_helpers import send

from approvals.decisions import approve_effect
from runs import sweep as sweep_module
from runs.lifecycle import start_run
from runs.models import AuditEvent, Effect, EffectStatus, Run, RunStatus, TaskState
from runs.sweep import SweepReport, sweep, time_out_effect

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda *a, **kw: None)


def _locking(queries) -> list[str]:
    """The statements that lock journal rows (the sweep's own TaskState row aside)."""
    journal = ('FROM "runs_run"', 'FROM "runs_effect"')
    return [
        q["sql"]
        for q in queries
        if "FOR UPDATE" in q["sql"] and any(table in q["sql"] for table in journal)
    ]


def _broken(monkeypatch, name: str, broken_pk) -> None:
    """Make ``sweep_module.<name>`` raise for one row, and work for the others."""
    real = getattr(sweep_module, name)

    def unit(pk, now, report):
        if str(pk) == str(broken_pk):
            raise RuntimeError("a bad row")
        return real(pk, now, report)

    monkeypatch.setattr(sweep_module, name, unit)


@pytest.mark.django_db
def test_the_log_fields_count_each_list_of_the_report():
    report = SweepReport(
        interrupted=["a", "b", "c"],
        restart_ready=["a", "b"],
        needs_person=["c"],
        timed_out=["t1", "t2", "t3", "t4"],
        expired=["e1", "e2", "e3", "e4", "e5"],
        handoffs_dispatched=6,
        errors=["x"] * 7,
        duration=0.123456,
    )

    assert report.log_fields() == {
        "interrupted": 3,
        "restart_ready": 2,
        "needs_person": 1,
        "timed_out": 4,
        "expired": 5,
        "handoffs_dispatched": 6,
        "errors": 7,
        "duration": "0.1235",
    }


@pytest.mark.django_db
def test_a_quiet_sweep_locks_no_healthy_row(agent, operator):
    # A run heartbeating within its timeout, an effect in flight within its timeout,
    # an approval within its deadline: nothing is due, so nothing is locked (a lock
    # would make the run's own heartbeat or claim wait on the sweep).
    run = start_run(agent, "healthy", heartbeat_timeout=60, now=T0).run
    send(agent, run, key="in-flight:1", timeout=60, now=T0)
    send(agent, run, key="awaiting:1", needs_approval=True, approval_ttl=3600, now=T0)
    # Approved before its deadline passed: its deadline no longer counts.
    approved = send(agent, run, key="approved:1", needs_approval=True, approval_ttl=10, now=T0)
    approve_effect(operator, approved.effect.pk, args_hash=approved.effect.args_hash, now=later(1))
    assert Effect.objects.filter(status=EffectStatus.IN_FLIGHT).count() == 1

    with CaptureQueriesContext(connection) as queries:
        report = sweep(now=later(30))

    assert _locking(queries.captured_queries) == []
    assert (report.interrupted, report.timed_out, report.expired) == ([], [], [])


@pytest.mark.django_db(transaction=True)
def test_a_full_batch_held_by_another_transaction_is_tried_once_per_sweep(agent, monkeypatch):
    monkeypatch.setattr(sweep_module, "BATCH", 2)
    stale = [start_run(agent, f"held-{i}", heartbeat_timeout=5, now=T0).run for i in range(2)]
    held, release = threading.Event(), threading.Event()

    def hold_the_rows():
        with transaction.atomic():
            list(Run.objects.select_for_update().filter(pk__in=[r.pk for r in stale]))
            held.set()
            # Not longer than a sweep takes: a sweep that waited on the lock instead of
            # skipping it would interrupt both runs once it is released.
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=hold_the_rows)
    holder.start()
    try:
        assert held.wait(30)
        with CaptureQueriesContext(connection) as queries:
            report = sweep(now=later(6))
    finally:
        release.set()
        holder.join(30)

    # SKIP LOCKED left both to the next sweep; a full batch that interrupted nothing
    # ends the loop instead of reading the same rows again up to MAX_RUN_BATCHES times.
    assert report.interrupted == []
    assert len(_locking(queries.captured_queries)) == 1
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.RUNNING}


@pytest.mark.django_db
def test_a_broken_run_says_which_run_and_why_in_the_report_and_the_log(
    agent, other_agent, monkeypatch, caplog
):
    broken = start_run(agent, "job-broken", heartbeat_timeout=5, now=T0).run
    start_run(other_agent, "job-fine", heartbeat_timeout=5, now=later(0.5))
    _broken(monkeypatch, "interrupt_stale_run", broken.pk)

    def batch(run_ids, now, report):
        raise ValueError("the batch broke")

    monkeypatch.setattr(sweep_module, "interrupt_stale_runs", batch)

    with caplog.at_level("INFO", logger="startsafe.sweep"):
        report = sweep(now=later(6))

    assert report.errors == [f"run {broken.pk}: RuntimeError: a bad row"]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "startsafe.sweep"]
    assert ("WARNING", "event=sweep_batch_failed runs=2 error=ValueError") in lines
    assert ("ERROR", f"event=sweep_row_failed kind=run id={broken.pk} error=RuntimeError") in lines


def test_a_row_that_cannot_be_pushed_back_is_logged_and_the_sweep_goes_on(caplog):
    tried = []

    def unit(pk, now, report):
        tried.append(pk)
        raise RuntimeError("a bad row")

    def push_back(pk):
        raise OSError("the push back broke")

    report = SweepReport()
    with caplog.at_level("INFO", logger="startsafe.sweep"):
        sweep_module._each("timeout", ["r1", "r2"], unit, T0, report, push_back=push_back)

    assert tried == ["r1", "r2"]
    assert report.errors == [
        "timeout r1: RuntimeError: a bad row",
        "timeout r2: RuntimeError: a bad row",
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == "startsafe.sweep"]
    assert lines == [
        "event=sweep_row_failed kind=timeout id=r1 error=RuntimeError",
        "event=sweep_push_back_failed kind=timeout id=r1",
        "event=sweep_row_failed kind=timeout id=r2 error=RuntimeError",
        "event=sweep_push_back_failed kind=timeout id=r2",
    ]


@pytest.mark.django_db
def test_a_broken_expiry_is_named_as_an_expiry(agent, monkeypatch):
    run = start_run(agent, "job-1", heartbeat_timeout=600, now=T0).run
    effect = send(agent, run, key="awaiting:1", needs_approval=True, approval_ttl=60, now=T0)
    _broken(monkeypatch, "expire_effect", effect.effect.pk)

    report = sweep(now=later(120))

    assert report.errors == [f"expiry {effect.effect.pk}: RuntimeError: a bad row"]


@pytest.mark.django_db
def test_an_effect_that_left_flight_before_its_lock_does_not_time_out(agent):
    run = start_run(agent, "job-1", heartbeat_timeout=600, now=T0).run
    effect = send(agent, run, key="mail:1", timeout=5, now=T0).effect
    # Completed between the sweep's read and its lock: its timeout date is still set.
    Effect.objects.filter(pk=effect.pk).update(status=EffectStatus.DONE)
    report = SweepReport()

    assert time_out_effect(effect.pk, later(60), report) is False

    effect.refresh_from_db()
    assert (effect.status, report.timed_out) == (EffectStatus.DONE, [])


@pytest.mark.django_db
def test_the_sweeps_audit_events_carry_the_attempt_the_verdict_and_the_count(agent, other_agent):
    ready = start_run(agent, "job-ready", heartbeat_timeout=5, now=T0).run
    manual = start_run(
        other_agent, "job-manual", heartbeat_timeout=5, restart_policy="manual", now=T0
    ).run

    report = sweep(now=later(6))

    assert (report.restart_ready, report.needs_person) == ([str(ready.pk)], [str(manual.pk)])
    handed_back = AuditEvent.objects.get(run=ready, verb="restart_ready")
    assert handed_back.attempt_number == 1
    assert set(handed_back.data) == {"verdict", "auto_restarts"}
    assert handed_back.data["auto_restarts"] == 1
    assert handed_back.data["verdict"]["safe"] is True
    waits = AuditEvent.objects.get(run=manual, verb="needs_person")
    assert (waits.attempt_number, waits.note) == (1, "manual policy")
    assert set(waits.data) == {"verdict"} and waits.data["verdict"]["policy"] == "manual"
    for run in (ready, manual):
        stopped = AuditEvent.objects.get(run=run, verb="run_interrupted")
        assert stopped.note == f"No heartbeat since {run.heartbeat_at.isoformat()}."
    ready.refresh_from_db()
    assert (ready.restart_ready, ready.auto_restarts) == (True, 1)


@pytest.mark.django_db
def test_the_one_run_fallback_interrupts_that_run_only(agent, other_agent):
    first = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    second = start_run(other_agent, "job-2", heartbeat_timeout=5, now=T0).run
    report = SweepReport()

    assert sweep_module.interrupt_stale_run(first.pk, later(6), report) is True

    assert report.interrupted == [str(first.pk)]
    second.refresh_from_db()
    assert second.status == RunStatus.RUNNING


@pytest.mark.django_db
def test_the_report_counts_the_hand_offs_it_queued(agent, monkeypatch):
    queued = []
    monkeypatch.setattr(
        "runs.handoff.enqueue_handoff", lambda run_id, attempt, **kw: queued.append(run_id)
    )
    start_run(agent, "job-1", heartbeat_timeout=5, restart_url="http://runtime.test/r", now=T0)
    sweep(now=later(6))  # hands it back: its hand-off row is written

    report = sweep(now=later(7))  # the row is due (the test's transaction never commits)

    assert report.handoffs_dispatched == 1 == len(queued)
    assert report.log_fields()["handoffs_dispatched"] == 1


@pytest.mark.django_db
def test_a_failed_dispatch_is_an_error_of_the_sweep_and_logged(monkeypatch, caplog):
    def dispatch(now):
        raise ConnectionError("the broker is down")

    monkeypatch.setattr(sweep_module, "dispatch_due_handoffs", dispatch)

    with caplog.at_level("INFO", logger="startsafe.sweep"):
        report = sweep(now=later(6))

    assert report.errors == ["dispatch: ConnectionError: the broker is down"]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "startsafe.sweep"]
    assert ("ERROR", "event=sweep_dispatch_failed error=ConnectionError") in lines


@pytest.mark.django_db
def test_the_sweep_logs_its_counts_at_info_when_busy_and_at_debug_when_idle(agent, caplog):
    start_run(agent, "job-1", heartbeat_timeout=5, restart_policy="manual", now=T0)

    with caplog.at_level("DEBUG", logger="startsafe.sweep"):
        busy = sweep(now=later(6))
        idle = sweep(now=later(7))

    summaries = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "startsafe.sweep" and r.getMessage().startswith("event=sweep ")
    ]
    expected = "event=sweep interrupted={} restart_ready=0 needs_person={} timed_out=0 "
    expected += "expired=0 handoffs_dispatched=0 errors=0 duration={}"
    assert summaries == [
        ("INFO", expected.format(1, 1, f"{busy.duration:.4f}")),
        ("DEBUG", expected.format(0, 0, f"{idle.duration:.4f}")),
    ]


@pytest.mark.django_db
def test_the_duration_is_the_time_the_sweep_took():
    before = sweep_module.time.monotonic()
    report = sweep(now=later(6))
    took = sweep_module.time.monotonic() - before

    assert 0 <= report.duration <= took


@pytest.mark.django_db
def test_the_task_state_adds_the_sweeps_counts_and_keeps_its_errors(agent, monkeypatch):
    start_run(agent, "job-1", heartbeat_timeout=5, restart_policy="manual", now=T0)
    run = start_run(agent, "job-2", heartbeat_timeout=600, now=T0).run
    send(agent, run, key="awaiting:1", needs_approval=True, approval_ttl=5, now=T0)

    def dispatch(now):
        raise ConnectionError("the broker is down")

    def expire(pk, now, report):
        report.expired.append(str(pk))
        raise ValueError("and a row")

    monkeypatch.setattr(sweep_module, "dispatch_due_handoffs", dispatch)
    monkeypatch.setattr(sweep_module, "expire_effect", expire)

    report = sweep(now=later(6))

    state = TaskState.objects.get(name="sweep")
    assert state.counters == {"interrupted": 1, "expired": 1, "row_errors": 2}
    assert state.last_error == "; ".join(report.errors)
    assert state.last_error.count("; ") == 1


@pytest.mark.django_db
def test_each_hand_back_records_the_count_so_far(agent):
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    sweep(now=later(6))
    start_run(agent, "job-1", now=later(7))  # its runtime starts it again (attempt 2)

    sweep(now=later(13))

    counts = AuditEvent.objects.filter(run=run, verb="restart_ready").order_by("at")
    assert [event.data["auto_restarts"] for event in counts] == [1, 2]
