"""A reconcile records what it settled, by whom and on what evidence; a bad one names its field.

tests/test_reconcile.py checks the status a reconcile leaves and the refusals' kinds;
``make mutate`` showed the rest unread: the decision a reconcile writes (who, when,
the hash it settled, not final), its audit event's run, attempt and data, and the
``details.fields`` an agent's refused request names (api.md, errors) all passed
when changed or dropped.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lifecycle_helpers import send, start

from runs.errors import InvalidRequest
from runs.models import AuditEvent
from runs.outcomes import reconcile_effect

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _unknown(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, now=T0).effect
    start(agent, supersede=1, now=T0)
    return run, effect


@pytest.mark.parametrize("outcome", ["done", "not_done"])
def test_a_reconcile_records_its_decision_and_event_in_full(agent, outcome):
    run, effect = _unknown(agent)
    result = {"id": "abc"} if outcome == "done" else None

    effect, _ = reconcile_effect(
        agent,
        effect.pk,
        run_id=run.pk,
        attempt=2,
        outcome=outcome,
        evidence="sent items at 10:02",
        result=result,
        now=T0,
    )

    effect.refresh_from_db()
    assert effect.decision == {
        "verb": "reconciled",
        "by": "agent:support-bot",
        "at": T0.isoformat(),
        "note": "sent items at 10:02",
        "args_hash": effect.args_hash,
        # The agent's own lookup: an operator may still look again.
        "final": False,
    }
    event = AuditEvent.objects.get(effect=effect, verb=f"reconciled_{outcome}")
    assert (event.run_id, event.attempt_number, event.at) == (run.pk, 2, T0)
    assert event.data == {"outcome": outcome, "result": result}


@pytest.mark.parametrize(
    ("outcome", "evidence", "fields"),
    [
        ("maybe", "sent items", {"outcome": "maybe"}),
        ("done", "", {"evidence": "required"}),
    ],
)
def test_a_refused_reconcile_names_the_field_and_says_why(agent, outcome, evidence, fields):
    run, effect = _unknown(agent)

    with pytest.raises(InvalidRequest) as refused:
        reconcile_effect(
            agent, effect.pk, run_id=run.pk, attempt=2, outcome=outcome, evidence=evidence
        )

    assert refused.value.details == {"fields": fields}
    assert isinstance(refused.value.message, str) and refused.value.message
