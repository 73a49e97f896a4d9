"""The sweep's fallback, one run at a time, makes the changes the batch makes.

``interrupt_stale_runs`` interrupts stale runs in set-based batches; when a batch
raises, the sweep redoes its runs one at a time with ``interrupt_stale_run``, which
writes the same rows by its own code. Only one test reached that code, with one
plain run: ``make mutate`` found most of its one-line bugs passing. Here each kind
of stale run the sweep decides about goes through both paths, and what each path
wrote (runs, attempts, effects, audit trail, notifications, hand-offs, the report)
must be the same, the batch's being checked by tests/test_sweep.py.

Its re-check under the row lock (a run that is no longer running, or no longer
stale, is left alone) matters only when the run changed between the sweep's read
and its lock: called directly on such runs, it changes nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from approvals.models import Notification
from runs import sweep as sweep_module
from runs.calls import record_call
from runs.lifecycle import finish_run, heartbeat, start_run
from runs.models import Agent, AuditEvent, Call, Effect, RestartHandoff, Run, RunStatus
from runs.outcomes import complete_effect
from runs.sweep import SweepReport, interrupt_stale_run, interrupt_stale_runs, sweep

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
CAP = 2


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch, settings):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda run_id, attempt, **kw: None)
    settings.STARTSAFE = {**settings.STARTSAFE, "AUTO_RESTART_CAP": CAP}


def _call(agent, run, *, key, kind="effect", tool="send_mail", timeout=None):
    return record_call(
        agent,
        run.pk,
        attempt=run.current_attempt,
        tool=tool,
        kind=kind,
        args={"to": "a@example.com"},
        key=key,
        key_source="intent" if key else None,
        timeout=timeout,
        now=T0,
    )


def _stale_runs(prefix: str) -> dict[str, Run]:
    """One stale run of each kind the sweep decides about, and one not yet stale, of an
    agent of their own (their run keys are the same for every ``prefix``)."""
    agent = Agent(name=f"{prefix}-bot")
    agent.set_new_token()
    agent.save()
    runs = {}

    def start(name, **kwargs):
        runs[name] = start_run(agent, name, heartbeat_timeout=5, now=T0, **kwargs).run
        return runs[name]

    # Safe and keyed, with a runtime to hand it to: its in-flight effect (with a
    # timeout) becomes unknown; the one it completed stays done.
    handed_off = start("handed-off", restart_url="http://runtime.test/restart")
    done = _call(agent, handed_off, key="mail:0").effect
    complete_effect(
        agent, done.pk, run_id=handed_off.pk, attempt=1, outcome="done", result={}, now=T0
    )
    _call(agent, handed_off, key="mail:1", timeout=30)
    # Safe and keyed, no runtime: marked ready, nothing to hand off. On its second
    # attempt, handed back once already: the count goes on from there.
    start("ready")
    start("ready", supersede=1)
    Run.objects.filter(pk=runs["ready"].pk).update(auto_restarts=1)
    # Safe, but its automatic restarts are used up.
    Run.objects.filter(pk=start("capped").pk).update(auto_restarts=CAP)
    # Keyed, but it started an effect without a key.
    _call(agent, start("unkeyed-effect"), key=None)
    # Blunt: any recorded call blocks.
    _call(agent, start("blunt", restart_policy="blunt"), key=None, kind="read", tool="lookup")
    # Manual: never handed back.
    start("manual", restart_policy="manual", restart_url="http://runtime.test/restart")
    # Heartbeating: not stale at the sweep.
    heartbeat(agent, start("alive").pk, attempt=1, now=later(4))
    for name, run in runs.items():
        runs[name] = Run.objects.get(pk=run.pk)
    return runs


def _what_was_written(runs: dict[str, Run], report: SweepReport) -> dict:
    """Every row the sweep may write for these runs, with ids replaced by names."""
    names = {str(run.pk): name for name, run in runs.items()}
    effects = Effect.objects.filter(run__in=runs.values()).order_by("created_at")
    for effect in effects:
        names[str(effect.pk)] = f"effect of {names[str(effect.run_id)]}"
    for call in Call.objects.filter(run__in=runs.values()):
        names[str(call.pk)] = f"call {call.seq} of {names[str(call.run_id)]}"

    def named(value):
        text = json.dumps(value, sort_keys=True, default=str)
        for pk, name in names.items():
            text = text.replace(pk, name)
        return json.loads(text)

    written = {}
    for name, run in runs.items():
        run = Run.objects.get(pk=run.pk)
        written[name] = named(
            {
                "run": [run.status, run.restart_ready, run.auto_restarts, run.current_attempt]
                + [run.updated_at.isoformat()],
                "stale_at": run.stale_at.isoformat(),
                "attempts": list(
                    run.attempts.order_by("number").values_list("number", "status", "ended_at")
                ),
                "effects": list(
                    Effect.objects.filter(run=run)
                    .order_by("created_at")
                    .values_list(
                        "status",
                        "claimed_run",
                        "claimed_attempt",
                        "claimed_at",
                        "timeout_at",
                        "revision",
                        "updated_at",
                    )
                ),
                "events": [
                    [e.verb, e.actor, e.actor_kind, e.attempt_number, e.effect_id, e.old_status]
                    + [e.new_status, e.note, e.data, e.at.isoformat()]
                    for e in AuditEvent.objects.filter(run=run, at=later(6)).order_by("id")
                ],
                # An effect's own events name it, not the run (outcome_unknown).
                "effect_events": [
                    [e.verb, e.actor, e.attempt_number, e.old_status, e.new_status, e.note]
                    for e in AuditEvent.objects.filter(
                        effect__run=run, run__isnull=True, at=later(6)
                    ).order_by("id")
                ],
                "notifications": list(
                    Notification.objects.filter(run=run)
                    .order_by("dedupe_key")
                    .values_list("kind", "line", "due_at")
                ),
                "handoffs": list(
                    RestartHandoff.objects.filter(run=run).values_list(
                        "attempt", "status", "due_at"
                    )
                ),
            }
        )
    written["report"] = named(
        {
            "interrupted": sorted(report.interrupted),
            "restart_ready": sorted(report.restart_ready),
            "needs_person": sorted(report.needs_person),
            "timed_out": report.timed_out,
            "errors": report.errors,
        }
    )
    return written


@pytest.mark.django_db
def test_one_run_at_a_time_the_sweep_writes_what_the_batch_writes(monkeypatch):
    batch_runs = _stale_runs("batch")
    by_batch = _what_was_written(batch_runs, sweep(now=later(6)))

    def batch_fails(run_ids, now, report):
        raise RuntimeError("the batch failed")

    monkeypatch.setattr(sweep_module, "interrupt_stale_runs", batch_fails)
    single_runs = _stale_runs("single")
    one_at_a_time = _what_was_written(single_runs, sweep(now=later(6)))

    assert one_at_a_time == by_batch
    # And the batch did what tests/test_sweep.py says, for each kind of run.
    decided = {
        name: [written["events"][-1][0], written["events"][-1][7]]
        for name, written in by_batch.items()
        if name not in ("alive", "report")
    }
    assert decided == {
        "handed-off": ["restart_ready", "The verdict is safe: handed back to its runtime."],
        "ready": ["restart_ready", "The verdict is safe: handed back to its runtime."],
        "capped": ["needs_person", "automatic restarts capped"],
        "unkeyed-effect": ["needs_person", "verdict not safe"],
        "blunt": ["needs_person", "verdict not safe"],
        "manual": ["needs_person", "manual policy"],
    }
    assert by_batch["alive"]["events"] == [] and by_batch["alive"]["run"][0] == "running"


@pytest.mark.django_db
@pytest.mark.parametrize("change", ["finished", "heartbeat", "gone"])
def test_a_run_that_changed_before_its_lock_is_left_alone(agent, change):
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    if change == "finished":
        finish_run(agent, run.pk, attempt=1, outcome="completed", now=later(1))
    elif change == "heartbeat":
        heartbeat(agent, run.pk, attempt=1, now=later(5))  # stale at 10 s, the sweep is at 6
    else:
        run.delete()
    events = AuditEvent.objects.count()
    report = SweepReport()

    assert interrupt_stale_run(run.pk, later(6), report) is False

    assert report == SweepReport()
    assert AuditEvent.objects.count() == events
    if change != "gone":
        run.refresh_from_db()
        assert run.status != RunStatus.INTERRUPTED and run.restart_ready is False


@pytest.mark.django_db
def test_a_run_exactly_at_its_stale_time_is_not_yet_stale(agent):
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run

    assert interrupt_stale_run(run.pk, run.stale_at, SweepReport()) is False
    assert interrupt_stale_run(run.pk, run.stale_at + timedelta(microseconds=1), SweepReport())


@pytest.mark.django_db
@pytest.mark.parametrize("change", ["finished", "heartbeat"])
def test_the_batch_leaves_a_run_that_changed_before_its_lock_alone(agent, change):
    """The batch, too, re-checks the runs it was given under their locks."""
    run = start_run(agent, "job-1", heartbeat_timeout=5, now=T0).run
    if change == "finished":
        finish_run(agent, run.pk, attempt=1, outcome="completed", now=later(1))
    else:
        heartbeat(agent, run.pk, attempt=1, now=later(5))
    events = AuditEvent.objects.count()
    report = SweepReport()

    interrupt_stale_runs([run.pk], later(6), report)

    assert report == SweepReport() and AuditEvent.objects.count() == events
    run.refresh_from_db()
    assert run.status != RunStatus.INTERRUPTED
