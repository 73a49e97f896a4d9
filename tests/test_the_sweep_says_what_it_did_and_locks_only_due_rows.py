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

from runs import sweep as sweep_module
from runs.lifecycle import start_run
from runs.models import Effect, EffectStatus, Run, RunStatus
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
def test_a_quiet_sweep_locks_no_healthy_row(agent):
    # A run heartbeating within its timeout, an effect in flight within its timeout,
    # an approval within its deadline: nothing is due, so nothing is locked (a lock
    # would make the run's own heartbeat or claim wait on the sweep).
    run = start_run(agent, "healthy", heartbeat_timeout=60, now=T0).run
    send(agent, run, key="in-flight:1", timeout=60, now=T0)
    send(agent, run, key="awaiting:1", needs_approval=True, approval_ttl=3600, now=T0)
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
            release.wait(30)
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
