"""The effect page says why an effect waits (``effect.hold``); a key-drift hold
shows the earlier effect it names side by side with this one, with their
arguments' diff (approvals/views.py ``hold_context``)."""

from __future__ import annotations

import pytest
from django.utils.html import escape
from lifecycle_helpers import send, start

from runs.canonical import args_hash
from runs.models import Tool, ToolMode, ToolPolicy
from runs.outcomes import complete_effect
from runs.registry import save_policy

pytestmark = pytest.mark.django_db


def _drifted(agent):
    """The arguments-hash key design: attempt 2 rewrote the body, so its key is new
    and the effect is held for key drift; returns (earlier, held)."""

    def send_body(attempt: int, body: str):
        args = {"to": "ceo@example.com", "body": body}
        key = "email:" + args_hash(args)
        return send(agent, run, attempt=attempt, key=key, key_source="content", args=args)

    run = start(agent).run
    first = send_body(1, "Hi, the Q3 numbers are attached.")
    complete_effect(
        agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "m-1"}
    )
    start(agent, "job-1", supersede=1)
    second = send_body(2, "Hello! Attached are the Q3 figures.")
    assert second.effect.hold["reason"] == "key_drift"
    return first.effect, second.effect


def test_a_drift_held_effect_shows_the_earlier_one_side_by_side_with_the_diff(
    client, viewer, agent
):
    earlier, held = _drifted(agent)
    client.force_login(viewer)

    response = client.get(f"/effects/{held.pk}/")

    assert response.status_code == 200
    html = response.content.decode()
    assert "Why it waits" in html and 'data-hold="key_drift"' in html
    assert escape(held.hold["message"]) in html
    # The earlier effect, linked, with its key, arguments and result.
    assert f'href="/effects/{earlier.pk}/"' in html
    assert earlier.key in html and held.key in html
    assert "The earlier effect" in html and "This effect" in html
    assert "m-1" in html
    # Their arguments' diff, line by line.
    assert '<span class="d-del">-  &quot;body&quot;: &quot;Hi, the Q3 numbers' in html
    assert '<span class="d-add">+  &quot;body&quot;: &quot;Hello! Attached' in html


def test_a_decided_drift_hold_still_says_why_it_was_held(client, operator, agent):
    _, held = _drifted(agent)
    client.force_login(operator)
    client.post(f"/effects/{held.pk}/approve", {"args_hash": held.args_hash})

    html = client.get(f"/effects/{held.pk}/").content.decode()

    assert "Why it was held" in html and "Why it waits" not in html
    assert "The earlier effect" in html


@pytest.mark.parametrize(
    ("setup", "reason", "words"),
    [
        ("confirm", "tool_unconfirmed", "not confirmed by an admin"),
        ("policy", "policy_rule", "policy of send_email, rule big"),
    ],
)
def test_any_hold_shows_its_reason_and_message(
    client, viewer, admin_user, agent, setup, reason, words
):
    if setup == "confirm":
        agent.tool_mode = ToolMode.CONFIRM
        agent.save()
    else:
        send(agent, start(agent, "warm-up").run, key="w")  # registers the tool
        rule = {"id": "big", "pointer": "/n", "op": ">", "value": 5, "action": "require"}
        save_policy(admin_user, ToolPolicy(tool=Tool.objects.get(name="send_email"), rules=[rule]))
    effect = send(agent, start(agent).run, args={"n": 9}).effect
    assert effect.hold["reason"] == reason
    client.force_login(viewer)

    html = client.get(f"/effects/{effect.pk}/").content.decode()

    assert "Why it waits" in html and f'data-hold="{reason}"' in html
    assert words in html
    assert escape(effect.hold["message"]) in html
    assert "The earlier effect" not in html


def test_an_effect_without_a_hold_says_nothing_of_one(client, viewer, agent):
    effect = send(agent, start(agent).run).effect
    client.force_login(viewer)
    html = client.get(f"/effects/{effect.pk}/").content.decode()
    assert "Why it waits" not in html and "Why it was held" not in html


def test_the_drift_held_effect_page_costs_one_query_more(
    client, viewer, agent, django_assert_max_num_queries
):
    _, held = _drifted(agent)
    client.force_login(viewer)
    # the effect page's budget (test_console_queries) and the earlier effect
    with django_assert_max_num_queries(13):
        assert client.get(f"/effects/{held.pk}/").status_code == 200
