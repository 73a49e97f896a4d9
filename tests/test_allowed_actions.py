"""What an operator may do with an effect or a run (``decisions.allowed_actions``):
what the console shows (tests/test_console_pages.py) and what the rules take, which agree."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import effect_in, send, start

from approvals.decisions import (
    allowed_actions,
    allowed_run_actions,
    approve_effect,
    mark_effect_done,
    reject_effect,
    release_effect,
)
from runs.errors import NotAllowed
from runs.lifecycle import finish_run
from runs.models import RunStatus

pytestmark = pytest.mark.django_db

# product.md's table ("Which action is allowed from which status"), restated here on
# purpose: the test holds the one function to the contract.
EXPECTED = {
    "awaiting_approval": {"approve", "edit", "reject", "mark_done"},
    "approved": {"reject", "mark_done"},
    "unknown": {"release", "mark_done", "reject"},
    "failed": {"mark_done"},
    "in_flight": set(),
    "pending": set(),
    "done": set(),
    "rejected": set(),
    "expired": set(),
}


@pytest.mark.parametrize("status", sorted(EXPECTED))
def test_an_operator_may_take_the_actions_the_status_allows(agent, operator, status):
    effect = effect_in(agent, operator, status)

    assert allowed_actions(effect, operator, timezone.now()) == EXPECTED[status]


@pytest.mark.parametrize("status", ["awaiting_approval", "unknown"])
def test_a_viewer_may_take_none(agent, operator, viewer, status):
    effect = effect_in(agent, operator, status)

    assert allowed_actions(effect, viewer, timezone.now()) == set()


def test_past_its_deadline_an_awaiting_effect_allows_nothing(agent, operator):
    effect = effect_in(agent, operator, "awaiting_approval")

    deadline = effect.approval_expires_at
    assert allowed_actions(effect, operator, deadline - timedelta(seconds=1))
    assert allowed_actions(effect, operator, deadline) == set()


def test_who_approved_this_version_may_edit_it_but_not_approve_it_again(
    agent, operator, second_operator
):
    run = start(agent).run
    effect = send(agent, run, needs_approval=True, approvals_required=2).effect
    effect = approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    now = timezone.now()

    assert allowed_actions(effect, operator, now) == {"edit", "reject", "mark_done"}
    assert allowed_actions(effect, second_operator, now) == EXPECTED["awaiting_approval"]


@pytest.mark.parametrize("status", sorted(EXPECTED))
@pytest.mark.parametrize("action", ["approve", "reject", "mark_done", "release"])
def test_the_rules_take_exactly_the_allowed_actions(agent, operator, status, action):
    # The buttons and the rules agree: a shown action is taken, a hidden one is 409.
    effect = effect_in(agent, operator, status)
    allowed = action in allowed_actions(effect, operator, timezone.now())
    decide = {
        "approve": approve_effect,
        "reject": reject_effect,
        "mark_done": mark_effect_done,
        "release": release_effect,
    }[action]
    note = {} if action == "approve" else {"note": "checked"}

    try:
        decide(operator, effect.pk, args_hash=effect.args_hash, **note)
        taken = True
    except NotAllowed:
        taken = False

    assert taken == allowed


def test_run_actions_are_for_operators_while_the_run_is_stopped(agent, operator, viewer):
    run = start(agent).run
    assert allowed_run_actions(run, operator) == set()
    finish_run(agent, run.pk, attempt=1, outcome="failed")
    run.refresh_from_db()

    assert allowed_run_actions(run, operator) == {"allow_restart", "abandon"}
    assert allowed_run_actions(run, viewer) == set()
    run.status = RunStatus.ABANDONED
    assert allowed_run_actions(run, operator) == set()
