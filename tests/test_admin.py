"""The Django admin, opened to the role groups without is_staff (startsafe/admin_site.py)."""

from __future__ import annotations

import pytest
from lifecycle_helpers import start

pytestmark = pytest.mark.django_db


def _login(client, user):
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": user.username, "password": "pw-" + user.username},
    )
    return response


def test_an_admin_in_the_group_signs_in_to_the_admin_and_sees_agents(client, admin_user, agent):
    response = _login(client, admin_user)

    assert response.status_code == 302
    page = client.get("/admin/runs/agent/")
    assert page.status_code == 200
    assert agent.name in page.content.decode()
    # An admin may add agents (the token is shown once, on creation).
    assert client.get("/admin/runs/agent/add/").status_code == 200


def test_an_operator_sees_runs_read_only_and_no_agents(client, operator, agent):
    run = start(agent, "ticket-7").run
    assert _login(client, operator).status_code == 302

    listing = client.get("/admin/runs/run/")
    assert listing.status_code == 200
    assert "ticket-7" in listing.content.decode()
    detail = client.get(f"/admin/runs/run/{run.pk}/change/")
    assert detail.status_code == 200
    # Read-only: no save button, and a POST changes nothing.
    assert 'name="_save"' not in detail.content.decode()
    assert client.post(f"/admin/runs/run/{run.pk}/change/", {"status": "failed"}).status_code == 403
    run.refresh_from_db()
    assert run.status == "running"
    assert client.get("/admin/runs/agent/").status_code == 403


def test_a_signed_in_user_without_a_role_cannot_sign_in_to_the_admin(client, viewer):
    response = _login(client, viewer)

    assert response.status_code == 200  # the form again, with an error
    assert client.get("/admin/").status_code == 302


def test_a_deactivated_account_cannot_sign_in_to_the_admin(client, outsider):
    _login(client, outsider)

    assert client.get("/admin/").status_code == 302
