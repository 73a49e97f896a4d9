"""Recording a call: what ``make mutate`` found unchecked in runs/calls.py (issue 16).

The rules held here:

- A pruned key brought back from its tombstone (product.md rule 8: keys do not
  expire) writes a ``restored`` audit event that says where it came from: on the
  redelivering run, by the system, with its note and the tombstone's key, tool,
  pruned effect, pruned run and time of pruning (the console shows them).
- A key is the agent's own: restoring one agent's pruned key is not confused by
  another agent's effect of the same key, nor by the agent's other keys.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import send, start

from runs.lifecycle import finish_run
from runs.models import AuditEvent, Effect, KeyTombstone
from runs.outcomes import complete_effect
from runs.prune import prune_finished_runs

pytestmark = pytest.mark.django_db

LONG_AGO = timezone.now() - timedelta(days=60)
KEY = "outlook:message:<a1@example.com>"
ARGS = {"subject": "Re: hello"}


def _pruned_done_key(agent) -> KeyTombstone:
    """``KEY`` sent and done in a run of long ago, then pruned: only its tombstone stays."""
    run = start(agent, "old", heartbeat_timeout=3600, now=LONG_AGO).run
    effect = send(agent, run, key=KEY, args=ARGS, now=LONG_AGO).effect
    complete_effect(
        agent,
        effect.pk,
        run_id=run.pk,
        attempt=1,
        outcome="done",
        result={"id": "sent-1"},
        now=LONG_AGO,
    )
    finish_run(agent, run.pk, attempt=1, outcome="completed", now=LONG_AGO)
    prune_finished_runs(timedelta(days=30))
    assert not Effect.objects.filter(pk=effect.pk).exists()
    return KeyTombstone.objects.get(agent=agent, key=KEY)


def test_a_restored_key_is_audited_on_the_redelivering_run_with_where_it_came_from(agent):
    tombstone = _pruned_done_key(agent)
    run = start(agent, "new").run

    recorded = send(agent, run, key=KEY, args=ARGS)

    assert recorded.action == "skip"
    event = AuditEvent.objects.get(effect=recorded.effect, verb="restored")
    assert (event.actor, event.actor_kind, event.agent_id) == ("system", "system", agent.pk)
    assert event.run_id == run.pk
    assert (event.old_status, event.new_status) == ("", "done")
    assert event.note == "The key's run was pruned; its tombstone keeps the outcome."
    assert event.data == {
        "key": KEY,
        "tool": "send_email",
        "pruned_effect_id": str(tombstone.effect_id),
        "pruned_run_key": "old",
        "pruned_at": tombstone.pruned_at.isoformat(),
    }


def test_restoring_a_key_ignores_another_agents_effect_of_the_same_key(agent, other_agent):
    _pruned_done_key(agent)
    theirs = send(other_agent, start(other_agent, "theirs").run, key=KEY, args=ARGS).effect

    recorded = send(agent, start(agent, "new").run, key=KEY, args=ARGS)

    assert recorded.action == "skip"
    assert recorded.effect.agent_id == agent.pk and recorded.effect.pk != theirs.pk
    assert recorded.effect.result == {"id": "sent-1"}
    theirs.refresh_from_db()
    assert (theirs.agent_id, theirs.status) == (other_agent.pk, "in_flight")


def test_restoring_a_key_finds_it_among_the_agents_other_keys(agent):
    _pruned_done_key(agent)
    run = start(agent, "new").run
    other = send(agent, run, key="outlook:message:<other@example.com>", args=ARGS).effect

    recorded = send(agent, run, key=KEY, args=ARGS)

    assert recorded.action == "skip"
    assert recorded.effect.key == KEY and recorded.effect.pk != other.pk
    assert recorded.effect.result == {"id": "sent-1"}
