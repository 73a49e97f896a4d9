"""A fake, seeded "LLM" that plans the support agent's tool calls.

Like a real model, it is not deterministic across attempts: seeded with
``(seed, attempt)``, each attempt rewrites the subject lines and wording and
changes the order of its calls. That is the point of the example: "step 3" is not
a stable coordinate, and a key hashed from these arguments would change every
time. What stays the same is the intent — which message is answered, which file is
imported, which campaign is sent — and that is what the tools key on.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATASET = Path(__file__).resolve().parent / "data" / "winter-eu-segment.csv"

_REPLY_SUBJECTS = [
    "Re: Your winter plan question",
    "Re: Question about the winter offer",
    "About your message: the winter plan",
    "Re: winter plan — here is what we found",
]
_REPLY_OPENERS = [
    "Thanks for reaching out, {name}.",
    "Hello {name}, thank you for your patience.",
    "Hi {name}! Good question.",
    "Dear {name}, thanks for writing to us.",
]
_REPLY_BODIES = [
    "Your {plan} plan includes the winter discount; it applies at the next renewal.",
    "The winter discount is part of your {plan} plan and shows on your next invoice.",
    "Good news: on the {plan} plan the winter offer is applied automatically.",
]
_CAMPAIGN_SUBJECTS = [
    "Winter sale: 20% off for EU customers",
    "It's winter — 20% off everything",
    "Our winter offer is here",
    "20% off this winter, just for you",
]
_IMPORT_NOTES = ["segment for the winter campaign", "EU winter list", "winter-eu recipients"]


@dataclass(frozen=True)
class Ticket:
    """A support ticket and the inbound message that opened it."""

    ticket_id: str
    message_id: str  # the provider's internetMessageId of the inbound e-mail
    customer_email: str
    campaign_id: str = "2026-winter-eu"
    dataset: Path = DATASET


def ticket_for(ticket_id: str) -> Ticket:
    """The (fake) inbox's ticket: its inbound message id is stable across attempts."""
    return Ticket(
        ticket_id=ticket_id,
        message_id=f"<{ticket_id}.inbound@mail.example.com>",
        customer_email="ana.silva@example.eu",
    )


@dataclass
class FakeLLM:
    """Plans one attempt's tool calls; ``seed`` and ``attempt`` fix its choices."""

    seed: int
    attempt: int
    heard: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}:{self.attempt}")

    def plan(self, ticket: Ticket) -> list[str]:
        """The order of this attempt's calls: look the customer up, then the three
        effects in an order that differs from one attempt to the next."""
        orders = list(itertools.permutations(["send_reply", "import_dataset", "send_campaign"]))
        return ["lookup_customer", *orders[(self.seed * 7 + self.attempt) % len(orders)]]

    def arguments(self, tool: str, ticket: Ticket, customer: dict[str, Any]) -> dict[str, Any]:
        """The arguments it generates for ``tool`` this time (reworded every attempt)."""
        rng = self.rng
        name = customer.get("name", "there")
        if tool == "lookup_customer":
            return {"email": ticket.customer_email}
        if tool == "send_reply":
            body = " ".join(
                [
                    rng.choice(_REPLY_OPENERS).format(name=name),
                    rng.choice(_REPLY_BODIES).format(plan=customer.get("plan", "current")),
                    f"(drafted on attempt {self.attempt})",
                ]
            )
            return {
                "message_id": ticket.message_id,
                "to": ticket.customer_email,
                "subject": rng.choice(_REPLY_SUBJECTS),
                "body": body,
            }
        if tool == "import_dataset":
            return {
                "path": str(ticket.dataset),
                "table": "campaign_recipients",
                "note": rng.choice(_IMPORT_NOTES),
            }
        if tool == "send_campaign":
            return {
                "campaign_id": ticket.campaign_id,
                "segment": "EU",
                "subject": rng.choice(_CAMPAIGN_SUBJECTS),
                "recipients": 240,
            }
        raise ValueError(f"the model knows no tool {tool!r}")

    def hear(self, note: str) -> None:
        """Take a rejection note into account (a real model would change course)."""
        self.heard.append(note)
