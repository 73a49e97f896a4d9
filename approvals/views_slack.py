"""``POST /integrations/slack/interactions``: Slack's clicks on a message's buttons.

Slack signs every request with the app's signing secret; an unsigned, mis-signed or
older than five minutes (a replay) request is refused before anything is read. The
Slack member is mapped to a console user (``approvals.slack.console_user``); one
mapped to nobody decides nothing and is told so. Approve decides at once, bound to
the ``args_hash`` the button showed; Reject opens a modal that asks for the note, and
its submission decides. Both through ``approvals/decisions.py``, so the console's
rules (permission, state, deadline, hash) hold as they are; the message is updated
by the decision's audit event (``approvals.slack.sync_after_commit``).
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.http import HttpResponse, HttpResponseBadRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier

from approvals.decisions import approve_effect, reject_effect
from approvals.slack import (
    APPROVE,
    NOTE,
    REJECT,
    REJECT_MODAL,
    console_url,
    console_user,
    escape,
    parse_button_value,
    slack_enabled,
    web_client,
)
from runs.errors import JournalError
from runs.models import Effect
from startsafe.logs import kv

logger = logging.getLogger("startsafe.slack")

UNMAPPED = (
    "Your Slack account is not linked to a startsafe user, so nothing was decided. "
    "An admin can link it (Slack user mappings), or decide in the console."
)


@csrf_exempt
@require_POST
def interactions(request):
    if not slack_enabled():
        return HttpResponse(status=404)
    # Signature and timestamp (at most five minutes off) as Slack specifies them,
    # over the raw body, before the body is parsed.
    verifier = SignatureVerifier(settings.STARTSAFE["SLACK_SIGNING_SECRET"])
    if not verifier.is_valid_request(request.body, request.headers):
        logger.warning(kv("slack_signature_refused"))
        return HttpResponse("Invalid signature.", status=401, content_type="text/plain")
    try:
        payload = json.loads(request.POST["payload"])
    except (KeyError, ValueError):
        return HttpResponseBadRequest("No payload.", content_type="text/plain")
    kind = payload.get("type")
    if kind == "block_actions":
        return _button_clicked(payload)
    if kind == "view_submission" and (payload.get("view") or {}).get("callback_id") == REJECT_MODAL:
        return _reject_submitted(payload)
    return HttpResponse(status=200)  # nothing else is ours to answer


def _button_clicked(payload: dict) -> HttpResponse:
    action = (payload.get("actions") or [{}])[0]
    action_id = action.get("action_id")
    if action_id not in (APPROVE, REJECT):
        return HttpResponse(status=200)  # "Open in console" is a link: nothing to do
    parsed = parse_button_value(action.get("value", ""))
    if parsed is None:
        return HttpResponseBadRequest("Not a startsafe button.", content_type="text/plain")
    effect_id, args_hash = parsed
    member = (payload.get("user") or {}).get("id", "")
    channel = (payload.get("channel") or {}).get("id") or (payload.get("container") or {}).get(
        "channel_id", ""
    )
    client = web_client()
    user = console_user(member, client)
    if user is None:
        _tell(client, channel, member, UNMAPPED, effect_id)
        return HttpResponse(status=200)
    if action_id == REJECT:
        _open_reject_modal(client, payload.get("trigger_id", ""), effect_id, args_hash)
        return HttpResponse(status=200)
    try:
        approve_effect(user, effect_id, args_hash=args_hash)
    except JournalError as exc:
        _tell(client, channel, member, escape(f"Not approved: {exc.message}"), effect_id)
    return HttpResponse(status=200)


def _reject_submitted(payload: dict) -> HttpResponse:
    view = payload["view"]
    parsed = parse_button_value(view.get("private_metadata", ""))
    if parsed is None:
        return HttpResponseBadRequest("Not a startsafe modal.", content_type="text/plain")
    effect_id, args_hash = parsed
    values = (view.get("state") or {}).get("values") or {}
    note = ((values.get(NOTE) or {}).get(NOTE) or {}).get("value") or ""
    user = console_user((payload.get("user") or {}).get("id", ""))
    if user is None:
        return _modal_error(UNMAPPED)
    try:
        reject_effect(user, effect_id, args_hash=args_hash, note=note)
    except JournalError as exc:
        return _modal_error(f"Not rejected: {exc.message}")
    return HttpResponse(status=200)  # an empty 200 closes the modal


def _modal_error(message: str) -> JsonResponse:
    # Shown under the note's field; the modal stays open.
    return JsonResponse({"response_action": "errors", "errors": {NOTE: message}})


def _open_reject_modal(client, trigger_id: str, effect_id, args_hash: str) -> None:
    effect = Effect.objects.filter(pk=effect_id).only("tool", "preview").first()
    what = f"*{escape(effect.tool)}*: {escape(effect.preview[:300])}" if effect else "this effect"
    view = {
        "type": "modal",
        "callback_id": REJECT_MODAL,
        "private_metadata": f"{effect_id}:{args_hash}",
        "title": {"type": "plain_text", "text": "Reject"},
        "submit": {"type": "plain_text", "text": "Reject"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"Reject {what}? It will never run."},
            },
            {
                "type": "input",
                "block_id": NOTE,
                "label": {"type": "plain_text", "text": "Why (the agent is told)"},
                "element": {"type": "plain_text_input", "action_id": NOTE, "multiline": True},
            },
        ],
    }
    try:
        client.views_open(trigger_id=trigger_id, view=view)
    except (SlackApiError, OSError) as exc:
        logger.warning(kv("slack_views_open_failed", effect=effect_id, error=str(exc)[:200]))


def _tell(client, channel: str, member: str, text: str, effect_id) -> None:
    """A message only the clicking member sees, with the console's link if known."""
    if url := console_url(effect_id):
        text += f" <{url}|Open in console>"
    try:
        client.chat_postEphemeral(channel=channel, user=member, text=text)
    except (SlackApiError, OSError) as exc:
        logger.warning(kv("slack_ephemeral_failed", effect=effect_id, error=str(exc)[:200]))
