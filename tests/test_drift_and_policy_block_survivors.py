"""What the mutation run (make mutate) found untested in the key-drift lookup
(runs/policies.py ``drift_origin``), in a revision a ``block`` rule refuses
(runs/calls.py), and in the refusal to approve an unconfirmed tool's effect
(approvals/decisions.py). Each test fails with the mutant it was written for."""

from __future__ import annotations

import pytest
from django.db.models import F
from lifecycle_helpers import read, send, start

from approvals.decisions import allow_restart, approve_effect, mark_effect_done
from runs.errors import NotAllowed
from runs.lifecycle import finish_run
from runs.models import AuditEvent, Call, EffectStatus, Tool, ToolMode, ToolPolicy
from runs.outcomes import complete_effect
from runs.registry import declare_tools, save_policy

pytestmark = pytest.mark.django_db


def _done(agent, run, key: str, attempt: int = 1, tool: str = "send_email"):
    effect = send(agent, run, attempt=attempt, key=key, tool=tool).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=attempt, outcome="done", result={})
    return effect


def _restart(agent, supersede: int, run_key: str = "job-1") -> int:
    return start(agent, run_key, supersede=supersede).attempt.number


def test_a_read_the_restarted_attempt_made_first_does_not_hide_the_drift(agent):
    run = start(agent).run
    earlier = _done(agent, run, "mail:1")
    attempt = _restart(agent, 1)
    read(agent, run, attempt=attempt)  # a call with no effect: NULL in "named"

    held = send(agent, run, attempt=attempt, key="mail:rewritten").effect

    assert held.hold["reason"] == "key_drift"
    assert held.hold["effect_id"] == str(earlier.pk)


def test_the_origin_is_the_earliest_by_attempt_then_seq(agent, operator):
    run = start(agent).run
    read(agent, run)
    read(agent, run)
    first = _done(agent, run, "mail:a")  # attempt 1, seq 3
    attempt = _restart(agent, 1)
    # Attempt 2's new key is held for drift; an operator says it was sent: done, seq 1.
    second = send(agent, run, attempt=attempt, key="mail:b").effect
    mark_effect_done(operator, second.pk, args_hash=second.args_hash, note="sent by hand")
    attempt = _restart(agent, attempt)

    held = send(agent, run, attempt=attempt, key="mail:new").effect

    assert held.hold["effect_id"] == str(first.pk)  # attempt 1 first, whatever its seq


def test_seq_orders_the_candidates_within_an_attempt(agent):
    run = start(agent).run
    first = _done(agent, run, "mail:a")
    second = _done(agent, run, "mail:b")
    Call.objects.filter(effect=first).update(seq=10)  # now after the second in the journal
    # and stored after it too, so that an order by attempt alone would return the first.
    Call.objects.filter(effect=second).update(seq=F("seq"))
    attempt = _restart(agent, 1)

    held = send(agent, run, attempt=attempt, key="mail:new").effect

    assert held.hold["effect_id"] == str(second.pk)


def test_another_runs_effects_are_no_origin(agent):
    other = start(agent, "other-run").run
    _done(agent, other, "mail:other")
    run = start(agent).run
    read(agent, run)
    attempt = _restart(agent, 1)

    effect = send(agent, run, attempt=attempt, key="mail:new").effect

    assert (effect.hold, effect.status) == (None, EffectStatus.IN_FLIGHT)


def test_an_earlier_unkeyed_effect_is_no_origin(agent, operator):
    run = start(agent).run
    unkeyed = send(agent, run, key=None).effect
    complete_effect(agent, unkeyed.pk, run_id=run.pk, attempt=1, outcome="done", result={})
    finish_run(agent, run.pk, attempt=1, outcome="failed")
    allow_restart(operator, run.pk, note="the unkeyed mail was checked")
    attempt = start(agent).attempt.number

    effect = send(agent, run, attempt=attempt, key="mail:new").effect

    assert (effect.hold, effect.status) == (None, EffectStatus.IN_FLIGHT)


BLOCK = {"id": "all", "pointer": "/segment", "op": "=", "value": "all", "action": "block"}


def test_a_revision_a_block_rule_refuses_is_decided_and_audited_in_full(agent, admin_user):
    [tool] = declare_tools(agent, [{"name": "send_campaign", "kind": "effect"}])
    save_policy(admin_user, ToolPolicy(tool=tool, needs_approval=True, rules=[BLOCK]))
    run = start(agent).run
    send(agent, run, tool="send_campaign", key="c-1", args={"segment": "vip"})

    effect = send(agent, run, tool="send_campaign", key="c-1", args={"segment": "all"}).effect

    message = "Blocked by the policy of send_campaign, rule all."
    assert effect.hold == {"reason": "policy_rule", "message": message, "effect_id": None}
    effect.refresh_from_db()
    assert effect.status == EffectStatus.REJECTED
    assert {k: effect.decision[k] for k in ("verb", "by", "note", "final")} == {
        "verb": "rejected",
        "by": "policy:all",
        "note": message,
        "final": True,
    }
    event = AuditEvent.objects.get(effect=effect, verb="rejected")
    assert (event.actor, event.note, event.run_id, event.attempt_number, event.data) == (
        "policy:all",
        message,
        run.pk,
        1,
        {"final": True},
    )
    assert event.new_status == EffectStatus.REJECTED


def test_approving_an_unconfirmed_tools_effect_is_refused_with_its_hold(agent, operator):
    agent.tool_mode = ToolMode.CONFIRM
    agent.save(update_fields=["tool_mode"])
    effect = send(agent, start(agent).run).effect
    assert Tool.objects.get(agent=agent).state == "registered"

    with pytest.raises(NotAllowed) as refused:
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    assert refused.value.details == {"status": "awaiting_approval", "hold": effect.hold}


def test_a_require_rule_without_a_number_asks_one_approval_of_a_revision(agent, admin_user):
    require = {"id": "big", "pointer": "/amount", "op": ">", "value": 100, "action": "require"}
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    save_policy(admin_user, ToolPolicy(tool=tool, rules=[require]))
    run = start(agent).run
    effect = send(agent, run, tool="refund", key="r-1", args={"amount": 5}).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed", error="x")

    revised = send(agent, run, tool="refund", key="r-1", args={"amount": 500}).effect

    assert (revised.status, revised.needs_approval, revised.approvals_required) == (
        EffectStatus.AWAITING_APPROVAL,
        True,
        1,
    )


def test_an_effect_call_of_a_tool_declared_read_records_an_effect(agent):
    declare_tools(agent, [{"name": "search", "kind": "read"}])

    recorded = send(agent, start(agent).run, tool="search", key="s:1")

    assert (recorded.call.kind, recorded.effect is not None) == ("effect", True)


def test_an_unkeyed_effect_of_a_restarted_attempt_is_not_checked_for_drift(agent):
    run = start(agent).run
    _done(agent, run, "mail:1")
    attempt = _restart(agent, 1)

    effect = send(agent, run, attempt=attempt, key=None).effect

    assert (effect.hold, effect.status) == (None, EffectStatus.IN_FLIGHT)
