"""The tools pages (product.md, "Tool registry and policies"): every tool of every
agent with its declaration, policy, state and what the journal did with it; one
tool's history, where admins confirm it and edit its policy after trying it.

Everyone signed in reads them. The POSTs are for admins only: ``runs.change_tool``
confirms, ``runs.change_toolpolicy`` (and ``add_toolpolicy`` for a tool without
one) edits the policy; anyone else gets 403 whatever the form holds, checked after
the id (404) and before the form (400): there is nothing a non-admin could fix.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event

from approvals.forms import PolicyForm
from approvals.views import base_context
from runs.models import (
    AuditEvent,
    Call,
    CallKind,
    Effect,
    EffectStatus,
    Tool,
    ToolPolicy,
)
from runs.policies import HOLD_KEY_DRIFT
from runs.registry import (
    TRIAL_CALLS,
    Trial,
    confirm_tool,
    effective_of,
    policy_dict,
    save_policy,
    tool_policy,
    try_policy,
    with_policy,
)

CONFIRM_PERMISSION = "runs.change_tool"
# The audit events about a tool itself (runs/registry.py ``_tool_event``).
TOOL_VERBS = ("tool_confirmed", "policy_created", "policy_changed")
COUNTS = ("calls", "executions", "duplicates", "unknown", "unknown_now", "drift_holds")

# --- What the journal did with each tool ---------------------------------------------


def journal_counts(tools: list[Tool]) -> dict[tuple[Any, str], dict[str, int]]:
    """Per (agent id, tool name), what the journal did with the tool, in three
    grouped queries whatever the number of tools (no query per row):

    - ``calls``: calls recorded;
    - ``executions``: reads (each is executed) and claims of its effects (each
      start, retries included: the audit log's ``claimed``);
    - ``duplicates``: duplicates prevented, the calls answered ``skip`` or ``wait``
      on a key that already existed before the call (its effect was recorded
      earlier; the call that records an awaiting effect waits too, and is no
      duplicate);
    - ``unknown``: effects whose outcome became unknown (``outcome_unknown``),
      ``unknown_now`` those still unknown;
    - ``drift_holds``: effects held for a key drift (the hold stays on the effect
      after it is decided: a tool that drifts often has a key rule to fix).
    """
    if not tools:
        return {}
    agents = {tool.agent_id for tool in tools}
    names = {tool.name for tool in tools}
    counts: dict[tuple[Any, str], dict[str, int]] = {}

    def add(key: tuple[Any, str], **values: int) -> None:
        row = counts.setdefault(key, dict.fromkeys(COUNTS, 0))
        for name, value in values.items():
            row[name] += value

    calls = (
        Call.objects.filter(run__agent_id__in=agents, tool__in=names)
        .values("run__agent_id", "tool")
        .annotate(
            n=Count("pk"),
            reads=Count("pk", filter=Q(kind=CallKind.READ)),
            duplicates=Count("pk", filter=Q(prevented_duplicate=True)),
        )
        .order_by()
    )
    for row in calls:
        add(
            (row["run__agent_id"], row["tool"]),
            calls=row["n"],
            executions=row["reads"],
            duplicates=row["duplicates"],
        )
    effects = (
        Effect.objects.filter(agent_id__in=agents, tool__in=names)
        .values("agent_id", "tool")
        .annotate(
            unknown_now=Count("pk", filter=Q(status=EffectStatus.UNKNOWN)),
            drift_holds=Count("pk", filter=Q(hold__reason=HOLD_KEY_DRIFT)),
        )
        .order_by()
    )
    for row in effects:
        add(
            (row["agent_id"], row["tool"]),
            unknown_now=row["unknown_now"],
            drift_holds=row["drift_holds"],
        )
    events = (
        AuditEvent.objects.filter(
            verb__in=("claimed", "outcome_unknown"),
            effect__agent_id__in=agents,
            effect__tool__in=names,
        )
        .values("effect__agent_id", "effect__tool")
        .annotate(
            claims=Count("pk", filter=Q(verb="claimed")),
            unknown=Count("effect", filter=Q(verb="outcome_unknown"), distinct=True),
        )
        .order_by()
    )
    for row in events:
        add(
            (row["effect__agent_id"], row["effect__tool"]),
            executions=row["claims"],
            unknown=row["unknown"],
        )
    return counts


def _with_counts(tools: list[Tool]) -> list[Tool]:
    counts = journal_counts(tools)
    for tool in tools:
        tool.counts = counts.get((tool.agent_id, tool.name), dict.fromkeys(COUNTS, 0))
        tool.effective = effective_of(tool)
        tool.current_policy = policy_dict(tool_policy(tool))
    return tools


# --- Trying a policy ---------------------------------------------------------------

_APPROVERS = {1: "one approver", 2: "two approvers", 3: "three approvers"}


def _outcome(trial: Trial) -> str:
    """What a trial's opening means, in the words of the tools page."""
    opening = trial.opening
    if opening is None:
        return "read, never gated"
    if opening.status == EffectStatus.APPROVED:
        return "approved automatically"
    if opening.status == EffectStatus.REJECTED:
        return "blocked"
    if opening.status == EffectStatus.AWAITING_APPROVAL:
        return "sent to " + _APPROVERS[opening.approvals_required]
    return "run without approval"


OUTCOME_ORDER = (
    "approved automatically",
    "sent to one approver",
    "sent to two approvers",
    "sent to three approvers",
    "blocked",
    "run without approval",
    "read, never gated",
)


def trial_summary(trials: list[Trial]) -> dict:
    """``try_policy``'s answer as the page shows it: "would have: 12 approved
    automatically, 3 sent to two approvers, 1 blocked", and each call's row."""
    rows = [{"call": t.call, "rule": t.rule, "outcome": _outcome(t)} for t in trials]
    counts = {name: 0 for name in OUTCOME_ORDER}
    for row in rows:
        counts[row["outcome"]] += 1
    parts = [f"{n} {name}" for name, n in counts.items() if n]
    matched: dict[str, int] = {}
    for trial in trials:
        if trial.rule is not None:
            matched[trial.rule["id"]] = matched.get(trial.rule["id"], 0) + 1
    return {
        "calls": len(trials),
        "text": "would have: " + ", ".join(parts) if parts else "no call to try it on",
        "counts": [(name, n) for name, n in counts.items() if n],
        "matched": matched,
        "rows": rows,
    }


# --- Pages -------------------------------------------------------------------------


def _tool(tool_id: Any) -> Tool:
    return get_object_or_404(
        with_policy(Tool.objects.select_related("agent", "confirmed_by", "policy__updated_by")),
        pk=tool_id,
    )


def can_edit_policy(user, tool: Tool) -> bool:
    """``change_toolpolicy``, and ``add_toolpolicy`` for a tool that has none yet."""
    needed = ["runs.change_toolpolicy"]
    if tool_policy(tool) is None:
        needed.append("runs.add_toolpolicy")
    return user.has_perms(needed)


@require_GET
@login_required
def tools(request: HttpRequest) -> HttpResponse:
    """Every tool of every agent, its declaration, policy, state and counts."""
    rows = list(
        with_policy(Tool.objects.select_related("agent")).order_by("agent__name", "name", "pk")
    )
    return render(request, "approvals/tools.html", base_context(request, tools=_with_counts(rows)))


def tool_context(request: HttpRequest, tool: Tool, form: PolicyForm | None = None, **extra):
    """One tool: its declarations (newest first), policy, counts, the tool's audit
    events, and the policy form for an admin (bound when it was just posted)."""
    _with_counts([tool])
    policy = tool_policy(tool)
    declarations = list(tool.declarations.order_by("-first_seen_at", "-id"))
    events = list(
        AuditEvent.objects.filter(
            agent_id=tool.agent_id, effect=None, verb__in=TOOL_VERBS, data__tool=tool.name
        ).order_by("-at", "-id")[:50]
    )
    can_edit = can_edit_policy(request.user, tool)
    if form is None and can_edit:
        form = PolicyForm(instance=policy or ToolPolicy(tool_id=tool.pk))
    return base_context(
        request,
        tool=tool,
        policy=policy,
        declarations=declarations,
        events=events,
        policy_form=form,
        can_edit=can_edit,
        can_confirm=request.user.has_perm(CONFIRM_PERMISSION),
        trial=None,
        trial_calls=TRIAL_CALLS,
        **extra,
    )


@require_GET
@login_required
def tool_detail(request: HttpRequest, tool_id) -> HttpResponse:
    tool = _tool(tool_id)
    return render(request, "approvals/tool.html", tool_context(request, tool))


def _tool_answer(request: HttpRequest, tool: Tool, *, status: int, **context) -> HttpResponse:
    """The tool's page (or, for htmx, its panel) after an action, with ``error``."""
    template = "approvals/tool.html" + ("#tool-detail" if request.htmx else "")
    response = render(request, template, tool_context(request, tool, **context), status=status)
    error = context.get("error")
    if request.htmx and error:
        trigger_client_event(response, "toast", {"message": error, "level": "error"})
    return response


def _back_to(request: HttpRequest, tool: Tool, message: str) -> HttpResponse:
    if request.htmx:
        response = render(
            request, "approvals/tool.html#tool-detail", tool_context(request, _tool(tool.pk))
        )
        return trigger_client_event(response, "toast", {"message": message, "level": "success"})
    messages.success(request, message)
    response = HttpResponseRedirect(reverse("console:tool", args=[tool.pk]))
    response.status_code = 303  # a POST's answer is fetched with GET
    return response


@require_POST
@login_required
def tool_confirm(request: HttpRequest, tool_id) -> HttpResponse:
    """An admin confirms the tool's latest declaration (runs/registry.py ``confirm_tool``:
    audited; the effects held until then go on)."""
    tool = _tool(tool_id)
    if not request.user.has_perm(CONFIRM_PERMISSION):
        return _tool_answer(request, tool, status=403, error="Only an admin confirms tools.")
    confirm_tool(request.user, tool.pk)
    return _back_to(request, tool, f"Confirmed {tool.name}: its latest declaration is in force.")


@require_POST
@login_required
def edit_policy(request: HttpRequest, tool_id) -> HttpResponse:
    """An admin edits the tool's policy. With ``try`` in the form, nothing is saved:
    the page shows what the rule would have done to the tool's last calls
    (runs/registry.py ``try_policy``); else it is saved and audited (``save_policy``)."""
    tool = _tool(tool_id)
    if not can_edit_policy(request.user, tool):
        return _tool_answer(request, tool, status=403, error="Only an admin edits policies.")
    # A copy of the policy for the form to fill in: the tool's own (shown as the
    # policy in force) must not take the values being tried. By ``tool_id``: a new
    # policy given ``tool=`` would become ``tool.policy`` (the one-to-one's cache).
    current = tool_policy(tool)
    policy = ToolPolicy.objects.get(pk=current.pk) if current else ToolPolicy(tool_id=tool.pk)
    form = PolicyForm(request.POST, instance=policy)
    if not form.is_valid():
        return _tool_answer(
            request, tool, status=400, form=form, error="Not saved: the policy has errors."
        )
    if "try" in request.POST:
        trial = trial_summary(try_policy(tool, policy_dict(form.instance)))
        context = tool_context(request, tool, form=form)
        context["trial"] = trial
        template = "approvals/tool.html" + ("#tool-detail" if request.htmx else "")
        return render(request, template, context)
    save_policy(request.user, form.instance)
    return _back_to(request, tool, f"Saved the policy of {tool.name}.")
