"""Schemathesis against the live OpenAPI schema, with every check it has.

Whatever it generates, valid or not, must get an answer the schema documents and
never a server error. (Schemathesis 4: OpenAPI 3.1, which django-ninja generates.)
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation

from runs.models import Agent
from startsafe.wsgi import application


@pytest.fixture
def api_schema(transactional_db):
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture
def bearer(transactional_db) -> dict:
    agent = Agent(name="fuzz-bot")
    token = agent.set_new_token()
    agent.save()
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def no_rate_limit(settings) -> None:
    """Off, as in tests/test_api_stateful.py: at 600 a minute it answered ~45% of the
    cases 429, which tests the limiter (tests/test_security_settings.py does) and
    nothing behind it. Set once per test, not per case: each assignment stacks a
    settings override."""
    settings.STARTSAFE = {**settings.STARTSAFE, "RATE_LIMIT": "0"}


def _leaves_authorization_out(case) -> bool:
    """A negative case that removed or mangled the ``Authorization`` header on purpose
    (``violates `required` (was Authorization)``): the API must refuse it (401), and
    our token, sent over it, would make it a valid request that schemathesis then
    reports as "schema-violating request accepted"."""
    data = case.meta.phase.data if case.meta is not None else None
    return any(
        mutation.parameter_location == ParameterLocation.HEADER
        and str(mutation.parameter or mutation.original_value).lower() == "authorization"
        for mutation in getattr(data, "mutations", ())
    )


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_never_errors_and_always_answers_its_schema(case, bearer, no_rate_limit):
    # All of schemathesis' checks run by default (server errors, status codes,
    # content types, headers, response schemas, negative and positive data, auth).
    case.call_and_validate(headers={} if _leaves_authorization_out(case) else bearer)
