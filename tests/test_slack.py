"""Slack messages: each effect awaiting approval posted once, then updated in place.

Against a loopback fake of Slack's Web API (tests/slack_fake.py), slack_sdk's own
client pointed at it.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from approvals.decisions import approve_effect, reject_effect
from approvals.models import SlackMessage
from approvals.slack import (
    CHANGES_A_MESSAGE,
    changes_a_message,
    claim_due_messages,
    collect_slack_messages,
    enqueue_sync,
    send_slack_messages,
    sync_slack,
)
from runs.audit import SYSTEM, record_event
from runs.models import AuditEvent, Effect, TaskState
from startsafe.settings import _slack_settings
from tests.lifecycle_helpers import send
from tests.slack_fake import CHANNEL, CHANNEL_IDS, ESCALATION_CHANNEL, FakeSlack
from tests.slack_fake import awaiting_effect as _awaiting

pytestmark = pytest.mark.django_db

CHANNEL_ID = CHANNEL_IDS[CHANNEL]


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda *a, **kw: None)


def _buttons(blocks: list[dict]) -> dict[str, dict]:
    return {
        element["action_id"]: element
        for block in blocks
        if block["type"] == "actions"
        for element in block["elements"]
    }


def _text(blocks: list[dict]) -> str:
    return json.dumps(blocks, ensure_ascii=False)


def test_each_awaiting_effect_is_posted_once_with_its_buttons_bound_to_its_hash(
    agent, operator, slack: FakeSlack
):
    first, second = _awaiting(agent, 1), _awaiting(agent, 2)

    report = sync_slack()
    again = sync_slack()  # the task runs twice: nothing new to post

    assert report.posted == 2 and again.posted == 0 and again.updated == 0
    posts = slack.made("chat.postMessage")
    assert len(posts) == 2 and {p["channel"] for p in posts} == {CHANNEL}
    by_effect = {str(e.pk): e for e in (first, second)}
    for post in posts:
        buttons = _buttons(post["blocks"])
        effect_id, _, args_hash = buttons["approve"]["value"].partition(":")
        effect = by_effect[effect_id]
        # Each button carries the effect and the hash of the arguments shown.
        assert (
            args_hash == effect.args_hash
            and buttons["reject"]["value"] == f"{effect_id}:{args_hash}"
        )
        shown = _text(post["blocks"])
        assert effect.preview in shown and effect.run.run_key in shown
        assert '\\"amount\\": 120' in shown and "refund" in shown
        assert buttons["open_console"]["url"].endswith(f"/effects/{effect_id}/")
    # Each row keeps where its message is, to update it later.
    rows = SlackMessage.objects.order_by("id")
    assert [(r.channel, r.status) for r in rows] == [("C0APPROVALS", "sent")] * 2
    assert len({r.ts for r in rows}) == 2
    assert TaskState.objects.get(name="slack").last_started_at is not None


def test_a_change_updates_the_message_in_place_never_posting_it_again(
    agent, operator, slack: FakeSlack
):
    effect = _awaiting(agent, 1)
    sync_slack()
    (row,) = SlackMessage.objects.all()

    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    report = sync_slack()
    sync_slack()

    assert report.updated == 1 and report.posted == 0
    assert len(slack.made("chat.postMessage")) == 1
    (update,) = slack.made("chat.update")
    assert (update["channel"], update["ts"]) == ("C0APPROVALS", row.ts)
    # Who decided what, and no buttons left to click.
    assert "Approved by olivia" in _text(update["blocks"])
    assert set(_buttons(update["blocks"])) == {"open_console"}
    row.refresh_from_db()
    effect.refresh_from_db()
    assert row.shown_revision == effect.revision and row.status == "sent"


def test_an_effect_that_awaits_approval_again_gets_its_message_updated_not_a_second_one(
    agent, operator, second_operator, slack: FakeSlack
):
    effect = _awaiting(agent, 1, approvals_required=2)
    sync_slack()

    # An operator edits the arguments: a new version, new buttons on the same message.
    edited = approve_effect(
        second_operator,
        effect.pk,
        args_hash=effect.args_hash,
        edited_args={"order": 1, "amount": 80},
    )
    sync_slack()

    assert len(slack.made("chat.postMessage")) == 1
    (update,) = slack.made("chat.update")
    assert _buttons(update["blocks"])["approve"]["value"] == f"{effect.pk}:{edited.args_hash}"
    assert "Approved by oscar" in _text(update["blocks"])


def test_an_effect_decided_before_its_message_went_out_is_not_posted_unless_asked_again(
    agent, operator, slack: FakeSlack
):
    effect = _awaiting(agent, 1)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    report = sync_slack()

    assert report.posted == 0 and report.skipped == 1 and slack.calls == []
    assert SlackMessage.objects.get().status == "obsolete"
    # Rejected after its approval, then asked again with new arguments: news again.
    reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="Wrong amount.")
    again = send(
        agent, effect.run, tool="refund", args={"order": 1, "amount": 60}, key="refund:1",
        key_source="intent", needs_approval=True, now=timezone.now(),
    ).effect  # fmt: skip
    assert again.pk == effect.pk and again.status == "awaiting_approval"

    assert sync_slack().posted == 1
    (post,) = slack.made("chat.postMessage")
    assert _buttons(post["blocks"])["approve"]["value"] == f"{effect.pk}:{again.args_hash}"


def test_long_arguments_are_cut_and_an_agents_mentions_are_shown_not_sent(
    agent, operator, slack: FakeSlack
):
    _awaiting(agent, 1, args={"body": "x" * 5000}, preview="Mail <!channel> & <@U0BOSS>")

    sync_slack()

    (post,) = slack.made("chat.postMessage")
    shown = _text(post["blocks"])
    # Slack refuses a section over 3,000 characters; the console shows them whole.
    assert all(len(b.get("text", {}).get("text", "")) <= 3000 for b in post["blocks"])
    assert "more characters: see the console" in shown
    assert "&lt;!channel&gt; &amp; &lt;@U0BOSS&gt;" in shown and "<!channel>" not in shown
    assert "<!channel>" not in post["text"]


def test_a_rate_limited_post_waits_its_retry_after_and_loses_nothing(
    agent, operator, slack: FakeSlack
):
    for n in range(3):
        _awaiting(agent, n)
    slack.fail_next(
        "chat.postMessage", 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "30"}
    )
    now = timezone.now()

    first = sync_slack(now)

    assert first.posted == 0 and first.deferred == 3
    assert all(r.due_at == now + timedelta(seconds=30) for r in SlackMessage.objects.all())
    assert set(SlackMessage.objects.values_list("status", "tries")) == {("pending", 0)}
    # Not before Retry-After passed...
    assert sync_slack(now + timedelta(seconds=29)).posted == 0
    # ...then every one of them, once.
    assert sync_slack(now + timedelta(seconds=31)).posted == 3
    assert len(slack.made("chat.postMessage")) == 4  # the refused try, then three


def test_a_refused_post_backs_off_and_is_given_up_after_the_tries(
    agent, operator, slack: FakeSlack, settings
):
    settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_MAX_TRIES": 2}
    _awaiting(agent, 1)
    slack.fail_next("chat.postMessage", 200, {"ok": False, "error": "channel_not_found"})
    slack.fail_next("chat.postMessage", 200, {"ok": False, "error": "channel_not_found"})
    now = timezone.now()

    assert sync_slack(now).failures == 1
    row = SlackMessage.objects.get()
    assert (row.status, row.tries, row.ts) == ("pending", 1, "")
    assert row.last_error == "slack: channel_not_found" and row.due_at == now + timedelta(seconds=2)
    assert sync_slack(now + timedelta(seconds=1)).failures == 0  # backing off

    sync_slack(now + timedelta(seconds=3))

    row.refresh_from_db()
    assert (row.status, row.tries) == ("given_up", 2)


# --- A post whose answer was lost is found, not posted again ------------------------


@pytest.fixture
def by_id(slack: FakeSlack, settings) -> FakeSlack:
    """The channel given by its id, as the lookup needs (conversations.history)."""
    settings.STARTSAFE = {**settings.STARTSAFE, "SLACK_CHANNEL": CHANNEL_ID}
    return slack


def test_a_post_whose_answer_was_lost_is_found_by_its_metadata_and_not_posted_again(
    agent, operator, by_id: FakeSlack
):
    effect = _awaiting(agent, 1)
    by_id.drop_next("chat.postMessage", done=True)  # Slack posts it; we never hear
    now = timezone.now()

    first = sync_slack(now)

    assert first.failures == 1 and first.posted == 0
    row = SlackMessage.objects.get()
    assert (row.ts, row.tries) == ("", 1)
    # Stamped on the real clock just before the post: the lookup's window.
    assert now <= row.post_tried_at <= timezone.now()
    (lost,) = by_id.messages(CHANNEL_ID)
    assert lost["metadata"] == {
        "event_type": "startsafe_approval",
        "event_payload": {
            "effect_id": str(effect.pk),
            "purpose": "approval",
            "message_id": str(row.pk),
            "revision": effect.revision,
        },
    }

    again = sync_slack(now + timedelta(seconds=3))

    assert (again.found, again.posted, again.updated, again.failures) == (1, 0, 0, 0)
    assert by_id.messages(CHANNEL_ID) == [lost]  # one message, still
    assert len(by_id.made("chat.postMessage")) == 1 and by_id.made("chat.update") == []
    (look,) = by_id.made("conversations.history")
    assert look["channel"] == CHANNEL_ID and look["include_all_metadata"] in ("1", "true")
    tried = row.post_tried_at.timestamp()
    assert float(look["oldest"]) == pytest.approx(tried - 60)
    assert float(look["latest"]) == pytest.approx(tried + 10 + 60)  # TIMEOUT + the skew
    row.refresh_from_db()
    assert (row.status, row.channel, row.ts, row.tries) == ("sent", CHANNEL_ID, lost["ts"], 0)
    assert row.shown_revision == effect.revision


def test_a_worker_that_died_between_the_post_and_saving_its_ts_leaves_it_to_be_found(
    agent, operator, by_id: FakeSlack
):
    _awaiting(agent, 1)
    now = timezone.now()
    sync_slack(now)
    (posted,) = by_id.messages(CHANNEL_ID)
    # What the dead worker left: the post tried, no ts saved, no try counted, its
    # claim's lease running out.
    SlackMessage.objects.update(ts="", channel=CHANNEL_ID, status="sending", due_at=now)

    again = sync_slack(now + timedelta(seconds=1))

    assert again.found == 1 and again.posted == 0
    assert by_id.messages(CHANNEL_ID) == [posted]
    assert SlackMessage.objects.get().ts == posted["ts"]


def test_a_post_that_never_reached_slack_is_posted_once_by_the_retry(
    agent, operator, by_id: FakeSlack
):
    _awaiting(agent, 1)
    by_id.drop_next("chat.postMessage", done=False)
    now = timezone.now()

    assert sync_slack(now).failures == 1 and by_id.messages(CHANNEL_ID) == []
    again = sync_slack(now + timedelta(seconds=3))

    assert again.posted == 1 and again.found == 0
    assert len(by_id.made("conversations.history")) == 1  # looked, found nothing
    (message,) = by_id.messages(CHANNEL_ID)
    assert SlackMessage.objects.get().ts == message["ts"]


def test_a_first_post_looks_nothing_up(agent, operator, by_id: FakeSlack):
    _awaiting(agent, 1)
    _awaiting(agent, 2)

    assert sync_slack().posted == 2

    assert by_id.made("conversations.history") == []
    assert [c["method"] for c in by_id.calls] == ["chat.postMessage"] * 2


def test_the_lookup_pages_back_and_an_effect_decided_since_gets_its_found_message_updated(
    agent, operator, by_id: FakeSlack, monkeypatch
):
    monkeypatch.setattr("approvals.slack.LOOKUP_PAGE", 2)
    effect = _awaiting(agent, 1)
    by_id.drop_next("chat.postMessage", done=True)
    now = timezone.now()
    sync_slack(now)
    for n in (2, 3, 4):  # three newer messages: the lost one is on the second page
        _awaiting(agent, n)
    assert sync_slack(now + timedelta(seconds=1)).posted == 3
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    again = sync_slack(now + timedelta(seconds=3))

    assert (again.found, again.updated, again.posted, again.skipped) == (1, 1, 0, 0)
    pages = by_id.made("conversations.history")
    assert len(pages) == 2 and "cursor" not in pages[0] and pages[1]["cursor"]
    assert len(by_id.messages(CHANNEL_ID)) == 4
    lost = by_id.messages(CHANNEL_ID)[0]
    (update,) = by_id.made("chat.update")
    assert update["ts"] == lost["ts"] and "Approved by olivia" in _text(update["blocks"])
    assert set(_buttons(lost["blocks"])) == {"open_console"}  # its buttons are gone


def test_a_lookup_that_cannot_settle_it_is_a_failed_try_never_a_blind_post(
    agent, operator, by_id: FakeSlack, monkeypatch
):
    monkeypatch.setattr("approvals.slack.LOOKUP_PAGE", 1)
    monkeypatch.setattr("approvals.slack.LOOKUP_PAGES", 1)
    _awaiting(agent, 1)
    by_id.drop_next("chat.postMessage", done=False)
    now = timezone.now()
    sync_slack(now)
    _awaiting(agent, 2)
    _awaiting(agent, 3)
    sync_slack(now + timedelta(seconds=1))  # two newer messages: more than a page
    by_id.drop_next("conversations.history", done=False)  # then the network fails

    for later in (3, 10):
        assert sync_slack(now + timedelta(seconds=later)).failures == 1

    assert len(by_id.made("chat.postMessage")) == 3  # the lost try, effects 2 and 3
    row = SlackMessage.objects.order_by("id").first()
    assert (row.status, row.ts, row.tries) == ("pending", "", 3)
    assert row.last_error == "slack: not found in the last 1 messages"


@pytest.mark.parametrize("why", ["missing_scope", "channel_given_by_name"])
def test_a_lookup_slack_will_never_answer_posts_anyway_with_one_warning_per_run(
    agent, operator, by_id: FakeSlack, settings, caplog, why
):
    if why == "missing_scope":
        by_id.scopes -= {"channels:history", "groups:history"}
    else:
        settings.STARTSAFE = {**settings.STARTSAFE, "SLACK_CHANNEL": CHANNEL}
    _awaiting(agent, 1)
    _awaiting(agent, 2)
    by_id.drop_next("chat.postMessage", done=True)
    by_id.drop_next("chat.postMessage", done=True)
    now = timezone.now()
    sync_slack(now)

    with caplog.at_level("WARNING", logger="startsafe.slack"):
        again = sync_slack(now + timedelta(seconds=3))

    # The old risk, said in the log: each lost post is posted a second time.
    assert again.posted == 2 and again.found == 0
    assert len(by_id.messages(CHANNEL_ID)) == 4
    warnings = [
        r.getMessage() for r in caplog.records if "slack_lookup_impossible" in r.getMessage()
    ]
    assert len(warnings) == 1 and why in warnings[0]
    looked = by_id.made("conversations.history")
    assert len(looked) == (2 if why == "missing_scope" else 0)


def test_an_escalation_is_posted_once_to_the_escalation_channel(agent, operator, slack: FakeSlack):
    effect = _awaiting(agent, 1)
    sync_slack()
    # What the escalation task writes when the SLA passes.
    record_event(SYSTEM, "escalated", at=timezone.now(), effect=effect, run=effect.run)

    sync_slack()
    sync_slack()

    posts = slack.made("chat.postMessage")
    assert [p["channel"] for p in posts] == [CHANNEL, ESCALATION_CHANNEL]
    assert "Escalated" in _text(posts[1]["blocks"])
    assert _buttons(posts[1]["blocks"])["approve"]["value"] == f"{effect.pk}:{effect.args_hash}"
    assert SlackMessage.objects.filter(purpose="escalation", channel="C0ESCALATE").count() == 1


def test_without_an_escalation_channel_an_escalation_is_not_posted(
    agent, operator, slack: FakeSlack, settings
):
    settings.STARTSAFE = {**settings.STARTSAFE, "SLACK_ESCALATION_CHANNEL": ""}
    effect = _awaiting(agent, 1)
    record_event(SYSTEM, "escalated", at=timezone.now(), effect=effect, run=effect.run)

    sync_slack()

    assert [p["channel"] for p in slack.made("chat.postMessage")] == [CHANNEL]


def test_a_change_queues_the_task_once_after_the_commit(
    agent, operator, slack: FakeSlack, settings, django_capture_on_commit_callbacks
):
    # Made with Slack off: the test's own transaction would already hold their task.
    on = settings.STARTSAFE
    settings.STARTSAFE = {**on, "SLACK_BOT_TOKEN": ""}
    first, second = _awaiting(agent, 1), _awaiting(agent, 2)
    settings.STARTSAFE = on

    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        approve_effect(operator, first.pk, args_hash=first.args_hash)
        approve_effect(operator, second.pk, args_hash=second.args_hash)

    # Not inside the decision's transaction: after its commit, and once for both.
    assert callbacks == [enqueue_sync]


def test_with_slack_off_nothing_is_queued_nor_posted(
    agent, operator, slack: FakeSlack, settings, django_capture_on_commit_callbacks
):
    settings.STARTSAFE = {**settings.STARTSAFE, "SLACK_BOT_TOKEN": ""}
    with django_capture_on_commit_callbacks() as callbacks:
        effect = _awaiting(agent, 1)

    assert callbacks == [] and sync_slack().posted == 0
    assert slack.calls == [] and not SlackMessage.objects.exists()
    assert Effect.objects.get(pk=effect.pk).status == "awaiting_approval"


@pytest.mark.parametrize(
    "env",
    [
        {"STARTSAFE_SLACK_BOT_TOKEN": "xoxb-1"},
        {"STARTSAFE_SLACK_SIGNING_SECRET": "s"},
        {"STARTSAFE_SLACK_BOT_TOKEN": "xoxb-1", "STARTSAFE_SLACK_SIGNING_SECRET": "s"},
    ],
)
def test_half_a_slack_configuration_is_refused_at_the_start(monkeypatch, env):
    from django.core.exceptions import ImproperlyConfigured

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured):
        _slack_settings()


# (verb, actor kind, old status, new status) → whether a message shows the change.
SHOWN = [
    ("recorded", "agent", "", "awaiting_approval", True),  # it starts to await
    ("expired", "system", "awaiting_approval", "expired", True),  # it stops awaiting
    ("args_edited", "operator", "awaiting_approval", "awaiting_approval", True),
    ("released", "operator", "unknown", "pending", True),  # any person's decision
    ("escalated", "system", "", "", True),
    ("claimed", "agent", "approved", "in_flight", False),  # the agent's work after it
    ("completed", "agent", "in_flight", "done", False),
]


@pytest.mark.parametrize(("verb", "kind", "old", "new", "shown"), SHOWN)
def test_which_changes_a_message_shows_is_one_rule_in_python_and_in_sql(
    agent, verb, kind, old, new, shown
):
    effect = _awaiting(agent)
    event = AuditEvent.objects.create(
        at=timezone.now(), actor="x", actor_kind=kind, verb=verb, effect=effect,
        old_status=old, new_status=new,
    )  # fmt: skip

    assert changes_a_message(event) is shown
    assert AuditEvent.objects.filter(CHANGES_A_MESSAGE, pk=event.pk).exists() is shown
    event.effect = None  # an event of no effect changes no message
    assert not changes_a_message(event)


def test_the_system_checks_warn_about_a_channel_given_by_name(slack, settings):
    def warnings() -> list[str]:
        return [m.msg for m in checks.run_checks() if m.id == "startsafe.W002"]

    # The fixture's channels are names (#approvals, #escalations): both are named.
    [message] = warnings()
    assert "STARTSAFE_SLACK_CHANNEL=#approvals" in message
    assert "STARTSAFE_SLACK_ESCALATION_CHANNEL=#escalations" in message
    # Ids: no warning; and none while Slack is off.
    settings.STARTSAFE = {
        **settings.STARTSAFE,
        "SLACK_CHANNEL": "C0APPROVALS",
        "SLACK_ESCALATION_CHANNEL": "",
    }
    assert warnings() == []
    settings.STARTSAFE = {
        **settings.STARTSAFE,
        "SLACK_CHANNEL": "#approvals",
        "SLACK_BOT_TOKEN": "",
    }
    assert warnings() == []
    call_command("check")  # a warning never stops the start


def test_a_row_whose_lease_passed_mid_batch_is_left_to_the_sender_that_took_it(
    agent, operator, by_id: FakeSlack, monkeypatch
):
    _awaiting(agent, 1)
    now = timezone.now()
    collect_slack_messages(now)
    held_by_a = claim_due_messages(now)  # sender A claims it, then is slow
    # Past the lease (NOTIFY_LEASE, 120 s), sender B claims the same row and posts it.
    assert send_slack_messages(now + timedelta(seconds=130)).posted == 1
    monkeypatch.setattr("approvals.slack.claim_due_messages", lambda now: held_by_a)

    late = send_slack_messages(now)  # A goes on with the row it held

    assert (late.posted, late.lost) == (0, 1)
    assert len(by_id.messages(CHANNEL_ID)) == 1 and len(by_id.made("chat.postMessage")) == 1
    assert SlackMessage.objects.get().status == "sent"


def test_a_lost_post_decided_since_and_asked_again_is_posted_with_no_stale_lookup(
    agent, operator, by_id: FakeSlack, monkeypatch
):
    # A lookup that cannot settle is a failed try: a stale one would fail forever.
    monkeypatch.setattr("approvals.slack.LOOKUP_PAGE", 1)
    monkeypatch.setattr("approvals.slack.LOOKUP_PAGES", 1)
    effect = _awaiting(agent, 1)
    by_id.drop_next("chat.postMessage", done=False)  # it never reached Slack
    now = timezone.now()
    assert sync_slack(now).failures == 1
    reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="Wrong amount.")
    # Looked up, not there, no longer news: obsolete, its old try forgotten.
    assert sync_slack(now + timedelta(seconds=3)).skipped == 1
    assert SlackMessage.objects.get().post_tried_at is None
    _awaiting(agent, 2)
    _awaiting(agent, 3)
    sync_slack(now + timedelta(seconds=4))  # the channel busier than a page
    again = send(
        agent, effect.run, tool="refund", args={"order": 1, "amount": 60}, key="refund:1",
        key_source="intent", needs_approval=True, now=timezone.now(),
    ).effect  # fmt: skip
    assert again.status == "awaiting_approval"
    looked = len(by_id.made("conversations.history"))

    assert sync_slack(now + timedelta(seconds=5)).posted == 1

    assert len(by_id.made("conversations.history")) == looked  # no lookup this time
    row = SlackMessage.objects.get(effect=effect)
    assert row.status == "sent" and row.ts
    assert len(by_id.messages(CHANNEL_ID)) == 3


def test_a_message_of_another_install_naming_the_same_row_id_is_not_taken_for_ours(
    agent, operator, by_id: FakeSlack
):
    effect = _awaiting(agent, 1)
    by_id.drop_next("chat.postMessage", done=False)  # ours never reached Slack
    now = timezone.now()
    sync_slack(now)
    row = SlackMessage.objects.get()
    # Staging posting to the same channel: its row has our row's id, for another effect.
    foreign = {"message_id": str(row.pk), "effect_id": str(uuid.uuid4())}
    by_id.history.setdefault(CHANNEL_ID, []).append(
        {
            "type": "message",
            "ts": f"{time.time():.6f}",
            "text": "another install's approval",
            "metadata": {
                "event_type": "startsafe_approval",
                "event_payload": {**foreign, "purpose": "approval", "revision": 1},
            },
        }
    )

    again = sync_slack(now + timedelta(seconds=3))

    assert (again.found, again.posted) == (0, 1)
    row.refresh_from_db()
    ours = [m for m in by_id.messages(CHANNEL_ID) if m["ts"] == row.ts]
    assert ours and ours[0]["metadata"]["event_payload"]["effect_id"] == str(effect.pk)
