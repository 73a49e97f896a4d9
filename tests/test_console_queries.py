"""Query budgets: the console's pages cost the same with 200 runs as with 2."""

from __future__ import annotations

import pytest

from approvals.views_common import needs_decision_runs
from runs.calls import record_call
from runs.models import Effect, Run
from tests.console_helpers import awaiting_campaign, failed_unkeyed_run, unknown_effect

pytestmark = pytest.mark.django_db


@pytest.fixture
def many_runs(agent):
    """200 runs: awaiting campaigns, failed runs with a blocking verdict, unknown effects."""
    for i in range(80):
        awaiting_campaign(agent, f"camp-{i}")
    for i in range(60):
        failed_unkeyed_run(agent, f"refund-{i}")
    for i in range(60):
        unknown_effect(agent, f"reply-{i}")
    assert Run.objects.count() == 200


def test_the_queue_makes_a_constant_number_of_queries(
    client, operator, many_runs, django_assert_max_num_queries
):
    client.force_login(operator)
    # session, user, 2 permission lookups, the queue's sets (once: fingerprint and
    # nav counts), awaiting, stopped runs, their reasons (blunt calls, keyed
    # unkeyed-effects, unknown notes), unknown effects
    with django_assert_max_num_queries(11):
        response = client.get("/")
    assert response.status_code == 200
    # Each section capped (QUEUE_LIMITS): 25 nearest deadlines, 15 stopped runs, 15 unknown.
    html = response.content.decode()
    assert html.count('class="item"') == 25 + 15 + 15
    assert "Showing the 25 nearest deadlines of 80." in html
    assert 'href="/?more=1"' in html


def test_show_more_lists_every_row_up_to_its_cap_at_the_same_query_count(
    client, operator, many_runs, django_assert_max_num_queries
):
    client.force_login(operator)
    stopped = needs_decision_runs().count()
    unknown = Effect.objects.filter(status="unknown").count()
    assert stopped > 15 and unknown > 15
    with django_assert_max_num_queries(16):
        response = client.get("/?more=1")
    html = response.content.decode()
    assert html.count('class="item"') == 80 + min(stopped, 200) + min(unknown, 200)
    # The refresh keeps the long list, and the way back is offered.
    assert "&amp;more=1" in html and 'href="/">Show fewer</a>' in html


def test_an_unchanged_queue_poll_costs_the_fingerprint_only(
    client, operator, many_runs, django_assert_max_num_queries
):
    client.force_login(operator)
    html = client.get("/").content.decode()
    fingerprint = html.split("?fp=")[1].split('"')[0]
    # session, user, fingerprint (2)
    with django_assert_max_num_queries(4):
        response = client.get(f"/?fp={fingerprint}", headers={"HX-Request": "true"})
    assert response.status_code == 204


def test_the_runs_page_makes_a_constant_number_of_queries(
    client, operator, many_runs, django_assert_max_num_queries
):
    client.force_login(operator)
    # session, user, perms (2), nav (2), count, page, agents
    with django_assert_max_num_queries(12):
        assert client.get("/runs/").status_code == 200
    with django_assert_max_num_queries(12):
        assert client.get("/runs/?verdict=blocked&page=2").status_code == 200


def test_the_run_page_makes_a_constant_number_of_queries(
    client, operator, agent, django_assert_max_num_queries
):
    run = failed_unkeyed_run(agent, "big")
    small = failed_unkeyed_run(agent, "small")
    Run.objects.filter(pk=run.pk).update(status="running")
    for i in range(200):
        record_call(agent, run.pk, attempt=1, tool="read", kind="read", args={"i": i})
    client.force_login(operator)

    def count(run_id):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as ctx:
            assert client.get(f"/runs/{run_id}/").status_code == 200
        return len(ctx)

    assert count(run.pk) == count(small.pk)
    # session, user, perms, nav (2), run, calls, attempts, events, verdict (<= 3)
    with django_assert_max_num_queries(16):
        client.get(f"/runs/{run.pk}/")


def test_the_effect_page_makes_a_constant_number_of_queries(
    client, operator, agent, many_runs, django_assert_max_num_queries
):
    effect = Effect.objects.filter(status="awaiting_approval").first()
    client.force_login(operator)
    # session, user, perms (2), nav (2), effect, versions, approvals, events, calls
    with django_assert_max_num_queries(12):
        assert client.get(f"/effects/{effect.pk}/").status_code == 200


def test_the_history_makes_a_constant_number_of_queries(
    client, admin_user, many_runs, django_assert_max_num_queries
):
    client.force_login(admin_user)
    with django_assert_max_num_queries(14):
        assert client.get("/history/").status_code == 200
