"""A key redelivered while a prune is deleting its old effect (runs/calls.py, runs/prune.py).

The redelivery's insert meets the old effect's row, which the prune has deleted but
not committed: it waits, and when the prune commits, nothing stops it any more. Its
statement began before the tombstone existed, so the insert alone would record the
key as new and execute it again (product.md rule 8: keys do not expire). Committed
for real: the prune on this connection, the redelivery on another thread's.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from lifecycle_helpers import send, start
from race_helpers import wait_for_lock_waiters

from runs.models import AuditEvent, EffectStatus
from tests.test_prune import KEY, _done_run, _prune

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="SQLite runs one writer at a time"
    ),
]


def test_a_key_redelivered_while_its_effect_is_pruned_is_restored_not_executed(agent):
    _done_run(agent, result={"id": "sent-1"})
    again = start(agent, "ticket-1-redelivered").run
    answers: list = []

    def redeliver():
        try:
            answers.append(send(agent, again, key=KEY, args={"subject": "RE: Hello!"}))
        except Exception as exc:  # reported by the assertion below
            answers.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=redeliver)
    with transaction.atomic():  # the prune's batches commit when this block ends
        report = _prune()
        assert report.tombstones == 1
        thread.start()
        assert wait_for_lock_waiters(1) == 1  # the insert waits on the deleted row
    thread.join(timeout=10)

    (recorded,) = answers
    assert not isinstance(recorded, Exception), recorded
    assert recorded.action == "skip"
    assert recorded.effect.status == EffectStatus.DONE
    assert recorded.effect.result == {"id": "sent-1"}
    assert AuditEvent.objects.filter(effect=recorded.effect, verb="restored").exists()
