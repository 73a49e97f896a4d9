"""The notification task is thin over ``approvals.notifications.notify``."""

from __future__ import annotations

import pytest
from django.core import mail

from approvals import tasks
from runs.calls import record_call
from runs.lifecycle import start_run


def test_the_notify_task_acknowledges_late():
    assert tasks.notify.acks_late


@pytest.mark.django_db
def test_the_notify_task_sends_what_waits(agent, operator):
    run = start_run(agent, "job", heartbeat_timeout=3600).run
    record_call(
        agent,
        run.pk,
        attempt=1,
        tool="refund",
        kind="effect",
        args={},
        key="r:1",
        key_source="intent",
        needs_approval=True,
    )

    assert tasks.notify.apply().get() == "1 sent, 0 skipped"
    assert len(mail.outbox) == 1
