"""The insights page (/insights/, approvals/insights.py): each figure against values
worked out by hand on a journal made through the product's own rules, the period
filter, who may see it, and a query count that does not grow with the data."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect, reject_effect
from approvals.escalation import escalate
from approvals.insights import Period, _percentile, decision_figures, insights
from runs.models import Call, Tool, ToolPolicy
from runs.outcomes import complete_effect
from runs.registry import declare_tools

pytestmark = pytest.mark.django_db

MIN = timedelta(minutes=1)
URL = "/insights/"


def _ask(agent, run, key, *, tool="send_email", ttl=3600, now):
    return send(
        agent, run, tool=tool, key=key, needs_approval=True, approval_ttl=ttl, now=now
    ).effect


def _drift_hold(agent, tool="refund", run_key="drift"):
    """A restarted attempt's new key after a done effect: held for key drift (at the
    real clock: start_run's restart takes none)."""
    run = start(agent, run_key).run
    first = send(agent, run, tool=tool, key=f"{run_key}:a", key_source="content")
    complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={})
    attempt = start(agent, run_key, supersede=1).attempt.number
    held = send(agent, run, attempt=attempt, tool=tool, key=f"{run_key}:b", key_source="content")
    assert held.action == "wait" and held.effect.hold["reason"] == "key_drift"
    return held.effect


@pytest.fixture
def journal(agent, operator, second_operator):
    """send_email: three asked (decided after 10, 50 and 20 minutes: approve, reject,
    approve; the last rejected again once approved), e2 revised, asking again and
    approved 3 minutes later; one escalated; waits on an awaiting effect and a skip
    of a done one (duplicates). refund: one expired, one held for drift. pay: held
    by its policy. wire: rejected by the system at its deadline (its policy's
    ``on_expiry``). And one decision 40 days before, outside every period below."""
    t0 = timezone.now() - timedelta(hours=2)
    run = start(agent, "job", heartbeat_timeout=86_400, now=t0 - timedelta(days=41)).run

    old = _ask(agent, run, "old", now=t0 - timedelta(days=40))
    approve_effect(operator, old.pk, args_hash=old.args_hash, now=t0 - timedelta(days=40) + MIN)

    e1 = _ask(agent, run, "k1", now=t0)
    e2 = _ask(agent, run, "k2", now=t0)
    e3 = _ask(agent, run, "k3", now=t0)
    replay = send(agent, run, tool="send_email", key="k1", needs_approval=True, now=t0 + 5 * MIN)
    assert replay.action == "wait"
    approve_effect(operator, e1.pk, args_hash=e1.args_hash, now=t0 + 10 * MIN)
    approve_effect(operator, e3.pk, args_hash=e3.args_hash, now=t0 + 20 * MIN)
    assert escalate(e2.pk, t0 + 31 * MIN)  # half way to its one-hour deadline
    reject_effect(second_operator, e2.pk, args_hash=e2.args_hash, note="no", now=t0 + 50 * MIN)

    done = send(agent, run, tool="send_email", key="k5", now=t0).effect
    complete_effect(agent, done.pk, run_id=run.pk, attempt=1, outcome="done", result={}, now=t0)
    assert send(agent, run, tool="send_email", key="k5", now=t0 + 60 * MIN).action == "skip"

    e4 = _ask(agent, run, "r1", tool="refund", ttl=600, now=t0)
    late = send(agent, run, tool="refund", key="r1", needs_approval=True, now=t0 + 11 * MIN)
    assert late.effect.status == "expired"  # the replay past the deadline records it
    # Revised after the rejection, e2 asks again; approved 3 minutes after that.
    revised = send(agent, run, tool="send_email", key="k2", args={"subject": "Better"},
                   needs_approval=True, now=t0 + 55 * MIN)  # fmt: skip
    assert revised.effect.status == "awaiting_approval"
    approve_effect(operator, e2.pk, args_hash=revised.effect.args_hash, now=t0 + 58 * MIN)
    # pay's policy requires approval: a hold, but not for drift.
    declare_tools(agent, [{"name": "pay", "kind": "effect"}])
    rule = {"id": "all", "pointer": "/amount", "op": ">", "value": 0, "action": "require"}
    pay = Tool.objects.get(agent=agent, name="pay")
    ToolPolicy.objects.create(tool=pay, rules=[rule], updated_at=t0)
    held = send(agent, run, tool="pay", key="p1", args={"amount": 5}, now=t0).effect
    assert held.hold["reason"] == "policy_rule"
    # A rejection after the approval is no decision of an awaiting effect.
    reject_effect(second_operator, e3.pk, args_hash=e3.args_hash, note="late", now=t0 + 25 * MIN)
    # wire's policy rejects at the deadline: the system's rejection is an expiry.
    declare_tools(agent, [{"name": "wire", "kind": "effect"}])
    wire = Tool.objects.get(agent=agent, name="wire")
    ToolPolicy.objects.create(tool=wire, on_expiry="reject", updated_at=t0)
    _ask(agent, run, "w1", tool="wire", ttl=600, now=t0)
    late = send(agent, run, tool="wire", key="w1", needs_approval=True, now=t0 + 11 * MIN)
    assert late.effect.status == "rejected" and late.effect.decision["by"] == "system"
    _drift_hold(agent)
    return {"t0": t0, "e4": e4, "period": Period(t0 - timedelta(days=1), timezone.now() + MIN)}


def _by_name(rows):
    return {row["name"]: row for row in rows}


def test_the_figures_per_tool_are_the_hand_computed_ones(journal):
    tools = _by_name(insights(journal["period"])["tools"])

    send_email, refund = tools["send_email"], tools["refund"]
    assert {k: send_email[k] for k in ("asked", "decided", "approved", "expired")} == {
        "asked": 4,  # e2 twice; not the escalation (awaiting → awaiting) nor the old one
        "decided": 4,
        "approved": 3,
        "expired": 0,
    }
    assert send_email["rate"] == pytest.approx(3 / 4)
    # Waits 600, 3000, 1200 and 180 s (e2's second ask, from its revision): the
    # median (600 + 1200) / 2; p90 at 2.7 of 3: 1200 + 0.7 × (3000 − 1200).
    assert send_email["median"] == timedelta(seconds=900)
    assert send_email["p90"] == timedelta(seconds=2460)
    assert (send_email["escalated"], send_email["duplicates"], send_email["drift_holds"]) == (
        1,
        3,  # waits on k1 and on k2's revision, the skip of k5; not first calls' waits
        0,
    )
    assert {k: refund[k] for k in ("asked", "decided", "expired", "drift_holds", "duplicates")} == {
        "asked": 2,  # r1 and the drifted key
        "decided": 0,
        "expired": 1,
        "drift_holds": 1,
        "duplicates": 0,  # the held effect's first call waits at its own creation
    }
    assert refund["rate"] is None and refund["median"] is None
    assert (tools["pay"]["asked"], tools["pay"]["drift_holds"]) == (1, 0)
    wire = tools["wire"]
    assert (wire["asked"], wire["decided"], wire["expired"]) == (1, 0, 1)


def test_the_figures_per_operator_count_who_decided(journal):
    operators = _by_name(insights(journal["period"])["operators"])

    assert set(operators) == {"olivia", "oscar"}
    olivia, oscar = operators["olivia"], operators["oscar"]
    assert (olivia["decided"], olivia["approved"], olivia["rate"]) == (3, 3, 1.0)
    assert olivia["median"] == timedelta(seconds=600)  # 180, 600 and 1200
    assert olivia["p90"] == timedelta(seconds=1080)
    assert (oscar["decided"], oscar["approved"], oscar["rate"]) == (1, 0, 0.0)
    assert oscar["median"] == oscar["p90"] == timedelta(seconds=3000)


def test_the_period_leaves_out_what_happened_outside_it(journal):
    t0 = journal["t0"]
    old = insights(Period(t0 - timedelta(days=41), t0 - timedelta(days=39)))
    assert [(r["name"], r["asked"], r["decided"]) for r in old["tools"]] == [("send_email", 1, 1)]
    assert [(r["name"], r["decided"], r["median"]) for r in old["operators"]] == [
        ("olivia", 1, MIN)
    ]
    # Up to t0 + 15 min: e1's approval (at 10) is in, e3's (at 20) and e2's are not.
    early = insights(Period(t0, t0 + 15 * MIN))
    tools = _by_name(early["tools"])
    assert (tools["send_email"]["decided"], tools["send_email"]["escalated"]) == (1, 0)
    assert (tools["send_email"]["duplicates"], tools["refund"]["expired"]) == (1, 1)
    assert "refund" in tools and tools["refund"]["drift_holds"] == 0  # held at the real clock
    assert [r["name"] for r in early["operators"]] == ["olivia"]
    assert insights(Period(t0 - timedelta(days=30), t0 - timedelta(days=29))) == {
        "tools": [],
        "operators": [],
    }


def test_the_embedded_defaults_python_percentiles_are_percentile_conts(journal):
    """The embedded default (SQLite) computes the percentiles in Python: the same
    figures as PostgreSQL's percentile_cont, from the same rows."""
    for by in ("effect__tool", "actor"):
        in_python = decision_figures(journal["period"], by, postgres=False)
        assert in_python == decision_figures(journal["period"], by, postgres=True)
    assert in_python["olivia"]["p90"] == timedelta(seconds=1080)
    assert _percentile([], 0.5) is None


def test_the_page_shows_the_figures_and_charts_to_an_operator(journal, operator, admin_user):
    client = Client()
    client.force_login(operator)

    page = client.get(URL, {"days": "7"})

    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<svg class="bars"') == 4
    assert "<code>send_email</code></th><td>4</td><td>4</td><td>75%</td><td>15 min</td>" in html
    assert 'href="/insights/" aria-current="page"' in html
    client.force_login(admin_user)
    assert client.get(URL).status_code == 200


def test_chosen_dates_are_whole_days_and_a_bad_period_is_refused(journal, operator):
    client = Client()
    client.force_login(operator)
    t0 = journal["t0"]
    day = timezone.localdate(t0 - timedelta(days=40))

    page = client.get(URL, {"start": day.isoformat(), "end": day.isoformat()})

    assert page.status_code == 200
    assert page.context["tools"][0]["decided"] == 1  # the old decision only
    assert [r["name"] for r in page.context["tools"]] == ["send_email"]
    refused = client.get(URL, {"start": day.isoformat()})
    assert refused.status_code == 400
    backwards = {"start": day.isoformat(), "end": (day - timedelta(days=1)).isoformat()}
    assert client.get(URL, backwards).status_code == 400


def test_viewers_are_refused_and_anonymous_sent_to_sign_in(viewer):
    assert Client().get(URL)["Location"].startswith("/accounts/login/")
    client = Client()
    client.force_login(viewer)
    assert client.get(URL).status_code == 403
    # Nor is the page in a viewer's navigation.
    assert 'href="/insights/"' not in client.get("/").content.decode()


def _more(agent, operator, n):
    """n more tools, each asked and approved once, another operator deciding."""
    run = start(agent, f"more-{n}").run
    for i in range(n):
        effect = _ask(agent, run, f"more:{n}:{i}", tool=f"tool_{n}_{i}", now=timezone.now())
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    _drift_hold(agent, tool=f"drift_{n}", run_key=f"drift-{n}")


def test_the_page_makes_as_many_queries_with_more_data(
    agent, operator, second_operator, django_assert_max_num_queries
):
    client = Client()
    client.force_login(operator)
    _more(agent, operator, 1)
    with CaptureQueriesContext(connection) as few:
        assert client.get(URL).status_code == 200
    _more(agent, second_operator, 6)

    with django_assert_max_num_queries(len(few)):
        page = client.get(URL)

    assert len(page.context["tools"]) == 1 + 1 + 6 + 1
    assert len(page.context["operators"]) == 2


@pytest.fixture
def immediate_constraints():
    """Foreign keys checked at once, so the journal's rows leave no pending trigger
    event on runs_call: PostgreSQL refuses to alter a table that has one, and the
    migration test below drops and adds a column of it inside the test's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def test_the_migration_marks_past_calls_as_the_record_time_rule_does(
    immediate_constraints, journal
):
    """runs 0013 adds Call.prevented_duplicate and fills it for the calls recorded
    before it: it must give every call the flag record_call gives it now."""
    flags = dict(Call.objects.values_list("pk", "prevented_duplicate"))
    # The journal has both kinds: a skip and waits that repeat a keyed call, and the
    # waits of the calls that created their awaiting effect.
    assert sorted(Counter(flags.values()).items()) == [(False, len(flags) - 3), (True, 3)]
    executor = MigrationExecutor(connection)
    executor.migrate([("runs", "0012_insights_indexes")])
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert dict(Call.objects.values_list("pk", "prevented_duplicate")) == flags
