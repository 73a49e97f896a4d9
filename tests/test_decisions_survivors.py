"""What each refusal of a person's decision says (approvals/decisions.py).

The rules held here:

- every refusal of approve, edit, reject, mark done, release, allow restart and
  abandon is the contract's error class with a clear message and the details the
  console and the API show (product.md: errors must be clear; api.md, errors): one
  table, one row per refusal, checked in the console's order (request, permission,
  row, deadline, status, hash);
- a refusal changes nothing: no decision, no audit event, no approval row.

``make mutate`` let through changes to these messages (a missing run named in
lower case, or with no message at all) because the tests read only the class and
the details.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from lifecycle_helpers import send, start

from approvals.decisions import (
    abandon_run,
    allow_restart,
    approve_effect,
    mark_effect_done,
    reject_effect,
    release_effect,
)
from approvals.models import Approval
from runs.errors import Forbidden, InvalidRequest, NotAllowed, NotFound, StaleArgs
from runs.lifecycle import finish_run
from runs.models import AuditEvent, Effect, EffectVersion

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=1)


def _awaiting(agent, **kwargs) -> Effect:
    run = start(agent, now=T0).run
    return send(agent, run, needs_approval=True, now=T0, **kwargs).effect


# Each row: what is refused, then a function of (agent, operator, viewer) that sets the
# scene and returns the refused call and the details it must carry.


def _viewer_approves(agent, operator, viewer):
    effect = _awaiting(agent)
    return lambda: approve_effect(viewer, effect.pk, args_hash=effect.args_hash, now=T0), {}


def _viewer_allows_a_restart(agent, operator, viewer):
    run = start(agent, now=T0).run
    finish_run(agent, run.pk, attempt=1, outcome="failed", now=T0)
    return lambda: allow_restart(viewer, run.pk, note="go", now=LATER), {}


def _reject_without_a_note(agent, operator, viewer):
    effect = _awaiting(agent)
    details = {"fields": {"note": "required"}}
    return lambda: reject_effect(
        operator, effect.pk, args_hash=effect.args_hash, note=" ", now=T0
    ), details


def _abandon_without_a_note(agent, operator, viewer):
    run = start(agent, now=T0).run
    finish_run(agent, run.pk, attempt=1, outcome="failed", now=T0)
    details = {"fields": {"note": "required"}}
    return lambda: abandon_run(operator, run.pk, note="", now=LATER), details


def _approve_without_a_hash(agent, operator, viewer):
    effect = _awaiting(agent)
    details = {"fields": {"args_hash": "required"}}
    return lambda: approve_effect(operator, effect.pk, args_hash="", now=T0), details


def _edit_to_a_list(agent, operator, viewer):
    effect = _awaiting(agent)
    details = {"fields": {"args": "object"}}
    return lambda: approve_effect(
        operator, effect.pk, args_hash=effect.args_hash, edited_args=["x"], now=T0
    ), details


def _approve_a_missing_effect(agent, operator, viewer):
    return lambda: approve_effect(operator, uuid.uuid4(), args_hash="x", now=T0), {}


def _allow_restart_of_a_missing_run(agent, operator, viewer):
    return lambda: allow_restart(operator, uuid.uuid4(), note="go", now=T0), {}


def _abandon_a_missing_run(agent, operator, viewer):
    return lambda: abandon_run(operator, uuid.uuid4(), note="go", now=T0), {}


def _approve_past_the_deadline(agent, operator, viewer):
    effect = _awaiting(agent, approval_ttl=60)
    late = T0 + timedelta(seconds=60)
    return lambda: approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=late), {
        "status": "expired"
    }


def _release_an_awaiting_effect(agent, operator, viewer):
    effect = _awaiting(agent)
    return lambda: release_effect(
        operator, effect.pk, args_hash=effect.args_hash, note="x", now=T0
    ), {"status": "awaiting_approval"}


def _mark_done_an_effect_in_flight(agent, operator, viewer):
    effect = send(agent, start(agent, now=T0).run, now=T0).effect
    return lambda: mark_effect_done(
        operator, effect.pk, args_hash=effect.args_hash, note="x", now=T0
    ), {"status": "in_flight"}


def _approve_a_stale_hash(agent, operator, viewer):
    run = start(agent, now=T0).run
    seen = send(agent, run, needs_approval=True, args={"v": 1}, now=T0).effect
    current = send(agent, run, needs_approval=True, args={"v": 2}, now=T0).effect
    assert current.args_hash != seen.args_hash
    details = {"status": "awaiting_approval", "args_hash": current.args_hash}
    return lambda: approve_effect(operator, seen.pk, args_hash=seen.args_hash, now=T0), details


def _approve_one_version_twice(agent, operator, viewer):
    effect = _awaiting(agent, approvals_required=2)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=T0)
    return lambda: approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=LATER), {
        "status": "awaiting_approval"
    }


def _allow_restart_of_a_running_run(agent, operator, viewer):
    run = start(agent, now=T0).run
    return lambda: allow_restart(operator, run.pk, note="go", now=T0), {"status": "running"}


def _abandon_an_abandoned_run(agent, operator, viewer):
    run = start(agent, now=T0).run
    finish_run(agent, run.pk, attempt=1, outcome="failed", now=T0)
    abandon_run(operator, run.pk, note="given up", now=T0)
    return lambda: abandon_run(operator, run.pk, note="again", now=LATER), {"status": "abandoned"}


REFUSALS = [
    (_viewer_approves, Forbidden, "You may not decide: this needs the operator role."),
    (_viewer_allows_a_restart, Forbidden, "You may not decide: this needs the operator role."),
    (_reject_without_a_note, InvalidRequest, "A note is required for this decision."),
    (_abandon_without_a_note, InvalidRequest, "A note is required for this decision."),
    (_approve_without_a_hash, InvalidRequest, "args_hash is required."),
    (_edit_to_a_list, InvalidRequest, "The edited arguments must be a JSON object."),
    (_approve_a_missing_effect, NotFound, "No such effect."),
    (_allow_restart_of_a_missing_run, NotFound, "No such run."),
    (_abandon_a_missing_run, NotFound, "No such run."),
    (
        _approve_past_the_deadline,
        NotAllowed,
        "The approval deadline passed: the effect expired.",
    ),
    (
        _release_an_awaiting_effect,
        NotAllowed,
        "This action is not allowed while the effect is awaiting_approval.",
    ),
    (
        _mark_done_an_effect_in_flight,
        NotAllowed,
        "This action is not allowed while the effect is in_flight.",
    ),
    (
        _approve_a_stale_hash,
        StaleArgs,
        "The arguments changed since you saw them: review the new content.",
    ),
    (_approve_one_version_twice, NotAllowed, "You already approved this version."),
    (
        _allow_restart_of_a_running_run,
        NotAllowed,
        "This action is not allowed while the run is running.",
    ),
    (
        _abandon_an_abandoned_run,
        NotAllowed,
        "This action is not allowed while the run is abandoned.",
    ),
]


@pytest.mark.parametrize(
    ("scene", "error", "message"), REFUSALS, ids=[s.__name__.strip("_") for s, *_ in REFUSALS]
)
def test_each_refused_decision_says_why_with_its_code_message_and_details(
    agent, operator, viewer, scene, error, message
):
    refused_call, details = scene(agent, operator, viewer)
    events = AuditEvent.objects.count()
    approvals = Approval.objects.count()

    with pytest.raises(error) as refused:
        refused_call()

    assert type(refused.value) is error
    assert (refused.value.message, str(refused.value)) == (message, message)
    assert refused.value.details == details
    # A refusal writes nothing, but the expiry it found: that is a fact of its own.
    expired = 1 if error is NotAllowed and details == {"status": "expired"} else 0
    assert AuditEvent.objects.count() == events + expired
    assert Approval.objects.count() == approvals


# --- What an approval records (api.md, Effect: "approvals" and "decision") -------------


def test_an_approval_that_decides_records_the_approval_the_decision_and_the_event_in_full(
    agent, operator
):
    effect = _awaiting(agent)

    approve_effect(operator, effect.pk, args_hash=effect.args_hash, note=" looks right ", now=LATER)

    effect.refresh_from_db()
    mine = {"by": "olivia", "at": LATER.isoformat(), "note": "looks right"}
    assert effect.current_approvals == [{**mine, "args_hash": effect.args_hash}]
    assert effect.decision == {
        **mine,
        "verb": "approved",
        "args_hash": effect.args_hash,
        "final": False,
    }
    event = AuditEvent.objects.get(effect=effect, verb="approved")
    assert (event.actor, event.at, event.note, event.data) == ("olivia", LATER, "looks right", {})
    assert (event.old_status, event.new_status) == ("awaiting_approval", "approved")


def test_an_approval_short_of_the_count_is_audited_with_its_note_and_the_count(agent, operator):
    effect = _awaiting(agent, approvals_required=2)

    approve_effect(operator, effect.pk, args_hash=effect.args_hash, note="one of two", now=LATER)

    effect.refresh_from_db()
    assert effect.status == "awaiting_approval" and effect.decision is None
    assert effect.current_approvals == [
        {
            "by": "olivia",
            "at": LATER.isoformat(),
            "note": "one of two",
            "args_hash": effect.args_hash,
        }
    ]
    added = AuditEvent.objects.get(effect=effect, verb="approval_added")
    assert (added.actor, added.at, added.note) == ("olivia", LATER, "one of two")
    assert added.data == {"approvals": 1, "required": 2}
    assert (added.old_status, added.new_status) == ("awaiting_approval", "awaiting_approval")


def test_an_edit_to_the_arguments_already_there_is_a_plain_approval(agent, operator):
    effect = _awaiting(agent, args={"to": "a"})

    approve_effect(
        operator, effect.pk, args_hash=effect.args_hash, edited_args={"to": "a"}, now=LATER
    )

    effect.refresh_from_db()
    assert (effect.status, effect.args_versions, effect.args) == ("approved", 1, {"to": "a"})
    assert not AuditEvent.objects.filter(effect=effect, verb="args_edited").exists()
    assert list(EffectVersion.objects.filter(effect=effect).values_list("number", flat=True)) == [1]


def test_approving_earlier_content_again_refreshes_only_that_approval_row(
    agent, operator, second_operator
):
    """Olivia approved v1, then v2 (Oscar's edit), then edits back to v1's content and
    approves: only her row of this effect for v1's hash is refreshed, not her approval
    of v2, nor her approval of another effect with the same arguments."""
    run = start(agent, now=T0).run
    other = send(agent, run, key="mail:other", needs_approval=True, args={"to": "a"}, now=T0).effect
    approve_effect(operator, other.pk, args_hash=other.args_hash, note="the other", now=T0)
    effect = send(
        agent,
        run,
        key="mail:1",
        needs_approval=True,
        approvals_required=3,
        args={"to": "a"},
        now=T0,
    ).effect
    v1 = effect.args_hash
    assert v1 == other.args_hash
    approve_effect(operator, effect.pk, args_hash=v1, note="v1 ok", now=T0)
    approve_effect(second_operator, effect.pk, args_hash=v1, edited_args={"to": "b"}, now=T0)
    v2 = Effect.objects.get(pk=effect.pk).args_hash
    approve_effect(operator, effect.pk, args_hash=v2, note="v2 ok", now=T0)

    approve_effect(
        operator, effect.pk, args_hash=v2, note="back", edited_args={"to": "a"}, now=LATER
    )

    rows = {
        (a.effect_id, a.args_hash): (a.note, a.at) for a in Approval.objects.filter(user=operator)
    }
    assert rows == {
        (other.pk, v1): ("the other", T0),
        (effect.pk, v2): ("v2 ok", T0),
        (effect.pk, v1): ("back", LATER),
    }
