"""``args_hash`` against the contract's own definition, with fixed vectors.

api.md: ``args_hash`` is the SHA-256 (lowercase hex) of the RFC 8785 canonical JSON
(JCS) of ``args``, so any language computes the same hash. Comparing hashes the
code made with other hashes the code made cannot tell a wrong definition from the
right one (``json.dumps`` hashes passed the suite). Here every expected digest is a
literal, computed outside the project (clients/vectors/canonical.json, which the
TypeScript client's tests read too): the SHA-256 of a canonical text written by
hand from RFC 8785's rules, or taken from the RFC itself (section 3.2.2's sample,
whose UTF-8 bytes section 3.2.4 prints; section 3.2.3's sorting sample; numbers
from Appendix B). The checks go through every place a hash is made: the
function, a recorded call (its effect, its call, its version), the API's answer
to the JSON text an agent sent, and an operator's edit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from django.urls import reverse
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect
from runs.canonical import args_hash, canonical_json
from runs.models import Call, Effect, EffectVersion
from tests.api_client import Api

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent

# The vectors are shared with the TypeScript client's tests (clients/vectors/, README):
# (id, args, canonical JSON text, SHA-256 of its UTF-8 bytes), the args parsed here
# from the JSON text each vector gives, as another language parses it.
CANONICAL = json.loads((ROOT / "clients" / "vectors" / "canonical.json").read_text())
VECTORS = [
    (vector["name"], json.loads(vector["args_json"]), vector["canonical"], vector["sha256"])
    for vector in CANONICAL["args_hash"]
]
IDS = [vector[0] for vector in VECTORS]


def test_every_shared_vector_is_run_here():
    # clients/typescript/test/canonical.test.ts asserts the same 5 + 3.
    assert (len(VECTORS), len(API_BODIES)) == (5, 3)


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
API_BODIES = [(body["name"], body["args_json"], body["sha256"]) for body in CANONICAL["api_bodies"]]


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
