"""``POST /api/v1/tools``, ``GET /api/v1/tools`` and the v1 additions to calls and
effects (api.md, "Additions in v1"): the exact shapes."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.utils import timezone

from runs.models import Tool, ToolMode, ToolPolicy
from tests.api_client import Api

pytestmark = pytest.mark.django_db

TOOL_FIELDS = [
    "name",
    "kind",
    "key_source",
    "needs_approval",
    "approvals_required",
    "schema",
    "annotations",
    "fingerprint",
    "state",
    "policy",
    "effective",
    "created_at",
    "updated_at",
]


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


def _declare(api, *tools):
    return api.post("/tools", {"tools": list(tools)})


def test_a_declaration_answers_each_tool_with_its_effective_rule(api):
    answer = _declare(
        api,
        {
            "name": "send_campaign",
            "kind": "effect",
            "key_source": "intent",
            "needs_approval": True,
            "approvals_required": 2,
            "schema": {"type": "object"},
            "annotations": {"destructiveHint": True},
        },
        {"name": "search", "kind": "read"},
    )

    assert answer.status == 200
    assert list(answer.body) == ["tools"]
    campaign, search = answer.body["tools"]
    assert list(campaign) == TOOL_FIELDS
    assert {k: campaign[k] for k in TOOL_FIELDS[:7]} == {
        "name": "send_campaign",
        "kind": "effect",
        "key_source": "intent",
        "needs_approval": True,
        "approvals_required": 2,
        "schema": {"type": "object"},
        "annotations": {"destructiveHint": True},
    }
    assert len(campaign["fingerprint"]) == 64
    assert campaign["state"] == "registered"
    assert campaign["policy"] is None
    assert campaign["effective"] == {
        "kind": "effect",
        "needs_approval": True,
        "approvals_required": 2,
        "approval_ttl": settings.STARTSAFE["APPROVAL_TTL"],
        "on_expiry": "expire",
    }
    assert isinstance(campaign["effective"]["approval_ttl"], int)
    assert search["name"] == "search"
    assert (search["key_source"], search["schema"], search["annotations"]) == (None, None, None)
    assert search["effective"]["kind"] == "read"


def test_the_same_declaration_again_changes_nothing_and_a_looser_one_is_a_change(api):
    tool = {"name": "send_campaign", "kind": "effect", "needs_approval": True}
    first = _declare(api, tool).body["tools"][0]
    again = _declare(api, tool).body["tools"][0]
    assert again == first

    changed = _declare(api, {**tool, "needs_approval": False}).body["tools"][0]
    assert changed["state"] == "changed"
    assert changed["needs_approval"] is False  # as declared
    assert changed["effective"]["needs_approval"] is True  # never adopted looser
    assert changed["fingerprint"] != first["fingerprint"]


def test_a_policy_shows_and_tightens_the_effective_rule(api, agent):
    _declare(api, {"name": "send_campaign", "kind": "read"})
    ToolPolicy.objects.create(
        tool=Tool.objects.get(agent=agent),
        kind="effect",
        needs_approval=True,
        approvals_required=3,
        approval_ttl=600,
        on_expiry="reject",
        rules=[{"id": "r1", "pointer": "/n", "op": "<", "value": 5, "action": "approve"}],
        updated_at=timezone.now(),
    )

    tool = api.get("/tools").body["items"][0]

    assert tool["policy"] == {
        "kind": "effect",
        "needs_approval": True,
        "approvals_required": 3,
        "approval_ttl": 600,
        "on_expiry": "reject",
        "rules": [{"id": "r1", "pointer": "/n", "op": "<", "value": 5, "action": "approve"}],
        "updated_at": tool["policy"]["updated_at"],
    }
    assert tool["effective"] == {
        "kind": "effect",
        "needs_approval": True,
        "approvals_required": 3,
        "approval_ttl": 600,
        "on_expiry": "reject",
    }


@pytest.mark.parametrize("count", [0, 501])
def test_one_to_five_hundred_tools(api, count):
    answer = _declare(api, *({"name": f"t{i}", "kind": "read"} for i in range(count)))
    assert answer.status == 400
    assert answer.code == "invalid_request"


def test_five_hundred_tools_are_taken(api):
    answer = _declare(api, *({"name": f"t{i}", "kind": "read"} for i in range(500)))
    assert answer.status == 200
    assert [t["name"] for t in answer.body["tools"]] == [f"t{i}" for i in range(500)]


def test_a_malformed_declaration_is_refused(api):
    for tool in (
        {"name": "x", "kind": "write"},
        {"name": "x"},
        {"name": "x y", "kind": "read"},
        {"name": "x", "kind": "read", "needs_aproval": True},
        {"name": "x", "kind": "read", "approvals_required": 4},
        {"name": "x", "kind": "read", "schema": []},
    ):
        answer = _declare(api, tool)
        assert (answer.status, answer.code) == (400, "invalid_request"), tool


def test_the_list_is_the_agents_own(api, agent, other_agent):
    _declare(api, {"name": "mine", "kind": "read"})
    Api(other_agent.token).post("/tools", {"tools": [{"name": "theirs", "kind": "read"}]})

    listed = api.get("/tools")

    assert listed.status == 200
    assert list(listed.body) == ["items", "next_cursor"]
    assert [t["name"] for t in listed.body["items"]] == ["mine"]
    assert api.get("/tools", name="nope").body["items"] == []
    assert api.get("/tools", state="registered").body["items"][0]["name"] == "mine"
    assert api.get("/tools", bogus="1").status == 400
    # One value per parameter, as the schema says (schemathesis sent ?name=a&name=b).
    for path in ("/tools", "/runs", "/effects"):
        repeated = api.get(path, limit=["1", "2"])
        assert (repeated.status, repeated.body["error"]["details"]) == (
            400,
            {"fields": {"limit": "given more than once"}},
        )


def test_closed_mode_answers_tool_not_registered(api, agent):
    agent.tool_mode = ToolMode.CLOSED
    agent.save()
    run_id = api.start().body["run"]["id"]

    called = api.call(run_id, tool="send_email")
    declared = _declare(api, {"name": "send_email", "kind": "effect"})

    for answer in (called, declared):
        assert answer.status == 409
        assert answer.body["error"]["code"] == "tool_not_registered"
        assert answer.body["error"]["details"] == {"tool": "send_email"}


def test_an_effect_shows_its_hold_and_a_policys_decision(api, agent):
    _declare(api, {"name": "refund", "kind": "effect"})
    ToolPolicy.objects.create(
        tool=Tool.objects.get(agent=agent),
        rules=[
            {"id": "small", "pointer": "/amount", "op": "≤", "value": 50, "action": "approve"},
            {
                "id": "big",
                "pointer": "/amount",
                "op": ">",
                "value": 500,
                "action": "require",
                "approvals": 2,
            },
        ],
        updated_at=timezone.now(),
    )
    run_id = api.start().body["run"]["id"]

    small = api.call(run_id, tool="refund", key="r-1", key_source="intent", args={"amount": 20})
    big = api.call(run_id, tool="refund", key="r-2", key_source="intent", args={"amount": 900})

    assert small.status == big.status == 201
    assert small.body["action"] == "execute"
    assert small.body["effect"]["hold"] is None
    assert small.body["effect"]["decision"]["by"] == "policy:small"
    assert small.body["effect"]["decision"]["verb"] == "approved"
    assert big.body["action"] == "wait"
    assert big.body["effect"]["approvals_required"] == 2
    assert big.body["effect"]["hold"] == {
        "reason": "policy_rule",
        "message": "The policy of refund, rule big, requires 2 approvals.",
        "effect_id": None,
    }
    # The poll shows it too (its one statement reads the new column).
    polled = api.get(f"/effects/{big.body['effect']['id']}")
    assert polled.body["effect"]["hold"] == big.body["effect"]["hold"]
    assert polled.body["action"] == "wait"
