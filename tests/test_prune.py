"""Retention: ``manage.py prune`` deletes old finished runs and keeps every key's outcome.

product.md rule 8: a message redelivered a month after its run was pruned is still
deduplicated. These tests prune, then redeliver.
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.utils import timezone
from lifecycle_helpers import send, start

from approvals.decisions import abandon_run, reject_effect
from approvals.models import Approval
from runs.errors import KeyConflict
from runs.lifecycle import finish_run
from runs.models import (
    Attempt,
    AuditEvent,
    Call,
    Effect,
    EffectStatus,
    EffectVersion,
    KeyTombstone,
    Run,
)
from runs.outcomes import complete_effect
from runs.prune import prune_finished_runs
from tests.api_client import Api

pytestmark = pytest.mark.django_db

LONG_AGO = timezone.now() - timedelta(days=60)
KEY = "outlook:message:<a1@example.com>"


def _done_run(agent, run_key="ticket-1", *, key=KEY, result=None, at=LONG_AGO):
    """A run that sent one keyed reply (done with ``result``) and completed, at ``at``."""
    run = start(agent, run_key, now=at).run
    recorded = send(agent, run, key=key, args={"subject": "Re: hello"}, now=at)
    complete_effect(
        agent,
        recorded.effect.pk,
        run_id=run.pk,
        attempt=1,
        outcome="done",
        result=result or {"id": "sent-1"},
        now=at,
    )
    finish_run(agent, run.pk, attempt=1, outcome="completed", now=at)
    return run, recorded.effect


def _prune(days=30):
    return prune_finished_runs(timedelta(days=days))


def test_a_key_redelivered_after_pruning_is_still_skipped_with_its_result(agent):
    run, effect = _done_run(agent, result={"id": "sent-1"})

    report = _prune()

    assert report.runs == 1 and report.tombstones == 1
    assert not Run.objects.filter(pk=run.pk).exists()
    assert not Effect.objects.filter(pk=effect.pk).exists()
    tombstone = KeyTombstone.objects.get(agent=agent, key=KEY)
    assert (tombstone.tool, tombstone.status, tombstone.result) == (
        "send_email",
        "done",
        {"id": "sent-1"},
    )
    assert (tombstone.effect_id, tombstone.run_key) == (effect.pk, "ticket-1")

    # The message comes back a month later; the model rewrote the subject line.
    again = start(agent, "ticket-1-redelivered").run
    recorded = send(agent, again, key=KEY, args={"subject": "RE: Hello!"})

    assert recorded.action == "skip"
    assert recorded.effect.status == EffectStatus.DONE
    assert recorded.effect.result == {"id": "sent-1"}
    # What ran is the recorded version; the rewritten one is kept as drift.
    versions = list(
        recorded.effect.versions.order_by("number").values_list("args", "adopted", "author")
    )
    assert versions == [
        ({"subject": "Re: hello"}, True, "system"),
        ({"subject": "RE: Hello!"}, False, "agent:support-bot"),
    ]
    assert AuditEvent.objects.filter(effect=recorded.effect, verb="restored").exists()


def test_the_same_arguments_redelivered_are_skipped_without_drift(agent):
    _done_run(agent)
    _prune()

    again = start(agent, "ticket-2").run
    recorded = send(agent, again, key=KEY, args={"subject": "Re: hello"})

    assert recorded.action == "skip"
    assert recorded.effect.versions.count() == 1


def test_a_pruned_key_named_by_another_tool_is_a_key_conflict(agent):
    _done_run(agent)
    _prune()
    again = start(agent, "ticket-2").run

    with pytest.raises(KeyConflict) as raised:
        send(agent, again, key=KEY, tool="send_sms")

    assert raised.value.details == {"tool": "send_email"}
    assert not Effect.objects.exists()  # nothing half-restored


def test_a_redelivery_through_the_api_is_skipped(agent):
    _done_run(agent, result={"id": "sent-1"})
    call_command("prune", "--older-than", "30", stdout=StringIO())
    api = Api(agent.token)
    run_id = api.start("ticket-9").body["run"]["id"]

    answer = api.call(
        run_id, tool="send_email", key=KEY, key_source="provider", args={"subject": "x"}
    )

    assert answer.status == 201
    assert answer.body["action"] == "skip"
    assert answer.body["effect"]["result"] == {"id": "sent-1"}


def test_keys_stay_in_their_agents_namespace(agent, other_agent):
    _done_run(agent)
    _prune()
    run = start(other_agent, "ticket-1").run

    recorded = send(other_agent, run, key=KEY)

    assert recorded.action == "execute"  # another agent's key is a new key


def test_an_unknown_outcome_comes_back_for_review_never_executed(agent):
    run = start(agent, "t", now=LONG_AGO).run
    send(agent, run, key=KEY, now=LONG_AGO)  # claimed: in flight
    # Finishing with the effect unreported makes it unknown.
    finish_run(agent, run.pk, attempt=1, outcome="completed", now=LONG_AGO)
    _prune()
    assert KeyTombstone.objects.get(key=KEY).status == "unknown"

    recorded = send(agent, start(agent, "t2").run, key=KEY)

    assert recorded.action == "review"
    assert recorded.effect.status == EffectStatus.UNKNOWN


def test_a_rejected_key_stays_blocked(agent, operator):
    run = start(agent, "t", now=LONG_AGO).run
    effect = send(agent, run, key=KEY, needs_approval=True, now=LONG_AGO).effect
    reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="no", now=LONG_AGO)
    finish_run(agent, run.pk, attempt=1, outcome="completed", now=LONG_AGO)
    _prune()

    recorded = send(agent, start(agent, "t2").run, key=KEY, args={"subject": "other"})

    assert recorded.action == "blocked"
    assert recorded.effect.status == EffectStatus.REJECTED
    assert recorded.effect.decision["final"] is True


def test_a_key_that_never_ran_is_a_fresh_effect_after_pruning(agent):
    run = start(agent, "t", now=LONG_AGO).run
    effect = send(agent, run, key=KEY, needs_approval=True, now=LONG_AGO).effect
    finish_run(agent, run.pk, attempt=1, outcome="completed", now=LONG_AGO)
    _prune()
    assert KeyTombstone.objects.get(key=KEY).status == "awaiting_approval"

    recorded = send(agent, start(agent, "t2").run, key=KEY, needs_approval=True)

    # Nothing happened, so it asks for approval again, as a new key would.
    assert recorded.action == "wait"
    assert recorded.effect.pk != effect.pk


def test_runs_that_are_not_finished_are_never_touched(agent, operator):
    running = start(agent, "running", now=LONG_AGO).run
    failed = start(agent, "failed", now=LONG_AGO).run
    finish_run(agent, failed.pk, attempt=1, outcome="failed", now=LONG_AGO)
    recent, _ = _done_run(agent, "recent", key="k:recent", at=timezone.now())

    report = _prune()

    assert (report.runs, report.not_finished) == (0, 2)
    assert Run.objects.filter(pk__in=[running.pk, failed.pk, recent.pk]).count() == 3


def test_an_abandoned_run_is_finished_and_pruned(agent, operator):
    run = start(agent, "t", now=LONG_AGO).run
    finish_run(agent, run.pk, attempt=1, outcome="failed", now=LONG_AGO)
    abandon_run(operator, run.pk, note="obsolete", now=LONG_AGO)

    assert _prune().runs == 1
    assert not Run.objects.exists()


def test_an_effect_shared_with_a_run_that_stays_keeps_its_run(agent):
    owner, effect = _done_run(agent, "owner")
    # A live run, woken by the same message, shares the reply.
    live = start(agent, "live").run
    assert send(agent, live, key=KEY).action == "skip"

    report = _prune()

    assert (report.runs, report.kept_shared) == (0, 1)
    assert Run.objects.filter(pk=owner.pk).exists()
    assert Effect.objects.filter(pk=effect.pk).exists()
    assert Call.objects.filter(run=live, effect=effect).exists()


def test_runs_sharing_an_effect_go_together_once_both_are_finished_and_old(agent):
    owner, effect = _done_run(agent, "owner")
    other = start(agent, "other", now=LONG_AGO).run
    send(agent, other, key=KEY, now=LONG_AGO)
    finish_run(agent, other.pk, attempt=1, outcome="completed", now=LONG_AGO)

    report = _prune()

    assert (report.runs, report.kept_shared, report.tombstones) == (2, 0, 1)
    assert not Effect.objects.exists()


def test_pruning_deletes_the_whole_run_and_keeps_the_audit_log(agent, operator):
    run, effect = _done_run(agent)
    events = AuditEvent.objects.filter(run=run).count()
    assert events > 0

    report = _prune()

    assert not Attempt.objects.filter(run_id=run.pk).exists()
    assert not Call.objects.filter(run_id=run.pk).exists()
    assert not EffectVersion.objects.filter(effect_id=effect.pk).exists()
    assert not Approval.objects.filter(effect_id=effect.pk).exists()
    # The audit log stays; its links to the deleted rows are emptied.
    assert AuditEvent.objects.filter(run__isnull=True).count() >= events
    assert report.deleted["runs.Run"] == 1 and report.deleted["runs.Effect"] == 1


def test_pruning_twice_updates_the_tombstone(agent):
    _done_run(agent, result={"id": "first"})
    _prune()
    again = start(agent, "again", now=LONG_AGO).run
    assert send(agent, again, key=KEY, now=LONG_AGO).action == "skip"
    finish_run(agent, again.pk, attempt=1, outcome="completed", now=LONG_AGO)
    Run.objects.filter(pk=again.pk).update(updated_at=LONG_AGO)

    assert _prune().tombstones == 1

    tombstone = KeyTombstone.objects.get(key=KEY)
    assert (tombstone.result, tombstone.run_key) == ({"id": "first"}, "again")


def test_the_command_prints_what_it_did_and_a_dry_run_changes_nothing(agent):
    _done_run(agent)
    out = StringIO()

    call_command("prune", "--older-than", "30", "--dry-run", stdout=out)

    assert "would delete 1 finished run(s)" in out.getvalue()
    assert Run.objects.count() == 1 and not KeyTombstone.objects.exists()

    out = StringIO()
    call_command("prune", "--older-than", "30", stdout=out)
    assert "deleted 1 finished run(s), wrote 1 key tombstone(s)" in out.getvalue()
    assert "runs.Effect: 1" in out.getvalue()
    assert Run.objects.count() == 0


def test_the_command_refuses_a_negative_age():
    with pytest.raises(CommandError):
        call_command("prune", "--older-than", "-1", stdout=StringIO())


def test_the_scheduled_prune_uses_the_setting_and_is_off_without_it(agent, settings):
    from runs.tasks import prune

    old_run, _ = _done_run(agent, "ticket-old")
    recent_run, _ = _done_run(agent, "ticket-recent", key="k:recent", at=timezone.now())

    settings.STARTSAFE = {**settings.STARTSAFE, "PRUNE_OLDER_THAN_DAYS": None}
    assert "off" in prune()
    assert Run.objects.filter(pk=old_run.pk).exists()

    settings.STARTSAFE = {**settings.STARTSAFE, "PRUNE_OLDER_THAN_DAYS": 30}
    said = prune()
    assert not Run.objects.filter(pk=old_run.pk).exists()
    assert Run.objects.filter(pk=recent_run.pk).exists()
    assert KeyTombstone.objects.filter(agent=agent, key=KEY).exists()
    assert "1" in said
    # Twice is safe: the second run finds nothing more to prune.
    prune()
    assert Run.objects.filter(pk=recent_run.pk).exists()


def test_the_schedule_has_the_prune_only_when_retention_is_set(monkeypatch):
    import importlib

    import startsafe.settings as settings_module

    try:
        monkeypatch.delenv("STARTSAFE_PRUNE_OLDER_THAN_DAYS", raising=False)
        assert "prune" not in importlib.reload(settings_module).CELERY_BEAT_SCHEDULE
        monkeypatch.setenv("STARTSAFE_PRUNE_OLDER_THAN_DAYS", "90")
        reloaded = importlib.reload(settings_module)
        assert reloaded.STARTSAFE["PRUNE_OLDER_THAN_DAYS"] == 90
        assert reloaded.CELERY_BEAT_SCHEDULE["prune"]["task"] == "runs.tasks.prune"
        # Out of the calendar (the daily task would crash on it): refused at start.
        monkeypatch.setenv("STARTSAFE_PRUNE_OLDER_THAN_DAYS", "1000000")
        with pytest.raises(ImproperlyConfigured, match="PRUNE_OLDER_THAN_DAYS"):
            importlib.reload(settings_module)
    finally:
        monkeypatch.delenv("STARTSAFE_PRUNE_OLDER_THAN_DAYS", raising=False)
        importlib.reload(settings_module)
