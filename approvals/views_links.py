"""The page of a signed e-mail link (``/links/<token>/``; approvals/links.py).

``GET`` shows the effect as it is NOW and a form to confirm; it changes nothing, so
a mail scanner that follows the link decides nothing (and, not signed in, is sent to
the sign-in page). ``POST`` from that page takes the decision, for the signed-in
recipient only, through the console's rules. Every refusal is this page with why,
and its status: 400 a link not signed here, 403 another user, 410 expired or used,
409 the effect changed or its state no longer allows the action.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from approvals.decisions import allowed_actions, can_decide, has_approved
from approvals.forms import ApproveForm, LinkDecisionForm, MarkDoneForm, RejectForm
from approvals.links import LABELS, Link, LinkRefused, check_link, decide_by_link
from approvals.views import base_context
from approvals.views_actions import FORBIDDEN, _see_other, _stale_diff
from approvals.views_common import versions_with_diffs
from runs.audit import Actor
from runs.errors import JournalError, StaleArgs
from runs.lifecycle import is_past_deadline
from runs.models import Effect, EffectVersion

TEMPLATE = "approvals/link.html"


def _edit_diff(effect: Effect) -> list:
    """The diff of the current version from the adopted one before it (an edit or a
    revision), so the confirm page shows what changed; empty for a first version."""
    versions = list(EffectVersion.objects.filter(effect=effect).order_by("number"))
    rows = [r for r in versions_with_diffs(versions) if r["version"].adopted]
    return rows[-1]["diff"] if rows else []


def _refusal(link: Link, effect: Effect, request: HttpRequest, now) -> tuple[int, str] | None:
    """Why the page cannot offer the link's action now, without changing anything
    (the decision itself re-checks all of it under the effect's lock)."""
    if not can_decide(request.user):  # the role was taken away since the e-mail
        return 403, FORBIDDEN
    if effect.args_hash != link.args_hash:
        return 409, "The arguments changed since the e-mail: review the new content below."
    if is_past_deadline(effect, now):
        return 409, "The approval deadline passed: the effect expired."
    if link.action not in allowed_actions(effect, request.user, now):
        if link.action == "approve" and has_approved(effect, Actor.for_user(request.user).label):
            return 409, "You already approved this version."
        return 409, f"It can no longer be done from this link: the effect is {effect.status}."
    return None


@require_http_methods(["GET", "POST"])
@login_required
def link(request: HttpRequest, token: str) -> HttpResponse:
    context = base_context(request)
    now = context["now"]
    try:
        found = check_link(token, request.user, now)
    except LinkRefused as exc:
        return render(request, TEMPLATE, {**context, "error": exc.message}, status=exc.status)
    effect = Effect.objects.select_related("run", "agent").filter(pk=found.effect_id).first()
    if effect is None:
        context["error"] = "This effect is no longer in the journal."
        return render(request, TEMPLATE, context, status=404)
    context.update(
        effect=effect,
        action=found.action,
        label=LABELS[found.action],
        diff=_edit_diff(effect),
        form=LinkDecisionForm(request.POST or None, action=found.action),
    )
    status = 200
    if request.method == "GET":
        refused = _refusal(found, effect, request, now)
        if refused:
            status, context["error"] = refused
            if effect.args_hash != found.args_hash:
                context["stale"] = _stale_diff(effect.pk, found.args_hash)
        context["offer"] = not refused
        return render(request, TEMPLATE, context, status=status)
    form = context["form"]
    if not form.is_valid():  # a missing note: the form again, with its errors
        return render(request, TEMPLATE, {**context, "offer": True}, status=400)
    try:
        decided = decide_by_link(
            token,
            request.user,
            note=form.cleaned_data["note"],
            final=form.cleaned_data["final"],
            now=now,
        )
    except LinkRefused as exc:
        status, context["error"] = exc.status, exc.message
    except StaleArgs as exc:
        status, context["error"] = 409, exc.message
        context["stale"] = _stale_diff(effect.pk, found.args_hash)
    except JournalError as exc:
        status, context["error"] = exc.status, exc.message
    if status != 200:
        effect.refresh_from_db()
        return render(request, TEMPLATE, context, status=status)
    # The console's own words for it ("Approved send_campaign: the agent may claim it now.").
    console_form = {"approve": ApproveForm, "reject": RejectForm, "mark_done": MarkDoneForm}
    messages.success(request, console_form[found.action]().success_message(decided))
    return _see_other(reverse("console:effect", args=[decided.pk]))
