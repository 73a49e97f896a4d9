"""An agent's report is recorded in full, or kept for operators; each refusal says why.

The rules of ``runs/outcomes.py`` (api.md, ``/complete``, ``/reconcile``, ``/claim``):
a completion writes its run, attempt, report and note into the audit log; a report
that cannot apply is kept as a ``late_report`` with its run, attempt, the status it
found and its error; the holder's ``done`` after a person or a lookup settled the
effect is kept once per distinct report and effect; a refused request answers its
code, message and details; and a rule refused inside a caller's transaction rolls
back only itself. ``make mutate`` showed each of these unread by the other tests.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lifecycle_helpers import send, start

from approvals.decisions import mark_effect_done
from runs.errors import ClaimConflict, InvalidRequest, NotFound, RunFinished
from runs.lifecycle import finish_run
from runs.models import AuditEvent, Effect, EffectStatus
from runs.outcomes import claim_effect, complete_effect, reconcile_effect

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _unknown(agent, run_key: str = "job-1", key: str = "outlook:message:1"):
    """An effect attempt 1 claimed and left behind when attempt 2 started: ``unknown``."""
    run = start(agent, run_key, now=T0).run
    effect = send(agent, run, key=key, now=T0).effect
    start(agent, run_key, supersede=1, now=T0)
    return run, effect


def _late_reports(effect) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(effect=effect, verb="late_report").order_by("id"))


# --- Each refusal: its class, message and details -----------------------------------


def _complete_a_bad_outcome(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="maybe")


def _complete_after_the_run_finished(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    finish_run(agent, run.pk, attempt=1, outcome="completed")  # the effect becomes unknown
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")


def _complete_from_an_attempt_without_the_claim(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=2, outcome="done")


def _reconcile_a_bad_outcome(agent):
    run, effect = _unknown(agent)
    reconcile_effect(agent, effect.pk, run_id=run.pk, attempt=2, outcome="maybe", evidence="x")


def _reconcile_without_evidence(agent):
    run, effect = _unknown(agent)
    reconcile_effect(agent, effect.pk, run_id=run.pk, attempt=2, outcome="done", evidence="")


def _reconcile_an_effect_in_flight(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    reconcile_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", evidence="x")


def _claim_from_a_run_that_never_called_it(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    stranger = start(agent, "job-2").run
    claim_effect(agent, effect.pk, run_id=stranger.pk, attempt=1)


REFUSALS = [
    (
        _complete_a_bad_outcome,
        InvalidRequest,
        "outcome must be done or failed.",
        {"fields": {"outcome": "maybe"}},
    ),
    (
        _complete_after_the_run_finished,
        RunFinished,
        "The run is completed; the report is kept in the audit log.",
        {"status": "unknown"},
    ),
    (
        _complete_from_an_attempt_without_the_claim,
        ClaimConflict,
        "This attempt does not hold the effect now; the report is kept for operators.",
        {"status": "in_flight"},
    ),
    (
        _reconcile_a_bad_outcome,
        InvalidRequest,
        "outcome must be done or not_done.",
        {"fields": {"outcome": "maybe"}},
    ),
    (
        _reconcile_without_evidence,
        InvalidRequest,
        "evidence is required.",
        {"fields": {"evidence": "required"}},
    ),
    (
        _reconcile_an_effect_in_flight,
        ClaimConflict,
        "Only an effect whose outcome is unknown can be reconciled.",
        {"status": "in_flight"},
    ),
    (
        _claim_from_a_run_that_never_called_it,
        ClaimConflict,
        "This run never recorded a call to the effect.",
        {"status": "in_flight"},
    ),
]


@pytest.mark.parametrize(
    ("refused", "error", "message", "details"), REFUSALS, ids=[r[0].__name__ for r in REFUSALS]
)
def test_each_refusal_says_why_with_its_code_message_and_details(
    agent, refused, error, message, details
):
    with pytest.raises(error) as caught:
        refused(agent)

    assert type(caught.value) is error
    assert (caught.value.message, caught.value.details) == (message, details)


# --- A completion, recorded in full ----------------------------------------------


def test_a_completion_is_audited_with_its_run_attempt_report_and_no_note(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, now=T0).effect

    complete_effect(
        agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "m1"}, now=T0
    )

    effect.refresh_from_db()
    assert (effect.status, effect.result, effect.error) == ("done", {"id": "m1"}, None)
    completed = AuditEvent.objects.get(effect=effect, verb="completed")
    assert (completed.run_id, completed.attempt_number) == (run.pk, 1)
    assert (completed.old_status, completed.new_status, completed.note) == (
        "in_flight",
        "done",
        "",
    )
    assert completed.data == {
        "outcome": "done",
        "result": {"id": "m1"},
        "error": None,
        "attempt": 1,
    }


def test_a_failure_without_an_error_is_recorded_as_failed_with_no_note(agent):
    run = start(agent).run
    effect = send(agent, run).effect

    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed")

    effect.refresh_from_db()
    assert (effect.status, effect.error) == ("failed", "failed")
    completed = AuditEvent.objects.get(effect=effect, verb="completed")
    assert completed.note == ""
    assert completed.data == {"outcome": "failed", "result": None, "error": None, "attempt": 1}


def test_a_late_failure_is_recorded_with_its_error_as_the_note(agent):
    run, effect = _unknown(agent)

    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed", error="smtp 550")

    effect.refresh_from_db()
    assert (effect.status, effect.error) == ("failed", "smtp 550")
    late = AuditEvent.objects.get(effect=effect, verb="completed_late")
    assert (late.run_id, late.attempt_number, late.note) == (run.pk, 1, "smtp 550")
    assert (late.old_status, late.new_status) == ("unknown", "failed")


# --- A report that cannot apply, kept for operators ---------------------------------


@pytest.mark.parametrize(("error", "note"), [("smtp 550", "smtp 550"), (None, "")])
def test_a_refused_report_is_kept_with_its_run_attempt_status_and_error(agent, error, note):
    run = start(agent, now=T0).run
    effect = send(agent, run, now=T0).effect

    with pytest.raises(ClaimConflict):
        complete_effect(
            agent, effect.pk, run_id=run.pk, attempt=2, outcome="failed", error=error, now=T0
        )

    [late] = _late_reports(effect)
    assert (late.run_id, late.attempt_number, late.at) == (run.pk, 2, T0)
    # It changed nothing: the status it found, on both sides.
    assert (late.old_status, late.new_status) == ("in_flight", "in_flight")
    assert late.note == note
    assert late.data == {"outcome": "failed", "result": None, "error": error, "attempt": 2}


# --- The holder's done after someone else settled the effect -----------------------


def test_a_done_report_after_the_tools_lookup_settled_it_is_kept_with_its_run_and_attempt(agent):
    run, effect = _unknown(agent)
    reconcile_effect(
        agent, effect.pk, run_id=run.pk, attempt=2, outcome="done", evidence="sent items"
    )

    again = complete_effect(
        agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "m1"}
    )

    assert again.status == EffectStatus.DONE
    [late] = _late_reports(effect)
    assert (late.run_id, late.attempt_number) == (run.pk, 1)
    assert (late.old_status, late.new_status) == ("done", "done")
    assert late.data == {"outcome": "done", "result": {"id": "m1"}, "error": None, "attempt": 1}


def test_the_same_report_on_two_settled_effects_is_kept_for_each(agent, operator):
    run = start(agent, now=T0).run
    mine = send(agent, run, key="m:0", now=T0).effect
    complete_effect(agent, mine.pk, run_id=run.pk, attempt=1, outcome="done")
    first = send(agent, run, key="m:1", now=T0).effect
    second = send(agent, run, key="m:2", now=T0).effect
    start(agent, supersede=1, now=T0)
    for effect in (first, second):
        effect.refresh_from_db()
        mark_effect_done(operator, effect.pk, args_hash=effect.args_hash, note="saw it sent")

    for effect in (first, second, mine):
        complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")

    # Each effect's own log decides: not the report kept for the other, nor the
    # completion of a third effect (``mine``, whose repeat is a plain retry).
    assert [len(_late_reports(e)) for e in (first, second, mine)] == [1, 1, 0]


def test_a_done_report_after_a_person_marked_its_failure_done_is_kept(agent, operator):
    run = start(agent).run
    effect = send(agent, run).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed", error="5xx")
    effect.refresh_from_db()
    mark_effect_done(operator, effect.pk, args_hash=effect.args_hash, note="it went out")

    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "m"})

    # The agent's own failure did not make it done: the person did.
    assert [e.data["result"] for e in _late_reports(effect)] == [{"id": "m"}]


def test_a_retried_late_completion_is_no_late_report(agent):
    run, effect = _unknown(agent)

    for _ in range(2):
        complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")

    effect.refresh_from_db()
    assert effect.status == EffectStatus.DONE
    assert _late_reports(effect) == []


def test_a_second_different_report_after_a_settlement_is_kept_too(agent, operator):
    run, effect = _unknown(agent)
    effect.refresh_from_db()
    mark_effect_done(operator, effect.pk, args_hash=effect.args_hash, note="saw it sent")

    for result in ({"id": "m1"}, {"id": "m1"}, {"id": "m2"}):
        complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result=result)

    # The retry of the first is not news; the second result is.
    assert [e.data["result"] for e in _late_reports(effect)] == [{"id": "m1"}, {"id": "m2"}]


def test_a_retried_completion_after_an_earlier_lookup_released_the_effect_is_no_late_report(
    agent,
):
    """A lookup said not_done and released the effect; the next attempt claimed it and
    completed it itself. Its retried report is a plain retry, not a report about an
    effect someone else settled (the console would show it as a late report)."""
    run, effect = _unknown(agent)
    reconcile_effect(
        agent, effect.pk, run_id=run.pk, attempt=2, outcome="not_done", evidence="not sent"
    )
    claim_effect(agent, effect.pk, run_id=run.pk, attempt=2)

    for _ in range(2):  # the client retries a report whose answer it lost
        complete_effect(
            agent, effect.pk, run_id=run.pk, attempt=2, outcome="done", result={"id": "m3"}
        )

    effect.refresh_from_db()
    assert (effect.status, effect.result) == ("done", {"id": "m3"})
    assert _late_reports(effect) == []


# --- A refused rule inside a caller's transaction ----------------------------------


def test_a_refused_completion_inside_a_callers_transaction_lets_the_caller_carry_on(
    agent, other_agent
):
    """The default ``savepoint=True`` (runs/lifecycle.py's docstring): the test runs
    inside a transaction, as the console does, and goes on querying after the refusal."""
    run = start(agent).run
    theirs = send(other_agent, start(other_agent).run).effect

    with pytest.raises(NotFound):
        complete_effect(agent, theirs.pk, run_id=run.pk, attempt=1, outcome="done")

    # Without the savepoint the refusal would have doomed the caller's transaction.
    assert Effect.objects.get(pk=theirs.pk).status == EffectStatus.IN_FLIGHT
