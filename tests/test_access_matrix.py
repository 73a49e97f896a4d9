"""Every address of the console and the API, as every role: the allowed set, exactly.

The addresses are enumerated from the URL configuration and the OpenAPI schema, and
compared with the tables below, so a new address fails here until someone decides
who may use it. Each cell makes its own rows (an action changes state), sends a
valid request, and asserts the status (and, for a refusal, where it leads).

Roles: anonymous, a deactivated account, viewer, operator, admin (console); no
token, the owning agent, another agent, and a signed-in operator (API).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from lifecycle_helpers import send, start

from approvals.links import make_token
from runs.api.views import api
from runs.lifecycle import finish_run
from runs.models import Tool
from tests.api_client import Api

pytestmark = pytest.mark.django_db

CONSOLE_ROLES = ["anonymous", "deactivated", "viewer", "operator", "admin"]
LOGIN = "/accounts/login/"

# (method, address pattern) → {role: status}. 302 means "to the sign-in page".
# product.md: a viewer reads; an operator also decides; the history is admins'.
READ = {"anonymous": 302, "deactivated": 302, "viewer": 200, "operator": 200, "admin": 200}
DECIDE = {"anonymous": 302, "deactivated": 302, "viewer": 403, "operator": 303, "admin": 303}
# product.md, "Tool registry and policies": everyone signed in reads, admins edit.
ADMINISTER = {**DECIDE, "operator": 403}
CONSOLE = {
    ("GET", ""): READ,
    ("GET", "runs/"): READ,
    ("GET", "runs/<uuid:run_id>/"): READ,
    ("GET", "effects/<uuid:effect_id>/"): READ,
    ("GET", "history/"): {**READ, "viewer": 403, "operator": 403},
    ("GET", "history/export.csv"): {**READ, "viewer": 403, "operator": 403},
    ("GET", "history/export.ndjson"): {**READ, "viewer": 403, "operator": 403},
    # How people decide: operators' and admins' (approvals/views_insights.py).
    ("GET", "insights/"): {**READ, "viewer": 403},
    ("GET", "effects/<uuid:effect_id>/edit"): {**READ, "viewer": 403},
    ("POST", "effects/<uuid:effect_id>/edit"): {**READ, "viewer": 403},
    ("POST", "effects/<uuid:effect_id>/approve"): DECIDE,
    ("POST", "effects/<uuid:effect_id>/reject"): DECIDE,
    ("POST", "effects/<uuid:effect_id>/mark-done"): DECIDE,
    ("POST", "effects/<uuid:effect_id>/release"): DECIDE,
    ("POST", "effects/bulk"): DECIDE,
    ("POST", "runs/<uuid:run_id>/allow-restart"): DECIDE,
    ("POST", "runs/<uuid:run_id>/abandon"): DECIDE,
    ("GET", "tools/"): READ,
    ("GET", "tools/<uuid:tool_id>/"): READ,
    ("POST", "tools/<uuid:tool_id>/confirm"): ADMINISTER,
    ("POST", "tools/<uuid:tool_id>/policy"): ADMINISTER,
    # A signed e-mail link (approvals/links.py) is sent to one operator: here the
    # operator's. Anyone else signed in is refused (403), whatever their role.
    ("GET", "links/<str:token>/"): {**READ, "viewer": 403, "admin": 403},
    ("POST", "links/<str:token>/"): {**DECIDE, "admin": 403},
    # Slack's interactions: a console session is no credential there, only Slack's
    # signature is. Off here (no Slack app configured): not found for everyone; with
    # Slack on, 401 unsigned (tests/test_slack_interactions.py).
    ("POST", "integrations/slack/interactions"): dict.fromkeys(CONSOLE_ROLES, 404),
}
# Besides the console: the Django admin (both roles enter it with their own
# permissions: an operator reads the journal there, only an admin manages agents
# and tokens; others are sent to its sign-in page), the health check (public, for
# probes) and the metrics (a scraper's token of their own, STARTSAFE_METRICS_TOKEN,
# which a console role is not: with none set, as here, /metrics is off).
ADMIN_LOGIN = "/admin/login/"
OTHERS = {
    ("GET", "admin/"): {
        "anonymous": 302,
        "deactivated": 302,
        "viewer": 302,
        "operator": 200,
        "admin": 200,
    },
    ("GET", "admin/runs/agent/"): {
        "anonymous": 302,
        "deactivated": 302,
        "viewer": 302,
        "operator": 403,
        "admin": 200,
    },
    ("GET", "healthz"): dict.fromkeys(CONSOLE_ROLES, 200),
    ("GET", "metrics"): dict.fromkeys(CONSOLE_ROLES, 403),
    ("GET", "accounts/login/"): dict.fromkeys(CONSOLE_ROLES, 200),
    # OpenID Connect sign-in (startsafe/oidc.py; tests/test_oidc.py with a provider):
    # not found while no provider is set, as here.
    ("GET", "oidc/authenticate/"): dict.fromkeys(CONSOLE_ROLES, 404),
    ("GET", "oidc/callback/"): dict.fromkeys(CONSOLE_ROLES, 404),
}


def _patterns(resolver, prefix=""):
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            yield from _patterns(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def test_the_tables_name_every_console_address():
    console = {
        path
        for path, entry in _patterns(get_resolver())
        if entry.callback.__module__.startswith("approvals.")
    }
    assert console == {path for _, path in CONSOLE}


def test_the_tables_name_every_api_operation():
    schema = api.get_openapi_schema()
    operations = {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert operations == set(API)


# --- The console ------------------------------------------------------------------


def _user(role, cast) -> User | None:
    return {
        "anonymous": None,
        "deactivated": cast["outsider"],
        "viewer": cast["viewer"],
        "operator": cast["operator"],
        "admin": cast["admin_user"],
    }[role]


def _world(agent):
    """Fresh rows for one cell: an awaiting effect, an unknown one, a failed run."""
    live = start(agent, "live").run
    awaiting = send(agent, live, key="k:await", needs_approval=True).effect
    stopped = start(agent, "stopped").run
    unknown = send(agent, stopped, key="k:unknown", tool="import").effect
    finish_run(agent, stopped.pk, attempt=1, outcome="failed")  # in flight → unknown
    tool = Tool.objects.get(agent=agent, name=awaiting.tool)
    return {"run": stopped, "awaiting": awaiting, "unknown": unknown, "tool": tool}


def _request(path: str, method: str, world) -> tuple[str, dict]:
    awaiting, unknown, run = world["awaiting"], world["unknown"], world["run"]
    effect = unknown if path.endswith("release") else awaiting
    url = "/" + path.replace("<uuid:effect_id>", str(effect.pk)).replace(
        "<uuid:run_id>", str(run.pk)
    )
    url = url.replace("<uuid:tool_id>", str(world["tool"].pk))
    url = url.replace("<str:token>", make_token(awaiting, world["operator"], "approve"))
    if method == "GET":
        return url, {}
    if path.endswith("policy"):
        return url, {"approvals_required": "1", "on_expiry": "expire", "rules": "[]"}
    if path == "effects/bulk":
        return url, {
            "decision": "approve",
            "effect": [str(awaiting.pk)],
            f"args_hash_{awaiting.pk}": awaiting.args_hash,
        }
    form = {"note": "checked with the customer"}
    if path.startswith("effects/"):
        form["args_hash"] = effect.args_hash
    if path.endswith("edit"):
        form["args"] = '{"subject": "Edited"}'
    return url, form


CELLS = [(method, path, role) for (method, path) in {**CONSOLE, **OTHERS} for role in CONSOLE_ROLES]


@pytest.mark.parametrize(("method", "path", "role"), CELLS)
def test_console_access(method, path, role, agent, outsider, viewer, operator, admin_user):
    cast = {
        "outsider": outsider,
        "viewer": viewer,
        "operator": operator,
        "admin_user": admin_user,
    }
    expected = {**CONSOLE, **OTHERS}[(method, path)][role]
    client = Client()
    user = _user(role, cast)
    if user is not None:
        client.force_login(user)
    url, form = _request(path, method, {**_world(agent), "operator": operator})

    response = client.get(url) if method == "GET" else client.post(url, form)

    assert response.status_code == expected, (method, url, role, response.status_code)
    if expected == 302:
        login = ADMIN_LOGIN if path.startswith("admin/") else LOGIN
        assert response["Location"].startswith(login), response["Location"]


def test_another_users_session_cannot_post_without_the_csrf_token(operator, agent):
    world = _world(agent)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    url = f"/effects/{world['awaiting'].pk}/approve"

    response = client.post(url, {"args_hash": world["awaiting"].args_hash})

    assert response.status_code == 403
    world["awaiting"].refresh_from_db()
    assert world["awaiting"].status == "awaiting_approval"


def test_an_unknown_id_is_not_found_for_every_signed_in_role(viewer, operator, admin_user):
    for user in (viewer, operator, admin_user):
        client = Client()
        client.force_login(user)
        missing = "00000000-0000-4000-8000-000000000000"
        assert client.get(f"/runs/{missing}/").status_code == 404
        assert client.get(f"/effects/{missing}/").status_code == 404


# --- The API ----------------------------------------------------------------------

API_ROLES = ["no token", "owner", "other agent", "console session"]
OWN = {"no token": 401, "owner": 200, "other agent": 404, "console session": 401}
LIST = {"no token": 401, "owner": 200, "other agent": 200, "console session": 401}
API = {
    ("POST", "/api/v1/runs"): {**LIST, "owner": 201, "other agent": 201},
    ("GET", "/api/v1/runs"): LIST,
    ("GET", "/api/v1/runs/{run_id}"): OWN,
    ("POST", "/api/v1/runs/{run_id}/heartbeat"): OWN,
    ("POST", "/api/v1/runs/{run_id}/finish"): OWN,
    ("POST", "/api/v1/runs/{run_id}/calls"): {**OWN, "owner": 201},
    ("GET", "/api/v1/effects/{effect_id}"): OWN,
    ("GET", "/api/v1/effects"): LIST,
    ("POST", "/api/v1/effects/{effect_id}/claim"): OWN,
    ("POST", "/api/v1/effects/{effect_id}/complete"): OWN,
    ("POST", "/api/v1/effects/{effect_id}/reconcile"): OWN,
    # Each agent declares and lists its own tools (another's are never listed).
    ("POST", "/api/v1/tools"): LIST,
    ("GET", "/api/v1/tools"): LIST,
}


def _api_world(agent):
    run = start(agent, "api-run").run
    effect = send(agent, run, key="k:api").effect  # in flight under attempt 1
    return run, effect


def _api_body(path: str, run, effect) -> dict:
    if path.endswith("/runs"):
        return {"run_key": "new-run"}
    if path.endswith("/tools"):
        return {"tools": [{"name": "search", "kind": "read"}]}
    if path.endswith("heartbeat"):
        return {"attempt": 1}
    if path.endswith("finish"):
        return {"attempt": 1, "outcome": "completed"}
    if path.endswith("calls"):
        return {"attempt": 1, "kind": "read", "tool": "search", "args": {}}
    if path.endswith("claim"):
        return {"run_id": str(run.pk), "attempt": 1}
    if path.endswith("complete"):
        return {"run_id": str(run.pk), "attempt": 1, "outcome": "done", "result": {}}
    return {}


API_CELLS = [(method, path, role) for (method, path) in API for role in API_ROLES]


@pytest.mark.parametrize(("method", "path", "role"), API_CELLS)
def test_api_access(method, path, role, agent, other_agent, operator):
    run, effect = _api_world(agent)
    if path.endswith("reconcile"):
        # Reconcile is for an unknown effect, from a running attempt of its run.
        finish_run(agent, run.pk, attempt=1, outcome="failed")
        run = start(agent, "api-run").run
        body = {"run_id": str(run.pk), "attempt": 2, "outcome": "done", "evidence": "found it"}
    else:
        body = _api_body(path, run, effect)
    token = {"owner": agent.token, "other agent": other_agent.token}.get(role)
    client = Client()
    if role == "console session":
        client.force_login(operator)
    caller = Api(token, client)
    address = path.removeprefix("/api/v1").format(run_id=run.pk, effect_id=effect.pk)

    answer = caller.get(address) if method == "GET" else caller.post(address, body)

    expected = API[(method, path)][role]
    assert answer.status == expected, (method, address, role, answer.status, answer.body)
    if expected == 404:
        assert answer.code == "not_found"
    if expected == 401:
        assert answer.code == "unauthorized"
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    if role == "other agent" and method == "GET" and expected == 200:
        assert answer.body["items"] == []  # another agent's rows are never listed


def test_matrix_size():
    # The figures of the report: addresses × roles walked above.
    assert len(CELLS) == (len(CONSOLE) + len(OTHERS)) * len(CONSOLE_ROLES) == 155
    assert len(API_CELLS) == len(API) * len(API_ROLES) == 52
