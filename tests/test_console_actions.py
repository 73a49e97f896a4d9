"""The console's POST actions: the order of refusals, the state they change, the audit."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from approvals.models import Approval
from runs.calls import record_call
from runs.lifecycle import start_run
from runs.models import AuditEvent, EffectStatus, EffectVersion, RunStatus
from tests.console_helpers import (
    CAMPAIGN_ARGS,
    awaiting_campaign,
    failed_unkeyed_run,
    unknown_effect,
)

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def htmx_to(target: str) -> dict:
    """The headers htmx sends for a form whose answer replaces the element ``target``."""
    return {**HTMX, "HX-Target": target}


def post(client, name, obj_id, data, **kw):
    return client.post(reverse(f"console:{name}", args=[obj_id]), data, **kw)


def events(effect, verb):
    return AuditEvent.objects.filter(effect=effect, verb=verb)


# --- approve ------------------------------------------------------------------


def test_an_operator_approves_and_is_sent_back_with_303(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(client, "approve", effect.pk, {"args_hash": effect.args_hash, "next": "/"})
    assert response.status_code == 303
    assert response["Location"] == "/"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED
    # The audit names the person: the agent can never approve its own effect.
    event = events(effect, "approved").get()
    assert (event.actor, event.actor_kind) == ("olivia", "operator")


def test_a_redirect_never_leaves_the_site(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(
        client, "approve", effect.pk,
        {"args_hash": effect.args_hash, "next": "https://evil.example/"},
        headers={"referer": "https://evil.example/x"},
    )  # fmt: skip
    assert response.status_code == 303
    assert response["Location"] == f"/effects/{effect.pk}/"


def test_htmx_approve_answers_the_row_and_a_toast(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(
        client, "approve", effect.pk, {"args_hash": effect.args_hash},
        headers=htmx_to(f"effect-{effect.pk}"),
    )  # fmt: skip
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith(f'<article class="item" id="effect-{effect.pk}"')
    assert 'data-status="approved"' in html
    toast = json.loads(response["HX-Trigger"])["toast"]
    assert toast["level"] == "success" and "Approved send_campaign" in toast["message"]


def test_htmx_approve_from_the_effect_page_answers_the_panel(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(
        client, "approve", effect.pk, {"args_hash": effect.args_hash},
        headers=htmx_to("effect-detail"),
    )  # fmt: skip
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="effect-detail"')
    assert "<html" not in html


def test_two_approvers_are_needed_and_one_cannot_approve_twice(
    client, operator, second_operator, agent
):
    effect = awaiting_campaign(agent, approvals_required=2)
    client.force_login(operator)
    data = {"args_hash": effect.args_hash}
    assert post(client, "approve", effect.pk, data).status_code == 303
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert len(effect.current_approvals) == 1
    # A resubmit (double click, back button) never decides twice.
    response = post(client, "approve", effect.pk, data)
    assert response.status_code == 409
    assert Approval.objects.filter(effect=effect).count() == 1
    assert events(effect, "approval_added").count() == 1
    client.force_login(second_operator)
    assert post(client, "approve", effect.pk, data).status_code == 303
    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED


def test_a_resubmitted_approval_is_409_and_decides_once(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    data = {"args_hash": effect.args_hash}
    assert post(client, "approve", effect.pk, data).status_code == 303
    again = post(client, "approve", effect.pk, data)
    assert again.status_code == 409
    assert "approved" in again.content.decode()  # the page shows the current state
    assert events(effect, "approved").count() == 1


def test_a_stale_hash_is_409_with_the_new_content_and_diff(client, operator, agent):
    effect = awaiting_campaign(agent)
    seen = effect.args_hash
    record_call(
        agent, effect.run_id, attempt=1, tool="send_campaign", kind="effect",
        args={"campaign_id": "ticket-1", "subject": "Winter SALE!!", "segment": "EU"},
        key="campaign:ticket-1", key_source="intent", needs_approval=True,
    )  # fmt: skip
    client.force_login(operator)
    response = post(client, "approve", effect.pk, {"args_hash": seen})
    assert response.status_code == 409
    html = response.content.decode()
    assert "The content changed since you saw it" in html
    assert "Winter SALE!!" in html
    assert 'class="d-add"' in html
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert not Approval.objects.filter(effect=effect).exists()


def test_approve_with_edited_args_makes_an_operator_version(client, operator, agent):
    effect = awaiting_campaign(agent)
    edited = {"campaign_id": "ticket-1", "subject": "Winter sale -20%", "segment": "EU"}
    client.force_login(operator)
    response = post(
        client, "approve", effect.pk,
        {"args_hash": effect.args_hash, "args": json.dumps(edited), "note": "fixed subject"},
    )  # fmt: skip
    assert response.status_code == 303
    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED
    assert effect.args == edited
    version = EffectVersion.objects.get(effect=effect, number=2)
    assert version.author == "operator:olivia"
    assert events(effect, "args_edited").count() == 1


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", '"a string"'])
def test_edited_args_must_be_a_json_object(client, operator, agent, bad):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(client, "approve", effect.pk, {"args_hash": effect.args_hash, "args": bad})
    assert response.status_code == 400
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL


def test_the_edit_step_shows_the_diff_before_anything_changes(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    page = client.get(reverse("console:edit", args=[effect.pk]))
    assert page.status_code == 200 and "Winter sale" in page.content.decode()
    edited = dict(effect.args, subject="Cold deals")
    review = client.post(
        reverse("console:edit", args=[effect.pk]),
        {"args_hash": effect.args_hash, "args": json.dumps(edited)},
    )
    html = review.content.decode()
    assert review.status_code == 200
    assert "Approve the edited version" in html
    assert 'class="d-add">+  &quot;subject&quot;: &quot;Cold deals&quot;' in html
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL and effect.args_versions == 1
    invalid = client.post(
        reverse("console:edit", args=[effect.pk]), {"args_hash": effect.args_hash, "args": "{"}
    )
    assert invalid.status_code == 400


def test_the_editor_refuses_an_effect_that_may_no_longer_be_approved(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    assert post(client, "approve", effect.pk, {"args_hash": effect.args_hash}).status_code == 303

    response = client.get(reverse("console:edit", args=[effect.pk]))

    assert response.status_code == 409
    assert "It can no longer be approved (it is approved)." in response.content.decode()


def test_the_editor_refuses_past_the_deadline_and_changes_nothing(client, operator, agent):
    import time_machine

    effect = awaiting_campaign(agent, approval_ttl=60)
    client.force_login(operator)

    with time_machine.travel(effect.approval_expires_at.timestamp() + 5):
        response = client.get(reverse("console:edit", args=[effect.pk]))

    assert response.status_code == 409
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL


def test_a_viewer_cannot_open_the_editor(client, viewer, agent):
    effect = awaiting_campaign(agent)
    client.force_login(viewer)
    assert client.get(reverse("console:edit", args=[effect.pk])).status_code == 403


def test_past_its_deadline_an_approval_is_409_and_the_effect_expires(client, operator, agent):
    import time_machine

    effect = awaiting_campaign(agent, approval_ttl=60)
    client.force_login(operator)
    with time_machine.travel(effect.approval_expires_at.timestamp() + 5):
        response = post(client, "approve", effect.pk, {"args_hash": effect.args_hash})
    assert response.status_code == 409
    effect.refresh_from_db()
    assert effect.status == EffectStatus.EXPIRED
    assert events(effect, "expired").get().actor == "system"


# --- the order of refusals ----------------------------------------------------


def test_a_missing_args_hash_is_400_before_anything_else(client, viewer, agent):
    effect = awaiting_campaign(agent)
    client.force_login(viewer)  # even a viewer, who would get 403, gets the 400 first
    assert post(client, "approve", effect.pk, {}).status_code == 400


@pytest.mark.parametrize("action", ["reject", "mark-done", "release"])
def test_a_missing_note_is_400(client, operator, agent, action):
    effect = unknown_effect(agent)
    client.force_login(operator)
    response = post(client, action, effect.pk, {"args_hash": effect.args_hash, "note": "  "})
    assert response.status_code == 400
    assert "A note is required." in response.content.decode()
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


def test_invalid_result_json_is_400(client, operator, agent):
    effect = unknown_effect(agent)
    client.force_login(operator)
    response = post(
        client, "mark-done", effect.pk,
        {"args_hash": effect.args_hash, "note": "sent", "result": "{oops"},
    )  # fmt: skip
    assert response.status_code == 400


@pytest.mark.parametrize("raw", ['"sent"', "[1, 2]", "3", "true", "null"])
def test_a_result_that_is_not_a_json_object_is_400(client, operator, agent, raw):
    # A result is an object everywhere (api.md: complete and reconcile; the Effect
    # schema): an agent skipping the effect must get what a tool would have returned.
    effect = unknown_effect(agent)
    client.force_login(operator)
    form = {"args_hash": effect.args_hash, "note": "sent", "result": raw}
    response = post(client, "mark-done", effect.pk, form)
    assert response.status_code == 400
    effect.refresh_from_db()
    assert (effect.status, effect.result) == (EffectStatus.UNKNOWN, None)
    assert not events(effect, "marked_done").exists()


@pytest.mark.parametrize("action", ["approve", "reject", "mark-done", "release"])
def test_an_unknown_effect_id_is_404(client, operator, action):
    client.force_login(operator)
    missing = "00000000-0000-0000-0000-000000000000"
    response = post(client, action, missing, {"args_hash": "x", "note": "n"})
    assert response.status_code == 404


@pytest.mark.parametrize("action", ["approve", "reject", "mark-done"])
def test_a_viewer_posting_a_decision_is_403(client, viewer, agent, action):
    effect = awaiting_campaign(agent)
    client.force_login(viewer)
    response = post(client, action, effect.pk, {"args_hash": effect.args_hash, "note": "n"})
    assert response.status_code == 403
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert not AuditEvent.objects.filter(effect=effect, actor="vera").exists()


@pytest.mark.parametrize("action", ["allow-restart", "abandon"])
def test_a_viewer_posting_a_run_decision_is_403(client, viewer, agent, action):
    run = failed_unkeyed_run(agent)
    client.force_login(viewer)
    assert post(client, action, run.pk, {"note": "n"}).status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and not run.restart_ready


def test_anonymous_posts_are_sent_to_sign_in(client, agent):
    effect = awaiting_campaign(agent)
    response = post(client, "approve", effect.pk, {"args_hash": effect.args_hash})
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_get_on_an_action_is_405(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    assert client.get(reverse("console:approve", args=[effect.pk])).status_code == 405


def test_an_action_the_status_does_not_allow_is_409_and_changes_nothing(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(client, "release", effect.pk, {"args_hash": effect.args_hash, "note": "n"})
    assert response.status_code == 409
    assert "awaiting approval" in response.content.decode()
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL


def test_htmx_refusals_swap_the_row_with_the_error(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(
        client, "release", effect.pk,
        {"args_hash": effect.args_hash, "note": "n"}, headers=htmx_to(f"effect-{effect.pk}"),
    )  # fmt: skip
    assert response.status_code == 409
    assert 'role="alert"' in response.content.decode()
    assert json.loads(response["HX-Trigger"])["toast"]["level"] == "error"


# --- reject, mark done, release -----------------------------------------------


def test_reject_with_a_note_and_final(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(
        client, "reject", effect.pk,
        {"args_hash": effect.args_hash, "note": "wrong segment", "final": "on"},
    )  # fmt: skip
    assert response.status_code == 303
    effect.refresh_from_db()
    assert effect.status == EffectStatus.REJECTED
    assert effect.decision["final"] is True and effect.decision["note"] == "wrong segment"
    event = events(effect, "rejected").get()
    assert event.data == {"final": True} and event.note == "wrong segment"
    # Final: a revision is kept as drift and never asks again.
    assert _revise(effect, "Winter sale, EU only").action == "blocked"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.REJECTED
    assert effect.args == dict(CAMPAIGN_ARGS, campaign_id="ticket-1")


def _revise(effect, subject: str):
    """The agent's model rewrites the campaign after reading the rejection's note."""
    return record_call(
        effect.agent, effect.run_id, attempt=1, tool="send_campaign", kind="effect",
        args=dict(effect.args, subject=subject), key=effect.key, key_source="intent",
    )  # fmt: skip


def test_reject_without_final_lets_a_revision_ask_again(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    response = post(client, "reject", effect.pk, {"args_hash": effect.args_hash, "note": "no"})
    assert response.status_code == 303
    effect.refresh_from_db()
    assert (effect.status, effect.decision["final"]) == (EffectStatus.REJECTED, False)
    assert _revise(effect, "Winter sale").action == "blocked"  # the same content stays refused

    revision = _revise(effect, "Winter sale, EU only")

    # A revision asks again: awaiting approval of the new version, with a new deadline.
    assert revision.action == "wait"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert effect.args["subject"] == "Winter sale, EU only"
    assert effect.versions.get(number=effect.args_versions).adopted is True
    # The operator can decide on it from the console.
    response = post(client, "approve", effect.pk, {"args_hash": effect.args_hash})
    assert response.status_code == 303


def test_mark_an_unknown_effect_done_with_a_result(client, operator, agent):
    effect = unknown_effect(agent)
    client.force_login(operator)
    response = post(
        client, "mark-done", effect.pk,
        {"args_hash": effect.args_hash, "note": "found it in Sent", "result": '{"id": "m-1"}'},
    )  # fmt: skip
    assert response.status_code == 303
    effect.refresh_from_db()
    assert effect.status == EffectStatus.DONE
    assert effect.result == {"id": "m-1"}
    assert events(effect, "marked_done").get().note == "found it in Sent"


def test_release_an_unknown_effect(client, operator, agent):
    effect = unknown_effect(agent)
    client.force_login(operator)
    response = post(
        client, "release", effect.pk, {"args_hash": effect.args_hash, "note": "not sent"}
    )
    assert response.status_code == 303
    effect.refresh_from_db()
    assert effect.status == EffectStatus.PENDING  # it needs no approval
    assert effect.claimed_run_id is None
    assert events(effect, "released").count() == 1


# --- runs ---------------------------------------------------------------------


def test_allow_restart_leaves_an_override_for_the_next_start(client, operator, agent):
    run = failed_unkeyed_run(agent)
    client.force_login(operator)
    response = post(client, "allow-restart", run.pk, {"note": "refund checked by hand"})
    assert response.status_code == 303
    run.refresh_from_db()
    assert run.restart_ready and run.override_note == "refund checked by hand"
    assert AuditEvent.objects.filter(run=run, verb="restart_allowed").count() == 1

    # The next start goes through although the verdict blocks, and consumes it.
    restarted = start_run(agent, run.run_key)
    assert restarted.verdict.safe is False
    assert restarted.attempt.started_by == "operator:olivia"
    run.refresh_from_db()
    assert (run.override_at, run.restart_ready) == (None, False)


def test_abandon_is_final_and_a_second_abandon_is_409(client, operator, agent):
    run = failed_unkeyed_run(agent)
    client.force_login(operator)
    assert post(client, "abandon", run.pk, {"note": "give up"}).status_code == 303
    run.refresh_from_db()
    assert run.status == RunStatus.ABANDONED
    assert post(client, "abandon", run.pk, {"note": "again"}).status_code == 409
    assert AuditEvent.objects.filter(run=run, verb="run_abandoned").count() == 1


def test_run_actions_need_a_note_and_a_known_id(client, operator, agent):
    run = failed_unkeyed_run(agent)
    client.force_login(operator)
    assert post(client, "abandon", run.pk, {"note": ""}).status_code == 400
    missing = "00000000-0000-0000-0000-000000000000"
    assert post(client, "abandon", missing, {"note": "x"}).status_code == 404


def test_htmx_run_action_answers_the_row(client, operator, agent):
    run = failed_unkeyed_run(agent)
    client.force_login(operator)
    response = post(
        client, "abandon", run.pk, {"note": "give up"}, headers=htmx_to(f"run-{run.pk}")
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith(f'<article class="item" id="run-{run.pk}"')
    assert 'data-status="abandoned"' in html


# --- bulk ---------------------------------------------------------------------


def _bulk(effects, decision, **extra):
    data = {"decision": decision, "effect": [str(e.pk) for e in effects], **extra}
    for e in effects:
        data[f"args_hash_{e.pk}"] = e.args_hash
    return data


def test_bulk_approve_decides_each_effect_and_audits_each(client, operator, agent):
    effects = [awaiting_campaign(agent, f"t-{i}") for i in range(3)]
    client.force_login(operator)
    response = client.post(reverse("console:bulk"), _bulk(effects, "approve"))
    assert response.status_code == 303
    for effect in effects:
        effect.refresh_from_db()
        assert effect.status == EffectStatus.APPROVED
        assert events(effect, "approved").count() == 1


def test_bulk_binds_each_effect_to_its_own_hash(client, operator, agent):
    fresh, stale = awaiting_campaign(agent, "t-1"), awaiting_campaign(agent, "t-2")
    data = _bulk([fresh, stale], "approve")
    data[f"args_hash_{stale.pk}"] = "0" * 64
    client.force_login(operator)
    client.post(reverse("console:bulk"), data)
    fresh.refresh_from_db()
    stale.refresh_from_db()
    assert fresh.status == EffectStatus.APPROVED
    assert stale.status == EffectStatus.AWAITING_APPROVAL


def test_bulk_reject_needs_a_note_and_one_tool(client, operator, agent):
    a = awaiting_campaign(agent, "t-1")
    b = awaiting_campaign(agent, "t-2", tool="send_sms", args={"to": "+331"})
    client.force_login(operator)
    assert client.post(reverse("console:bulk"), _bulk([a], "reject")).status_code == 400
    mixed = client.post(reverse("console:bulk"), _bulk([a, b], "reject", note="no"))
    assert mixed.status_code == 400
    ok = client.post(reverse("console:bulk"), _bulk([a], "reject", note="no", final="on"))
    assert ok.status_code == 303
    a.refresh_from_db()
    assert a.status == EffectStatus.REJECTED and a.decision["final"] is True


def test_bulk_refuses_viewers_and_missing_hashes(client, viewer, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(viewer)
    assert client.post(reverse("console:bulk"), _bulk([effect], "approve")).status_code == 403
    client.force_login(operator)
    data = {"decision": "approve", "effect": [str(effect.pk)]}
    assert client.post(reverse("console:bulk"), data).status_code == 400


# --- a refused form shows its errors on the form ---------------------------------------


def _form(html: str, action: str) -> str:
    """The markup of the <details> that holds the form posting to ``action``."""
    start = html.index(f'action="{action}"')
    return html[html.rindex("<details", 0, start) : html.index("</details>", start)]


def test_a_missing_note_is_shown_on_the_form_that_needs_it(client, operator, agent):
    effect = unknown_effect(agent)
    client.force_login(operator)

    response = post(client, "reject", effect.pk, {"args_hash": effect.args_hash, "final": "on"})

    assert response.status_code == 400
    form = _form(response.content.decode(), reverse("console:reject", args=[effect.pk]))
    assert form.startswith('<details class="action" open>')
    assert '<ul class="errorlist"><li>A note is required.</li></ul>' in form
    assert 'name="final" value="on" checked' in form  # what the operator chose is kept


def test_invalid_json_is_shown_on_the_row_with_what_was_typed(client, operator, agent):
    effect = unknown_effect(agent)
    client.force_login(operator)

    response = post(
        client, "mark-done", effect.pk,
        {"args_hash": effect.args_hash, "note": "sent <by hand>", "result": "{oops"},
        headers=htmx_to(f"effect-{effect.pk}"),
    )  # fmt: skip

    assert response.status_code == 400
    html = response.content.decode()
    assert html.lstrip().startswith(f'<article class="item" id="effect-{effect.pk}"')
    form = _form(html, reverse("console:mark-done", args=[effect.pk]))
    assert form.startswith('<details class="action" open>')
    assert "result: This is not valid JSON" in form
    assert ">sent &lt;by hand&gt;</textarea>" in form and ">{oops</textarea>" in form
    # The other decisions stay folded and empty.
    release = _form(html, reverse("console:release", args=[effect.pk]))
    assert release.startswith('<details class="action">') and "errorlist" not in release
    assert json.loads(response["HX-Trigger"])["toast"]["level"] == "error"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


def test_a_run_action_without_a_note_shows_the_error_on_its_form(client, operator, agent):
    run = failed_unkeyed_run(agent)
    client.force_login(operator)

    response = post(client, "abandon", run.pk, {"note": " "})

    assert response.status_code == 400
    form = _form(response.content.decode(), reverse("console:abandon", args=[run.pk]))
    assert form.startswith('<details class="action" open>')
    assert "A note is required." in form
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED


def test_a_bulk_rejection_without_a_note_shows_the_error_on_the_bulk_form(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)

    response = client.post(reverse("console:bulk"), _bulk([effect], "reject"))

    assert response.status_code == 400
    html = response.content.decode()
    bulk = html[html.index('<form id="bulk"') : html.index("</form>", html.index('id="bulk"'))]
    assert "<li>A note is required to reject.</li>" in bulk
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL


def test_the_editor_shows_why_the_json_was_refused(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)

    response = client.post(
        reverse("console:edit", args=[effect.pk]),
        {"args_hash": effect.args_hash, "args": "[1, 2]"},
        headers=HTMX,
    )

    assert response.status_code == 400
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="review"')
    assert "args: This must be a JSON object" in html
