"""The console's pages: who may see them, and what they show."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test.html import Element, parse_html
from django.urls import get_script_prefix, reverse, set_script_prefix

from approvals.decisions import approve_effect
from runs.calls import record_call
from runs.errors import JournalError
from runs.lifecycle import start_run
from runs.models import AuditEvent, EffectStatus
from runs.outcomes import complete_effect
from runs.sweep import SweepReport, interrupt_stale_run
from tests.console_helpers import awaiting_campaign, failed_unkeyed_run, later, unknown_effect

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/", "/runs/", "/history/"])
def test_anonymous_users_are_sent_to_sign_in(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_a_deactivated_account_is_sent_to_sign_in(client, outsider):
    client.force_login(outsider)
    assert client.get("/").status_code == 302


def test_the_sign_in_page_renders_and_signs_in(client, operator):
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "olivia", "password": "pw-olivia"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200


def test_the_queue_shows_awaiting_effects_nearest_deadline_first(client, viewer, agent):
    late = awaiting_campaign(agent, "later-one", approval_ttl=7200)
    soon = awaiting_campaign(agent, "sooner-one", approval_ttl=600)
    client.force_login(viewer)
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.index(f"effect-{soon.pk}") < html.index(f"effect-{late.pk}")
    assert "Send &#x27;Winter sale&#x27; for sooner-one" in html  # escaped
    assert "0 of 1" in html  # approvals so far of required


def test_a_viewer_sees_the_queue_without_action_buttons(client, viewer, agent):
    effect = awaiting_campaign(agent)
    client.force_login(viewer)
    html = client.get("/").content.decode()
    assert f"effect-{effect.pk}" in html
    assert reverse("console:approve", args=[effect.pk]) not in html
    assert 'id="bulk"' not in html


def test_an_operator_sees_approve_reject_and_bulk(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)
    html = client.get("/").content.decode()
    assert reverse("console:approve", args=[effect.pk]) in html
    assert reverse("console:reject", args=[effect.pk]) in html
    assert 'id="bulk"' in html
    assert f'name="args_hash_{effect.pk}" value="{effect.args_hash}"' in html


def test_the_queue_shows_stopped_runs_with_the_verdicts_reasons_and_unknown_effects(
    client, viewer, agent
):
    run = failed_unkeyed_run(agent)
    effect = unknown_effect(agent)
    client.force_login(viewer)
    html = client.get("/").content.decode()
    assert f"run-{run.pk}" in html
    assert "An unkeyed effect of issue_refund was started" in html
    assert f"effect-{effect.pk}" in html
    assert "has an unknown outcome" in html


def test_the_queue_poll_answers_204_while_nothing_changed(client, viewer, agent):
    awaiting_campaign(agent)
    client.force_login(viewer)
    first = client.get("/", headers={"HX-Request": "true"})
    assert first.status_code == 200
    fingerprint = first.content.decode().split("?fp=")[1].split('"')[0]
    # Nothing changed: the poll skips the render.
    assert client.get(f"/?fp={fingerprint}", headers={"HX-Request": "true"}).status_code == 204
    awaiting_campaign(agent, "ticket-2")
    changed = client.get(f"/?fp={fingerprint}", headers={"HX-Request": "true"})
    assert changed.status_code == 200
    assert "<html" not in changed.content.decode()  # the fragment, not the page
    assert 'hx-swap-oob="true"' in changed.content.decode()  # nav count refreshed


def test_the_queue_polls_faster_when_visible_than_when_hidden(client, viewer):
    client.force_login(viewer)
    html = client.get("/").content.decode()
    assert 'hx-trigger="every 5s"' in html
    # The 30 s pace of a hidden tab and the busy guard live in console.js, not in an
    # hx-trigger filter: htmx evaluates filters with Function(), which the CSP forbids.
    script = client.get("/static/console/console.js").getvalue().decode()
    assert "document.hidden && now - lastQueuePoll < 30000" in script


def test_the_nav_counts_what_waits_for_a_person(client, viewer, agent):
    awaiting_campaign(agent)
    unknown_effect(agent)
    client.force_login(viewer)
    html = client.get("/runs/").content.decode()
    assert 'id="nav-count"' in html
    # one awaiting, one unknown, one failed run needing a decision
    assert ">3</span>" in html


def test_the_runs_page_filters_and_searches(client, viewer, agent, other_agent):
    awaiting_campaign(agent, "alpha-1")
    failed_unkeyed_run(agent, "beta-2")
    awaiting_campaign(other_agent, "gamma-3")
    client.force_login(viewer)

    def keys(query):
        html = client.get("/runs/" + query).content.decode()
        return {k for k in ("alpha-1", "beta-2", "gamma-3") if f"<code>{k}</code>" in html}

    assert keys("") == {"alpha-1", "beta-2", "gamma-3"}
    assert keys("?status=failed") == {"beta-2"}
    assert keys("?agent=other-bot") == {"gamma-3"}
    assert keys("?verdict=blocked") == {"beta-2"}
    assert keys("?verdict=safe") == {"alpha-1", "gamma-3"}
    assert keys("?q=alpha") == {"alpha-1"}
    assert keys("?q=Refund") == {"beta-2"}  # by title


def test_the_runs_page_paginates(client, viewer, agent):
    for i in range(55):
        start_run(agent, f"run-{i:03d}")
    client.force_login(viewer)
    html = client.get("/runs/").content.decode()
    assert "Page 1 of 2" in html
    assert "run-000" not in html
    assert "run-000" in client.get("/runs/?page=2").content.decode()


def test_the_run_page_shows_attempts_side_by_side_and_orphans(client, viewer, agent):
    started = start_run(agent, "import-1", heartbeat_timeout=60)
    run = started.run.pk
    first = record_call(
        agent, run, attempt=1, tool="export", kind="effect", args={"a": 1},
        key="export:1", key_source="intent",
    )  # fmt: skip
    complete_effect(agent, first.effect.pk, run_id=run, attempt=1, outcome="done")
    start_run(agent, "import-1", supersede=1)
    record_call(
        agent, run, attempt=2, tool="notify", kind="effect", args={"b": 2},
        key="notify:1", key_source="intent",
    )  # fmt: skip
    AuditEvent.objects.create(
        at=later(0), actor="system", actor_kind="system", verb="handoff_try", run=started.run,
        attempt_number=2, note="HTTP 503", data={"status": 503},
    )  # fmt: skip
    client.force_login(viewer)
    response = client.get(f"/runs/{run}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Attempt 1" in html and "Attempt 2" in html
    assert "Orphans" in html and reverse("console:effect", args=[first.effect.pk]) in html
    assert "Is it safe to start again?" in html
    assert "Restart hand-offs" in html and "HTTP 503" in html
    # The audit trail's card (_events.html's audit-card), with the run's events.
    card = html.split('<section class="card" aria-labelledby="run-audit-title">')[1]
    card = card.split("</section>")[0]
    assert '<h2 id="run-audit-title">Audit trail</h2>' in card and "handoff_try" in card


def test_the_run_page_offers_actions_only_to_operators_of_a_stopped_run(
    client, viewer, operator, agent
):
    run = failed_unkeyed_run(agent)
    client.force_login(viewer)
    assert (
        reverse("console:abandon", args=[run.pk])
        not in client.get(f"/runs/{run.pk}/").content.decode()
    )
    client.force_login(operator)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert reverse("console:abandon", args=[run.pk]) in html
    assert reverse("console:allow-restart", args=[run.pk]) in html


def test_unknown_ids_answer_404(client, viewer):
    client.force_login(viewer)
    missing = "00000000-0000-0000-0000-000000000000"
    assert client.get(f"/runs/{missing}/").status_code == 404
    assert client.get(f"/effects/{missing}/").status_code == 404
    assert client.get("/effects/not-a-uuid/").status_code == 404


def test_the_effect_page_shows_versions_with_diffs_authors_and_approvals(
    client, operator, second_operator, agent
):
    effect = awaiting_campaign(agent, approvals_required=2)
    approve_effect(second_operator, effect.pk, args_hash=effect.args_hash, note="ok by me")
    # The agent revises the subject before anyone else decides: a new version.
    record_call(
        agent, effect.run_id, attempt=1, tool="send_campaign", kind="effect",
        args={"campaign_id": "ticket-1", "subject": "Winter SALE", "segment": "EU"},
        key="campaign:ticket-1", key_source="intent", needs_approval=True, approvals_required=2,
    )  # fmt: skip
    client.force_login(operator)
    html = client.get(f"/effects/{effect.pk}/").content.decode()
    assert "v1" in html and "v2" in html
    assert "by agent:support-bot" in html
    assert '<span class="d-del">-  &quot;subject&quot;: &quot;Winter sale&quot;' in html
    assert '<span class="d-add">+  &quot;subject&quot;: &quot;Winter SALE&quot;' in html
    assert "oscar approved" in html and "no longer counts" in html
    assert reverse("console:approve", args=[effect.pk]) in html
    card = html.split('<section class="card" aria-labelledby="audit-title">')[1]
    card = card.split("</section>")[0]
    assert '<h2 id="audit-title">Audit trail</h2>' in card and "ok by me" in card


def _elements(node, name: str) -> list[Element]:
    """Every element called ``name`` (``*``: any) under ``node`` (Django's HTML parser)."""
    found = []
    for child in getattr(node, "children", []):
        if isinstance(child, Element):
            if name in ("*", child.name):
                found.append(child)
            found += _elements(child, name)
    return found


def _text(node) -> str:
    if isinstance(node, str):
        return node
    return " ".join(_text(child) for child in node.children)


def _attrs(element: Element) -> dict:
    return dict(element.attributes)


# What each decision on an unknown outcome causes, as the operator reads it first.
CONSEQUENCES = {
    "release": "The next attempt performs it again: if it did happen, it happens twice.",
    "mark-done": "The next attempt skips it, with your note (and result) as its outcome.",
    "reject": "It is never performed: the agent is told it was rejected, with your note.",
}


@pytest.mark.parametrize("page", ["effect", "queue"])
def test_no_decision_is_preselected_for_an_unknown_outcome_and_each_says_what_it_causes(
    client, operator, agent, page
):
    effect = unknown_effect(agent)
    client.force_login(operator)
    html = client.get(f"/effects/{effect.pk}/" if page == "effect" else "/").content.decode()
    # The effect's panel, or its row in the queue's unknown outcomes.
    panel_id = "effect-detail" if page == "effect" else f"effect-{effect.pk}"
    (panel,) = [e for e in _elements(parse_html(html), "*") if _attrs(e).get("id") == panel_id]
    decisions = [d for d in _elements(panel, "details") if _attrs(d).get("class") == "action"]

    actions = {_attrs(_elements(d, "form")[0])["action"].rsplit("/", 1)[1]: d for d in decisions}
    assert sorted(actions) == ["mark-done", "reject", "release"]
    for action, details in actions.items():
        # Folded, and no button is the default one: releasing may do the effect twice.
        assert "open" not in _attrs(details), action
        assert all(
            "primary" not in (_attrs(b).get("class") or "") for b in _elements(details, "button")
        ), action
        # Its summary (visible while folded) says what the decision will cause.
        summary = " ".join(_text(_elements(details, "summary")[0]).split())
        assert CONSEQUENCES[action] in summary, summary
        # The form is still the fixed POST form that works without JavaScript.
        form = _attrs(_elements(details, "form")[0])
        assert form["method"] == "post"
        assert form["action"] == reverse(f"console:{action}", args=[effect.pk])
        fields = {_attrs(f).get("name") for f in _elements(details, "input")}
        fields |= {_attrs(f).get("name") for f in _elements(details, "textarea")}
        assert {"args_hash", "note"} <= fields
    assert "Release: it did not happen" in _text(actions["release"])


def test_the_effect_page_shows_late_reports_prominently(client, viewer, agent, operator):
    effect = unknown_effect(agent)
    from approvals.decisions import mark_effect_done

    mark_effect_done(operator, effect.pk, args_hash=effect.args_hash, note="it went out")
    with pytest.raises(JournalError):
        complete_effect(
            agent, effect.pk, run_id=effect.run_id, attempt=1, outcome="failed",
            error="SMTP 550",
        )  # fmt: skip
    client.force_login(viewer)
    html = client.get(f"/effects/{effect.pk}/").content.decode()
    assert "Late reports" in html
    assert html.index("Late reports") < html.index("Arguments")
    assert "SMTP 550" in html


def test_the_effect_page_shows_reconcile_evidence(client, viewer, agent):
    started = start_run(agent, "rec-1", heartbeat_timeout=60)
    recorded = record_call(
        agent, started.run.pk, attempt=1, tool="reply_email", kind="effect", args={"x": 1},
        key="outlook:message:rec", key_source="provider",
    )  # fmt: skip
    interrupt_stale_run(started.run.pk, later(3600), SweepReport())
    recorded.effect.refresh_from_db()
    assert recorded.effect.status == EffectStatus.UNKNOWN
    from runs.outcomes import reconcile_effect

    start_run(agent, "rec-1")
    reconcile_effect(
        agent, recorded.effect.pk, run_id=started.run.pk, attempt=2, outcome="done",
        evidence="Found message id <abc@x> in Sent Items",
    )  # fmt: skip
    client.force_login(viewer)
    html = client.get(f"/effects/{recorded.effect.pk}/").content.decode()
    assert "Reconciled by agent:support-bot" in html
    assert "Found message id &lt;abc@x&gt; in Sent Items" in html


def test_the_history_is_for_admins_only(client, viewer, operator, admin_user, agent):
    awaiting_campaign(agent)
    client.force_login(viewer)
    assert client.get("/history/").status_code == 403
    client.force_login(operator)
    assert client.get("/history/").status_code == 403
    client.force_login(admin_user)
    response = client.get("/history/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "ticket-1" in html and "first start" in html
    assert "recorded" in html  # the audit log


def test_the_history_filters_attempts(client, admin_user, agent):
    started = start_run(agent, "h-1")
    start_run(agent, "h-1", supersede=1)
    start_run(agent, "h-2")
    client.force_login(admin_user)
    html = client.get("/history/?status=superseded").content.decode()
    assert html.count('data-status="superseded"') == 1
    html = client.get("/history/?agent=nobody").content.decode()
    assert "No attempt matches." in html
    assert started.run.run_key in client.get("/history/?started_by=agent").content.decode()


def test_a_row_renders_for_an_effect_given_no_actions_at_all(agent, rf):
    # The queue's row partial on its own, as an action's answer renders it, for a
    # request with nobody signed in: no form.
    from django.template.loader import render_to_string

    effect = awaiting_campaign(agent, "no-actions")
    html = render_to_string(
        "approvals/_rows.html#effect-row", {"effect": effect}, request=rf.get("/")
    )
    assert html.lstrip().startswith(f'<article class="item" id="effect-{effect.pk}"')
    assert "<form" not in html


def test_row_addresses_follow_the_script_prefix_of_each_request(client, operator, agent):
    effect = awaiting_campaign(agent)
    client.force_login(operator)

    # Django keeps STATIC_URL with the prefix of its first read: read it unprefixed
    # first, or the rest of the session would serve /ops/static/.
    assert settings.STATIC_URL == "/static/"
    # As WSGIHandler sets it from SCRIPT_NAME (the test client does not).
    before = get_script_prefix()
    set_script_prefix("/ops/")
    try:
        mounted = client.get("/").content.decode()
    finally:
        set_script_prefix(before)
    plain = client.get("/").content.decode()

    assert f'action="/ops/effects/{effect.pk}/approve"' in mounted
    assert f'action="/effects/{effect.pk}/approve"' in plain
    assert f"/ops/effects/{effect.pk}" not in plain


def test_who_approved_this_version_sees_a_hint_instead_of_approve(
    client, operator, second_operator, agent
):
    effect = awaiting_campaign(agent, approvals_required=2)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    approve = f'action="{reverse("console:approve", args=[effect.pk])}"'
    client.force_login(operator)

    queue = client.get("/").content.decode()
    page = client.get(reverse("console:effect", args=[effect.pk])).content.decode()

    for html in (queue, page):
        assert "You approved this version; it needs another operator." in html
        assert approve not in html
        assert f'action="{reverse("console:reject", args=[effect.pk])}"' in html
    # They may still edit it into a new version, which needs their approval again.
    assert client.get(reverse("console:edit", args=[effect.pk])).status_code == 200
    client.force_login(second_operator)
    assert approve in client.get("/").content.decode()


def test_no_decision_is_offered_past_the_deadline(client, operator, agent):
    import time_machine

    effect = awaiting_campaign(agent, approval_ttl=60)
    client.force_login(operator)

    with time_machine.travel(effect.approval_expires_at.timestamp() + 5):
        html = client.get(reverse("console:effect", args=[effect.pk])).content.decode()

    assert 'id="effect-detail"' in html
    for name in ("approve", "reject", "mark-done", "edit"):
        assert reverse(f"console:{name}", args=[effect.pk]) not in html
