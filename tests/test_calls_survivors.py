"""Recording a call: what ``make mutate`` found unchecked in runs/calls.py (issue 16).

The rules held here (api.md, ``POST /runs/{id}/calls``; product.md rules 1, 5, 8, 9):

- A new effect is journaled in full: its call (the run's own attempt, the request's
  time, the attempt's next number), the effect as declared (one approval unless
  it needs approval and asks for more, no preview unless given, its deadline or its
  claim and timeout), its version 1 (adopted, with the call) and its ``recorded``
  and ``claimed`` events.
- Other arguments for an existing effect: a pending or awaiting effect, or a
  non-final refusal, takes them as a new version (``args_revised``: approvals reset,
  a new deadline only when it starts awaiting again); a frozen one keeps them as
  drift (``args_drift``, naming both hashes). Each event names the run, attempt,
  actor and statuses. An in-flight effect whose attempt stopped turns ``unknown``
  by the system, with why.
- New arguments that the tool policy's ``require`` rule covers make a pending
  effect await approval (issue 20): it never runs unapproved.
- A refused call (a read with a key, a key without its source or a source without
  a key, a key of another tool, live or pruned) says why (class, message, details)
  and journals nothing; another agent's run is not found.
- A pruned key brought back from its tombstone (rule 8: keys do not expire) writes
  a ``restored`` audit event that says where it came from: on the redelivering
  run, by the system, with its note and the tombstone's key, tool, pruned effect,
  pruned run and time of pruning. Keys and tombstones are the agent's own: another
  agent's effect or tombstone of the same key, or the agent's other keys, change
  nothing; a tombstone of a key that never ran gives a fresh effect.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import read, send, start

from approvals.decisions import approve_effect, reject_effect, release_effect
from runs.calls import record_call
from runs.canonical import args_hash
from runs.errors import InvalidRequest, KeyConflict, NotFound
from runs.lifecycle import finish_run
from runs.models import (
    Attempt,
    AuditEvent,
    Call,
    Effect,
    EffectVersion,
    KeyTombstone,
    Run,
    Tool,
    ToolPolicy,
)
from runs.outcomes import complete_effect
from runs.prune import prune_finished_runs
from runs.registry import declare_tools

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


def _tombstone(agent, key: str, status: str, effect_id: str) -> KeyTombstone:
    """A tombstone written as prune writes one, of a key last ``status``."""
    return KeyTombstone.objects.create(
        agent=agent,
        key=key,
        tool="send_email",
        key_source="provider",
        status=status,
        result={"id": "sent"} if status == "done" else None,
        args={"subject": "old"},
        args_hash="0" * 64,
        effect_id=effect_id,
        run_key="old",
        pruned_at=LONG_AGO,
    )


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


# --- A new effect, its call, version and events, in full --------------------

T0 = timezone.now() - timedelta(hours=1)


def _events(effect) -> list[tuple]:
    return [
        (e.verb, e.actor, e.actor_kind, e.run_id, e.attempt_number, e.old_status, e.new_status)
        for e in AuditEvent.objects.filter(effect=effect).order_by("id")
    ]


def test_a_new_keyed_effect_is_recorded_claimed_and_numbered_in_full(agent):
    """The call's own time, its run's own attempt (another run has an attempt 1
    too), the first number of the attempt, the version it adopts."""
    start(agent, "earlier", now=T0)
    run = start(agent, "job", now=T0).run
    args = {"subject": "Hi"}

    recorded = send(agent, run, args=args, timeout=30, now=T0)

    assert recorded.action == "execute"
    call = Call.objects.get(run=run)
    assert recorded.call.pk == call.pk and recorded.effect.pk == call.effect_id
    assert call.attempt_id == Attempt.objects.get(run=run, number=1).pk
    assert (call.attempt_number, call.seq, call.kind, call.tool, call.action) == (
        1,
        1,
        "effect",
        "send_email",
        "execute",
    )
    assert (call.args, call.args_hash, call.at) == (args, args_hash(args), T0)
    effect = Effect.objects.get(pk=recorded.effect.pk)
    assert (effect.agent_id, effect.run_id, effect.tool) == (agent.pk, run.pk, "send_email")
    assert (effect.key, effect.key_source) == ("outlook:message:1", "provider")
    assert (effect.args, effect.args_hash, effect.args_versions) == (args, args_hash(args), 1)
    assert (effect.needs_approval, effect.approvals_required, effect.preview) == (False, 1, "")
    assert (effect.status, effect.revision) == ("in_flight", 2)
    assert (effect.claimed_run_id, effect.claimed_attempt) == (run.pk, 1)
    assert effect.claimed_at == effect.first_claimed_at == T0
    assert effect.timeout_at == T0 + timedelta(seconds=30)
    assert effect.created_at == effect.updated_at == T0
    assert effect.approval_expires_at is None
    label = agent.label
    assert _events(effect) == [
        ("recorded", label, "agent", run.pk, 1, "", "pending"),
        ("claimed", label, "agent", run.pk, 1, "pending", "in_flight"),
    ]
    recorded_event = AuditEvent.objects.get(effect=effect, verb="recorded")
    assert recorded_event.data == {
        "key": "outlook:message:1",
        "tool": "send_email",
        "args_hash": args_hash(args),
    }
    assert recorded_event.at == T0
    version = EffectVersion.objects.get(effect=effect)
    assert (version.number, version.args, version.args_hash) == (1, args, args_hash(args))
    assert (version.author, version.call_id, version.adopted, version.at) == (
        label,
        call.pk,
        True,
        T0,
    )


def test_a_read_answers_with_the_call_it_journaled(agent):
    run = start(agent, now=T0).run

    recorded = read(agent, run, args={"q": "x"})

    call = Call.objects.get(run=run)
    assert (recorded.call.pk, recorded.action, recorded.effect) == (call.pk, "execute", None)
    assert (call.kind, call.tool, call.args, call.seq, call.action, call.effect_id) == (
        "read",
        "search",
        {"q": "x"},
        1,
        "execute",
        None,
    )


def test_a_new_effect_that_needs_approval_waits_with_what_it_declared(agent):
    run = start(agent, now=T0).run

    recorded = send(agent, run, needs_approval=True, preview="Send Hi", approval_ttl=120, now=T0)

    assert recorded.action == "wait"
    effect = Effect.objects.get(pk=recorded.effect.pk)
    assert (effect.status, effect.revision, effect.claimed_run_id) == ("awaiting_approval", 1, None)
    # One approval unless asked for more.
    assert (effect.needs_approval, effect.approvals_required, effect.preview) == (
        True,
        1,
        "Send Hi",
    )
    assert (effect.approval_ttl, effect.approval_expires_at) == (120, T0 + timedelta(seconds=120))
    assert _events(effect) == [
        ("recorded", agent.label, "agent", run.pk, 1, "", "awaiting_approval"),
    ]
    assert Call.objects.get(run=run).action == "wait"


def test_approvals_required_counts_only_for_an_effect_that_needs_approval(agent):
    run = start(agent).run

    asked = send(agent, run, key="k-1", needs_approval=True, approvals_required=2).effect
    free = send(agent, run, key="k-2", approvals_required=2).effect

    assert Effect.objects.get(pk=asked.pk).approvals_required == 2
    assert Effect.objects.get(pk=free.pk).approvals_required == 1


def test_an_unkeyed_effect_takes_the_next_number_after_keyed_calls_and_reads(agent):
    run = start(agent).run
    send(agent, run, key="k-1")
    read(agent, run)
    send(agent, run, key=None)
    send(agent, run, key="k-1")

    assert list(Call.objects.filter(run=run).order_by("seq").values_list("seq", "kind")) == [
        (1, "effect"),
        (2, "read"),
        (3, "effect"),
        (4, "effect"),
    ]


# --- A replay with other arguments: a revision, or drift --------------------


def test_a_revision_of_an_awaiting_effect_is_audited_resets_approvals_and_keeps_its_deadline(
    agent, operator
):
    run = start(agent, now=T0).run
    first = send(
        agent, run, needs_approval=True, approvals_required=2, approval_ttl=600, now=T0
    ).effect
    approve_effect(operator, first.pk, args_hash=first.args_hash, now=T0)
    later = T0 + timedelta(seconds=60)

    replay = send(agent, run, args={"subject": "Hi again"}, now=later)

    assert replay.action == "wait"
    effect = Effect.objects.get(pk=first.pk)
    new_hash = args_hash({"subject": "Hi again"})
    assert (effect.args, effect.args_hash, effect.args_versions) == (
        {"subject": "Hi again"},
        new_hash,
        2,
    )
    assert (effect.status, effect.current_approvals) == ("awaiting_approval", [])
    # Still awaiting: the deadline the first version was given stands.
    assert effect.approval_expires_at == T0 + timedelta(seconds=600)
    assert effect.updated_at == later
    revised = AuditEvent.objects.get(effect=effect, verb="args_revised")
    assert (revised.actor, revised.run_id, revised.attempt_number, revised.at) == (
        agent.label,
        run.pk,
        1,
        later,
    )
    assert (revised.old_status, revised.new_status) == ("awaiting_approval", "awaiting_approval")
    assert revised.data == {"args_hash": new_hash}
    version = EffectVersion.objects.get(effect=effect, number=2)
    assert (version.args, version.adopted, version.call_id) == (
        {"subject": "Hi again"},
        True,
        replay.call.pk,
    )


def test_a_revision_of_a_rejection_asks_again_with_a_new_deadline(agent, operator):
    run = start(agent, now=T0).run
    first = send(agent, run, needs_approval=True, approval_ttl=600, now=T0).effect
    reject_effect(operator, first.pk, args_hash=first.args_hash, note="no", now=T0)
    later = T0 + timedelta(seconds=60)

    replay = send(agent, run, args={"subject": "Hi again"}, now=later)

    assert replay.action == "wait"
    effect = Effect.objects.get(pk=first.pk)
    assert effect.status == "awaiting_approval"
    assert effect.approval_expires_at == later + timedelta(seconds=600)
    revised = AuditEvent.objects.get(effect=effect, verb="args_revised")
    assert (revised.old_status, revised.new_status) == ("rejected", "awaiting_approval")


def test_a_rewritten_replay_of_an_in_flight_effect_is_drift_audited_in_full(agent):
    run = start(agent, now=T0).run
    first = send(agent, run, now=T0)
    later = T0 + timedelta(seconds=5)
    other = {"subject": "Rewritten"}

    replay = send(agent, run, args=other, now=later)

    assert replay.action == "wait"
    effect = Effect.objects.get(pk=first.effect.pk)
    assert (effect.args, effect.args_versions, effect.status) == (
        {"subject": "Hello"},
        2,
        "in_flight",
    )
    drift = AuditEvent.objects.get(effect=effect, verb="args_drift")
    assert (drift.actor, drift.run_id, drift.attempt_number, drift.at) == (
        agent.label,
        run.pk,
        1,
        later,
    )
    assert (drift.old_status, drift.new_status) == ("in_flight", "in_flight")
    assert drift.data == {
        "args_hash": args_hash(other),
        "current_args_hash": args_hash({"subject": "Hello"}),
    }
    version = EffectVersion.objects.get(effect=effect, number=2)
    assert (version.args, version.args_hash, version.adopted, version.call_id) == (
        other,
        args_hash(other),
        False,
        replay.call.pk,
    )


def test_an_effect_whose_holder_stopped_is_made_unknown_by_the_system_on_replay(agent):
    run_a = start(agent, "a", now=T0).run
    first = send(agent, run_a, timeout=60, now=T0)
    # Attempt 1 of run A stops by a path that did not settle its effects.
    Run.objects.filter(pk=run_a.pk).update(status="interrupted")
    run_b = start(agent, "b", now=T0).run
    later = T0 + timedelta(seconds=5)

    replay = send(agent, run_b, now=later)

    assert replay.action == "review"
    effect = Effect.objects.get(pk=first.effect.pk)
    assert (effect.status, effect.timeout_at, effect.updated_at) == ("unknown", None, later)
    event = AuditEvent.objects.get(effect=effect, verb="outcome_unknown")
    assert (event.actor, event.actor_kind, event.attempt_number, event.at) == (
        "system",
        "system",
        1,
        later,
    )
    assert (event.old_status, event.new_status) == ("in_flight", "unknown")
    assert event.note == "The attempt that claimed it has stopped."


def test_a_failed_effect_is_claimed_again_by_the_replaying_attempt_in_full(agent):
    """The retry's claim names the attempt that replays it (here a restart's)."""
    run = start(agent, now=T0).run
    first = send(agent, run, timeout=30, now=T0).effect
    complete_effect(agent, first.pk, run_id=run.pk, attempt=1, outcome="failed", now=T0)
    start(agent, supersede=1, now=T0)
    later = T0 + timedelta(seconds=60)

    retry = send(agent, run, attempt=2, now=later)

    assert retry.action == "execute"
    effect = Effect.objects.get(pk=first.pk)
    assert (effect.status, effect.claimed_run_id, effect.claimed_attempt) == (
        "in_flight",
        run.pk,
        2,
    )
    assert (effect.claimed_at, effect.first_claimed_at, effect.updated_at) == (later, T0, later)
    assert effect.timeout_at == later + timedelta(seconds=30)
    claim = AuditEvent.objects.filter(effect=effect, verb="claimed").order_by("id").last()
    assert (claim.actor, claim.run_id, claim.attempt_number, claim.at) == (
        agent.label,
        run.pk,
        2,
        later,
    )
    assert (claim.old_status, claim.new_status) == ("failed", "in_flight")


# --- Refusals: class, message, details; nothing journaled ------------------

REFUSALS = {
    "read with a key": (
        {"kind": "read", "key": "k", "key_source": "intent"},
        InvalidRequest,
        "A read may not carry a key.",
        {"fields": {"key": "not allowed on a read"}},
    ),
    "key without source": (
        {"key": "k", "key_source": None},
        InvalidRequest,
        "key_source is required with key.",
        {"fields": {"key_source": "required"}},
    ),
    "source without key": (
        {"key": None, "key_source": "intent"},
        InvalidRequest,
        "key_source needs a key.",
        {"fields": {"key_source": "only with key"}},
    ),
    "the key of another tool": (
        {"key": "k-1", "key_source": "intent", "tool": "archive_message"},
        KeyConflict,
        "The key 'k-1' belongs to the tool 'send_email'.",
        {"tool": "send_email"},
    ),
    "the pruned key of another tool": (
        {"key": KEY, "key_source": "provider", "tool": "archive_message"},
        KeyConflict,
        f"The key {KEY!r} belongs to the tool 'send_email'.",
        {"tool": "send_email"},
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refused_call_says_why_and_journals_nothing(agent, case):
    fields, error, message, details = REFUSALS[case]
    _pruned_done_key(agent)
    run = start(agent, "new").run
    send(agent, run, key="k-1", key_source="intent")
    request = {
        "attempt": 1,
        "tool": "send_email",
        "kind": "effect",
        "args": {"subject": "Hello"},
        **fields,
    }

    with pytest.raises(error) as caught:
        record_call(agent, run.pk, **request)

    assert (caught.value.message, caught.value.details) == (message, details)
    # The test's transaction is still usable (the rule's block rolled back alone),
    # and only the first call was journaled.
    assert Call.objects.filter(run=run).count() == 1
    assert not Effect.objects.filter(key=KEY).exists()


def test_another_agents_run_is_not_found(agent, other_agent):
    run = start(agent).run

    with pytest.raises(NotFound) as caught:
        send(other_agent, run)

    assert caught.value.message == "No such run for this agent."
    assert not Call.objects.exists()


def test_a_call_of_a_restarted_run_is_journaled_on_its_current_attempt(agent):
    run = start(agent).run
    start(agent, supersede=1)

    recorded = send(agent, run, attempt=2)

    assert recorded.call.attempt_id == Attempt.objects.get(run=run, number=2).pk
    assert Call.objects.get(pk=recorded.call.pk).attempt_id == recorded.call.attempt_id


# --- Tombstones of other keys, other agents, and keys that never ran ---------


def test_another_agents_tombstone_of_the_same_key_leaves_the_key_new(agent, other_agent):
    _pruned_done_key(other_agent)

    recorded = send(agent, start(agent, "new").run, key=KEY, args=ARGS)

    assert recorded.action == "execute"
    assert recorded.effect.result is None and recorded.effect.agent_id == agent.pk


def test_a_tombstone_of_another_key_leaves_a_new_key_new(agent):
    _pruned_done_key(agent)

    recorded = send(agent, start(agent, "new").run, key="outlook:message:<new@x>", args=ARGS)

    assert recorded.action == "execute"
    assert not AuditEvent.objects.filter(effect=recorded.effect, verb="restored").exists()


def test_a_pruned_key_is_restored_from_its_agents_tombstone_among_others(agent, other_agent):
    """Two agents pruned the same key, and the agent pruned another key too."""
    _pruned_done_key(other_agent)
    mine = _pruned_done_key(agent)
    _tombstone(agent, "another", "done", "01900000-0000-7000-8000-000000000001")

    recorded = send(agent, start(agent, "new").run, key=KEY, args=ARGS)

    assert recorded.action == "skip"
    restored = AuditEvent.objects.get(effect=recorded.effect, verb="restored")
    assert restored.data["pruned_effect_id"] == str(mine.effect_id)


def test_a_pruned_key_that_never_ran_is_declared_afresh_by_the_call(agent):
    """A failed key's tombstone: nothing was done, so the call makes a new effect."""
    _tombstone(agent, KEY, "failed", "01900000-0000-7000-8000-000000000000")
    run = start(agent, "new", now=T0).run

    recorded = send(agent, run, key=KEY, args=ARGS, timeout=30, now=T0)

    assert recorded.action == "execute"
    effect = Effect.objects.get(pk=recorded.effect.pk)
    assert (effect.agent_id, effect.run_id, effect.tool) == (agent.pk, run.pk, "send_email")
    assert (effect.key, effect.key_source, effect.args, effect.args_versions) == (
        KEY,
        "provider",
        ARGS,
        1,
    )
    assert (effect.status, effect.claimed_run_id, effect.claimed_attempt) == (
        "in_flight",
        run.pk,
        1,
    )
    assert (effect.created_at, effect.timeout_at) == (T0, T0 + timedelta(seconds=30))
    assert [e[0] for e in _events(effect)] == ["recorded", "claimed"]
    assert recorded.call.seq == 1


def test_new_arguments_that_a_require_rule_covers_make_a_pending_effect_ask_first(agent, operator):
    """A released effect (pending, no approval) replayed with arguments its tool's
    policy requires approval for waits for a person: it never runs unapproved."""
    declare_tools(agent, [{"name": "send_campaign", "kind": "effect"}])
    ToolPolicy.objects.create(
        tool=Tool.objects.get(agent=agent, name="send_campaign"),
        updated_at=T0,
        rules=[{"id": "big", "pointer": "/amount", "op": ">", "value": 1000, "action": "require"}],
    )
    run = start(agent, now=T0).run
    campaign = {"tool": "send_campaign", "key": "c-1", "key_source": "intent"}
    first = send(agent, run, args={"amount": 100}, now=T0, **campaign).effect
    start(agent, supersede=1, now=T0)
    release_effect(operator, first.pk, args_hash=first.args_hash, note="not sent", now=T0)
    later = T0 + timedelta(seconds=60)

    replay = send(agent, run, attempt=2, args={"amount": 5000}, now=later, **campaign)

    assert replay.action == "wait"
    effect = Effect.objects.get(pk=first.pk)
    assert (effect.status, effect.needs_approval, effect.claimed_run_id) == (
        "awaiting_approval",
        True,
        None,
    )
    assert effect.approval_expires_at == later + timedelta(seconds=effect.approval_ttl)
    revised = AuditEvent.objects.get(effect=effect, verb="args_revised")
    assert (revised.old_status, revised.new_status) == ("pending", "awaiting_approval")
