"""The operators and admins groups exist after migrate, each carrying its whole role."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from approvals.decisions import can_decide

pytestmark = pytest.mark.django_db


def _codenames(name):
    return set(Group.objects.get(name=name).permissions.values_list("codename", flat=True))


def test_the_operators_group_may_decide_and_read_the_journal():
    perms = _codenames("operators")

    assert {"decide", "view_run", "view_effect", "view_attempt", "view_call"} <= perms
    assert "view_auditevent" not in perms
    assert "change_agent" not in perms


def test_the_admins_group_also_manages_agents_and_reads_the_history():
    perms = _codenames("admins")

    assert _codenames("operators") <= perms
    assert {"view_history", "view_auditevent", "view_agent", "add_agent", "change_agent"} <= perms


def test_group_membership_alone_decides_who_may_decide(operator, admin_user, viewer, outsider):
    # admins carry the operators' permissions too (a superset), so both decide.
    assert can_decide(operator) is True
    assert can_decide(admin_user) is True
    assert can_decide(viewer) is False
    assert can_decide(outsider) is False
    assert not operator.is_staff and not admin_user.is_staff
