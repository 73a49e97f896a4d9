"""POST/GET /api/v1/runs, heartbeat and finish, through HTTP on PostgreSQL."""

from __future__ import annotations

import pytest

from approvals.decisions import allow_restart
from runs.models import Attempt, AuditEvent, Effect, Run
from tests.api_client import Api

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


def test_a_new_run_key_creates_the_run_and_attempt_1(api, agent):
    answer = api.start(
        "ticket-4812", title="Answer 4812", input={"ticket": 4812}, agent_version="v1"
    )
    assert answer.status == 201
    assert answer.body["run"]["run_key"] == "ticket-4812"
    assert answer.body["run"]["status"] == "running"
    assert answer.body["run"]["current_attempt"] == 1
    assert answer.body["attempt"]["number"] == 1
    assert answer.body["attempt"]["started_by"] == "agent"
    assert answer.body["attempt"]["verdict_at_start"] is None
    assert answer.body["attempt"]["agent_version"] == "v1"
    assert answer.body["verdict"]["safe"] is True
    assert answer.body["journal"] == [] and answer.body["effects"] == []
    run = Run.objects.get(pk=answer.body["run"]["id"])
    assert run.agent == agent and run.input == {"ticket": 4812}


def test_starting_a_running_run_is_already_running_with_its_attempt_and_heartbeat(api):
    api.start("t")
    answer = api.start("t")
    assert answer.status == 409
    assert answer.code == "already_running"
    assert answer.body["error"]["details"]["attempt"] == 1
    assert answer.body["error"]["details"]["heartbeat_at"]


def test_supersede_of_the_current_attempt_starts_attempt_2(api):
    run_id = api.start("t").body["run"]["id"]
    answer = api.start("t", supersede=1)
    assert answer.status == 200
    assert answer.body["attempt"]["number"] == 2
    assert answer.body["attempt"]["verdict_at_start"]["safe"] is True
    assert Attempt.objects.get(run_id=run_id, number=1).status == "superseded"


def test_supersede_naming_another_attempt_is_already_running(api):
    api.start("t")
    answer = api.start("t", supersede=2)
    assert answer.status == 409 and answer.code == "already_running"


def test_supersede_naming_another_attempt_of_a_failed_run_is_already_running(api):
    """Whatever the run's status (api.md): a stale view of a stopped run starts nothing."""
    run_id = api.start("t").body["run"]["id"]
    api.post(f"/runs/{run_id}/finish", {"attempt": 1, "outcome": "failed"})

    answer = api.start("t", supersede=2)

    assert answer.status == 409 and answer.code == "already_running"
    assert answer.body["error"]["details"]["attempt"] == 1
    assert list(Attempt.objects.filter(run_id=run_id).values_list("number", flat=True)) == [1]
    assert api.start("t", supersede=1).body["attempt"]["number"] == 2


def test_a_restart_may_not_loosen_the_policy_fixed_by_the_first_start(api):
    run_id = api.start("t", restart_policy="manual").body["run"]["id"]
    api.post(f"/runs/{run_id}/finish", {"attempt": 1, "outcome": "failed"})
    answer = api.start("t", restart_policy="keyed")
    assert answer.status == 409 and answer.code == "restart_blocked"
    verdict = answer.body["error"]["details"]["verdict"]
    assert verdict["policy"] == "manual"
    assert verdict["blocking"][0]["reason"] == "manual_policy"


def test_an_unkeyed_effect_blocks_the_restart_and_the_supersede_still_commits(api):
    run_id = api.start("t").body["run"]["id"]
    api.call(run_id, tool="send_email", args={"to": "a@example.com"})
    answer = api.start("t", supersede=1)
    assert answer.status == 409 and answer.code == "restart_blocked"
    blocking = answer.body["error"]["details"]["verdict"]["blocking"]
    assert [b["reason"] for b in blocking] == ["unkeyed_effect"]
    run = Run.objects.get(pk=run_id)
    # The supersede was committed although the restart was refused.
    assert run.status == "interrupted"
    assert Attempt.objects.get(run=run, number=1).status == "superseded"
    assert Effect.objects.get(run=run).status == "unknown"


def test_an_operator_override_lets_the_next_start_through_once(api, operator):
    run_id = api.start("t").body["run"]["id"]
    api.call(run_id, tool="send_email", args={"to": "a@example.com"})
    api.start("t", supersede=1)
    allow_restart(operator, run_id, note="checked the mailbox")
    answer = api.start("t")
    assert answer.status == 200
    assert answer.body["attempt"]["started_by"] == "operator:olivia"
    assert answer.body["attempt"]["verdict_at_start"]["override"]["by"] == "olivia"
    assert answer.body["verdict"]["override"] is None
    api.start("t", supersede=2)
    assert api.start("t").code == "restart_blocked"  # the override was consumed


def test_a_completed_run_answers_run_finished(api):
    run_id = api.start("t").body["run"]["id"]
    assert api.post(f"/runs/{run_id}/finish", {"attempt": 1, "outcome": "completed"}).status == 200
    assert api.start("t").code == "run_finished"
    assert api.post(f"/runs/{run_id}/heartbeat", {"attempt": 1}).code == "run_finished"
    assert api.call(run_id, tool="x", kind="read").code == "run_finished"


def test_later_starts_show_the_runs_own_fixed_values(api):
    run_id = api.start("t", title="first", heartbeat_timeout=30).body["run"]["id"]
    api.post(f"/runs/{run_id}/finish", {"attempt": 1, "outcome": "failed", "error": "boom"})
    answer = api.start("t", title="second", heartbeat_timeout=90)
    assert answer.status == 200
    assert answer.body["run"]["title"] == "first"
    assert answer.body["run"]["heartbeat_timeout"] == 30


def test_heartbeat_moves_the_heartbeat_and_a_stale_attempt_is_told_to_stop(api):
    run_id = api.start("t").body["run"]["id"]
    before = Run.objects.get(pk=run_id).heartbeat_at
    answer = api.post(f"/runs/{run_id}/heartbeat", {"attempt": 1})
    assert answer.status == 200
    assert Run.objects.get(pk=run_id).heartbeat_at > before
    api.start("t", supersede=1)
    assert api.post(f"/runs/{run_id}/heartbeat", {"attempt": 1}).code == "attempt_superseded"


def test_finish_failed_makes_effects_in_flight_unknown(api):
    run_id = api.start("t").body["run"]["id"]
    effect_id = api.call(run_id, tool="reply", key="outlook:message:1", key_source="provider").body[
        "effect"
    ]["id"]
    answer = api.post(f"/runs/{run_id}/finish", {"attempt": 1, "outcome": "failed", "error": "x"})
    assert answer.status == 200 and answer.body["run"]["status"] == "failed"
    assert Effect.objects.get(pk=effect_id).status == "unknown"
    assert Attempt.objects.get(run_id=run_id, number=1).error == "x"
    assert AuditEvent.objects.filter(effect_id=effect_id, new_status="unknown").exists()


def test_get_run_shows_attempts_verdict_journal_and_effects(api):
    run_id = api.start("t").body["run"]["id"]
    api.call(run_id, tool="lookup", kind="read", args={"q": 1})
    api.call(run_id, tool="reply", key="k1", key_source="provider")
    api.start("t", supersede=1)
    answer = api.get(f"/runs/{run_id}")
    assert answer.status == 200
    assert [a["number"] for a in answer.body["attempts"]] == [1, 2]
    assert [c["seq"] for c in answer.body["journal"]] == [1, 2]
    assert len(answer.body["effects"]) == 1
    assert answer.body["verdict"]["notes"][0]["reason"] == "unknown_outcome"


def test_list_runs_is_newest_first_filtered_and_paginated(api):
    for n in range(5):
        api.start(f"run-{n}")
    page = api.get("/runs", limit=2)
    assert page.status == 200
    assert [r["run_key"] for r in page.body["items"]] == ["run-4", "run-3"]
    page2 = api.get("/runs", limit=2, cursor=page.body["next_cursor"])
    assert [r["run_key"] for r in page2.body["items"]] == ["run-2", "run-1"]
    page3 = api.get("/runs", limit=2, cursor=page2.body["next_cursor"])
    assert [r["run_key"] for r in page3.body["items"]] == ["run-0"]
    assert page3.body["next_cursor"] is None
    assert [r["run_key"] for r in api.get("/runs", run_key="run-2").body["items"]] == ["run-2"]
    assert api.get("/runs", status="completed").body["items"] == []
    assert api.get("/runs", restart_ready="true").body["items"] == []


def test_another_agents_run_is_not_found(api, other_agent):
    run_id = api.start("t").body["run"]["id"]
    other = Api(other_agent.token)
    assert other.get(f"/runs/{run_id}").code == "not_found"
    assert other.post(f"/runs/{run_id}/heartbeat", {"attempt": 1}).code == "not_found"
    assert other.call(run_id, tool="x", kind="read").code == "not_found"
    assert other.get("/runs").body["items"] == []
    # The same run_key is another run in the other agent's namespace.
    assert other.start("t").status == 201
