"""Query budgets of the journal's rules on the API's hot paths (issue 19, item 6).

Each budget lists its statements, in order, by kind and table: a new query in a rule
shows up here, with the list saying which one it is. The rule functions are called
directly (the HTTP layer's own queries, the token and the key, are budgeted with
the middleware); savepoints are left out, since a rule nests in the test's
transaction here and runs in the request's own transaction through the API.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect
from runs.lifecycle import heartbeat, start_run
from runs.outcomes import claim_effect, complete_effect
from runs.registry import declare_tools

pytestmark = pytest.mark.django_db

_TABLE = re.compile(r'(?:FROM|INTO|UPDATE) "(\w+)"(?! [UV]\d)')  # not a subquery's


def _statements(queries) -> list[tuple[str, str]]:
    """(kind, first table) of each statement, savepoints left out."""
    found = []
    for query in queries:
        sql = query["sql"]
        if sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")):
            continue
        table = _TABLE.search(sql)
        found.append((sql.split()[0], table.group(1) if table else ""))
    return found


def _run(rule, *args, **kwargs):
    with CaptureQueriesContext(connection) as queries:
        result = rule(*args, **kwargs)
    return result, _statements(queries)


def test_start_of_a_new_run(agent):
    _, statements = _run(start_run, agent, "budget-run")
    assert statements == [
        ("SELECT", "runs_run"),  # the run by its key, locked: none yet
        ("INSERT", "runs_run"),  # the run, unless a concurrent start won (ON CONFLICT)
        ("SELECT", "runs_run"),  # the run that stands, locked: this one
        ("INSERT", "runs_attempt"),  # attempt 1
        ("UPDATE", "runs_run"),  # the run's current attempt and heartbeat
        ("INSERT", "runs_auditevent"),  # attempt_started
        ("SELECT", "runs_effect"),  # the verdict: unkeyed effects the run started
        ("SELECT", "runs_effect"),  # the verdict: effects its calls point to
    ]


def _declared(agent) -> None:
    """The agent's tool declared, as the clients do once per process before the first
    call (api.md, ``POST /tools``): the calls below are the steady state."""
    declare_tools(agent, [{"name": "send_email", "kind": "effect"}])


def test_record_of_a_new_key(agent):
    _declared(agent)
    run = start(agent).run
    _, statements = _run(send, agent, run, key="budget:1")
    assert statements == [
        # the run locked, with its running attempt's id and the tool's registered
        # rule (runs/registry.py rule_subquery: no query of its own)
        ("SELECT", "runs_run"),
        ("INSERT", "runs_effect"),  # the key's effect, inserted claimed (ON CONFLICT)
        ("SELECT", "runs_effect"),  # the key's effect locked, its tombstone, the last seq
        ("INSERT", "runs_auditevent"),  # recorded and claimed, one statement
        ("INSERT", "runs_call"),  # the call
        ("INSERT", "runs_effectversion"),  # the arguments' version 1
    ]


def test_first_call_of_an_undeclared_tool_registers_it(agent):
    # Once per (agent, tool), ever: the call's own declaration registers the tool.
    run = start(agent).run
    _, statements = _run(send, agent, run, key="budget:1")
    assert statements == [
        ("SELECT", "runs_run"),  # the run locked, its attempt's id, the tool's rule: none
        ("INSERT", "runs_tool"),  # the tool, unless a concurrent first call won (ON CONFLICT)
        ("SELECT", "runs_tool"),  # the tool that stands, locked: this one
        ("INSERT", "runs_tooldeclaration"),  # its first declaration, in its history
        ("INSERT", "runs_effect"),
        ("SELECT", "runs_effect"),
        ("INSERT", "runs_auditevent"),
        ("INSERT", "runs_call"),
        ("INSERT", "runs_effectversion"),
    ]


def test_record_of_a_key_again(agent):
    _declared(agent)
    run = start(agent).run
    send(agent, run, key="budget:1")
    _, statements = _run(send, agent, run, key="budget:1")
    assert statements == [
        ("SELECT", "runs_run"),  # the run locked, with its running attempt's id
        ("INSERT", "runs_effect"),  # nothing: the key is taken (ON CONFLICT DO NOTHING)
        ("SELECT", "runs_effect"),  # the key's effect locked, its tombstone, the last seq
        # (no query whether its holder runs: it is this locked, running attempt)
        ("INSERT", "runs_call"),  # the call (answer: wait, it is in flight)
    ]


def test_claim_of_an_approved_effect(agent, operator):
    _declared(agent)
    run = start(agent).run
    effect = send(agent, run, key="budget:1", needs_approval=True).effect
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    _, statements = _run(claim_effect, agent, effect.pk, run_id=run.pk, attempt=1)
    assert statements == [
        ("SELECT", "runs_run"),  # the run locked (running this attempt: no query for it)
        ("SELECT", "runs_effect"),  # the effect locked
        ("SELECT", "runs_call"),  # this run recorded a call to it
        ("UPDATE", "runs_effect"),  # claimed
        ("INSERT", "runs_auditevent"),  # claimed
    ]


def test_complete(agent):
    _declared(agent)
    run = start(agent).run
    effect = send(agent, run, key="budget:1").effect
    _, statements = _run(
        complete_effect, agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={}
    )
    assert statements == [
        ("SELECT", "runs_run"),  # the run locked
        ("SELECT", "runs_effect"),  # then the effect locked
        ("UPDATE", "runs_effect"),  # done, with its result
        ("INSERT", "runs_auditevent"),  # completed
    ]


def test_heartbeat(agent):
    run = start(agent).run
    _, statements = _run(heartbeat, agent, run.pk, attempt=1)
    assert statements == [
        ("SELECT", "runs_run"),  # the agent's run (its heartbeat timeout)
        ("UPDATE", "runs_run"),  # compare-and-set: still running this attempt
    ]
