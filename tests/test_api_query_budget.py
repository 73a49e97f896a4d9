"""Query budgets of the request path: a keyed POST through the idempotency middleware,
its replay, and the approval poll (200 and 304).

Each test lists the statements it allows, in order. The rule's own statements (the
journal's writes, runs/calls.py) run in the request's transaction, without a
savepoint; their list is the rule's tests' to keep (tests/test_query_budgets_write.py).
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api_client import Api

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the request's own BEGIN and COMMIT
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the key's lock is PostgreSQL's advisory lock"
    ),
]

# An effect that needs no approval: recorded already claimed (runs/calls.py).
_CALL = dict(attempt=1, tool="crm.note", kind="effect", key="n-1", key_source="intent", args={})


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


@pytest.fixture
def run_id(api, agent) -> str:
    # The tool declared first, as the clients do once per process (api.md, POST
    # /tools): a call of a registered tool is the steady state budgeted here (the
    # first call of an undeclared one registers it: test_query_budgets_write.py).
    from runs.registry import declare_tools

    declare_tools(agent, [{"name": "crm.note", "kind": "effect"}])
    return api.post("/runs", {"run_key": "budget"}).body["run"]["id"]


def _shape(statement: str) -> str:
    for shape, says in (
        # First: the poll's statement holds the token rule's condition too.
        ("the token's agent and its effect", "LEFT JOIN runs_effect e ON "),
        ("agent by token", '"runs_agent"."token_hash" = '),
        ("key's lock", "SELECT pg_try_advisory_xact_lock("),
        ("key's answer", 'FROM "runs_idempotentrequest" WHERE'),
        ("keep the answer", 'INSERT INTO "runs_idempotentrequest"'),
    ):
        if says in statement:
            return shape
    return statement


def test_a_keyed_post_is_four_statements_around_its_rule_in_one_transaction(api, run_id):
    with CaptureQueriesContext(connection) as queries:
        recorded = api.post(f"/runs/{run_id}/calls", _CALL, headers={"Idempotency-Key": "k1"})

    assert recorded.status == 201
    shapes = [_shape(q["sql"]) for q in queries]
    rule = shapes[4:-2]  # between the key's answer and its keeping
    assert shapes[:4] + ["<the rule>"] + shapes[-2:] == [
        "agent by token",  # auth.agent_for_request, before the body is read, alone
        "BEGIN",  # then one transaction from the key's lock on: one commit
        "key's lock",  # pg_try_advisory_xact_lock
        "key's answer",  # read after the lock: sees a duplicate's committed answer
        "<the rule>",  # record_call's statements, in the request's transaction
        "keep the answer",  # in the work's transaction
        "COMMIT",
    ]
    # The rule's six (tests/test_query_budgets_write.py::test_record_of_a_new_key: lock
    # the run, insert the effect, lock it, its events, the call, the argument version),
    # without a savepoint of its own: runs/outcomes.py, "savepoint".
    assert len(rule) == 6
    assert not any(s.startswith(("SAVEPOINT", "RELEASE SAVEPOINT")) for s in rule)


def test_a_keyed_replay_reads_the_kept_answer_and_runs_nothing(api, run_id):
    api.post(f"/runs/{run_id}/calls", _CALL, headers={"Idempotency-Key": "k1"})

    with CaptureQueriesContext(connection) as queries:
        again = api.post(f"/runs/{run_id}/calls", _CALL, headers={"Idempotency-Key": "k1"})

    assert again.headers["Idempotent-Replayed"] == "true"
    assert [_shape(q["sql"]) for q in queries] == [
        "agent by token",
        "BEGIN",
        "key's lock",
        "key's answer",
        "COMMIT",
    ]


def test_the_poll_is_one_statement_for_the_token_and_the_effect(api, run_id):
    effect_id = api.post(f"/runs/{run_id}/calls", _CALL).body["effect"]["id"]

    with CaptureQueriesContext(connection) as queries:
        polled = api.get(f"/effects/{effect_id}")
    with CaptureQueriesContext(connection) as unchanged:
        not_modified = api.get(f"/effects/{effect_id}", {"If-None-Match": polled.headers["ETag"]})
    with CaptureQueriesContext(connection) as missing:
        not_found = api.get(f"/effects/{uuid.uuid4()}")
    with CaptureQueriesContext(connection) as stranger:
        unauthorized = Api("no-such-token").get(f"/effects/{effect_id}")

    assert [polled.status, not_modified.status, not_found.status, unauthorized.status] == [
        200,
        304,
        404,
        401,
    ]
    for captured in (queries, unchanged, missing, stranger):
        assert [_shape(q["sql"]) for q in captured] == [
            # poll.poll_sql(), the read-only fast path: the agent by the token rule
            # (auth.agents_by_token_hash) LEFT JOIN its effect by primary key
            "the token's agent and its effect",
        ]


def test_a_post_reads_its_body_outside_any_transaction(api, run_id, monkeypatch):
    # A slow body must hold no transaction open (on SQLite: the one write lock). The
    # body is first read by the body-size check, after the token: no transaction yet.
    from django.db import transaction

    from runs.api import idempotency

    seen = []
    original = idempotency._body_over_limit

    def watched(request):
        seen.append(transaction.get_connection().in_atomic_block)
        return original(request)

    monkeypatch.setattr(idempotency, "_body_over_limit", watched)
    for headers in ({}, {"Idempotency-Key": "k-body"}):
        assert api.post(f"/runs/{run_id}/calls", _CALL, headers=headers).status == 201
    assert seen == [False, False]
