"""Hostile bodies at every POST endpoint of the API: never a 5xx, never a crash.

api.md: "No input, however malformed, produces a 5xx." The bodies here are the
ones a fuzzer rarely builds: 10,000 levels of nesting (a RecursionError in a
naive parser), invalid UTF-8, lone surrogates and U+0000 as JSON escapes, numbers
beyond what RFC 8785 can represent, and bodies over the 1 MiB limit.
"""

from __future__ import annotations

import uuid

import pytest

from tests.api_client import Api

pytestmark = pytest.mark.django_db

DEEP = 10_000


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


@pytest.fixture
def paths(api) -> list[str]:
    """Every POST address, with a real run and effect so that the body is what fails."""
    run_id = api.start("hostile").body["run"]["id"]
    effect = api.call(run_id, tool="send", key="k:1", key_source="provider").body["effect"]
    return [
        "/runs",
        f"/runs/{run_id}/heartbeat",
        f"/runs/{run_id}/finish",
        f"/runs/{run_id}/calls",
        f"/effects/{effect['id']}/claim",
        f"/effects/{effect['id']}/complete",
        f"/effects/{effect['id']}/reconcile",
    ]


def _deep_array(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _deep_object(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


HOSTILE = {
    "deep array": _deep_array(DEEP),
    "deep object": _deep_object(DEEP),
    "deep args": b'{"attempt": 1, "kind": "effect", "tool": "t", "args": '
    + _deep_object(DEEP)
    + b"}",
    "deep input": b'{"run_key": "deep", "input": ' + _deep_object(DEEP) + b"}",
    "invalid utf-8": b'{"run_key": "\xc3\x28"}',
    "utf-16": '{"run_key": "t"}'.encode("utf-16"),
    "overlong utf-8": b'{"run_key": "\xc0\xaf"}',
    "lone surrogate": b'{"run_key": "\\ud800", "title": "\\udfff"}',
    "nul escape": b'{"run_key": "a\\u0000b", "input": {"k\\u0000": "\\u0000"}}',
    "nul byte": b'{"run_key": "a\x00b"}',
    "huge integer": b'{"run_key": "t", "input": {"n": 1' + b"0" * 400 + b"}}",
    "huge exponent": b'{"run_key": "t", "input": {"n": 1e999}}',
    "negative zero": b'{"run_key": "t", "input": {"n": -0.0}, "attempt": -0.0}',
    "duplicate keys": b'{"run_key": "a", "run_key": "b", "attempt": 1, "attempt": 2}',
    "bom": b'\xef\xbb\xbf{"run_key": "t"}',
    "trailing garbage": b'{"run_key": "t"} {"run_key": "u"}',
    "number body": b"1" * 5000,
    "null": b"null",
    "string": b'"' + b"a" * 100_000 + b'"',
    "over one mib": b'{"run_key": "t", "title": "' + b"a" * (1024 * 1024) + b'"}',
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_body_is_refused_with_the_error_body_at_every_post(api, paths, name):
    for path in paths:
        answer = api.post(path, raw=HOSTILE[name])
        assert answer.status < 500, (path, answer.status, answer.body)
        if answer.status >= 400:
            assert set(answer.body["error"]) == {"code", "message", "details"}, path
            assert answer.code in {
                "invalid_request",
                "payload_too_large",
                "run_finished",
                "attempt_superseded",
                "claim_conflict",
                "already_running",
            }, (path, answer.code)


@pytest.mark.parametrize("number", [b"1e17", b"9007199254740993", b"-9007199254740993.0"])
def test_integers_beyond_2_53_are_invalid_request_however_written(api, number):
    answer = api.post("/runs", raw=b'{"run_key": "t", "input": {"n": ' + number + b"}}")
    assert answer.status == 400 and answer.code == "invalid_request"


def test_ten_thousand_levels_of_nesting_are_invalid_request(api):
    answer = api.post("/runs", raw=HOSTILE["deep input"])
    assert answer.status == 400 and answer.code == "invalid_request"


def test_a_hostile_body_with_an_idempotency_key_is_refused_and_not_a_5xx(api, paths):
    # The middleware fingerprints the body before the API parses it.
    for name, raw in HOSTILE.items():
        answer = api.post("/runs", raw=raw, headers={"Idempotency-Key": f"k-{name}"})
        assert answer.status < 500, (name, answer.status)


@pytest.mark.parametrize(
    "key",
    ["", "a" * 256, "tab\there", "nul\x00", "é" * 10],
)
def test_odd_idempotency_keys_are_refused_or_accepted_never_a_5xx(api, key):
    try:
        answer = api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": key})
    except (ValueError, UnicodeError):
        return  # the test client itself refuses to send such a header
    assert answer.status in (200, 201, 400), answer.body


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Bearer ",
        "Bearer " + "x" * 10_000,
        "Bearer ss_\u00e9\u00e9",
        "Basic dXNlcjpwdw==",
        "bearer  spaced  token",
    ],
)
def test_malformed_authorization_headers_are_unauthorized(header):
    answer = Api(None).get("/runs", headers={"Authorization": header})
    assert answer.status == 401 and answer.code == "unauthorized"


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "1e9"},
        {"limit": "-1"},
        {"cursor": "9" * 40 + "." + "f" * 32},
        {"cursor": "\x00"},
        {"status": "<script>"},
        {"run_key": "\x00"},
        {"key": "\x00"},
        {"tool": "a" * 10_000},
        {"run_id": "not-a-uuid"},
    ],
)
def test_hostile_query_strings_never_5xx(api, query):
    for path in ("/runs", "/effects"):
        answer = api.get(path, **query)
        assert answer.status in (200, 400), (path, query, answer.status, answer.body)


@pytest.mark.parametrize("suffix", ["%00", "..%2F..%2Fetc", "x" * 5000, str(uuid.uuid4()) + "%00"])
def test_hostile_ids_in_paths_are_not_found(api, suffix):
    assert api.get(f"/runs/{suffix}").status == 404
    assert api.get(f"/effects/{suffix}").status == 404
