"""``args_hash`` against the contract's own definition, with fixed vectors.

api.md: ``args_hash`` is the SHA-256 (lowercase hex) of the RFC 8785 canonical JSON
(JCS) of ``args``, so any language computes the same hash. Comparing hashes the
code made with other hashes the code made cannot tell a wrong definition from the
right one (``json.dumps`` hashes passed the suite). Here every expected digest is a
literal, computed outside the project: the SHA-256 of a canonical text written by
hand from RFC 8785's rules, or taken from the RFC itself (section 3.2.2's sample,
whose UTF-8 bytes section 3.2.4 prints; section 3.2.3's sorting sample; numbers
from Appendix B). The checks go through every place a hash is made: the
function, a recorded call (its effect, its call, its version), the API's answer
to the JSON text an agent sent, and an operator's edit.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from django.urls import reverse
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect
from runs.canonical import args_hash, canonical_json
from runs.models import Call, Effect, EffectVersion
from tests.api_client import Api

pytestmark = pytest.mark.django_db

# RFC 8785 section 3.2.2: the sample, as JSON text (escapes and number forms as the
# RFC writes them), and its canonical UTF-8 bytes as section 3.2.4 prints them.
RFC_SAMPLE = r"""{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"""
RFC_SAMPLE_BYTES = bytes.fromhex(
    "7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72"
    "75 65 2c 66 61 6c 73 65 5d 2c 22 6e 75 6d 62 65 72 73 22 3a"
    "5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31"
    "65 2b 33 30 2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37"
    "5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24 5c 75 30 30"
    "30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d"
)

# RFC 8785 section 3.2.3: names sort by their UTF-16 code units (U+1F600 is the
# surrogate pair D83D DE00, so it sorts before U+FB33); only controls are escaped.
RFC_SORTING = r"""{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}"""

# (id, args, canonical JSON text, SHA-256 of its UTF-8 bytes)
VECTORS = [
    (
        "rfc-8785-3.2.2-sample",
        json.loads(RFC_SAMPLE),
        RFC_SAMPLE_BYTES.decode(),
        "2d5e01a318d0f0879ab568c4be289c8b1f64ef8921a53c6277d5e069978baacb",
    ),
    (
        "rfc-8785-3.2.3-sorting",
        json.loads(RFC_SORTING),
        '{"\\r":"Carriage Return","1":"One","\u0080":"Control",'
        '"\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign",'
        '"\U0001f600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}',
        "5e321556d22018a9656991a9e94f77ec175fa193e52a2429d312f8419ec8b08c",
    ),
    (
        "key-order-nested",
        {"b": 1, "a": {"d": [3, {"z": True, "y": None}], "c": "x"}},
        '{"a":{"c":"x","d":[3,{"y":null,"z":true}]},"b":1}',
        "109c10372fece82dad3551747dc327d8b9213eb579e06542a2a4af2c76770b64",
    ),
    (
        # Non-ASCII as UTF-8, never \u escapes; controls as \t \b \f or \u00xx
        # (lowercase); DEL and "/" as they are.
        "unicode-and-escapes",
        {"s": '\u00e9\u20ac\U0001f600\u001f\u007f"\\/\t\b\f'},
        '{"s":"\u00e9\u20ac\U0001f600\\u001f\u007f\\"\\\\/\\t\\b\\f"}',
        "e438843c138d453bd2ed6c4e5aa691aef813c1aae8b362a1f006b6ce5648ebd6",
    ),
    (
        # ECMAScript's number form (RFC 8785 section 3.2.2.3, Appendix B): 1.0 is 1,
        # -0 is 0, exponents from 1e21 up and below 1e-6, shortest round trip.
        "numbers",
        {
            "n": [
                1.0,
                -0.0,
                1e21,
                1e-7,
                1e23,
                5e-324,
                1.7976931348623157e308,
                9007199254740992.0,
                295147905179352830000.0,
                0.000001,
                9.999999999999997e-7,
                333333333.33333329,
                -0.0000033333333333333333,
                1424953923781206.2,
            ]
        },
        '{"n":[1,0,1e+21,1e-7,1e+23,5e-324,1.7976931348623157e+308,9007199254740992,'
        "295147905179352830000,0.000001,9.999999999999997e-7,333333333.3333333,"
        "-0.0000033333333333333333,1424953923781206.2]}",
        "55047ab892c9a4a7e66a747a5a2855f3dbd30a1a91cb070d4db3f46ff8e06a1a",
    ),
]
IDS = [vector[0] for vector in VECTORS]


@pytest.mark.parametrize(("name", "args", "canonical", "digest"), VECTORS, ids=IDS)
def test_args_hash_is_the_sha256_of_the_rfc_8785_canonical_json(name, args, canonical, digest):
    assert hashlib.sha256(canonical.encode()).hexdigest() == digest  # the table itself
    assert canonical_json(args) == canonical.encode()
    assert args_hash(args) == digest


@pytest.mark.parametrize(("name", "args", "canonical", "digest"), VECTORS, ids=IDS)
def test_a_recorded_call_keeps_the_contracts_hash(agent, name, args, canonical, digest):
    run = start(agent).run

    recorded = send(agent, run, args=args)

    assert recorded.call.args_hash == recorded.effect.args_hash == digest
    # As stored: the effect, the call and the version operators compare.
    assert Effect.objects.get(pk=recorded.effect.pk).args_hash == digest
    assert Call.objects.get(pk=recorded.call.pk).args_hash == digest
    assert EffectVersion.objects.get(effect=recorded.effect).args_hash == digest


# What an agent sends as JSON text, as another language would write it: keys in any
# order, \u escapes, 1.0, -0, 4.50, exponents. (1E30 or 1e21 are integer values
# beyond 2^53, which the API refuses: api.md.)
API_BODIES = [
    (
        "key-order-nested",
        '{"b":1,"a":{"d":[3,{"z":true,"y":null}],"c":"x"}}',
        "109c10372fece82dad3551747dc327d8b9213eb579e06542a2a4af2c76770b64",
    ),
    (
        "unicode-and-escapes",
        r'{"s":"\u00e9\u20ac\ud83d\ude00\u001F' + "\u007f" + r'\"\\\/\t\b\f"}',
        "e438843c138d453bd2ed6c4e5aa691aef813c1aae8b362a1f006b6ce5648ebd6",
    ),
    (
        "numbers",
        '{"n":[1.0,-0,-0.0,1E-7,4.50,2e-3,0.000000000000000000000000001,'
        "333333333.33333329,5e-324,1424953923781206.2]}",
        # {"n":[1,0,0,1e-7,4.5,0.002,1e-27,333333333.3333333,5e-324,1424953923781206.2]}
        "74376cf71193042c37a2709bf16baf1f420c4e60122952c0b6c79433438e80bf",
    ),
]


@pytest.mark.parametrize(
    ("name", "args_text", "digest"), API_BODIES, ids=[b[0] for b in API_BODIES]
)
def test_the_api_answers_the_contracts_hash_of_the_json_it_was_sent(agent, name, args_text, digest):
    api = Api(agent.token)
    run_id = api.start("t").body["run"]["id"]
    body = (
        '{"attempt":1,"tool":"send_email","kind":"effect","key":"m-1",'
        f'"key_source":"provider","args":{args_text}}}'
    )

    answer = api.post(f"/runs/{run_id}/calls", raw=body.encode())

    assert answer.status == 201, answer.body
    assert answer.body["call"]["args_hash"] == digest
    assert answer.body["effect"]["args_hash"] == digest


def test_a_replay_written_another_way_is_the_same_version_not_drift(agent):
    """{"n": 1} and {"n": 1.0} are one canonical JSON: the replay changes nothing."""
    api = Api(agent.token)
    run_id = api.start("t").body["run"]["id"]
    call = '{"attempt":1,"tool":"t","kind":"effect","key":"k","key_source":"intent","args":%s}'
    first = api.post(f"/runs/{run_id}/calls", raw=(call % '{"n":1}').encode())

    replay = api.post(f"/runs/{run_id}/calls", raw=(call % '{"n":1.0}').encode())

    digest = "2bfd14f43d17fc7cea24e0917a8879b4b2f880b8baeec1b9d90fbaad655e71bd"  # {"n":1}
    assert first.body["effect"]["args_hash"] == replay.body["effect"]["args_hash"] == digest
    assert replay.body["effect"]["args_versions"] == 1


EDITED = {"subject": "Caf\u00e9 -20%", "segment": "EU"}
EDITED_DIGEST = "1cb8a5bb736968a36557450a21ccb99ff4811f6161df874baa27fb45c3b1dc4d"
# {"segment":"EU","subject":"Café -20%"}


def test_an_operators_edit_gets_the_contracts_hash(agent, operator):
    run = start(agent).run
    effect = send(agent, run, needs_approval=True, args={"subject": "Cafe"}).effect

    approve_effect(operator, effect.pk, args_hash=effect.args_hash, edited_args=EDITED)

    effect.refresh_from_db()
    assert effect.args_hash == EDITED_DIGEST
    assert effect.versions.get(number=2).args_hash == EDITED_DIGEST


def test_an_edit_posted_from_the_console_gets_the_contracts_hash(client, agent, operator):
    run = start(agent).run
    effect = send(agent, run, needs_approval=True, args={"subject": "Cafe"}).effect
    client.force_login(operator)

    response = client.post(
        reverse("console:approve", args=[effect.pk]),
        {"args_hash": effect.args_hash, "args": r'{"subject": "Caf\u00e9 -20%", "segment": "EU"}'},
    )

    assert response.status_code == 303
    effect.refresh_from_db()
    assert (effect.args, effect.args_hash) == (EDITED, EDITED_DIGEST)
