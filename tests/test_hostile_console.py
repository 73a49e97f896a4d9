"""Hostile data in the console: script in every free-text field, bad forms.

Agents write most of what the console shows (run keys, titles, tools, keys,
previews, arguments, results, errors, evidence), so every page must escape it; an
operator's note is shown to other operators, so it must be escaped too. And the
forms refuse bad JSON, notes over 2,000 characters and U+0000 with a 400, never a 500.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from lifecycle_helpers import send, start

from approvals.decisions import abandon_run, approve_effect, reject_effect
from runs.calls import record_call
from runs.lifecycle import finish_run
from runs.models import Agent, Effect
from runs.outcomes import complete_effect, reconcile_effect

pytestmark = pytest.mark.django_db

SCRIPT = '<script>alert("xss")</script>'
IMG = '"><img src=x onerror=alert(1)>'
EVIL = SCRIPT + IMG
# Unescaped, any of these would open a tag or leave an attribute. ("onerror=" may
# appear as text inside a quoted attribute once its quotes and brackets are escaped.)
RAW = ("<script>alert(", "<img src=x onerror", '"><img src=x', "'><img src=x")


@pytest.fixture
def hostile(operator):
    """A journal whose every free-text field carries script."""
    agent = Agent(name="bot" + EVIL[:80])
    agent.set_new_token()
    agent.save()
    run = start(
        agent,
        "run" + EVIL,
        title="title" + EVIL,
        input={EVIL: EVIL},
        agent_version="v" + EVIL[:60],
    ).run
    read = record_call(
        agent, run.pk, attempt=1, tool="read" + EVIL[:50], kind="read", args={"q": EVIL}
    )
    assert read.action == "execute"
    awaiting = send(
        agent,
        run,
        tool="campaign" + EVIL[:50],
        key="key" + EVIL,
        args={EVIL: EVIL, "nested": [EVIL, {"deep": EVIL}]},
        needs_approval=True,
        approvals_required=2,
        preview="preview" + EVIL,
    ).effect
    approve_effect(operator, awaiting.pk, args_hash=awaiting.args_hash, note="note" + EVIL)
    # A newer version, so the diff shows script on both sides.
    send(
        agent,
        run,
        tool="campaign" + EVIL[:50],
        key="key" + EVIL,
        args={EVIL: "changed" + EVIL},
    )
    done = send(agent, run, tool="send", key="k:done", args={"body": EVIL}).effect
    complete_effect(agent, done.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": EVIL})
    failed = send(agent, run, tool="send", key="k:failed", args={"body": EVIL}).effect
    complete_effect(
        agent, failed.pk, run_id=run.pk, attempt=1, outcome="failed", error="error" + EVIL
    )
    unknown = send(agent, run, tool="send", key="k:unknown").effect
    finish_run(agent, run.pk, attempt=1, outcome="failed", error="run error" + EVIL)
    second = start(agent, "run" + EVIL).run  # restarted: attempt 2, the verdict shown
    send(agent, second, attempt=2, tool="send", key="k:unknown")
    reconcile_effect(
        agent,
        unknown.pk,
        run_id=second.pk,
        attempt=2,
        outcome="done",
        evidence="evidence" + EVIL,
        result={EVIL: 1},
    )
    rejected = send(
        agent, second, attempt=2, tool="send", key="k:rejected", needs_approval=True
    ).effect
    reject_effect(operator, rejected.pk, args_hash=rejected.args_hash, note="reject" + EVIL)
    other = start(agent, "other" + EVIL).run
    finish_run(agent, other.pk, attempt=1, outcome="failed", error=EVIL)
    abandon_run(operator, other.pk, note="abandon" + EVIL)
    return {"agent": agent, "runs": [run, other], "effects": list(Effect.objects.all())}


def _assert_escaped(html: str, url: str) -> None:
    for raw in RAW:
        assert raw not in html, (url, raw)


def test_every_console_page_escapes_script_in_every_field(hostile, admin_user):
    client = Client()
    client.force_login(admin_user)
    urls = ["/", "/runs/", "/history/", f"/runs/?q={SCRIPT}", f"/history/?started_by={SCRIPT}"]
    urls += [f"/runs/{run.pk}/" for run in hostile["runs"]]
    urls += [f"/effects/{effect.pk}/" for effect in hostile["effects"]]
    urls += [f"/effects/{effect.pk}/edit" for effect in hostile["effects"]]
    urls += ["/admin/runs/run/", "/admin/runs/effect/", "/admin/runs/auditevent/"]
    shown = 0
    for url in urls:
        for headers in ({}, {"HX-Request": "true"}):
            response = client.get(url, headers=headers)
            assert response.status_code in (200, 204, 409), (url, response.status_code)
            html = response.content.decode()
            _assert_escaped(html, url)
            shown += html.count("&lt;script&gt;")
    # The data is on the pages (escaped), not merely absent.
    assert shown > 50


def test_the_edit_review_and_a_stale_answer_escape_script(hostile, operator):
    client = Client()
    client.force_login(operator)
    effect = next(e for e in hostile["effects"] if e.status == "awaiting_approval")
    edited = json.dumps({"subject": EVIL})

    review = client.post(
        f"/effects/{effect.pk}/edit", {"args_hash": effect.args_hash, "args": edited}
    )
    stale = client.post(
        f"/effects/{effect.pk}/approve", {"args_hash": "0" * 64, "note": "n" + EVIL}
    )

    assert review.status_code == 200 and stale.status_code in (400, 409)
    _assert_escaped(review.content.decode(), "edit")
    _assert_escaped(stale.content.decode(), "approve")


# --- Bad forms --------------------------------------------------------------------


@pytest.fixture
def awaiting(agent):
    run = start(agent, "forms").run
    return send(agent, run, key="k:forms", needs_approval=True).effect


@pytest.fixture
def failed_run(agent):
    run = start(agent, "failed").run
    finish_run(agent, run.pk, attempt=1, outcome="failed")
    return run


@pytest.fixture
def console(operator) -> Client:
    client = Client()
    client.force_login(operator)
    return client


DEEP = "[" * 10_000 + "]" * 10_000
BAD_JSON = [
    "{not json",
    '{"a": NaN}',
    '{"a": Infinity}',
    '{"a": 1e999}',
    '{"a": "\\u0000"}',
    '{"a": "\\ud800"}',
    '{"n": 9007199254740993}',
    '{"n": 1e17}',
    DEEP,
    '{"a": ' * 10_000 + "1" + "}" * 10_000,
    json.dumps({"big": "x" * (300 * 1024)}),
]


@pytest.mark.parametrize("raw", BAD_JSON, ids=range(len(BAD_JSON)))
@pytest.mark.parametrize(("action", "field"), [("approve", "args"), ("mark-done", "result")])
def test_json_the_journal_cannot_hold_is_a_400(console, awaiting, action, field, raw):
    form = {"args_hash": awaiting.args_hash, "note": "checked", field: raw}

    response = console.post(f"/effects/{awaiting.pk}/{action}", form)

    assert response.status_code == 400
    awaiting.refresh_from_db()
    assert awaiting.status == "awaiting_approval"  # nothing changed


@pytest.mark.parametrize("raw", BAD_JSON, ids=range(len(BAD_JSON)))
def test_the_editor_refuses_the_same_json(console, awaiting, raw):
    response = console.post(
        f"/effects/{awaiting.pk}/edit", {"args_hash": awaiting.args_hash, "args": raw}
    )
    assert response.status_code == 400


EFFECT_ACTIONS = ["approve", "reject", "mark-done"]
RUN_ACTIONS = ["allow-restart", "abandon"]


@pytest.mark.parametrize("action", EFFECT_ACTIONS)
def test_a_note_over_2000_characters_is_a_400_on_effect_actions(console, awaiting, action):
    form = {"args_hash": awaiting.args_hash, "note": "n" * 2001}
    assert console.post(f"/effects/{awaiting.pk}/{action}", form).status_code == 400
    awaiting.refresh_from_db()
    assert awaiting.status == "awaiting_approval"


@pytest.mark.parametrize("action", RUN_ACTIONS)
def test_a_note_over_2000_characters_is_a_400_on_run_actions(console, failed_run, action):
    assert console.post(f"/runs/{failed_run.pk}/{action}", {"note": "n" * 2001}).status_code == 400
    failed_run.refresh_from_db()
    assert failed_run.status == "failed" and failed_run.override_at is None


def test_a_note_of_exactly_2000_characters_is_taken(console, awaiting):
    form = {"args_hash": awaiting.args_hash, "note": "n" * 2000}
    assert console.post(f"/effects/{awaiting.pk}/reject", form).status_code == 303


def test_a_huge_note_in_a_bulk_decision_is_a_400(console, awaiting):
    form = {
        "decision": "reject",
        "effect": [str(awaiting.pk)],
        f"args_hash_{awaiting.pk}": awaiting.args_hash,
        "note": "n" * 100_000,
    }
    assert console.post("/effects/bulk", form).status_code == 400


@pytest.mark.parametrize("action", EFFECT_ACTIONS)
def test_a_nul_character_in_a_form_is_a_400(console, awaiting, action):
    form = {"args_hash": awaiting.args_hash, "note": "a\x00b"}
    assert console.post(f"/effects/{awaiting.pk}/{action}", form).status_code == 400


@pytest.mark.parametrize(
    "effects", [["not-a-uuid"], ["00000000-0000-4000-8000-000000000000"], ["\x00"]]
)
def test_bad_ids_in_a_bulk_decision_are_refused(console, effects):
    form = {"decision": "approve", "effect": effects}
    form.update({f"args_hash_{e}": "0" * 64 for e in effects})
    assert console.post("/effects/bulk", form).status_code in (400, 404)


@pytest.mark.parametrize(
    "query",
    ["q=%00", "agent=%00", "status=%00", "verdict=<script>", "page=-1", "page=99999999999"],
)
def test_hostile_filters_never_5xx(console, query):
    assert console.get(f"/runs/?{query}").status_code == 200


@pytest.mark.parametrize("query", ["started_by=%00", "agent=%00", "apage=x", "page=%00"])
def test_hostile_history_filters_never_5xx(admin_user, query):
    client = Client()
    client.force_login(admin_user)
    assert client.get(f"/history/?{query}").status_code == 200
