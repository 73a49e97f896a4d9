"""The console's POST actions: approve, reject, mark done, release, allow restart, abandon.

Every action is a plain form (``approvals/forms.py``) that works without
JavaScript; htmx enhances it. The order of checks is product.md's:

1. the form itself: a missing ``args_hash`` or note, or invalid JSON, is 400, shown
   on the form;
2. the id: one the user may not see is 404; then the role, checked by the rule in
   ``approvals/decisions.py``: 403;
3. the state, checked by the same rule under a row lock: 409 with the page showing
   the current state (a stale hash shows the new content and its diff).

Success answers 303 back to the page the form came from, or, for htmx, the element
the form targets re-rendered (its row in the queue, or its page's panel) with a
toast in ``HX-Trigger``. A resubmit (double click, back button) meets the new state
and is refused with 409: it never decides twice.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import trigger_client_event

from approvals.decisions import allowed_actions, can_decide
from approvals.forms import BulkForm, DecisionForm, EditForm
from approvals.views import (
    base_context,
    effect_context,
    queue_context,
    queue_row_context,
    run_context,
)
from approvals.views_common import (
    _effect_for_user,
    _run_for_user,
    diff_lines,
    pretty,
    queue_sets,
    safe_back_url,
)
from runs.errors import Forbidden, JournalError, StaleArgs
from runs.models import Effect, EffectVersion

FORBIDDEN = "You may not decide: this needs the operator role."

# --- Answers ------------------------------------------------------------------

# How an action finds what it acts on (404 for an id nobody may see), and its page.
FIND = {"effect": _effect_for_user, "run": _run_for_user}
PAGE_CONTEXT = {"effect": effect_context, "run": run_context}


def _see_other(url: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(url)
    response.status_code = 303  # a POST's answer is fetched with GET
    return response


def _toast(response: HttpResponse, message: str, level: str) -> HttpResponse:
    return trigger_client_event(response, "toast", {"message": message, "level": level})


def _problems(form: forms.Form) -> str:
    return " ".join(error for errors in form.errors.values() for error in errors)


def _answer(
    request: HttpRequest, kind: str, obj_id: Any, *, status: int, message: str, **extra
) -> HttpResponse:
    """The effect or run (``kind``) as it is now, after an action on it.

    For htmx, the element the form targets (``request.htmx.target``): its row in the
    queue (``effect-<id>``, ``run-<id>``) or its page's panel; else the whole page.
    ``message`` is a toast for htmx and, for a refusal, the page's error.
    """
    try:
        obj = FIND[kind](request, obj_id)
    except Http404:  # a malformed form for an id nobody can see: still its 400
        return render(request, "approvals/error.html", {"message": message}, status=status)
    error = message if status >= 400 else None
    if request.htmx.target == f"{kind}-{obj.pk}":
        template, context = f"approvals/_rows.html#{kind}-row", queue_row_context(request, obj)
    else:
        template = f"approvals/{kind}.html" + (f"#{kind}-detail" if request.htmx else "")
        context = PAGE_CONTEXT[kind](request, obj)
    response = render(request, template, {**context, "error": error, **extra}, status=status)
    if request.htmx:
        _toast(response, message, "error" if error else "success")
    return response


def _done(request: HttpRequest, kind: str, obj_id: Any, message: str) -> HttpResponse:
    if request.htmx:
        return _answer(request, kind, obj_id, status=200, message=message)
    messages.success(request, message)
    return _see_other(safe_back_url(request, reverse(f"console:{kind}", args=[obj_id])))


def _stale_diff(effect_id: Any, seen_hash: str) -> dict | None:
    """What changed since the operator saw ``seen_hash``: the diff to the current args."""
    effect = Effect.objects.filter(pk=effect_id).only("args", "args_hash").first()
    seen = (
        EffectVersion.objects.filter(effect_id=effect_id, args_hash=seen_hash)
        .order_by("-number")
        .first()
    )
    if effect is None or seen is None:
        return None
    return {"seen_hash": seen_hash, "diff": diff_lines(seen.args, effect.args)}


# --- Actions ------------------------------------------------------------------


@require_POST
@login_required
def decide(
    request: HttpRequest, form_class: type[DecisionForm], effect_id=None, run_id=None
) -> HttpResponse:
    """Approve, reject, mark done or release an effect; allow restart or abandon a run.

    ``form_class`` (from the address) says which action, on which kind of object.
    """
    kind = form_class.kind
    obj_id = effect_id if kind == "effect" else run_id
    form = form_class(request.POST)
    if not form.is_valid():
        problems = f"Not done: {_problems(form)}"
        return _answer(request, kind, obj_id, status=400, message=problems, form=form)
    FIND[kind](request, obj_id)  # 404 for an id nobody may see, before the rule's 403
    try:
        obj = form.save(request.user, obj_id)
    except StaleArgs as exc:
        stale = _stale_diff(obj_id, form.cleaned_data["args_hash"])
        return _answer(request, kind, obj_id, status=409, message=exc.message, stale=stale)
    except JournalError as exc:  # 403 without the operator role, 409 for the state
        return _answer(request, kind, obj_id, status=exc.status, message=exc.message)
    return _done(request, kind, obj_id, form.success_message(obj))


@require_http_methods(["GET", "POST"])
@login_required
def edit(request: HttpRequest, effect_id) -> HttpResponse:
    """Approve with edits: edit the arguments as JSON, see the diff, then confirm
    (which posts to approve, bound to the version the edit started from). Nothing
    changes before the confirm."""
    effect = _effect_for_user(request, effect_id)
    if not can_decide(request.user):
        return _answer(request, "effect", effect.pk, status=403, message=FORBIDDEN)
    initial = {"args": pretty(effect.args), "args_hash": effect.args_hash}
    form = EditForm(request.POST if request.method == "POST" else None, initial=initial)
    context = base_context(request, effect=effect, form=form)
    if form.is_bound and not form.is_valid():
        status = 400
    elif form.is_bound and form.cleaned_data["args_hash"] != effect.args_hash:
        status, context["stale"] = 409, _stale_diff(effect.pk, form.cleaned_data["args_hash"])
        context["error"] = "The arguments changed since you opened the editor."
    elif "edit" not in allowed_actions(effect, request.user, context["now"]):
        status, context["error"] = 409, f"It can no longer be approved (it is {effect.status})."
    else:
        status = 200
        if form.is_bound:
            context["review"] = _review(effect, form)
    template = "approvals/edit.html#edit-review" if request.htmx else "approvals/edit.html"
    return render(request, template, context, status=status)


def _review(effect: Effect, form: EditForm) -> dict:
    edited = form.cleaned_data["args"]
    return {
        "diff": diff_lines(effect.args, edited),
        "args_json": pretty(edited),
        "unchanged": edited == effect.args,
    }


@require_POST
@login_required
def bulk(request: HttpRequest) -> HttpResponse:
    """Approve or reject several awaiting effects of one tool, each bound to its own
    version (``BulkForm.save`` decides each on its own)."""
    form = BulkForm(request.POST)
    if form.is_valid():
        ids = form.cleaned_data["effect"]
        tools = dict(Effect.objects.filter(pk__in=ids).values_list("pk", "tool"))
        if len(tools) != len(ids):
            raise Http404("No such effect.")
        if len(set(tools.values())) > 1:
            form.add_error("effect", "A bulk decision applies to effects of one tool.")
    if not form.is_valid():
        messages.error(request, f"Not done: {_problems(form)}")
        return _queue_answer(request, status=400, bulk_form=form)
    try:
        done, refused = form.save(request.user)
    except Forbidden as exc:
        return render(request, "approvals/error.html", {"message": exc.message}, status=403)
    verb = "Approved" if form.cleaned_data["decision"] == "approve" else "Rejected"
    summary = f"{verb} {done} of {done + len(refused)}."
    summary += " Refused: " + "; ".join(refused) if refused else ""
    if request.htmx:
        return _toast(_queue_answer(request), summary, "error" if refused else "success")
    (messages.warning if refused else messages.success)(request, summary)
    return _see_other(safe_back_url(request, reverse("console:queue")))


def _queue_answer(request: HttpRequest, status: int = 200, **extra) -> HttpResponse:
    template = "approvals/queue.html#queue" if request.htmx else "approvals/queue.html"
    context = {**queue_context(request, queue_sets()), **extra}
    return render(request, template, context, status=status)
