"""The operator console's pages: queue, runs, run, effect, restart history.

Every page makes a fixed number of queries whatever the number of rows
(select_related / prefetch, lists capped or paginated); tests/test_console_queries.py
holds them to it. The POST actions are in ``approvals/views_actions.py``.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from approvals.audit_export import AuditFilterForm, audit_events, audit_filters
from approvals.decisions import can_decide
from approvals.models import Approval
from approvals.views_common import (
    HISTORY_PERMISSION,
    QUEUE_LIMITS,
    QUEUE_MORE_LIMIT,
    _effect_for_user,
    _run_for_user,
    diff_lines,
    nav_counts,
    needs_decision_runs,
    queue_fingerprint,
    queue_sets,
    verdict_reasons_for,
    versions_with_diffs,
)
from runs.models import (
    Agent,
    Attempt,
    AttemptStatus,
    AuditEvent,
    Call,
    Effect,
    EffectStatus,
    EffectVersion,
    Run,
    RunStatus,
)
from runs.policies import HOLD_KEY_DRIFT, HOLD_POLICY_RULE, HOLD_TOOL_UNCONFIRMED
from runs.verdict import restart_verdict

RUNS_PER_PAGE = 50
HISTORY_PER_PAGE = 50


def attempt_count() -> Coalesce:
    """A run's number of attempts, as a subquery evaluated for the rows shown only.

    ``Count("attempts")`` joined and grouped every run before the page was cut:
    over 100,000 runs that was most of the runs page, and its paginator had to
    count the grouped rows too. A correlated subquery is left out of ``count()``
    and runs once per row of the page, on the ``(run, number)`` unique index.
    """
    return Coalesce(
        Subquery(
            Attempt.objects.filter(run=OuterRef("pk"))
            .order_by()
            .values("run")
            .annotate(n=Count("pk"))
            .values("n")[:1]
        ),
        0,
    )


def base_context(request: HttpRequest, nav: dict | None = None, **extra) -> dict:
    """What every page and fragment reads: the navigation's counts, the clock (read
    once: the actions shown depend on it), and ``form``/``error``, set only on a
    refused action's answer (present, so that no row looks up a missing variable)."""
    nav = nav if nav is not None else nav_counts()
    return {
        "nav": nav,
        "user_can_decide": can_decide(request.user),
        "now": timezone.now(),
        "form": None,
        "error": None,
        **extra,
    }


# --- Queue --------------------------------------------------------------------

# What an effect's queue row shows (_rows.html's ``effect-row``) and its actions
# read: loading the rest (the run's input, the effect's result and
# decision, ten more times) was a fifth of the queue's time. A field the row comes
# to need and is missing here costs a query per row: the console's query-count
# tests catch it.
QUEUE_EFFECT_FIELDS = (
    "id",
    "tool",
    "key",
    "status",
    "args",
    "args_hash",
    "preview",
    "approvals_required",
    "current_approvals",
    # Why it waits (key drift, an unconfirmed tool, a policy rule); allowed_actions
    # reads it too (no approval before an admin confirms the tool).
    "hold",
    "created_at",
    "approval_expires_at",
    "claimed_attempt",
    "claimed_at",
    "run__id",
    "run__run_key",
    "agent__id",
    "agent__name",
)


def queue_context(request: HttpRequest, sets: tuple) -> dict:
    """The queue's rows; ``sets`` is ``queue_sets()``, read once for the fingerprint
    and the navigation's counts alike."""
    more = request.GET.get("more") == "1"
    limits = {name: QUEUE_MORE_LIMIT if more else n for name, n in QUEUE_LIMITS.items()}
    awaiting = list(
        Effect.objects.filter(status=EffectStatus.AWAITING_APPROVAL)
        .select_related("run", "agent")
        .only(*QUEUE_EFFECT_FIELDS)
        .order_by("approval_expires_at", "created_at")[: limits["awaiting"]]
    )
    stopped = list(
        needs_decision_runs()
        .select_related("agent")
        .annotate(attempt_count=attempt_count())
        .order_by("-updated_at")[: limits["stopped"]]
    )
    reasons = verdict_reasons_for(stopped)
    for run in stopped:
        run.reasons = reasons[run.pk]
    unknown = list(
        Effect.objects.filter(status=EffectStatus.UNKNOWN)
        .select_related("run", "agent")
        .only(*QUEUE_EFFECT_FIELDS)
        .order_by("-updated_at")[: limits["unknown"]]
    )
    # Bulk decisions apply to several awaiting effects of one tool: group by tool.
    tools = sorted({effect.tool for effect in awaiting})
    return base_context(
        request,
        nav=nav_counts(sets),
        awaiting=awaiting,
        stopped=stopped,
        unknown=unknown,
        tools=tools,
        fingerprint=queue_fingerprint(sets),
        limits=limits,
        more=more,
        more_limit=QUEUE_MORE_LIMIT,
        bulk_form=None,
        oob=False,
    )


def queue_row_context(request: HttpRequest, obj: Effect | Run) -> dict:
    """One row of the queue (an effect or a stopped run), as an action answers htmx."""
    if isinstance(obj, Run):
        obj.reasons = verdict_reasons_for([obj])[obj.pk]
        return base_context(request, run=obj, row=True)
    return base_context(request, effect=obj, row=True)


def _filter(request: HttpRequest, name: str) -> str:
    """A filter from the query string, without U+0000: PostgreSQL cannot compare text
    with it (a DataError, so a 500), and no run key, title or name contains one."""
    return request.GET.get(name, "").replace("\x00", "").strip()


@require_GET
@login_required
def queue(request: HttpRequest) -> HttpResponse:
    """The home page: what waits for a person. htmx polls it with ``?fp=``.

    A poll whose fingerprint is still current answers 204 (htmx swaps nothing), so
    an idle console costs one aggregate query per poll (queue_sets), not a render.
    """
    sets = queue_sets()
    if request.htmx:
        if request.GET.get("fp") == queue_fingerprint(sets):
            return HttpResponse(status=204)
        return render(request, "approvals/queue.html#queue", queue_context(request, sets))
    return render(request, "approvals/queue.html", queue_context(request, sets))


# --- Runs ---------------------------------------------------------------------


@require_GET
@login_required
def runs(request: HttpRequest) -> HttpResponse:
    """All runs: filter by status, agent, verdict; search by run key or title."""
    status = _filter(request, "status")
    agent = _filter(request, "agent")
    verdict = _filter(request, "verdict")
    search = _filter(request, "q")
    queryset = Run.objects.select_related("agent").annotate(attempt_count=attempt_count())
    if status in RunStatus.values:
        queryset = queryset.filter(status=status)
    if agent:
        queryset = queryset.filter(agent__name=agent)
    # The column the rules keep (runs/verdict.py), not the journal: an index, not a
    # test of every run's effects and calls (docs/performance.md).
    if verdict == "blocked":
        queryset = queryset.filter(verdict_blocked=True)
    elif verdict == "safe":
        queryset = queryset.filter(verdict_blocked=False)
    if search:
        queryset = queryset.filter(Q(run_key__icontains=search) | Q(title__icontains=search))
    page = Paginator(queryset.order_by("-created_at"), RUNS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    query = request.GET.copy()
    query.pop("page", None)
    context = base_context(
        request,
        page=page,
        filters={"status": status, "agent": agent, "verdict": verdict, "q": search},
        statuses=RunStatus.values,
        agents=Agent.objects.order_by("name").values_list("name", flat=True),
        query=query.urlencode(),
    )
    return render(request, "approvals/runs.html", context)


def run_context(request: HttpRequest, run: Run) -> dict:
    """A run's attempts side by side, orphans, verdict, hand-off tries, audit trail."""
    calls = list(
        Call.objects.filter(run=run).select_related("effect").order_by("attempt_number", "seq")
    )
    attempts = list(Attempt.objects.filter(run=run).order_by("number"))
    by_attempt: dict[int, list[Call]] = {a.number: [] for a in attempts}
    for call in calls:
        by_attempt.setdefault(call.attempt_number, []).append(call)
    for attempt in attempts:
        attempt.journal = by_attempt.get(attempt.number, [])
    # Orphans: effects an earlier attempt started (or finished) that the latest
    # attempt no longer asks for; the changed trajectory left them behind.
    latest = attempts[-1].number if attempts else None
    latest_effects = {c.effect_id for c in by_attempt.get(latest, []) if c.effect_id}
    orphans: dict = {}
    for call in calls:
        effect = call.effect
        if (
            effect is not None
            and call.attempt_number != latest
            and effect.pk not in latest_effects
            and (effect.first_claimed_at is not None or effect.status == EffectStatus.DONE)
        ):
            orphans.setdefault(effect.pk, (effect, call.attempt_number))
    events = list(
        AuditEvent.objects.filter(run=run).select_related("effect").order_by("-at", "-id")[:200]
    )
    return base_context(
        request,
        run=run,
        attempts=attempts,
        orphans=list(orphans.values()),
        verdict=restart_verdict(run),
        handoffs=[e for e in events if e.verb == "handoff_try"],
        events=events,
    )


@require_GET
@login_required
def run_detail(request: HttpRequest, run_id) -> HttpResponse:
    run = _run_for_user(request, run_id)
    return render(request, "approvals/run.html", run_context(request, run))


# --- Effect -------------------------------------------------------------------


def effect_context(request: HttpRequest, effect: Effect, **extra) -> dict:
    """An effect's content, versions with diffs, decisions, outcome, late reports, trail."""
    versions = list(EffectVersion.objects.filter(effect=effect).order_by("number"))
    approvals = list(Approval.objects.filter(effect=effect).select_related("user").order_by("at"))
    events = list(AuditEvent.objects.filter(effect=effect).order_by("-at", "-id")[:200])
    calls = list(Call.objects.filter(effect=effect).select_related("run").order_by("at")[:100])
    decision = effect.decision or {}
    return base_context(
        request,
        effect=effect,
        hold=hold_context(effect),
        versions=versions_with_diffs(versions),
        approvals=approvals,
        current_approvals=[a for a in approvals if a.args_hash == effect.args_hash],
        events=events,
        # A report that came after the effect was settled (by a person or the
        # sweep) is the truth the operator must see first.
        late_reports=[e for e in events if e.verb == "late_report"],
        reconciled=decision if decision.get("verb") == "reconciled" else None,
        calls=calls,
        **extra,
    )


HOLD_REASONS = {
    HOLD_KEY_DRIFT: "Key drift: a new key where an earlier effect of the tool may be the same",
    HOLD_TOOL_UNCONFIRMED: "The tool is new or changed and not confirmed by an admin",
    HOLD_POLICY_RULE: "The tool's policy",
}


def hold_context(effect: Effect) -> dict | None:
    """Why the server made ``effect`` wait (``effect.hold``), for its page: the reason
    in words and the message; for a key drift, the earlier effect it names side by
    side with this one and their arguments' diff (one query, only for a drift)."""
    if not effect.hold:
        return None
    hold = effect.hold
    context = {
        "reason": hold.get("reason"),
        "label": HOLD_REASONS.get(hold.get("reason"), hold.get("reason")),
        "message": hold.get("message") or "",
        "waits": effect.status == EffectStatus.AWAITING_APPROVAL,
        "earlier": None,
        "diff": [],
    }
    if hold.get("reason") == HOLD_KEY_DRIFT and hold.get("effect_id"):
        earlier = Effect.objects.select_related("run").filter(pk=hold["effect_id"]).first()
        if earlier is not None:  # gone only if its run was pruned
            context["earlier"] = earlier
            context["diff"] = diff_lines(earlier.args, effect.args)
    return context


@require_GET
@login_required
def effect_detail(request: HttpRequest, effect_id) -> HttpResponse:
    effect = _effect_for_user(request, effect_id)
    return render(request, "approvals/effect.html", effect_context(request, effect))


# --- History (admins) ---------------------------------------------------------


@require_GET
@login_required
@permission_required(HISTORY_PERMISSION, raise_exception=True)
def history(request: HttpRequest) -> HttpResponse:
    """Every attempt of every run and the audit log, each filterable and paginated."""
    status = _filter(request, "status")
    started_by = _filter(request, "started_by")
    agent = _filter(request, "agent")
    attempts = Attempt.objects.select_related("run", "run__agent").order_by("-started_at", "-id")
    if status in AttemptStatus.values:
        attempts = attempts.filter(status=status)
    if started_by:
        attempts = attempts.filter(started_by__icontains=started_by)
    if agent:
        attempts = attempts.filter(run__agent__name=agent)
    attempt_page = Paginator(attempts, HISTORY_PER_PAGE).get_page(request.GET.get("page"))
    # The audit log's filters (agent is shared with the attempts) are the export's:
    # the same function builds both lists (approvals/audit_export.py).
    audit_form = AuditFilterForm(request.GET)
    audit = audit_events(audit_filters(request.GET)).select_related("run", "effect")
    audit_page = Paginator(audit, HISTORY_PER_PAGE).get_page(request.GET.get("apage"))
    query = request.GET.copy()
    query.pop("page", None)
    query.pop("apage", None)
    context = base_context(
        request,
        attempt_page=attempt_page,
        audit_page=audit_page,
        audit_form=audit_form,
        filters={"status": status, "started_by": started_by, "agent": agent},
        statuses=AttemptStatus.values,
        agents=Agent.objects.order_by("name").values_list("name", flat=True),
        query=query.urlencode(),
    )
    return render(request, "approvals/history.html", context)
