"""An agent that answers a support ticket, and survives being killed half-way.

    python examples/support_agent.py --base-url http://127.0.0.1:8000 \\
        --token "$STARTSAFE_TOKEN" --ticket ticket-4812 --ledger var/ledger.jsonl \\
        [--crash-after N] [--kill-at POINT[:TOOL]] [--think SECONDS] [--seed S] \\
        [--approval-timeout SECONDS] [--supersede]

Four tools, each keyed from stable intent (never from what the model wrote):

- ``lookup_customer`` — a read: journaled, never gated;
- ``send_reply`` — keyed on the inbound message's provider id
  (``outlook:message:<internetMessageId>``); reconciles by searching the ledger;
- ``import_dataset`` — keyed on the SHA-256 of the file's content; reconciles too;
- ``send_campaign`` — keyed on its campaign id, needs a person's approval, and has no
  lookup: when its outcome is unknown, a person decides.

**An exception is not proof that nothing happened.** A tool that raises is not
reported: its effect stays in flight, becomes ``unknown`` when the attempt ends,
and the next run reconciles it (or a person decides), so it never happens twice.
A tool says "nothing was sent" only by raising ``NotPerformed`` (``import_dataset``
does, when it cannot read its file); that effect is reported ``failed`` and the
next run performs it.

A fake, seeded "LLM" rewrites the arguments and reorders the calls on every attempt.
Side effects go to the ledger (JSON lines) so ``count_ledger.py`` can count
duplicates. ``--crash-after N`` kills the process (``os._exit(137)``) right after the
N-th effect ran and before it was reported: the worst moment. ``--kill-at`` kills it
with SIGKILL at any point of the protocol instead (``kill_points.py`` lists them), and
``--think`` makes the model take that long before each call.

Exit codes: 0 answered (or already answered), 3 a person must decide first (see the
printed addresses), 4 another attempt is live, 5 the restart is blocked, 6 a tool sent
nothing (``NotPerformed``: run again), 137 crashed.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ledger  # noqa: E402
from fake_llm import FakeLLM, Ticket, ticket_for  # noqa: E402
from kill_points import KillAt, parse_kill_point  # noqa: E402

from startsafe_client import (  # noqa: E402
    AlreadyRunning,
    ApprovalTimeout,
    Client,
    EffectBlocked,
    NotPerformed,
    OutcomeUnknown,
    Reconciliation,
    RestartBlocked,
    Run,
    RunFinished,
    Tool,
    Waiting,
    content_key_of_file,
    effect,
    intent_key,
    provider_key,
    read,
)

CRASH_EXIT = 137
NEEDS_PERSON_EXIT = 3
ALREADY_RUNNING_EXIT = 4
RESTART_BLOCKED_EXIT = 5
NOT_PERFORMED_EXIT = 6

# The fake CRM the read looks customers up in.
CUSTOMERS = {
    "ana.silva@example.eu": {"name": "Ana", "plan": "team", "country": "PT", "since": "2023-04"},
}


class Crasher:
    """Kills the process right after the N-th effect ran, before it is reported."""

    def __init__(self, after: int | None) -> None:
        self.after = after
        self.performed = 0

    def effect_performed(self, tool: str) -> None:
        self.performed += 1
        if self.after is not None and self.performed >= self.after:
            print(f"!! crashing after effect {self.performed} ({tool}), before reporting it")
            sys.stdout.flush()
            os._exit(CRASH_EXIT)


class NeedsPerson(Exception):
    """Some effects wait for a person; the attempt ends failed so a restart resumes them."""


def declare_tools(client: Client, ledger_path: Path, crasher: Crasher) -> dict[str, Tool]:
    """The agent's four tools, declared once with their kind, key rule and approvals."""

    @client.tool(read())
    def lookup_customer(email: str) -> dict[str, Any]:
        return {"email": email, **CUSTOMERS.get(email, {"name": "there", "plan": "free"})}

    def reply_in_mailbox(args: dict[str, Any], key: str | None) -> Reconciliation:
        # The ledger is read in full, as it is now: the provider's latest state,
        # so "not sent" is a fact, not a lagging search index.
        found = ledger.find(ledger_path, "reply", args["message_id"])
        if found:
            line, entry = found
            return Reconciliation.done(
                f"sent items: a reply to {args['message_id']} at line {line} ({entry['at']})",
                {"in_reply_to": args["message_id"], "ledger_line": line},
            )
        return Reconciliation.not_done(
            f"sent items searched in full: no reply to {args['message_id']}"
        )

    @client.tool(
        effect(
            key=lambda args: provider_key("outlook", "message", args.get("message_id")),
            preview=lambda args: f"Reply {args['subject']!r} to {args['to']}",
            reconcile=reply_in_mailbox,
        )
    )
    def send_reply(message_id: str, to: str, subject: str, body: str) -> dict[str, Any]:
        ledger.append(
            ledger_path, "reply", message_id, {"to": to, "subject": subject, "body": body}
        )
        crasher.effect_performed("send_reply")
        return {"in_reply_to": message_id, "subject": subject}

    def import_in_warehouse(args: dict[str, Any], key: str | None) -> Reconciliation | None:
        if not key:
            return None
        found = ledger.find(ledger_path, "import", key)
        if found:
            line, entry = found
            return Reconciliation.done(
                f"warehouse: dataset {key} imported at ledger line {line} ({entry['at']})",
                {"sha256": key, "rows": entry["details"].get("rows"), "ledger_line": line},
            )
        return Reconciliation.not_done(f"warehouse load log read in full: no import of {key}")

    @client.tool(
        effect(
            key=lambda args: content_key_of_file(args["path"]),
            preview=lambda args: f"Import {Path(args['path']).name} into {args['table']}",
            reconcile=import_in_warehouse,
        )
    )
    def import_dataset(path: str, table: str, note: str = "") -> dict[str, Any]:
        try:
            content = Path(path).read_bytes()
        except OSError as unreadable:
            # Nothing has reached the warehouse yet: say so, and the next run imports it.
            raise NotPerformed(f"cannot read {path}: {unreadable}") from unreadable
        # From here on an exception is not proof that nothing happened: it is not
        # reported, and the next run looks the import up in the warehouse's log.
        digest = "sha256:" + hashlib.sha256(content).hexdigest()
        rows = sum(1 for _ in csv.DictReader(io.StringIO(content.decode("utf-8"))))
        ledger.append(ledger_path, "import", digest, {"table": table, "rows": rows, "note": note})
        crasher.effect_performed("import_dataset")
        return {"sha256": digest, "rows": rows, "table": table}

    @client.tool(
        effect(
            key=lambda args: intent_key("campaign", campaign_id=args.get("campaign_id")),
            needs_approval=True,
            preview=lambda args: (
                f"Send {args['subject']!r} to {args['recipients']} recipients of segment "
                f"{args['segment']} (campaign {args['campaign_id']})"
            ),
            # No reconcile lookup: when its outcome is unknown, a person decides.
        )
    )
    def send_campaign(
        campaign_id: str, segment: str, subject: str, recipients: int
    ) -> dict[str, Any]:
        ledger.append(
            ledger_path,
            "campaign",
            campaign_id,
            {"segment": segment, "subject": subject, "recipients": recipients},
        )
        crasher.effect_performed("send_campaign")
        return {"campaign_id": campaign_id, "subject": subject, "recipients": recipients}

    return {
        tool.name: tool for tool in (lookup_customer, send_reply, import_dataset, send_campaign)
    }


def answer_ticket(
    run: Run, tools: dict[str, Tool], ticket: Ticket, llm: FakeLLM, think: float = 0.0
) -> list[str]:
    """Follow the model's plan; return what waits for a person (empty when all is done)."""
    customer: dict[str, Any] = {}
    waiting: list[str] = []
    for name in llm.plan(ticket):
        time.sleep(think)  # a real model takes seconds per step; heartbeats go on meanwhile
        args = llm.arguments(name, ticket, customer)
        try:
            result = run.call(tools[name], **args)
        except EffectBlocked as blocked:
            # A rejection's note is written for the model: hand it back.
            llm.hear(blocked.note)
            print(f"  {name}: blocked ({blocked.effect.get('status')}): {blocked.note}")
            continue
        except (OutcomeUnknown, ApprovalTimeout) as stop:
            print(f"  {name}: {stop.code}: {stop.message}")
            waiting.append(f"{name}: decide at {run.client.console_url(str(stop.effect_id))}")
            continue
        action = run.journal[-1].get("action") if run.journal else "?"
        if name == "lookup_customer":
            customer = result
        print(f"  {name}: {action} -> {result}")
    return waiting


def say_waiting(waiting: Waiting) -> None:
    """The client's ``on_wait``: once per call that waits, say where a person decides."""
    print(
        f"  {waiting.tool}: waiting ({waiting.status}, up to {waiting.timeout:g} s) for a "
        f"decision at {waiting.url}",
        flush=True,  # the wait may be long: show it now, even when stdout is a pipe
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Answer a support ticket through startsafe.")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default=os.environ.get("STARTSAFE_TOKEN"))
    parser.add_argument("--ticket", default="ticket-4812")
    parser.add_argument("--ledger", default="var/ledger.jsonl", type=Path)
    parser.add_argument("--crash-after", type=int, default=None, metavar="N")
    parser.add_argument(
        "--kill-at",
        type=parse_kill_point,
        default=None,
        metavar="POINT[:TOOL]",
        help="SIGKILL this process at a point of the protocol (see kill_points.py)",
    )
    parser.add_argument("--think", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--approval-timeout", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--poll-interval", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--heartbeat-timeout", type=int, default=15, metavar="SECONDS")
    parser.add_argument(
        "--supersede",
        action="store_true",
        help="take over a running attempt even if its heartbeat is fresh (you know it died); "
        "without it, only an attempt silent for longer than its heartbeat timeout is taken over",
    )
    return parser.parse_args(argv)


def say_why_it_stopped(stopped: Exception, ticket_id: str) -> int:
    """What a run that did not complete means to the person at the terminal, printed,
    and the command's exit code. Every example ends this way; any other exception
    is a framework's "a person must decide" (NeedsPerson)."""
    if isinstance(stopped, RunFinished):
        print(f"{ticket_id} is already answered: its run is finished.")
        return 0
    if isinstance(stopped, NotPerformed):
        print(f"not performed: {stopped}. Nothing was sent; run this command again.")
        return NOT_PERFORMED_EXIT
    if isinstance(stopped, AlreadyRunning):
        print(
            f"attempt {stopped.attempt} of {ticket_id} is still running (heartbeat at "
            f"{stopped.heartbeat_at}). If you know that process died, run again with --supersede."
        )
        return ALREADY_RUNNING_EXIT
    if isinstance(stopped, RestartBlocked):
        reasons = "; ".join(b.get("message", "") for b in stopped.verdict.get("blocking", []))
        print(f"restart blocked: {reasons}. An operator may allow it in the console.")
        return RESTART_BLOCKED_EXIT
    print(f"{stopped}\nDecide in the console, then run this command again.")
    return NEEDS_PERSON_EXIT


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    try:
        client = Client(
            options.base_url,
            options.token or "",
            approval_timeout=options.approval_timeout,
            poll_interval=options.poll_interval,
            poll_max_interval=max(options.poll_interval, 5.0),
            on_wait=say_waiting,
            transport=KillAt(*options.kill_at) if options.kill_at else None,
        )
    except ValueError as refused:  # the token (--token, or STARTSAFE_TOKEN) is empty
        print(f"support_agent.py: {refused}", file=sys.stderr)
        return 2
    tools = declare_tools(client, options.ledger, Crasher(options.crash_after))
    ticket = ticket_for(options.ticket)
    try:
        with client.run(
            ticket.ticket_id,
            title=f"Answer support ticket {ticket.ticket_id}",
            input={"ticket": ticket.ticket_id, "message_id": ticket.message_id},
            heartbeat_timeout=options.heartbeat_timeout,
            agent_version=f"support-agent/1 (fake LLM, seed {options.seed})",
            supersede=True if options.supersede else "stale",
        ) as run:
            notes = ", ".join(n["reason"] for n in run.verdict.get("notes", [])) or "none"
            print(f"run {run.id}: attempt {run.attempt} (verdict notes: {notes})")
            llm = FakeLLM(options.seed, run.attempt)
            waiting = answer_ticket(run, tools, ticket, llm, options.think)
            if waiting:
                raise NeedsPerson("waiting for a person: " + "; ".join(waiting))
    except (NeedsPerson, NotPerformed, AlreadyRunning, RestartBlocked, RunFinished) as stopped:
        return say_why_it_stopped(stopped, ticket.ticket_id)
    finally:
        client.close()
    print(f"{ticket.ticket_id} answered: run completed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
