"""The approval poll, the effect list, claim, complete and reconcile, through HTTP."""

from __future__ import annotations

import pytest
from lifecycle_helpers import effect_in

from approvals.decisions import approve_effect, release_effect
from runs.models import AuditEvent, Effect
from tests.api_client import Api

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


@pytest.fixture
def run_id(api) -> str:
    return api.start("ticket").body["run"]["id"]


def _campaign(api, run_id, **extra) -> dict:
    return api.call(
        run_id,
        tool="send_campaign",
        key="campaign:1",
        key_source="intent",
        needs_approval=True,
        args={"subject": "Winter"},
        **extra,
    ).body["effect"]


def test_the_poll_answers_wait_with_an_etag_and_304_while_nothing_changed(api, run_id):
    effect = _campaign(api, run_id)
    poll = api.get(f"/effects/{effect['id']}")
    assert poll.status == 200 and poll.body["action"] == "wait"
    etag = poll.headers["ETag"]
    again = api.get(f"/effects/{effect['id']}", headers={"If-None-Match": etag})
    assert again.status == 304 and again.body is None


def test_the_poll_answers_claim_after_approval_with_a_new_etag(api, run_id, operator):
    effect = _campaign(api, run_id)
    etag = api.get(f"/effects/{effect['id']}").headers["ETag"]
    approve_effect(operator, effect["id"], args_hash=effect["args_hash"])
    poll = api.get(f"/effects/{effect['id']}", headers={"If-None-Match": etag})
    assert poll.status == 200 and poll.body["action"] == "claim"
    assert poll.headers["ETag"] != etag
    assert poll.body["effect"]["approvals"][0]["by"] == "olivia"
    assert poll.body["effect"]["decision"]["verb"] == "approved"


def test_the_poll_is_one_token_lookup_and_one_effect_lookup(
    api, run_id, django_assert_max_num_queries
):
    effect = _campaign(api, run_id)
    # Expected: 1. the agent by token hash, 2. the effect by id and agent. No writes.
    with django_assert_max_num_queries(2):
        api.get(f"/effects/{effect['id']}")


def test_claim_executes_an_approved_effect_once(api, run_id, operator):
    effect = _campaign(api, run_id)
    approve_effect(operator, effect["id"], args_hash=effect["args_hash"])
    first = api.post(f"/effects/{effect['id']}/claim", {"run_id": run_id, "attempt": 1})
    second = api.post(f"/effects/{effect['id']}/claim", {"run_id": run_id, "attempt": 1})
    assert first.body["action"] == "execute"
    assert second.body["action"] == "wait"
    assert Effect.objects.get(pk=effect["id"]).status == "in_flight"


def test_claim_by_a_run_that_never_called_the_effect_is_a_claim_conflict(api, run_id, operator):
    effect = _campaign(api, run_id)
    approve_effect(operator, effect["id"], args_hash=effect["args_hash"])
    other_run = api.start("other").body["run"]["id"]
    answer = api.post(f"/effects/{effect['id']}/claim", {"run_id": other_run, "attempt": 1})
    assert answer.status == 409 and answer.code == "claim_conflict"


def test_claim_from_a_stopped_attempt_is_attempt_superseded(api, run_id):
    effect = _campaign(api, run_id)
    api.start("ticket", supersede=1)
    answer = api.post(f"/effects/{effect['id']}/claim", {"run_id": run_id, "attempt": 1})
    assert answer.status == 409 and answer.code == "attempt_superseded"


def test_complete_done_records_the_result_and_a_repeat_keeps_the_first(api, run_id):
    effect = api.call(run_id, tool="reply", key="m", key_source="provider").body["effect"]
    done = api.post(
        f"/effects/{effect['id']}/complete",
        {"run_id": run_id, "attempt": 1, "outcome": "done", "result": {"id": 1}},
    )
    assert done.status == 200 and done.body["effect"]["status"] == "done"
    again = api.post(
        f"/effects/{effect['id']}/complete",
        {"run_id": run_id, "attempt": 1, "outcome": "done", "result": {"id": 2}},
    )
    assert again.status == 200 and again.body["effect"]["result"] == {"id": 1}


def test_a_late_report_after_the_attempt_stopped_is_recorded(api, run_id):
    effect = api.call(run_id, tool="reply", key="m", key_source="provider").body["effect"]
    api.start("ticket", supersede=1)
    assert Effect.objects.get(pk=effect["id"]).status == "unknown"
    late = api.post(
        f"/effects/{effect['id']}/complete",
        {"run_id": run_id, "attempt": 1, "outcome": "done", "result": {"ok": 1}},
    )
    assert late.status == 200 and late.body["effect"]["status"] == "done"


def test_a_late_report_after_release_is_a_conflict_kept_for_operators(api, run_id, operator):
    effect = api.call(run_id, tool="reply", key="m", key_source="provider").body["effect"]
    api.start("ticket", supersede=1)
    release_effect(operator, effect["id"], args_hash=effect["args_hash"], note="not sent")
    late = api.post(
        f"/effects/{effect['id']}/complete",
        {"run_id": run_id, "attempt": 1, "outcome": "done", "result": {"ok": 1}},
    )
    assert late.status == 409 and late.code == "claim_conflict"
    # Operators must see a report that contradicts their release.
    assert AuditEvent.objects.filter(effect_id=effect["id"], verb="late_report").exists()


def test_reconcile_done_settles_an_unknown_effect_with_evidence(api, run_id):
    effect = api.call(run_id, tool="reply", key="m", key_source="provider").body["effect"]
    api.start("ticket", supersede=1)
    api.call(run_id, attempt=2, tool="reply", key="m", key_source="provider")
    answer = api.post(
        f"/effects/{effect['id']}/reconcile",
        {
            "run_id": run_id,
            "attempt": 2,
            "outcome": "done",
            "evidence": "found in Sent Items by internetMessageId",
            "result": {"found": True},
        },
    )
    assert answer.status == 200
    assert answer.body["action"] == "skip"
    assert answer.body["effect"]["decision"]["verb"] == "reconciled"
    assert answer.body["effect"]["decision"]["by"] == "agent:support-bot"


def test_reconcile_not_done_releases_the_effect_to_be_claimed(api, run_id):
    effect = api.call(run_id, tool="reply", key="m", key_source="provider").body["effect"]
    api.start("ticket", supersede=1)
    answer = api.post(
        f"/effects/{effect['id']}/reconcile",
        {
            "run_id": run_id,
            "attempt": 2,
            "outcome": "not_done",
            "evidence": "not in Sent Items",
        },
    )
    assert answer.body["effect"]["status"] == "pending" and answer.body["action"] == "claim"


def test_reconcile_of_an_effect_that_is_not_unknown_is_a_claim_conflict(api, run_id):
    effect = api.call(run_id, tool="reply", key="m", key_source="provider").body["effect"]
    answer = api.post(
        f"/effects/{effect['id']}/reconcile",
        {
            "run_id": run_id,
            "attempt": 1,
            "outcome": "done",
            "evidence": "x",
        },
    )
    assert answer.status == 409 and answer.code == "claim_conflict"


def test_list_effects_filters_by_run_status_key_and_tool(api, run_id):
    api.call(run_id, tool="reply", key="m1", key_source="provider")
    _campaign(api, run_id)
    assert len(api.get("/effects").body["items"]) == 2
    assert len(api.get("/effects", run_id=run_id).body["items"]) == 2
    assert [e["key"] for e in api.get("/effects", status="awaiting_approval").body["items"]] == [
        "campaign:1"
    ]
    assert [e["tool"] for e in api.get("/effects", key="m1").body["items"]] == ["reply"]
    assert len(api.get("/effects", tool="send_campaign").body["items"]) == 1


def test_another_agents_effect_is_not_found(api, run_id, other_agent):
    effect = _campaign(api, run_id)
    other = Api(other_agent.token)
    assert other.get(f"/effects/{effect['id']}").code == "not_found"
    assert (
        other.post(f"/effects/{effect['id']}/claim", {"run_id": run_id, "attempt": 1}).code
        == "not_found"
    )
    assert other.get("/effects").body["items"] == []


@pytest.mark.parametrize(
    ("status", "action"),
    [
        ("pending", "claim"),
        ("approved", "claim"),
        ("failed", "claim"),
        ("awaiting_approval", "wait"),
        ("in_flight", "wait"),
        ("done", "skip"),
        ("unknown", "review"),
        ("rejected", "blocked"),
        ("expired", "blocked"),
    ],
)
def test_the_poll_answers_the_action_of_every_status(api, agent, operator, status, action):
    """api.md's Action table: the poll never answers execute, and an unknown outcome
    is for a person (review), never released by a poll."""
    effect = effect_in(agent, operator, status)

    poll = api.get(f"/effects/{effect.pk}")

    assert poll.status == 200
    assert (poll.body["effect"]["status"], poll.body["action"]) == (status, action)
