"""Demo data for ``make run``: runs in every state an operator meets.

Everything is made through the lifecycle and decision functions (never by writing
rows directly), so the demo's audit trail, versions and verdicts are the real ones.
Times are set in the past so that the runs already look stale and the sweep's
interruption can be applied to exactly the runs that need it.
"""

from __future__ import annotations

import base64
from datetime import timedelta

from django.contrib.auth.models import Group, User
from django.utils import timezone
from django.utils.crypto import salted_hmac

from approvals.decisions import approve_effect, reject_effect
from runs.calls import record_call
from runs.lifecycle import finish_run, start_run
from runs.models import TOKEN_PREFIX, Agent, Run
from runs.outcomes import complete_effect

DEMO_AGENT = "demo-agent"
DEMO_REVIEWER = "demo-reviewer"


def demo_token() -> str:
    """The demo agent's token, the same every time ``make run`` seeds.

    A random one per seeding made the token printed by the last ``make run`` answer
    401 after a restart. Derived from SECRET_KEY (an HMAC, with a salt of its own), it
    stays the same while the key does (var/dev.env keeps make run's key), each clone
    has its own, and it is as secret as the key. Same shape as a random token.
    """
    digest = salted_hmac("startsafe.demo.agent-token", DEMO_AGENT, algorithm="sha256").digest()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _reviewer() -> User:
    """A second operator, so one campaign can show one approval of the two it needs."""
    user, created = User.objects.get_or_create(
        username=DEMO_REVIEWER, defaults={"email": "reviewer@example.com"}
    )
    if created:
        user.set_unusable_password()
        user.save()
    user.groups.add(Group.objects.get(name="operators"))
    return user


def _interrupt(run: Run, now) -> None:
    from runs.sweep import SweepReport, interrupt_stale_run

    interrupt_stale_run(run.pk, now, SweepReport())


def seed_demo_runs(agent: Agent) -> str:
    """Create the demo runs once; later calls leave them as they are."""
    if Run.objects.filter(agent=agent).exists():
        return "already seeded"
    reviewer = _reviewer()
    t0 = timezone.now() - timedelta(hours=3)

    def at(minutes: float):
        return t0 + timedelta(minutes=minutes)

    # 1. A campaign awaiting one approval.
    started = start_run(
        agent,
        "ticket-5310",
        title="Answer ticket 5310 and send the spring campaign",
        heartbeat_timeout=86400,
        now=at(150),
    )
    run = started.run.pk
    record_call(
        agent, run, attempt=1, tool="lookup_customer", kind="read",
        args={"customer_id": "c-1042"}, now=at(150),
    )  # fmt: skip
    record_call(
        agent, run, attempt=1, tool="send_campaign", kind="effect",
        args={"campaign_id": "2026-spring-nordics", "subject": "Spring sale",
              "segment": "Nordics"},
        key="campaign:2026-spring-nordics", key_source="intent", needs_approval=True,
        approval_ttl=86400, preview="Send 'Spring sale' to 12,408 recipients of segment Nordics",
        now=at(151),
    )  # fmt: skip

    # 2. A campaign that needs two approvers, one of whom already approved.
    started = start_run(
        agent, "newsletter-2026-02", title="February newsletter", heartbeat_timeout=86400,
        now=at(160),
    )  # fmt: skip
    recorded = record_call(
        agent, started.run.pk, attempt=1, tool="send_campaign", kind="effect",
        args={"campaign_id": "2026-02-newsletter", "subject": "What's new in February",
              "segment": "all-customers"},
        key="campaign:2026-02-newsletter", key_source="intent", needs_approval=True,
        approval_ttl=86400, approvals_required=2,
        preview="Send the February newsletter to 48,130 customers", now=at(161),
    )  # fmt: skip
    approve_effect(
        reviewer, recorded.effect.pk, args_hash=recorded.effect.args_hash,
        note="Copy checked with marketing.", now=at(165),
    )  # fmt: skip

    # 3. An interrupted run: an unkeyed payment was started (it blocks an automatic
    #    restart) and a keyed reply was in flight when the process died (unknown).
    started = start_run(
        agent, "refund-9120", title="Refund order 9120 and tell the customer",
        heartbeat_timeout=60, now=at(60),
    )  # fmt: skip
    run = started.run.pk
    record_call(
        agent, run, attempt=1, tool="issue_refund", kind="effect",
        args={"order": "9120", "amount_eur": 42.5}, now=at(60),
    )  # fmt: skip
    record_call(
        agent, run, attempt=1, tool="reply_email", kind="effect",
        args={"to": "jane@example.com", "body": "Your refund of 42.50 EUR is on its way."},
        key="outlook:message:<CAF1x-9120@mail.example.com>", key_source="provider",
        now=at(61),
    )  # fmt: skip
    _interrupt(started.run, at(70))

    # 4. A run restarted twice whose trajectory changed: attempt 1 imported the
    #    dataset and started an export; attempt 2 chose another branch; attempt 3
    #    skipped the done import and took a third path.
    started = start_run(
        agent, "import-7731", title="Import the March price list", heartbeat_timeout=86400,
        now=at(20),
    )  # fmt: skip
    run = started.run.pk
    imported = record_call(
        agent, run, attempt=1, tool="import_dataset", kind="effect",
        args={"file": "prices-2026-03.csv", "rows": 1840},
        key="sha256:9f86d081884c7d659a2feaa0c55ad015", key_source="content", now=at(21),
    )  # fmt: skip
    complete_effect(
        agent, imported.effect.pk, run_id=run, attempt=1, outcome="done",
        result={"imported": 1840}, now=at(22),
    )  # fmt: skip
    record_call(
        agent, run, attempt=1, tool="export_to_shop", kind="effect",
        args={"shop": "eu", "list": "2026-03"}, key="export:eu:2026-03", key_source="intent",
        now=at(23),
    )  # fmt: skip
    start_run(agent, "import-7731", supersede=1, agent_version="1.4.1", now=at(30))
    record_call(
        agent, run, attempt=2, tool="import_dataset", kind="effect",
        args={"file": "prices-2026-03.csv", "rows": 1840},
        key="sha256:9f86d081884c7d659a2feaa0c55ad015", key_source="content", now=at(31),
    )  # fmt: skip
    record_call(
        agent, run, attempt=2, tool="lookup_prices", kind="read", args={"list": "2026-03"},
        now=at(32),
    )  # fmt: skip
    start_run(agent, "import-7731", supersede=2, agent_version="1.4.2", now=at(40))
    record_call(
        agent, run, attempt=3, tool="import_dataset", kind="effect",
        args={"file": "prices-2026-03.csv", "rows": 1840},
        key="sha256:9f86d081884c7d659a2feaa0c55ad015", key_source="content", now=at(41),
    )  # fmt: skip
    record_call(
        agent, run, attempt=3, tool="notify_pricing_team", kind="effect",
        args={"channel": "#pricing", "text": "March prices imported (1,840 rows)."},
        key="notify:pricing:2026-03", key_source="intent", now=at(42),
    )  # fmt: skip

    # 5. A rejected revision: v1 rejected (not final), the agent revised the text and
    #    asks again; the operator sees the diff between the two versions.
    started = start_run(
        agent, "ticket-4901", title="Apologise for the delayed delivery",
        heartbeat_timeout=86400, now=at(100),
    )  # fmt: skip
    run = started.run.pk
    first = record_call(
        agent, run, attempt=1, tool="send_voucher", kind="effect",
        args={"customer": "c-2231", "voucher_eur": 50, "message": "Sorry! Here is 50 EUR."},
        key="voucher:ticket-4901", key_source="intent", needs_approval=True, approval_ttl=86400,
        preview="Send a 50 EUR voucher to customer c-2231", now=at(101),
    )  # fmt: skip
    reject_effect(
        reviewer, first.effect.pk, args_hash=first.effect.args_hash,
        note="Too generous for a two-day delay: 15 EUR at most.", now=at(110),
    )  # fmt: skip
    record_call(
        agent, run, attempt=1, tool="send_voucher", kind="effect",
        args={"customer": "c-2231", "voucher_eur": 15, "message": "Sorry for the delay: 15 EUR."},
        key="voucher:ticket-4901", key_source="intent", needs_approval=True, approval_ttl=86400,
        preview="Send a 15 EUR voucher to customer c-2231", now=at(120),
    )  # fmt: skip

    # 6. A finished run, for contrast: one keyed effect done, run completed.
    started = start_run(
        agent, "ticket-4700", title="Close ticket 4700", heartbeat_timeout=86400, now=at(5)
    )
    done = record_call(
        agent, started.run.pk, attempt=1, tool="close_ticket", kind="effect",
        args={"ticket": "4700"}, key="ticket:4700:close", key_source="intent", now=at(6),
    )  # fmt: skip
    complete_effect(
        agent, done.effect.pk, run_id=started.run.pk, attempt=1, outcome="done",
        result={"closed": True}, now=at(7),
    )  # fmt: skip
    finish_run(agent, started.run.pk, attempt=1, outcome="completed", now=at(8))

    return (
        "ticket-5310 (campaign awaiting approval), newsletter-2026-02 (1 of 2 approvals), "
        "refund-9120 (interrupted, unknown effect), import-7731 (restarted twice), "
        "ticket-4901 (rejected, revised), ticket-4700 (completed)"
    )
