"""Tests that kill one surviving mutant each, where no test module of the rule fits.

``make mutate`` (docs/guarantees.md, "Mutation testing") runs the tests listed in
[tool.mutmut]; a test added here needs no change to that list, so
``make mutate MUTATE_RESUME=1`` re-tests the survivors against it without starting
afresh. The answers of a claim and a heartbeat say what the journal holds after them:
a claim of an effect still awaiting approval, within its
deadline, was never asked for (the answer's ``action_for`` then compares the
deadline with no time at all); a heartbeat's returned run was never read (its
``heartbeat_at`` could be anything).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect, reject_effect
from approvals.models import Approval
from runs import sweep as sweep_module
from runs.canonical import args_hash as compute_args_hash
from runs.errors import ClaimConflict, InvalidRequest, NotAllowed, NotFound
from runs.lifecycle import finish_run, heartbeat
from runs.models import AuditEvent, Call, Effect, EffectStatus, EffectVersion, Run
from runs.outcomes import claim_effect
from runs.sweep import sweep
from runs.verdict import restart_verdict, restart_verdicts

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def test_a_claim_of_an_effect_awaiting_approval_within_its_deadline_is_told_to_wait(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, needs_approval=True, approval_ttl=60, now=T0).effect

    effect, action = claim_effect(
        agent, effect.pk, run_id=run.pk, attempt=1, now=T0 + timedelta(seconds=59)
    )

    assert action == "wait"
    assert effect.status == EffectStatus.AWAITING_APPROVAL


def test_a_heartbeat_answers_the_run_as_it_now_stands(agent):
    run = start(agent, heartbeat_timeout=30, now=T0).run
    now = T0 + timedelta(seconds=20)

    answered = heartbeat(agent, run.pk, attempt=1, now=now)

    stored = Run.objects.get(pk=run.pk)
    assert (answered.heartbeat_at, answered.stale_at) == (now, now + timedelta(seconds=30))
    assert (stored.heartbeat_at, stored.stale_at) == (answered.heartbeat_at, answered.stale_at)


# --- Approvals (approvals/decisions.py, approve_effect) -------------------------------
# The tests of approvals read the status an approval leaves; make mutate found the
# rest unread: the version an edit writes, its event, the note, the approval row of
# an operator approving again content they approved before, the refusals' details.


def _awaiting(agent, required=1):
    run = start(agent, now=T0).run
    return send(
        agent, run, needs_approval=True, approvals_required=required, args={"to": "a"}, now=T0
    ).effect


def test_an_approval_with_edits_records_the_new_version_its_event_and_the_note(agent, operator):
    effect = _awaiting(agent)
    seen = effect.args_hash
    edited = {"to": "b"}

    approve_effect(
        operator, effect.pk, args_hash=seen, note="  fixed the address ", edited_args=edited, now=T0
    )

    effect.refresh_from_db()
    new_hash = compute_args_hash(edited)
    assert (effect.status, effect.args, effect.args_hash) == ("approved", edited, new_hash)
    version = EffectVersion.objects.get(effect=effect, number=2)
    assert (version.args, version.args_hash, version.adopted, version.at) == (
        edited,
        new_hash,
        True,
        T0,
    )
    assert version.author == "operator:olivia"
    edit = AuditEvent.objects.get(effect=effect, verb="args_edited")
    assert edit.note == "fixed the address"
    assert edit.data == {"args_hash": new_hash, "previous_args_hash": seen}
    approval = Approval.objects.get(effect=effect)
    assert (approval.args_hash, approval.note, approval.at) == (new_hash, "fixed the address", T0)
    assert effect.decision["note"] == "fixed the address"


def test_an_approval_without_a_note_keeps_none(agent, operator):
    effect = _awaiting(agent)

    approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=T0)

    effect.refresh_from_db()
    assert Approval.objects.get(effect=effect).note == ""
    assert effect.current_approvals[0]["note"] == "" and effect.decision["note"] == ""


def test_edited_arguments_that_are_not_an_object_name_the_field(agent, operator):
    effect = _awaiting(agent)

    with pytest.raises(InvalidRequest) as refused:
        approve_effect(operator, effect.pk, args_hash=effect.args_hash, edited_args=["b"])

    assert refused.value.details == {"fields": {"args": "object"}}
    assert isinstance(refused.value.message, str) and refused.value.message


def test_approving_one_version_twice_is_refused_with_its_status(agent, operator):
    effect = _awaiting(agent, required=2)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=T0)

    with pytest.raises(NotAllowed) as refused:
        approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=T0)

    assert refused.value.details == {"status": "awaiting_approval"}


def test_approving_again_content_approved_in_an_earlier_version_refreshes_that_approval(
    agent, operator, second_operator
):
    """v1 approved by Olivia and Oscar, edited to v2 by Oscar, edited back to v1 and
    approved by Olivia: her approval row of v1's content is the one she gives now,
    and Oscar's stays his."""
    effect = _awaiting(agent, required=3)
    v1 = effect.args_hash
    approve_effect(operator, effect.pk, args_hash=v1, note="first", now=T0)
    approve_effect(second_operator, effect.pk, args_hash=v1, note="oscar's", now=T0)
    later = T0 + timedelta(minutes=5)
    approve_effect(second_operator, effect.pk, args_hash=v1, edited_args={"to": "b"}, now=later)
    v2 = Effect.objects.get(pk=effect.pk).args_hash

    approve_effect(
        operator, effect.pk, args_hash=v2, note="again", edited_args={"to": "a"}, now=later
    )

    effect.refresh_from_db()
    assert effect.args_hash == v1 and effect.status == "awaiting_approval"
    mine = Approval.objects.get(effect=effect, user=operator, args_hash=v1)
    assert (mine.note, mine.at) == ("again", later)
    his = Approval.objects.get(effect=effect, user=second_operator, args_hash=v1)
    assert (his.note, his.at) == ("oscar's", T0)
    assert Approval.objects.get(effect=effect, user=second_operator, args_hash=v2).at == later
    added = AuditEvent.objects.filter(effect=effect, verb="approval_added").order_by("id").last()
    assert added.data == {"approvals": 1, "required": 3}


# --- Whose effect (runs/lifecycle.py lock_effect, runs/outcomes.py) ------------------


def test_an_agent_cannot_claim_another_agents_effect_it_is_not_found(agent, other_agent):
    effect = send(agent, start(agent, now=T0).run, now=T0).effect
    theirs = start(other_agent, now=T0).run

    with pytest.raises(NotFound):
        claim_effect(other_agent, effect.pk, run_id=theirs.pk, attempt=1, now=T0)


def test_a_run_whose_calls_named_other_effects_cannot_claim_this_one(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, key="mail:1", now=T0).effect
    other = start(agent, "job-2", now=T0).run
    send(agent, other, key="mail:2", now=T0)  # it recorded a call, not to this effect

    with pytest.raises(ClaimConflict) as refused:
        claim_effect(agent, effect.pk, run_id=other.pk, attempt=1, now=T0)

    assert refused.value.details == {"status": "in_flight"}


# --- Notes (approvals/decisions.py, _require_note) -------------------------------------


@pytest.mark.parametrize("note", ["", "   ", None])
def test_a_decision_that_needs_a_note_refuses_none_and_names_the_field(agent, operator, note):
    run = start(agent, now=T0).run
    effect = send(agent, run, needs_approval=True, now=T0).effect

    with pytest.raises(InvalidRequest) as refused:
        reject_effect(operator, effect.pk, args_hash=effect.args_hash, note=note, now=T0)

    assert refused.value.details == {"fields": {"note": "required"}}
    assert isinstance(refused.value.message, str) and refused.value.message


# --- The sweep's batch (runs/sweep.py, interrupt_stale_runs) ---------------------------


def test_ordinary_stale_runs_are_interrupted_by_the_batch_not_its_fallback(
    agent, monkeypatch, settings
):
    """The one-run-at-a-time fallback makes the same changes (tests/test_sweep_one_run_
    at_a_time_does_what_the_batch_does.py), so a batch that always failed would pass
    every test that looks at the rows: its dozen statements per run would go unseen."""
    settings.STARTSAFE = {**settings.STARTSAFE, "AUTO_RESTART_CAP": 1}
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda run_id, attempt, **kw: None)
    fallback = []
    monkeypatch.setattr(
        sweep_module, "interrupt_stale_run", lambda *args: fallback.append(args) or False
    )
    runs = [
        start(agent, "with-effect", heartbeat_timeout=5, now=T0).run,
        # An effect without a key that never started (it waits for a person) does not
        # block a keyed run; one that started does.
        start(agent, "unkeyed-awaiting", heartbeat_timeout=5, now=T0).run,
        start(agent, "capped", heartbeat_timeout=5, now=T0).run,
        start(agent, "manual", heartbeat_timeout=5, restart_policy="manual", now=T0).run,
    ]
    send(agent, runs[0], now=T0)
    send(agent, runs[1], key=None, needs_approval=True, now=T0)
    Run.objects.filter(pk=runs[2].pk).update(auto_restarts=1)
    # Not stale, with a started unkeyed effect: not the batch's business.
    send(agent, start(agent, "alive", heartbeat_timeout=60, now=T0).run, key=None, now=T0)

    report = sweep(now=T0 + timedelta(seconds=6))

    assert fallback == [] and report.errors == []
    assert sorted(report.interrupted) == sorted(str(run.pk) for run in runs)
    assert sorted(report.restart_ready) == sorted(str(run.pk) for run in runs[:2])
    assert sorted(report.needs_person) == sorted(str(run.pk) for run in runs[2:])


def test_the_batch_verdict_lists_a_blunt_runs_calls_attempt_by_attempt(agent):
    """Attempt 1's calls 1 and 2, then attempt 2's call 1: not by seq alone."""
    run = start(agent, restart_policy="blunt", now=T0).run
    send(agent, run, key="mail:1", now=T0)
    send(agent, run, key="mail:2", now=T0)
    override = Run.objects.filter(pk=run.pk)
    override.update(override_at=T0, override_note="go on")  # let attempt 2 start
    start(agent, supersede=1, now=T0)
    send(agent, run, attempt=2, key="mail:3", now=T0)
    run.refresh_from_db()

    batch = restart_verdicts([run])[run.pk]

    assert batch.as_dict() == restart_verdict(run).as_dict()
    recorded = Call.objects.filter(run=run)
    in_order = [str(recorded.get(attempt_number=a, seq=n).pk) for a, n in [(1, 1), (1, 2), (2, 1)]]
    assert [item["call_id"] for item in batch.blocking] == in_order


# --- The sweep's loop (runs/sweep.py, sweep) ---------------------------------------------


def test_a_backlog_larger_than_a_batch_is_swept_batch_after_batch(agent, monkeypatch):
    """With batches of one: a finished run with an old stale_at is not listed (it would
    fill the batch and end the loop), and each stale run gets its batch."""
    monkeypatch.setattr(sweep_module, "BATCH", 1)
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda run_id, attempt, **kw: None)
    finished = start(agent, "finished", heartbeat_timeout=1, now=T0).run
    finish_run(agent, finished.pk, attempt=1, outcome="completed", now=T0)
    stale = [
        start(agent, f"stale-{i}", heartbeat_timeout=5, now=T0 + timedelta(seconds=i)).run
        for i in range(2)
    ]

    report = sweep(now=T0 + timedelta(seconds=10))

    assert sorted(report.interrupted) == sorted(str(run.pk) for run in stale)


def test_an_effect_whose_timeout_cannot_be_settled_is_pushed_back(agent, monkeypatch):
    run = start(agent, heartbeat_timeout=3600, now=T0).run
    broken = send(agent, run, key="mail:1", timeout=30, now=T0).effect
    fine = send(agent, run, key="mail:2", timeout=30, now=T0).effect
    real = sweep_module.time_out_effect

    def time_out(effect_id, now, report):
        if str(effect_id) == str(broken.pk):
            raise RuntimeError("a bad row")
        return real(effect_id, now, report)

    monkeypatch.setattr(sweep_module, "time_out_effect", time_out)
    now = T0 + timedelta(seconds=31)

    report = sweep(now=now)

    assert report.timed_out == [str(fine.pk)]
    assert len(report.errors) == 1 and report.errors[0].startswith(f"timeout {broken.pk}: ")
    broken.refresh_from_db()
    assert broken.status == EffectStatus.IN_FLIGHT
    assert broken.timeout_at == now + sweep_module.BROKEN_ROW_DELAY
