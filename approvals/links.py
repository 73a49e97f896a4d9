"""Signed e-mail links: approve, reject or mark done from the notification e-mail.

product.md, "Operators where they are": a link is signed (Django's signing, with
the server's SECRET_KEY), expires (``EMAIL_LINK_TTL``, never past the effect's
deadline), is bound to one recipient (a console user) and one version of one effect
(its ``args_hash``), and is single use (``EmailLinkUse``, written in the decision's
transaction). Following a link decides nothing: its page asks to confirm, and the
decision is a POST by the signed-in recipient, through the console's own rules
(approvals/decisions.py), so every rule of the console holds here too.

Each refusal is a ``LinkRefused`` with the status its page answers:

- 400 the link is not one this server signed (tampered, truncated);
- 410 it expired, or it was used already;
- 403 another user is signed in;
- 409 (from the rules) the effect changed since the e-mail (a stale ``args_hash``),
  or its state no longer allows the action (decided already, expired).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from approvals import decisions
from approvals.models import EmailLinkUse
from runs.errors import JournalError
from runs.models import Effect

SALT = "startsafe.approvals.email-link"
# The actions a link may carry, in the order the e-mail lists them.
LINK_ACTIONS = ("approve", "reject", "mark_done")
LABELS = {"approve": "Approve", "reject": "Reject", "mark_done": "Mark done"}
# Added to the decision's note, so the audit trail says where it was taken.
VIA = "via e-mail link"


class LinkRefused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Link:
    effect_id: str
    user_id: int
    args_hash: str
    action: str
    nonce: str
    expires_at: datetime


def _ttl() -> int:
    return settings.STARTSAFE["EMAIL_LINK_TTL"]


def link_expiry(effect: Effect, now: datetime) -> datetime:
    """``EMAIL_LINK_TTL`` from now, or the effect's deadline if that comes first."""
    expires = now + timedelta(seconds=_ttl())
    if effect.approval_expires_at is not None:
        expires = min(expires, effect.approval_expires_at)
    return expires


def make_token(effect: Effect, user, action: str, now: datetime | None = None) -> str:
    """A signed token naming the effect, its current version, the recipient and the
    action; the nonce makes each link its own (and its use recordable once)."""
    if action not in LINK_ACTIONS:
        raise ValueError(f"No link for {action!r}.")
    now = now or timezone.now()
    payload = {
        "e": str(effect.pk),
        "u": user.pk,
        "h": effect.args_hash,
        "a": action,
        "n": secrets.token_urlsafe(16),
        "x": int(link_expiry(effect, now).timestamp()),
    }
    return signing.TimestampSigner(salt=SALT).sign_object(payload)


def link_path(token: str) -> str:
    return reverse("console:link", args=[token])


def read_token(token: str, now: datetime | None = None) -> Link:
    """The link a token carries, or ``LinkRefused`` (400 not ours, 410 expired)."""
    now = now or timezone.now()
    try:
        # max_age: the signer's own clock, a bound even if the payload's were wrong.
        payload = signing.TimestampSigner(salt=SALT).unsign_object(token, max_age=_ttl())
    except signing.SignatureExpired:
        raise LinkRefused(410, "This link expired: open the effect in the console.") from None
    except signing.BadSignature:
        raise LinkRefused(
            400, "This link is not valid: it was changed or cut short. Use the console."
        ) from None
    try:
        link = Link(
            effect_id=str(payload["e"]),
            user_id=int(payload["u"]),
            args_hash=str(payload["h"]),
            action=str(payload["a"]),
            nonce=str(payload["n"]),
            expires_at=datetime.fromtimestamp(int(payload["x"]), tz=UTC),
        )
    except (KeyError, TypeError, ValueError):  # signed by us, but not a link
        raise LinkRefused(400, "This link is not valid. Use the console.") from None
    if link.action not in LINK_ACTIONS:
        raise LinkRefused(400, "This link is not valid. Use the console.")
    if now >= link.expires_at:
        raise LinkRefused(410, "This link expired: open the effect in the console.")
    return link


def check_link(token: str, user, now: datetime | None = None) -> Link:
    """Everything about the link itself, for the page and the decision alike: it is
    ours and in time (``read_token``), for this user (403), not used yet (410)."""
    link = read_token(token, now)
    if user.pk != link.user_id:
        raise LinkRefused(
            403,
            "This link was sent to another person: it decides only for them. "
            "Sign out, or decide in the console.",
        )
    if EmailLinkUse.objects.filter(nonce=link.nonce).exists():
        raise LinkRefused(410, "This link was used already: it decides once.")
    return link


def with_via(note: str, action: str) -> str:
    """The operator's note with where it came from. An empty note stays empty where
    the rule requires one, so the rule still refuses it (400)."""
    note = (note or "").strip()
    if note:
        return f"{note} ({VIA})"
    return VIA if action == "approve" else ""


def decide_by_link(
    token: str, user, *, note: str = "", final: bool = False, now: datetime | None = None
) -> Effect:
    """Take the link's decision for ``user``, once.

    1. The link's own checks (``check_link``).
    2. In one transaction: the use is recorded (the unique nonce: a concurrent second
       use waits for this transaction, then fails its INSERT and is refused 410), then
       the console's rule decides, bound to the link's ``args_hash``.
    3. A decision the rule refuses uses nothing up: the use is taken back, and what
       the rule itself recorded (an effect found past its deadline, recorded expired)
       stays, as in the console. The rule's refusal is raised (JournalError).
    """
    now = now or timezone.now()
    link = check_link(token, user, now)
    rule_kwargs: dict[str, Any] = {"args_hash": link.args_hash, "note": with_via(note, link.action)}
    if link.action == "reject":
        rule_kwargs["final"] = final
    rule = {
        "approve": decisions.approve_effect,
        "reject": decisions.reject_effect,
        "mark_done": decisions.mark_effect_done,
    }[link.action]
    refusal = None
    with transaction.atomic():
        try:
            with transaction.atomic():
                EmailLinkUse.objects.create(
                    nonce=link.nonce,
                    effect_id=link.effect_id,
                    user=user,
                    action=link.action,
                    used_at=now,
                )
        except IntegrityError:
            raise LinkRefused(410, "This link was used already: it decides once.") from None
        try:
            effect = rule(user, link.effect_id, now=now, **rule_kwargs)
        except JournalError as exc:  # a refusal; anything else rolls it all back
            refusal = exc
            EmailLinkUse.objects.filter(nonce=link.nonce).delete()
    if refusal is not None:
        raise refusal
    return effect


def actions_for(effect: Effect, user, now: datetime) -> list[str]:
    """The link actions ``user`` may take on ``effect`` now (the console's rule)."""
    allowed = decisions.allowed_actions(effect, user, now)
    return [action for action in LINK_ACTIONS if action in allowed]
