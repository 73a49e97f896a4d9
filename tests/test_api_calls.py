"""POST /api/v1/runs/{id}/calls: dedupe on keys, versions, actions, conflicts."""

from __future__ import annotations

import pytest

from approvals.decisions import approve_effect, reject_effect
from runs.models import Call, Effect, EffectVersion
from tests.api_client import Api

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


@pytest.fixture
def run_id(api) -> str:
    return api.start("ticket").body["run"]["id"]


def test_a_read_executes_and_has_no_effect(api, run_id):
    answer = api.call(run_id, tool="lookup_customer", kind="read", args={"id": "c-1"})
    assert answer.status == 201
    assert answer.body["action"] == "execute"
    assert answer.body["effect"] is None
    assert answer.body["call"]["kind"] == "read" and answer.body["call"]["seq"] == 1


def test_a_read_may_not_carry_a_key(api, run_id):
    answer = api.call(run_id, tool="lookup", kind="read", key="k", key_source="provider")
    assert answer.status == 400 and answer.code == "invalid_request"


def test_a_key_without_key_source_is_invalid(api, run_id):
    answer = api.call(run_id, tool="reply", key="k")
    assert answer.status == 400 and "key_source" in answer.body["error"]["details"]["fields"]


def test_a_new_keyed_effect_is_claimed_and_executed(api, run_id):
    answer = api.call(
        run_id, tool="reply", key="outlook:message:1", key_source="provider", args={"body": "hi"}
    )
    assert answer.body["action"] == "execute"
    assert answer.body["effect"]["status"] == "in_flight"
    assert answer.body["effect"]["claimed_by"] == {"run_id": run_id, "attempt": 1}


def test_a_replay_with_rewritten_args_of_a_done_effect_is_skipped(api, run_id):
    first = api.call(run_id, tool="reply", key="m1", key_source="provider", args={"body": "hi"})
    effect_id = first.body["effect"]["id"]
    api.post(
        f"/effects/{effect_id}/complete",
        {"run_id": run_id, "attempt": 1, "outcome": "done", "result": {"sent": True}},
    )
    api.start("ticket", supersede=1)
    replay = api.call(
        run_id,
        attempt=2,
        tool="reply",
        key="m1",
        key_source="provider",
        args={"body": "Hello there"},
    )
    assert replay.body["action"] == "skip"
    assert replay.body["effect"]["result"] == {"sent": True}
    assert replay.body["effect"]["args"] == {"body": "hi"}  # frozen: drift changes nothing
    assert replay.body["effect"]["args_versions"] == 2
    assert EffectVersion.objects.filter(effect_id=effect_id, adopted=False).count() == 1


def test_an_effect_needing_approval_waits(api, run_id):
    answer = api.call(
        run_id,
        tool="send_campaign",
        key="campaign:1",
        key_source="intent",
        needs_approval=True,
        approvals_required=2,
        preview="Send it",
        approval_ttl=3600,
    )
    assert answer.body["action"] == "wait"
    effect = answer.body["effect"]
    assert effect["status"] == "awaiting_approval"
    assert effect["approvals_required"] == 2 and effect["preview"] == "Send it"
    assert effect["approval_expires_at"] is not None


def test_approvals_required_counts_only_with_needs_approval(api, run_id):
    answer = api.call(run_id, tool="x", key="k", key_source="intent", approvals_required=2)
    assert answer.status == 201
    assert answer.body["effect"]["approvals_required"] == 1
    assert answer.body["action"] == "execute"


def test_the_same_key_for_another_tool_is_a_key_conflict(api, run_id):
    api.call(run_id, tool="reply", key="k", key_source="provider")
    answer = api.call(run_id, tool="forward", key="k", key_source="provider")
    assert answer.status == 409 and answer.code == "key_conflict"
    assert answer.body["error"]["details"]["tool"] == "reply"


def test_two_runs_woken_by_one_message_share_one_reply(api):
    first = api.start("webhook-1").body["run"]["id"]
    second = api.start("webhook-2").body["run"]["id"]
    a = api.call(first, tool="reply", key="outlook:message:9", key_source="provider")
    b = api.call(second, tool="reply", key="outlook:message:9", key_source="provider")
    assert a.body["action"] == "execute" and b.body["action"] == "wait"
    assert a.body["effect"]["id"] == b.body["effect"]["id"]
    assert Effect.objects.count() == 1


def test_an_approved_effect_is_claimed_by_the_next_call_with_the_approved_args(
    api, run_id, operator
):
    waiting = api.call(
        run_id,
        tool="send_campaign",
        key="c",
        key_source="intent",
        needs_approval=True,
        args={"subject": "Winter sale"},
    )
    effect = waiting.body["effect"]
    approve_effect(
        operator,
        effect["id"],
        args_hash=effect["args_hash"],
        edited_args={"subject": "Winter sale!"},
    )
    again = api.call(
        run_id,
        tool="send_campaign",
        key="c",
        key_source="intent",
        needs_approval=True,
        args={"subject": "WINTER SALE"},
    )
    assert again.body["action"] == "execute"
    # The agent executes what the operator approved, not what it generated this time.
    assert again.body["effect"]["args"] == {"subject": "Winter sale!"}


def test_a_rejected_effect_is_blocked_and_a_revision_asks_again(api, run_id, operator):
    waiting = api.call(
        run_id,
        tool="send_campaign",
        key="c",
        key_source="intent",
        needs_approval=True,
        args={"subject": "A"},
    )
    effect = waiting.body["effect"]
    reject_effect(operator, effect["id"], args_hash=effect["args_hash"], note="wrong segment")
    same = api.call(
        run_id,
        tool="send_campaign",
        key="c",
        key_source="intent",
        needs_approval=True,
        args={"subject": "A"},
    )
    assert same.body["action"] == "blocked"
    assert same.body["effect"]["decision"]["note"] == "wrong segment"
    revised = api.call(
        run_id,
        tool="send_campaign",
        key="c",
        key_source="intent",
        needs_approval=True,
        args={"subject": "B"},
    )
    assert revised.body["action"] == "wait"
    assert revised.body["effect"]["status"] == "awaiting_approval"


def test_the_journal_numbers_calls_in_order_within_an_attempt(api, run_id):
    for n in range(3):
        api.call(run_id, tool="lookup", kind="read", args={"n": n})
    assert list(Call.objects.filter(run_id=run_id).values_list("seq", flat=True)) == [1, 2, 3]


def test_a_call_from_a_superseded_attempt_is_refused(api, run_id):
    api.start("ticket", supersede=1)
    answer = api.call(run_id, attempt=1, tool="lookup", kind="read")
    assert answer.status == 409 and answer.code == "attempt_superseded"
