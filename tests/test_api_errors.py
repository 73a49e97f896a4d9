"""Every failure answers the contract's error body; no input produces a 5xx."""

from __future__ import annotations

import json

import pytest
from django.db import OperationalError
from django.test import Client

from tests.api_client import Api

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


def _names(answer, field: str) -> bool:
    """details.fields names the field (or a path inside it, for nested JSON values)."""
    fields = answer.body["error"]["details"]["fields"]
    return any(name == field or name.startswith(field + ".") for name in fields)


def test_no_token_is_unauthorized_with_www_authenticate():
    answer = Api(None).get("/runs")
    assert answer.status == 401 and answer.code == "unauthorized"
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert set(answer.body["error"]) == {"code", "message", "details"}


def test_an_unknown_token_is_unauthorized():
    assert Api("ss_not-a-token").post("/runs", {"run_key": "t"}).status == 401


def test_a_deactivated_agent_is_refused_at_once(agent):
    api = Api(agent.token)
    assert api.get("/runs").status == 200
    agent.is_active = False
    agent.save()
    assert api.get("/runs").status == 401


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b'{"run_key": "t", "input": {"a": NaN}}',
        b'{"run_key": "t", "input": {"a": Infinity}}',
        b'{"run_key": "\xff\xfe"}',
        b"[1, 2]",
        b"",
    ],
)
def test_malformed_bodies_are_invalid_request(api, raw):
    answer = api.post("/runs", raw=raw)
    assert answer.status == 400 and answer.code == "invalid_request"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "run_key"),
        ({"run_key": 5}, "run_key"),
        ({"run_key": ""}, "run_key"),
        ({"run_key": "x" * 201}, "run_key"),
        ({"run_key": "tab\there"}, "run_key"),
        ({"run_key": "t", "surprise": 1}, "surprise"),
        ({"run_key": "t", "heartbeat_timeout": 4}, "heartbeat_timeout"),
        ({"run_key": "t", "heartbeat_timeout": "60"}, "heartbeat_timeout"),
        ({"run_key": "t", "restart_policy": "yolo"}, "restart_policy"),
        ({"run_key": "t", "restart_url": "ftp://example.com"}, "restart_url"),
        ({"run_key": "t", "input": {"a": "nul\u0000"}}, "input"),
        ({"run_key": "t", "input": {"a": "\ud800"}}, "input"),
        ({"run_key": "t", "input": {"a": 2**53}}, "input"),
        ({"run_key": "t", "input": [1]}, "input"),
        ({"run_key": "t", "title": "x" * 201}, "title"),
    ],
)
def test_wrong_fields_are_named_in_details_fields(api, body, field):
    answer = api.post("/runs", raw=json.dumps(body).encode())
    assert answer.status == 400 and answer.code == "invalid_request"
    assert _names(answer, field)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"tool": "bad tool!"}, "tool"),
        ({"tool": "x" * 101}, "tool"),
        ({"kind": "write"}, "kind"),
        ({"needs_aproval": True}, "needs_aproval"),
        ({"key": "k" * 256, "key_source": "intent"}, "key"),
        ({"key": "k", "key_source": "model"}, "key_source"),
        ({"approvals_required": 4, "needs_approval": True}, "approvals_required"),
        ({"approval_ttl": 59}, "approval_ttl"),
        ({"timeout": 0}, "timeout"),
        ({"preview": "p" * 4001}, "preview"),
        ({"needs_approval": 1}, "needs_approval"),
        ({"attempt": 0}, "attempt"),
    ],
)
def test_wrong_call_fields_are_invalid_request(api, fields, name):
    run_id = api.start("t").body["run"]["id"]
    body = {"attempt": 1, "tool": "reply", "kind": "effect", "args": {}, **fields}
    answer = api.post(f"/runs/{run_id}/calls", body)
    assert answer.status == 400
    assert _names(answer, name)


def test_deeply_nested_args_are_refused_not_crashed_on(api):
    run_id = api.start("t").body["run"]["id"]
    nested: dict = {}
    cursor = nested
    for _ in range(150):
        cursor["a"] = {}
        cursor = cursor["a"]
    body = {"attempt": 1, "tool": "reply", "kind": "effect", "args": nested}
    answer = api.post(f"/runs/{run_id}/calls", body)
    assert answer.status == 400


def test_a_body_over_one_mib_is_payload_too_large(api):
    answer = api.post("/runs", {"run_key": "t", "input": {"a": "x" * (1024 * 1024)}})
    assert answer.status == 413 and answer.code == "payload_too_large"


def test_args_over_256_kib_are_payload_too_large(api):
    run_id = api.start("t").body["run"]["id"]
    body = {"attempt": 1, "tool": "r", "kind": "effect", "args": {"a": "x" * (257 * 1024)}}
    answer = api.post(f"/runs/{run_id}/calls", body)
    assert answer.status == 413 and answer.code == "payload_too_large"


def test_a_malformed_id_in_a_path_is_not_found(api):
    assert api.get("/runs/not-a-uuid").code == "not_found"
    assert api.get("/effects/123").code == "not_found"
    assert api.post("/effects/xyz/claim", {"run_id": "x", "attempt": 1}).code == "not_found"


def test_an_unknown_id_is_not_found(api):
    answer = api.get("/runs/00000000-0000-0000-0000-000000000000")
    assert answer.status == 404 and answer.code == "not_found"


def test_list_limits_and_cursors_are_checked(api):
    assert api.get("/runs", limit=0).status == 400
    assert api.get("/runs", limit=201).status == 400
    assert api.get("/runs", limit="many").status == 400
    assert api.get("/effects", cursor="!!").status == 400
    assert api.get("/effects", cursor="12.zz").status == 400


def test_the_openapi_schema_and_docs_are_served():
    from django.test import Client

    client = Client()
    schema = client.get("/api/v1/openapi.json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    for path in [
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/heartbeat",
        "/api/v1/runs/{run_id}/finish",
        "/api/v1/runs/{run_id}/calls",
        "/api/v1/effects",
        "/api/v1/effects/{effect_id}",
        "/api/v1/effects/{effect_id}/claim",
        "/api/v1/effects/{effect_id}/complete",
        "/api/v1/effects/{effect_id}/reconcile",
    ]:
        assert path in paths
    assert client.get("/api/v1/docs").status_code == 200


def test_an_unknown_address_and_method_answer_the_error_body(api):
    from django.test import Client

    headers = {"Authorization": f"Bearer {api.token}"}
    for path in ["/api/v1/nothing", "/api/v1/runs/", "/api/v1/runs/x/y/z"]:
        answer = Client().get(path, headers=headers)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    answer = Client().delete("/api/v1/runs", headers=headers)
    assert answer.status_code == 405 and answer.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in answer["Allow"]
    # The console's own pages keep their HTML.
    assert "json" not in Client().get("/no-such-page")["Content-Type"]


def test_a_poll_without_a_token_is_unauthorized_whatever_the_id():
    for path in ["/effects/not-a-uuid", "/effects/00000000-0000-0000-0000-000000000000"]:
        answer = Api(None).get(path)
        assert answer.status == 401 and answer.code == "unauthorized"
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")


def test_malformed_json_names_the_body_in_details_fields(api):
    answer = api.post("/runs", raw=b"{not json")
    assert answer.body["error"]["details"]["fields"] == {"body": "is not valid UTF-8 JSON"}


@pytest.mark.parametrize(
    ("body", "field", "place"),
    [
        ({"run_key": "t", "input": {"a": 2**60}}, "input", "input.a"),
        ({"run_key": "t", "input": {"a": [1, {"b": "nul\u0000"}]}}, "input", "input.a.1.b"),
    ],
)
def test_a_wrong_value_inside_a_json_field_names_that_field(api, body, field, place):
    """Keyed by the request's field; the place inside it in the message, and none of
    the schema's own names (union members such as ``constrained-str``)."""
    answer = api.post("/runs", raw=json.dumps(body).encode())
    assert answer.status == 400
    fields = answer.body["error"]["details"]["fields"]
    assert list(fields) == [field]
    assert fields[field].startswith(place + ": ")
    assert "constrained" not in fields[field] and "[" not in fields[field].split(":")[0]


@pytest.mark.parametrize("kind", [None, "write", 5])
def test_a_missing_or_unknown_kind_names_kind(api, kind):
    run_id = api.start("t").body["run"]["id"]
    body = {"attempt": 1, "tool": "reply", "args": {}}
    if kind is not None:
        body["kind"] = kind
    answer = api.post(f"/runs/{run_id}/calls", body)
    assert answer.status == 400 and list(answer.body["error"]["details"]["fields"]) == ["kind"]


def test_a_client_key_named_like_a_schema_part_is_kept(api):
    run_id = api.start("t").body["run"]["id"]
    body = {"attempt": 1, "tool": "reply", "kind": "effect", "args": {"effect": 2**60}}
    answer = api.post(f"/runs/{run_id}/calls", body)
    assert answer.body["error"]["details"]["fields"]["args"].startswith("args.effect: ")


# --- What Django answers before or instead of the API (issue 15, item 9) -----------


def test_a_host_not_served_is_the_contracts_400_not_a_page():
    answer = Api(None, Client(HTTP_HOST="elsewhere.example")).get("/runs")
    assert answer.status == 400 and answer.code == "invalid_request"
    assert answer.headers["Content-Type"] == "application/json"
    # The console keeps Django's page.
    page = Client(HTTP_HOST="elsewhere.example").get("/accounts/login/")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")


def test_the_database_gone_in_a_middleware_is_the_contracts_500(agent, monkeypatch):
    def gone(*args, **kwargs):
        raise OperationalError("the database went away")

    monkeypatch.setattr("runs.api.idempotency.lock_key", gone)
    api = Api(agent.token, Client(raise_request_exception=False))
    answer = api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": "k"})
    assert answer.status == 500 and answer.code == "internal_error"
    assert answer.headers["Content-Type"] == "application/json"
