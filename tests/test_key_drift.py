"""The key-drift hold (product.md, "Key-drift hold"; runs/policies.py ``drift_origin``):
a restarted attempt's new key for a tool whose earlier effect in the run was done or
left unknown, and that this attempt has not named, waits for a person."""

from __future__ import annotations

import pytest
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect
from runs.canonical import args_hash
from runs.lifecycle import finish_run
from runs.models import AuditEvent, EffectStatus
from runs.outcomes import complete_effect

pytestmark = pytest.mark.django_db


def _key_from_text(to: str, body: str) -> str:
    """The arguments-hash key design: the key is built from the generated text, so a
    model that rewrites the text makes a new key (the failure the product prevents)."""
    return "email:" + args_hash({"to": to, "body": body})


def _send_generated(agent, run, attempt: int, body: str):
    args = {"to": "ceo@example.com", "body": body}
    return send(
        agent,
        run,
        attempt=attempt,
        tool="send_email",
        key=_key_from_text(args["to"], body),
        key_source="content",
        args=args,
    )


def _restart(agent, run_key="job-1"):
    """Attempt 1 dies (superseded): the run starts again as attempt 2."""
    return start(agent, run_key, supersede=1).attempt.number


def test_a_key_rebuilt_from_rewritten_text_is_held_not_executed(agent, operator):
    run = start(agent).run
    first = _send_generated(agent, run, 1, "Hi, the Q3 numbers are attached.")
    assert first.action == "execute"
    complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={})
    attempt = _restart(agent)

    # The model rewrote the body on the replay: the key is new, dedupe cannot see it.
    second = _send_generated(agent, run, attempt, "Hello! Attached are the Q3 figures.")

    assert second.effect.pk != first.effect.pk
    assert second.action == "wait"  # held: not executed
    effect = second.effect
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert effect.claimed_run_id is None and effect.first_claimed_at is None
    assert effect.hold["reason"] == "key_drift"
    assert effect.hold["effect_id"] == str(first.effect.pk)
    assert not AuditEvent.objects.filter(effect=effect, verb="claimed").exists()
    effect.refresh_from_db()  # as saved
    assert (effect.status, effect.hold["reason"], effect.revision) == (
        "awaiting_approval",
        "key_drift",
        1,
    )
    recorded = AuditEvent.objects.get(effect=effect, verb="recorded")
    assert recorded.new_status == "awaiting_approval"
    assert recorded.data["hold"]["effect_id"] == str(first.effect.pk)

    # An operator decides it is really new: approved, it may then run.
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED


def test_an_earlier_effect_left_unknown_holds_a_new_key_too(agent):
    run = start(agent).run
    first = _send_generated(agent, run, 1, "v1")  # in flight when attempt 1 dies
    attempt = _restart(agent)
    first.effect.refresh_from_db()
    assert first.effect.status == EffectStatus.UNKNOWN

    second = _send_generated(agent, run, attempt, "v2")

    assert second.effect.hold["reason"] == "key_drift"
    assert second.action == "wait"


def test_a_genuinely_new_effect_of_a_tool_with_no_earlier_one_is_not_held(agent):
    run = start(agent).run
    other = send(agent, run, tool="crm.note", key="note-1", key_source="intent")
    complete_effect(agent, other.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={})
    attempt = _restart(agent)

    recorded = _send_generated(agent, run, attempt, "first e-mail of this run")

    assert recorded.action == "execute"
    assert recorded.effect.hold is None


def test_a_new_key_after_the_attempt_named_the_earlier_one_is_not_held(agent):
    run = start(agent).run
    first = _send_generated(agent, run, 1, "same text")
    complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={})
    attempt = _restart(agent)

    assert _send_generated(agent, run, attempt, "same text").action == "skip"  # named
    assert _send_generated(agent, run, attempt, "a second, new e-mail").action == "execute"


def test_a_first_attempt_never_holds_and_undone_earlier_effects_do_not_count(agent):
    run = start(agent).run
    assert _send_generated(agent, run, 1, "a").action == "execute"
    assert _send_generated(agent, run, 1, "b").action == "execute"  # attempt 1: no earlier
    # An earlier effect that did not happen (failed) is no drift: it would be retried.
    other_run = start(agent, "job-2").run
    failed = _send_generated(agent, other_run, 1, "c")
    complete_effect(agent, failed.effect.pk, run_id=other_run.pk, attempt=1, outcome="failed")
    finish_run(agent, other_run.pk, attempt=1, outcome="failed")
    attempt = start(agent, "job-2").attempt.number

    assert _send_generated(agent, other_run, attempt, "d").action == "execute"


def test_a_drifted_key_is_held_even_where_the_policy_approves_automatically(agent):
    from django.utils import timezone

    from runs.models import Tool, ToolPolicy
    from runs.registry import declare_tools

    declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    ToolPolicy.objects.create(
        tool=Tool.objects.get(agent=agent, name="send_email"),
        rules=[{"id": "any", "pointer": "/to", "op": "matches", "value": "@", "action": "approve"}],
        updated_at=timezone.now(),
    )
    run = start(agent).run
    first = _send_generated(agent, run, 1, "v1")
    assert first.effect.decision["by"] == "policy:any"  # approved automatically, executed
    complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={})
    attempt = _restart(agent)

    second = _send_generated(agent, run, attempt, "v2")

    assert second.action == "wait"
    assert second.effect.hold["reason"] == "key_drift"
    assert second.effect.decision is None
