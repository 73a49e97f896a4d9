"""The console's POST actions: approve, reject, mark done, release, allow restart, abandon.

Every action is a plain form that works without JavaScript; htmx enhances it.
The order of checks is product.md's:

1. the form itself: a missing ``args_hash`` or note, or invalid JSON, is 400;
2. the id: one the user may not see is 404; then the role: 403;
3. the state, in ``approvals/decisions.py`` under a row lock: 409 with the page
   showing the current state (a stale hash shows the new content and its diff).

Success answers 303 back to the page the form came from, or, for htmx, the
re-rendered fragment (``fragment=row`` on the queue, ``detail`` on the pages)
with a toast in ``HX-Trigger``. A resubmit (double click, back button) meets the
new state and is refused with 409: it never decides twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import trigger_client_event

from approvals import decisions
from approvals.forms import checkbox, optional_json, optional_text, parse_json, required_text
from approvals.views import base_context, effect_context, queue_context, run_context
from approvals.views_common import (
    _effect_for_user,
    _run_for_user,
    diff_lines,
    effect_actions_for,
    pretty,
    queue_sets,
    safe_back_url,
    verdict_reasons_for,
)
from runs.errors import Forbidden, InvalidRequest, JournalError, NotAllowed, StaleArgs
from runs.models import Effect, EffectStatus, EffectVersion, Run

# --- Answers ------------------------------------------------------------------


def _see_other(url: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(url)
    response.status_code = 303  # a POST's answer is fetched with GET
    return response


def _toast(response: HttpResponse, message: str, level: str) -> HttpResponse:
    return trigger_client_event(response, "toast", {"message": message, "level": level})


def _fragment(request: HttpRequest) -> str:
    return "row" if request.POST.get("fragment") == "row" else "detail"


def _effect_answer(
    request: HttpRequest, effect_id: Any, message: str, *, status: int = 200, stale=None
) -> HttpResponse:
    """Render the effect as it is now: the row or panel for htmx, else the page."""
    try:
        effect = _effect_for_user(request, effect_id)
    except (Http404, ValidationError):
        return render(request, "approvals/error.html", {"message": message}, status=status or 404)
    error = message if status >= 400 else None
    if request.htmx and _fragment(request) == "row":
        effect.actions = effect_actions_for(effect, request.user)
        context = {"effect": effect, "error": error, "request": request}
        response = render(
            request, "approvals/_effect_row.html", context, status=status, using="jinja2"
        )
    else:
        template = (
            "approvals/effect.html#effect-detail" if request.htmx else "approvals/effect.html"
        )
        context = effect_context(request, effect, error=error, stale=stale)
        response = render(request, template, context, status=status)
    if request.htmx:
        _toast(response, message, "error" if error else "success")
    return response


def _run_answer(request: HttpRequest, run_id: Any, message: str, *, status: int = 200):
    try:
        run = _run_for_user(request, run_id)
    except (Http404, ValidationError):
        return render(request, "approvals/error.html", {"message": message}, status=status)
    error = message if status >= 400 else None
    if request.htmx and _fragment(request) == "row":
        run.reasons = verdict_reasons_for([run])[run.pk]
        context = {
            "run": run,
            "error": error,
            "user_can_decide": decisions.can_decide(request.user),
        }
        response = render(
            request, "approvals/_run_row.html", context, status=status, using="jinja2"
        )
    else:
        template = "approvals/run.html#run-detail" if request.htmx else "approvals/run.html"
        response = render(
            request, template, {**run_context(request, run), "error": error}, status=status
        )
    if request.htmx:
        _toast(response, message, "error" if error else "success")
    return response


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


# --- Effect actions -----------------------------------------------------------


def _effect_action(
    request: HttpRequest,
    effect_id: Any,
    *,
    read_form: Callable[[HttpRequest], dict],
    decide: Callable[..., Effect],
    done: Callable[[Effect], str],
) -> HttpResponse:
    """The shared control flow of the four effect actions (see the module's steps)."""
    try:
        args_hash = required_text(request, "args_hash")
        fields = read_form(request)
    except InvalidRequest as exc:
        return _effect_answer(request, effect_id, exc.message, status=400)
    try:
        exists = Effect.objects.filter(pk=effect_id).exists()
    except ValidationError:
        exists = False
    if not exists:
        raise Http404("No such effect.")
    if not decisions.can_decide(request.user):
        return _effect_answer(
            request, effect_id, "You may not decide: this needs the operator role.", status=403
        )
    try:
        effect = decide(request.user, effect_id, args_hash=args_hash, **fields)
    except StaleArgs as exc:
        stale = _stale_diff(effect_id, args_hash)
        return _effect_answer(request, effect_id, exc.message, status=409, stale=stale)
    except JournalError as exc:
        return _effect_answer(request, effect_id, exc.message, status=exc.status)
    message = done(effect)
    if request.htmx:
        return _effect_answer(request, effect_id, message)
    messages.success(request, message)
    return _see_other(safe_back_url(request, reverse("console:effect", args=[effect_id])))


def _approve_form(request: HttpRequest) -> dict:
    return {
        "note": optional_text(request, "note"),
        "edited_args": optional_json(request, "args", object_only=True),
    }


def _approved_message(effect: Effect) -> str:
    if effect.status == EffectStatus.APPROVED:
        return f"Approved {effect.tool}: the agent may claim it now."
    have, need = len(effect.current_approvals), effect.approvals_required
    return f"Your approval of {effect.tool} is recorded ({have} of {need})."


@require_POST
@login_required
def approve(request: HttpRequest, effect_id) -> HttpResponse:
    return _effect_action(
        request,
        effect_id,
        read_form=_approve_form,
        decide=decisions.approve_effect,
        done=_approved_message,
    )


@require_POST
@login_required
def reject(request: HttpRequest, effect_id) -> HttpResponse:
    return _effect_action(
        request,
        effect_id,
        read_form=lambda r: {"note": required_text(r, "note"), "final": checkbox(r, "final")},
        decide=decisions.reject_effect,
        done=lambda e: (
            f"Rejected {e.tool}" + (" for good." if (e.decision or {}).get("final") else ".")
        ),
    )


@require_POST
@login_required
def mark_done(request: HttpRequest, effect_id) -> HttpResponse:
    return _effect_action(
        request,
        effect_id,
        read_form=lambda r: {
            "note": required_text(r, "note"),
            # An effect's result is a JSON object everywhere (api.md: complete and
            # reconcile take "result"? (object); the Effect schema says object), so
            # the agent that skips it gets what a tool would have returned.
            "result": optional_json(r, "result", object_only=True),
        },
        decide=decisions.mark_effect_done,
        done=lambda e: f"Marked {e.tool} done.",
    )


@require_POST
@login_required
def release(request: HttpRequest, effect_id) -> HttpResponse:
    return _effect_action(
        request,
        effect_id,
        read_form=lambda r: {"note": required_text(r, "note")},
        decide=decisions.release_effect,
        done=lambda e: f"Released {e.tool}: it is {e.status} and may be claimed again.",
    )


# --- Approve with edits: the confirm step -------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
def edit(request: HttpRequest, effect_id) -> HttpResponse:
    """Edit the arguments as JSON, see the diff, then confirm (which posts to approve).

    GET shows the editor. POST validates the JSON and shows the diff with a confirm
    form bound to the hash the operator started from; nothing changes until then.
    """
    effect = _effect_for_user(request, effect_id)
    if not decisions.can_decide(request.user):
        return _effect_answer(
            request, effect_id, "You may not decide: this needs the operator role.", status=403
        )
    context = base_context(request, effect=effect)
    status = 200
    if request.method == "GET":
        context.update(args_text=pretty(effect.args), args_hash=effect.args_hash)
    else:
        args_hash = request.POST.get("args_hash", "")
        raw = request.POST.get("args", "")
        context.update(args_text=raw, args_hash=args_hash, note=request.POST.get("note", ""))
        try:
            if not args_hash:
                raise InvalidRequest("args_hash is required.")
            edited = parse_json(raw, "args", object_only=True)
        except InvalidRequest as exc:
            context["error"] = exc.message
            status = 400
        else:
            if args_hash != effect.args_hash:
                context["error"] = str(
                    StaleArgs("The arguments changed since you opened the editor.").message
                )
                context["stale"] = _stale_diff(effect_id, args_hash)
                status = 409
            else:
                context["review"] = {
                    "diff": diff_lines(effect.args, edited),
                    "args_json": pretty(edited),
                    "unchanged": edited == effect.args,
                }
    if effect.status != EffectStatus.AWAITING_APPROVAL and status == 200:
        context["error"] = str(
            NotAllowed(f"This effect is {effect.status}: it can no longer be approved.").message
        )
        status = 409
    template = "approvals/edit.html#edit-review" if request.htmx else "approvals/edit.html"
    return render(request, template, context, status=status)


# --- Bulk decisions on the queue ----------------------------------------------


@require_POST
@login_required
def bulk(request: HttpRequest) -> HttpResponse:
    """Approve or reject several awaiting effects of one tool, each bound to its own hash.

    Each effect is decided on its own (its own lock, hash check and audit event), so
    one stale or already-decided effect is refused without undoing the others.
    """
    decision = request.POST.get("decision", "")
    ids = request.POST.getlist("effect")
    try:
        if decision not in ("approve", "reject"):
            raise InvalidRequest("Choose approve or reject.")
        if not ids:
            raise InvalidRequest("Select at least one effect.")
        hashes = {}
        for effect_id in ids:
            hashes[effect_id] = required_text(request, f"args_hash_{effect_id}")
        note = (
            required_text(request, "note")
            if decision == "reject"
            else optional_text(request, "note")
        )
        final = checkbox(request, "final")
        try:
            found = list(Effect.objects.filter(pk__in=ids).values_list("pk", "tool"))
        except ValidationError:
            raise InvalidRequest("An effect id is not valid.") from None
    except InvalidRequest as exc:
        messages.error(request, exc.message)
        return render(request, "approvals/error.html", {"message": exc.message}, status=400)
    if len(found) != len(set(ids)):
        raise Http404("No such effect.")
    if len({tool for _, tool in found}) > 1:
        message = "A bulk decision applies to effects of one tool: select one tool's effects."
        return render(request, "approvals/error.html", {"message": message}, status=400)
    if not decisions.can_decide(request.user):
        message = "You may not decide: this needs the operator role."
        return render(request, "approvals/error.html", {"message": message}, status=403)
    done, refused = 0, []
    for effect_id in ids:
        try:
            if decision == "approve":
                decisions.approve_effect(
                    request.user, effect_id, args_hash=hashes[effect_id], note=note
                )
            else:
                decisions.reject_effect(
                    request.user, effect_id, args_hash=hashes[effect_id], note=note, final=final
                )
            done += 1
        except (JournalError, Forbidden) as exc:
            refused.append(f"{effect_id}: {exc.message}")
    verb = "Approved" if decision == "approve" else "Rejected"
    summary = f"{verb} {done} of {len(ids)}." + (
        " Refused: " + "; ".join(refused) if refused else ""
    )
    if request.htmx:
        response = render(
            request, "approvals/queue.html#queue", queue_context(request, queue_sets())
        )
        return _toast(response, summary, "error" if refused else "success")
    (messages.warning if refused else messages.success)(request, summary)
    return _see_other(safe_back_url(request, reverse("console:queue")))


# --- Run actions --------------------------------------------------------------


def _run_action(request: HttpRequest, run_id: Any, decide, done: str) -> HttpResponse:
    try:
        note = required_text(request, "note")
    except InvalidRequest as exc:
        return _run_answer(request, run_id, exc.message, status=400)
    try:
        exists = Run.objects.filter(pk=run_id).exists()
    except ValidationError:
        exists = False
    if not exists:
        raise Http404("No such run.")
    if not decisions.can_decide(request.user):
        return _run_answer(
            request, run_id, "You may not decide: this needs the operator role.", status=403
        )
    try:
        decide(request.user, run_id, note=note)
    except JournalError as exc:
        return _run_answer(request, run_id, exc.message, status=exc.status)
    if request.htmx:
        return _run_answer(request, run_id, done)
    messages.success(request, done)
    return _see_other(safe_back_url(request, reverse("console:run", args=[run_id])))


@require_POST
@login_required
def allow_restart(request: HttpRequest, run_id) -> HttpResponse:
    return _run_action(
        request, run_id, decisions.allow_restart, "Restart allowed: the next start goes through."
    )


@require_POST
@login_required
def abandon(request: HttpRequest, run_id) -> HttpResponse:
    return _run_action(request, run_id, decisions.abandon_run, "Run abandoned.")
