"""The Celery tasks are thin: they call the plain functions and are safe to run twice."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import tasks
from runs.lifecycle import start_run
from runs.models import RestartHandoff, Run, RunStatus
from tests.runtime_server import RuntimeServer


def test_the_tasks_acknowledge_late():
    # A message is acknowledged after its task ran: a worker that dies mid-task
    # leaves it for another.
    assert tasks.sweep.acks_late and tasks.deliver_restart_handoff.acks_late


@pytest.mark.django_db(transaction=True)
def test_the_sweep_task_interrupts_a_stale_run_and_queues_its_handoff_on_commit(agent, monkeypatch):
    queued = []
    monkeypatch.setattr(
        "runs.tasks.deliver_restart_handoff.apply_async",
        lambda args, **kw: queued.append(tuple(args)),
    )
    run = start_run(agent, "job", heartbeat_timeout=5, restart_url="http://rt.test/r").run
    Run.objects.filter(pk=run.pk).update(stale_at=timezone.now() - timedelta(seconds=1))

    summary = tasks.sweep.apply().get()

    assert summary.startswith("1 run(s) interrupted")
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    # Queued only after the commit, once the row it names exists.
    assert queued == [(str(run.pk), 2)]
    assert RestartHandoff.objects.filter(run=run, attempt=2).exists()


@pytest.mark.django_db
def test_the_handoff_task_delivers_once_and_a_duplicate_does_nothing(
    agent, monkeypatch, allow_loopback
):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda *a, **kw: None)
    with RuntimeServer() as runtime:
        run = start_run(agent, "job", heartbeat_timeout=5, restart_url=runtime.url).run
        Run.objects.filter(pk=run.pk).update(stale_at=timezone.now() - timedelta(seconds=1))
        tasks.sweep.apply()

        first = tasks.deliver_restart_handoff.apply(args=(str(run.pk), 2)).get()
        second = tasks.deliver_restart_handoff.apply(args=(str(run.pk), 2)).get()

    assert (first, second) == ("sent", "done")
    assert len(runtime.deliveries) == 1
