"""Schemathesis, stateful: sequences of requests that follow the schema's links.

A start's run id and attempt feed its heartbeat, calls and finish; a call's effect
id feeds the poll, claim, complete and reconcile (the OpenAPI ``links`` declared
in ``runs/api/views.py``). Every check schemathesis has runs on every answer: no server
error, every status, header and body as the schema documents. Bounded so that it
runs in well under two minutes.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from runs.models import Agent
from startsafe.wsgi import application

pytestmark = pytest.mark.slow


def _schema():
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)


def test_the_schema_declares_links_between_the_endpoints(db):
    schema = _schema().raw_schema
    start = schema["paths"]["/api/v1/runs"]["post"]["responses"]["201"]["links"]
    call = schema["paths"]["/api/v1/runs/{run_id}/calls"]["post"]["responses"]["201"]["links"]
    assert set(start) == {"GetRun", "Heartbeat", "RecordCall", "Finish", "ListEffectsOfRun"}
    assert set(call) == {"PollEffect", "ClaimEffect", "CompleteEffect", "ReconcileEffect"}


def test_stateful_sequences_never_error_and_always_answer_the_schema(transactional_db, settings):
    # One token makes every request here: the rate limit would only answer 429s.
    settings.STARTSAFE = {**settings.STARTSAFE, "RATE_LIMIT": "0"}
    agent = Agent(name="stateful-fuzz-bot")
    token = agent.set_new_token()
    agent.save()
    schema = _schema()

    # Declared as the schema's auth, so the auth checks know the token is meant to be
    # valid and probe the same request without it and with a wrong one (401 both).
    @schema.auth()
    class AgentBearer:
        def get(self, case, ctx):
            return token

        def set(self, case, data, ctx):
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}

    seen: Counter = Counter()

    failures: list[BaseException] = []

    class Workflow(schema.as_state_machine()):
        def validate_response(self, response, case, additional_checks=None, **kwargs):
            try:
                super().validate_response(response, case, additional_checks, **kwargs)
            except BaseException as exc:
                failures.append(exc)
                raise

        def after_call(self, response, case):
            super().after_call(response, case)
            seen[(case.operation.label, response.status_code)] += 1

    # As schemathesis' own runner does: a sequence replayed against a live journal
    # (new ids, new clocks) may draw differently, which hypothesis calls flaky.
    # Failures are kept as they happen (above), so none is lost by this.
    with contextlib.suppress(Flaky):
        run_state_machine_as_test(Workflow, settings=settings_for_workflow())
    assert not failures, failures

    calls = sum(seen.values())
    print(f"stateful: {calls} calls", dict(sorted(seen.items())))
    # The links were followed: a started run's id drove at least one of its linked
    # operations to a success (which ones varies with the exploration).
    reached = {label for (label, status), _ in seen.items() if status < 300}
    linked = {
        "GET /api/v1/runs/{run_id}",
        "POST /api/v1/runs/{run_id}/heartbeat",
        "POST /api/v1/runs/{run_id}/calls",
        "POST /api/v1/runs/{run_id}/finish",
    }
    assert "POST /api/v1/runs" in reached and reached & linked, reached


def settings_for_workflow():
    return settings(
        max_examples=40,
        stateful_step_count=8,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        # No shrinking: the journal's ids and clocks differ on every replay, which
        # hypothesis would report as flaky data generation instead of the failure.
        phases=[Phase.explicit, Phase.generate],
    )
