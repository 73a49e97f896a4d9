"""The restart verdict's forms agree on any journal (runs/verdict.py).

The rule is written once, but read in three forms: the verdict of a batch of runs
(``restart_verdicts``: the sweep, the queue) and of one run (``restart_verdict``:
a start, the run page, the API), the SQL condition (``blocked_runs_filter``:
``mark_blocked_runs``, migration 0009) and the stored flag the console filters on
(``Run.verdict_blocked``, kept by ``keep_verdict_blocked`` as the journal grows).
Hypothesis writes journals through the rules themselves (starts, reads, keyed,
shared and unkeyed effects, approvals, claims, reports, failures, supersedes, the
sweep, restarts) under each policy, and every form must say the same of every run,
whatever other runs share its batch.
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifecycle_helpers import read, send, start

from approvals.decisions import approve_effect
from runs.errors import JournalError
from runs.lifecycle import finish_run
from runs.models import Call, Effect, EffectStatus, Run, RunStatus
from runs.outcomes import claim_effect, complete_effect
from runs.sweep import SweepReport, interrupt_stale_run
from runs.verdict import blocked_runs_filter, restart_verdict, restart_verdicts

STEPS = (
    "read",
    "keyed",  # a key of its own
    "shared",  # a key every run of the journal names: one effect, a note of each run
    "replay",  # the run's latest keyed effect named again: two calls, one effect
    "unkeyed",  # executes at once: started
    "unkeyed_awaiting",  # waits for a person: not started
    "approve_and_claim",  # the run's oldest awaiting effect, approved then claimed
    "report_done",
    "report_failed",
    "finish_failed",
    "supersede",
    "sweep",  # silent past its heartbeat: interrupted, handed back or queued
    "restart",
)

journals = st.lists(
    st.tuples(
        st.sampled_from(["keyed", "blunt", "manual"]),
        st.lists(st.sampled_from(STEPS), max_size=8),
    ),
    min_size=1,
    max_size=4,
)


def _step(step: str, agent, operator, run: Run, prefix: str, n: int) -> None:
    run.refresh_from_db()
    attempt = run.current_attempt
    if step == "read":
        read(agent, run, attempt=attempt)
    elif step == "keyed":
        send(agent, run, attempt=attempt, key=f"{prefix}:{run.run_key}:{n}")
    elif step == "shared":
        send(agent, run, attempt=attempt, key=f"{prefix}:shared")
    elif step == "replay":
        effect = Effect.objects.filter(run=run, key__isnull=False).order_by("-created_at").first()
        if effect is not None:
            send(agent, run, attempt=attempt, key=effect.key)
    elif step == "unkeyed":
        send(agent, run, attempt=attempt, key=None)
    elif step == "unkeyed_awaiting":
        send(agent, run, attempt=attempt, key=None, needs_approval=True)
    elif step == "approve_and_claim":
        effect = (
            Effect.objects.filter(run=run, status=EffectStatus.AWAITING_APPROVAL)
            .order_by("created_at")
            .first()
        )
        if effect is not None:
            approve_effect(operator, effect.pk, args_hash=effect.args_hash)
            claim_effect(agent, effect.pk, run_id=run.pk, attempt=attempt)
    elif step in ("report_done", "report_failed"):
        effect = Effect.objects.filter(
            claimed_run=run, status=EffectStatus.IN_FLIGHT, claimed_attempt=attempt
        ).first()
        if effect is not None:
            outcome = step.removeprefix("report_")
            complete_effect(
                agent, effect.pk, run_id=run.pk, attempt=attempt, outcome=outcome, result={}
            )
    elif step == "finish_failed":
        finish_run(agent, run.pk, attempt=attempt, outcome="failed", error="boom")
    elif step == "supersede":
        start(agent, run.run_key, supersede=attempt)
    elif step == "sweep":
        interrupt_stale_run(run.pk, timezone.now() + timedelta(hours=1), SweepReport())
    elif step == "restart" and run.status != RunStatus.RUNNING:
        start(agent, run.run_key)


@pytest.mark.django_db
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(journal=journals)
def test_the_batch_the_single_run_the_sql_and_the_stored_flag_agree(agent, operator, journal):
    prefix = uuid.uuid4().hex[:8]  # examples share the test's database: their own keys
    runs = [
        start(agent, f"{prefix}-{i}", restart_policy=policy).run
        for i, (policy, _) in enumerate(journal)
    ]
    # The steps of the runs interleaved, as concurrent runs write them.
    longest = max(len(steps) for _, steps in journal)
    for n in range(longest):
        for run, (_, steps) in zip(runs, journal, strict=True):
            if n < len(steps):
                # Refused by the rules (a blocked restart, a finished run): a journal all the same.
                with contextlib.suppress(JournalError):
                    _step(steps[n], agent, operator, run, prefix, n)
    runs = list(Run.objects.filter(pk__in=[run.pk for run in runs]).order_by("run_key"))

    batch = restart_verdicts(runs)
    backwards = restart_verdicts(runs[::-1])
    blocked_by_sql = set(
        Run.objects.filter(blocked_runs_filter(), pk__in=[run.pk for run in runs]).values_list(
            "pk", flat=True
        )
    )
    for run in runs:
        single = restart_verdict(run)
        assert batch[run.pk].as_dict() == single.as_dict() == backwards[run.pk].as_dict()
        blocked = bool(single.blocking)
        assert single.safe is not blocked
        assert (run.pk in blocked_by_sql, run.verdict_blocked) == (blocked, blocked), (
            run.restart_policy,
            single.as_dict(),
        )
        # Every effect the run's calls name is a note once, unless it blocks.
        named = Call.objects.filter(run=run, effect__isnull=False).values_list("effect", flat=True)
        blocking = {b["effect_id"] for b in single.blocking if b["reason"] == "unkeyed_effect"}
        expected = {str(pk) for pk in named} - blocking
        assert sorted(n["effect_id"] for n in single.notes) == sorted(expected)
