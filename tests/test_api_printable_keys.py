"""``run_key`` and ``key`` are printable, exactly as ``str.isprintable()`` says (api.md,
"Limits"), like the ``Idempotency-Key`` header: a key that displays differently from
what it is (a right-to-left override that reverses what follows, a zero-width space
that makes two keys look alike) must never reach an operator's screen."""

from __future__ import annotations

import re

import pytest

from runs.api.schemas import PRINTABLE
from runs.models import Effect, Run
from tests.api_client import Api

pytestmark = pytest.mark.django_db

# Each displays differently from what it is; each is refused by str.isprintable().
DECEPTIVE = {
    "right-to-left override": "invoice-\u202egpj.exe",
    "line separator": "ticket\u20284812",
    "paragraph separator": "ticket\u20294812",
    "zero width space": "campaign:\u200bwinter",
    "zero width joiner": "campaign:\u200dwinter",
    "left-to-right mark": "campaign:\u200ewinter",
    "byte order mark": "\ufeffticket-1",
    "no-break space": "ticket\u00a04812",
    "soft hyphen": "ticket\u00ad4812",
    "ideographic space": "ticket\u30004812",
    "private use": "ticket-\ue000",
    "unassigned": "ticket-\u0378",
    "language tag": "ticket-\U000e0041",
    "C1 control": "ticket\u0085",
}
# Printable, though not ASCII: these are accepted.
PRINTABLE_KEYS = ["ticket 4812", "café-ünïcode", "チケット-4812", "emoji-🎟️".replace("\ufe0f", "")]


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


def _record_effect(api: Api, run_id: str, key: str):
    return api.post(
        f"/runs/{run_id}/calls",
        {
            "attempt": 1,
            "tool": "send_reply",
            "kind": "effect",
            "args": {},
            "key": key,
            "key_source": "provider",
        },
    )


@pytest.mark.parametrize("value", DECEPTIVE.values(), ids=DECEPTIVE.keys())
def test_a_run_key_that_is_not_printable_is_refused(api, value):
    assert not value.isprintable()
    answer = api.post("/runs", {"run_key": value})
    assert answer.status == 400 and answer.code == "invalid_request"
    assert "run_key" in answer.body["error"]["details"]["fields"]
    assert not Run.objects.exists()


@pytest.mark.parametrize("value", DECEPTIVE.values(), ids=DECEPTIVE.keys())
def test_an_effect_key_that_is_not_printable_is_refused(api, value):
    started = api.post("/runs", {"run_key": "t"})
    answer = _record_effect(api, started.body["run"]["id"], value)
    assert answer.status == 400 and answer.code == "invalid_request"
    assert "key" in answer.body["error"]["details"]["fields"]
    assert not Effect.objects.exists()


@pytest.mark.parametrize("value", PRINTABLE_KEYS)
def test_printable_keys_beyond_ascii_are_taken(api, value):
    assert value.isprintable()
    started = api.post("/runs", {"run_key": value})
    assert started.status == 201
    answer = _record_effect(api, started.body["run"]["id"], value)
    assert answer.status == 201 and answer.body["effect"]["key"] == value


def test_the_schema_pattern_says_exactly_what_isprintable_says():
    # The OpenAPI schema states the rule as a pattern (schemathesis generates from it):
    # over every code point but the surrogates, which no JSON text carries as UTF-8.
    single = re.compile(PRINTABLE)
    disagree = [
        hex(code)
        for code in range(0x110000)
        if not 0xD800 <= code <= 0xDFFF
        and (single.match(chr(code)) is not None) != chr(code).isprintable()
    ]
    assert disagree == []


def test_the_openapi_schema_states_the_pattern_for_both_keys(client):
    schema = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert schema["StartIn"]["properties"]["run_key"]["pattern"] == PRINTABLE
    assert schema["EffectCallIn"]["properties"]["key"]["anyOf"][0]["pattern"] == PRINTABLE
