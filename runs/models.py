"""The journal: agents, runs, attempts, calls, effects, argument versions, audit events;
and the rows of its background work (restart hand-offs, the periodic tasks' state).

Statuses change only through the functions in ``runs/lifecycle.py`` (and its
``calls.py`` and ``outcomes.py``) and
``approvals/decisions.py``; each change writes an ``AuditEvent``. The database keeps
the invariants a race could break (named constraints below), not the application.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid

import uuid6
from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

TOKEN_PREFIX = "ss_"


def time_ordered_id() -> uuid.UUID:
    """A new id for the journal's busiest tables (runs, effects, calls): a version 7
    UUID, time first. Random (version 4) ids put every insert on a random page of
    each index keyed by them, which at a million effects is a page to read and to
    write in full to the WAL after each checkpoint (docs/performance.md); these go
    next to the ids made just before. They still cannot be guessed (74 random
    bits), and an id was never a secret: the agent's token guards every read.
    """
    return uuid.UUID(int=uuid6.uuid7().int)  # the plain class, as uuid4() gives


def hash_token(token: str) -> str:
    """SHA-256 of a token. Tokens are 256 random bits, so a fast hash is enough."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class ToolMode(models.TextChoices):
    """How an agent's tools are admitted (product.md, "Tool registry and policies")."""

    # New tools register as declared.
    OPEN = "open"
    # The effects of a new or changed tool wait until an admin confirms the tool.
    CONFIRM = "confirm"
    # An unregistered tool is refused (409 tool_not_registered).
    CLOSED = "closed"


class Agent(models.Model):
    """An API client identity. Its token is stored hashed, never in clear."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    # The first characters of the token, so an admin can tell tokens apart.
    token_hint = models.CharField(max_length=12, editable=False, default="")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    token_rotated_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Read with the token's row (runs/api/auth.py), so the call path pays no query for it.
    tool_mode = models.CharField(
        max_length=10, choices=ToolMode.choices, default=ToolMode.OPEN, db_default=ToolMode.OPEN
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        return f"agent:{self.name}"

    def set_new_token(self) -> str:
        """Give the agent a new token and return it; only its hash is kept."""
        return self.set_token(TOKEN_PREFIX + secrets.token_urlsafe(32))

    def set_token(self, token: str) -> str:
        """Make ``token`` the agent's (only its hash and first characters are kept)."""
        self.token_hash = hash_token(token)
        self.token_hint = token[:8]
        return token

    def rotate_token(self) -> str:
        """A new token, saved now: the old one stops working at its next request."""
        token = self.set_new_token()
        self.token_rotated_at = timezone.now()
        self.save(update_fields=["token_hash", "token_hint", "token_rotated_at"])
        return token

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(self.token_hash, hash_token(token))


class RunStatus(models.TextChoices):
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"


FINISHED_RUN_STATUSES = (RunStatus.COMPLETED, RunStatus.ABANDONED)
STOPPED_RUN_STATUSES = (RunStatus.INTERRUPTED, RunStatus.FAILED)


class RestartPolicy(models.TextChoices):
    KEYED = "keyed"
    BLUNT = "blunt"
    MANUAL = "manual"


class Run(models.Model):
    """One task of an agent, named by its ``run_key``; starting it again is a restart."""

    id = models.UUIDField(primary_key=True, default=time_ordered_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="runs")
    run_key = models.CharField(max_length=200)
    title = models.CharField(max_length=200, blank=True, default="")
    input = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.RUNNING)
    restart_policy = models.CharField(
        max_length=10, choices=RestartPolicy.choices, default=RestartPolicy.KEYED
    )
    heartbeat_timeout = models.PositiveIntegerField(default=60)
    heartbeat_at = models.DateTimeField()
    # heartbeat_at + heartbeat_timeout, kept as a column so the sweep's query is
    # one range scan of a partial index instead of arithmetic on every row.
    stale_at = models.DateTimeField()
    current_attempt = models.PositiveIntegerField(default=1)
    restart_ready = models.BooleanField(default=False)
    restart_url = models.URLField(max_length=2000, null=True, blank=True)
    # Automatic hand-backs made so far (capped by STARTSAFE["AUTO_RESTART_CAP"]).
    auto_restarts = models.PositiveIntegerField(default=0)
    # An operator's "allow restart", waiting for the next start that consumes it.
    override_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    override_at = models.DateTimeField(null=True, blank=True)
    override_note = models.TextField(blank=True, default="")
    # Whether the run's history has a blocking reason (runs/verdict.py): set as it
    # becomes true (``runs.verdict.keep_verdict_blocked``), never false again, so the
    # console's "verdict" filter and its count read an index instead of testing
    # every run's effects and calls (docs/performance.md). The verdict itself is
    # still computed from the journal.
    # db_default too: a web process still on the previous release inserts runs
    # without the column while the migration has already added it.
    verdict_blocked = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "run_key"], name="run_key_unique_per_agent"),
        ]
        indexes = [
            # The sweep: running runs whose heartbeat is older than their timeout.
            models.Index(
                fields=["stale_at"], name="run_sweep_stale_idx", condition=Q(status="running")
            ),
            # The queue: stopped runs that need a person's decision (no "allow
            # restart" waiting), newest first, and their count and latest change on
            # every console page. With ``restart_ready`` outside its condition, the
            # count read every such run's row to filter it (docs/performance.md).
            models.Index(
                fields=["-updated_at"],
                name="run_queue_decide_idx",
                condition=Q(status__in=["interrupted", "failed"], restart_ready=False),
            ),
            # The runs page and GET /runs: an agent's runs, newest first, by status.
            models.Index(fields=["agent", "-created_at"], name="run_agent_created_idx"),
            # The console's runs page unfiltered, newest first: without it every page
            # (the first one too) sorted all runs (docs/performance.md).
            models.Index(fields=["-created_at"], name="run_created_idx"),
            models.Index(fields=["status", "-created_at"], name="run_status_created_idx"),
            # The runs page filtered by verdict (blocked or safe), newest first, and its count.
            models.Index(fields=["verdict_blocked", "-created_at"], name="run_verdict_created_idx"),
        ]

    def __str__(self) -> str:
        return self.run_key

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_RUN_STATUSES

    @property
    def has_override(self) -> bool:
        return self.override_at is not None


class AttemptStatus(models.TextChoices):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    SUPERSEDED = "superseded"


class Attempt(models.Model):
    """One start of a run. The list of attempts is the restart history."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    status = models.CharField(
        max_length=20, choices=AttemptStatus.choices, default=AttemptStatus.RUNNING
    )
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    # "agent", "auto", or "operator:<username>"
    started_by = models.CharField(max_length=200, default="agent")
    reason = models.TextField(blank=True, default="")
    agent_version = models.CharField(max_length=100, null=True, blank=True)
    verdict_at_start = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="attempt_number_unique_per_run"),
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(status="running"),
                name="one_running_attempt_per_run",
            ),
        ]
        indexes = [
            # The restart history page: every attempt, newest first.
            models.Index(fields=["-started_at"], name="attempt_history_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.number}"


class CallKind(models.TextChoices):
    READ = "read"
    EFFECT = "effect"


class Action(models.TextChoices):
    EXECUTE = "execute"
    CLAIM = "claim"
    SKIP = "skip"
    WAIT = "wait"
    REVIEW = "review"
    BLOCKED = "blocked"


class KeySource(models.TextChoices):
    PROVIDER = "provider"
    CONTENT = "content"
    INTENT = "intent"


class EffectStatus(models.TextChoices):
    PENDING = "pending"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    IN_FLIGHT = "in_flight"
    DONE = "done"
    FAILED = "failed"
    UNKNOWN = "unknown"


class OnExpiry(models.TextChoices):
    EXPIRE = "expire"
    REJECT = "reject"


# An effect in one of these may be claimed (and so executed).
CLAIMABLE_STATUSES = (EffectStatus.PENDING, EffectStatus.APPROVED, EffectStatus.FAILED)


class Effect(models.Model):
    """Something a tool does to the world, recorded once and shared by every call naming its key."""

    id = models.UUIDField(primary_key=True, default=time_ordered_id, editable=False)
    # No index of their own: effect_agent_created_idx and effect_run_key_idx lead with
    # these columns (every index is written on every insert: docs/performance.md).
    agent = models.ForeignKey(
        Agent, on_delete=models.PROTECT, related_name="effects", db_index=False
    )
    # The run that first recorded it; other runs of the agent may share it by key.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="owned_effects", db_index=False
    )
    tool = models.CharField(max_length=100)
    key = models.CharField(max_length=255, null=True, blank=True)
    key_source = models.CharField(max_length=10, choices=KeySource.choices, null=True, blank=True)
    needs_approval = models.BooleanField(default=False)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    approval_ttl = models.PositiveIntegerField()
    timeout = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=EffectStatus.choices)
    args = models.JSONField()
    args_hash = models.CharField(max_length=64)
    args_versions = models.PositiveIntegerField(default=1)
    preview = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    claimed_run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_attempt = models.PositiveIntegerField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    # When it was first claimed: an unkeyed effect that was ever started blocks
    # automatic restarts of its run under the keyed policy.
    first_claimed_at = models.DateTimeField(null=True, blank=True)
    # claimed_at + timeout: past it, the sweep makes an in-flight effect unknown.
    timeout_at = models.DateTimeField(null=True, blank=True)
    approval_expires_at = models.DateTimeField(null=True, blank=True)
    # Approvals of the current version, as the API shows them ({"by", "at", "note",
    # "args_hash"}), kept on the row so the poll answers in one query. The
    # Approval table is the source of truth and guards one approval per operator.
    current_approvals = models.JSONField(default=list, blank=True)
    # The latest decision, as the API shows it; the whole history is in AuditEvent.
    decision = models.JSONField(null=True, blank=True)
    # Grows with every change; the poll's ETag is built from it.
    revision = models.PositiveIntegerField(default=1)
    # Why the server made it wait although its call asked for less (api.md, "Additions
    # in v1"): {"reason": key_drift|tool_unconfirmed|policy_rule, "message",
    # "effect_id"} or null. Set when the effect is recorded (runs/policies.py).
    hold = models.JSONField(null=True, blank=True)
    # What its approval deadline does when nobody decided: "expire" or "reject"
    # (the tool's policy, fixed when the effect is recorded).
    on_expiry = models.CharField(
        max_length=10, choices=OnExpiry.choices, default=OnExpiry.EXPIRE, db_default="expire"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "key"],
                condition=Q(key__isnull=False),
                name="effect_key_unique_per_agent",
            ),
            models.CheckConstraint(
                condition=Q(key__isnull=True) | Q(key_source__isnull=False),
                name="effect_key_has_source",
            ),
            models.CheckConstraint(
                condition=Q(approvals_required__gte=1) & Q(approvals_required__lte=3),
                name="effect_approvals_required_1_to_3",
            ),
            models.CheckConstraint(
                condition=~Q(status="in_flight") | Q(claimed_run__isnull=False),
                name="effect_in_flight_has_claim",
            ),
        ]
        indexes = [
            # The queue and the expiry: awaiting effects, nearest deadline first.
            models.Index(
                fields=["approval_expires_at"],
                name="effect_awaiting_deadline_idx",
                condition=Q(status="awaiting_approval"),
            ),
            # The queue's fingerprint and the navigation's count, on every console
            # page: how many effects await approval and their latest change, from
            # the index alone (the deadline index had to read each row's updated_at).
            models.Index(
                fields=["-updated_at"],
                name="effect_awaiting_updated_idx",
                condition=Q(status="awaiting_approval"),
            ),
            # The sweep: in-flight effects whose timeout passed.
            models.Index(
                fields=["timeout_at"],
                name="effect_in_flight_timeout_idx",
                condition=Q(status="in_flight"),
            ),
            # The sweep and interrupt: effects held by one (run, attempt).
            models.Index(
                fields=["claimed_run", "claimed_attempt"],
                name="effect_in_flight_claim_idx",
                condition=Q(status="in_flight"),
            ),
            # The queue: unknown outcomes waiting for a person.
            models.Index(
                fields=["-updated_at"],
                name="effect_unknown_idx",
                condition=Q(status="unknown"),
            ),
            # GET /effects and the verdict: an agent's effects, newest first.
            models.Index(fields=["agent", "-created_at"], name="effect_agent_created_idx"),
            models.Index(fields=["run", "key"], name="effect_run_key_idx"),
            # The keyed policy's blocking rule (restart_verdict, the queue's reasons, the
            # runs page's "blocked" filter): unkeyed effects that were started. Small,
            # so PostgreSQL's hashed EXISTS over it no longer reads every effect.
            models.Index(
                fields=["run"],
                name="effect_unkeyed_started_idx",
                condition=Q(key__isnull=True, first_claimed_at__isnull=False),
            ),
            # The insights page: the period's held effects (its drift holds). Few
            # effects are held, so the index is small.
            models.Index(
                fields=["created_at"],
                name="effect_held_created_idx",
                condition=Q(hold__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.key or self.id}"

    def decide(self, verb: str, by: str, at, note: str = "", *, final: bool = False) -> None:
        """Set ``decision``, the latest decision on the effect, in its one shape (api.md,
        Effect): ``by`` a person's username, ``agent:<name>`` or ``system``; it names
        the arguments decided on by their hash. Saving it is the caller's."""
        self.decision = {
            "verb": verb,
            "by": by,
            "at": at.isoformat(),
            "note": note,
            "args_hash": self.args_hash,
            "final": final,
        }

    @property
    def claimed_by(self) -> dict | None:
        # Reads two columns only: the poll's EffectRow gives them too (runs/api/serialize.py).
        if self.claimed_run_id is None:
            return None
        return {"run_id": str(self.claimed_run_id), "attempt": self.claimed_attempt}


class Call(models.Model):
    """One line of a run's journal: a tool call as one attempt recorded it."""

    id = models.UUIDField(primary_key=True, default=time_ordered_id, editable=False)
    # Indexed by call_run_order_idx and call_seq_unique_per_attempt, which lead with them.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="calls", db_index=False)
    attempt = models.ForeignKey(
        Attempt, on_delete=models.CASCADE, related_name="calls", db_index=False
    )
    attempt_number = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    tool = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=CallKind.choices)
    args = models.JSONField()
    args_hash = models.CharField(max_length=64)
    action = models.CharField(max_length=10, choices=Action.choices)
    effect = models.ForeignKey(
        Effect, null=True, blank=True, on_delete=models.CASCADE, related_name="calls"
    )
    at = models.DateTimeField()
    # Set once, when the call is recorded (runs/calls.py): the call found a keyed
    # effect an earlier call had recorded and was answered skip or wait, so its key
    # kept the effect from happening again. Stored rather than derived by joining
    # each call to its effect, so the insights page counts a period's duplicates from
    # one small partial index (a million-call join took half a second). db_default:
    # rows copied in without it (bench/seed.py) are not duplicates.
    prevented_duplicate = models.BooleanField(default=False, db_default=False)

    class Meta:
        ordering = ["attempt_number", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "seq"], name="call_seq_unique_per_attempt"),
        ]
        indexes = [
            # The run page and the verdict: a run's journal in order.
            models.Index(fields=["run", "attempt_number", "seq"], name="call_run_order_idx"),
            # The insights page: the period's duplicates prevented, by tool (an
            # index-only scan: the index holds the duplicates only).
            models.Index(
                fields=["at", "tool"],
                name="call_duplicate_at_idx",
                condition=Q(prevented_duplicate=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} #{self.attempt_number}.{self.seq}"


class EffectVersion(models.Model):
    """One version of an effect's arguments: who proposed it and whether it was adopted.

    ``adopted`` is false for drift: arguments a later call proposed after the
    content was frozen (approved, claimed, done, unknown, finally rejected).
    """

    # Indexed by effect_version_unique_number, which leads with it.
    effect = models.ForeignKey(
        Effect, on_delete=models.CASCADE, related_name="versions", db_index=False
    )
    number = models.PositiveIntegerField()
    args = models.JSONField()
    args_hash = models.CharField(max_length=64)
    # "agent:<name>" or "operator:<username>"
    author = models.CharField(max_length=200)
    call = models.ForeignKey(
        Call, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    adopted = models.BooleanField(default=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["effect", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["effect", "number"], name="effect_version_unique_number"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.effect_id} v{self.number}"


class AuditEvent(models.Model):
    """An append-only record of a state change or decision: who, what, when, old → new, why."""

    at = models.DateTimeField()
    # "agent:<name>", the operator's username, or "system"
    actor = models.CharField(max_length=200)
    actor_kind = models.CharField(max_length=10)  # agent, operator, system
    verb = models.CharField(max_length=40)
    agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # run and effect: indexed by audit_run_idx and audit_effect_idx, which lead with them.
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    attempt_number = models.PositiveIntegerField(null=True, blank=True)
    effect = models.ForeignKey(
        Effect, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    old_status = models.CharField(max_length=20, blank=True, default="")
    new_status = models.CharField(max_length=20, blank=True, default="")
    note = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["-at"], name="audit_at_idx"),
            models.Index(fields=["effect", "at"], name="audit_effect_idx"),
            models.Index(fields=["run", "at"], name="audit_run_idx"),
            # The insights page: the period's events of effects entering, waiting in
            # or leaving awaiting_approval (asked, decided, expired, escalated), a
            # small part of the log: the rest (claims, results, calls) is left out.
            models.Index(
                fields=["at"],
                name="audit_awaiting_at_idx",
                condition=Q(new_status="awaiting_approval") | Q(old_status="awaiting_approval"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.verb}"

    def save(self, *args, **kwargs):
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValueError("Audit events are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("Audit events are append-only.")


# --- The tool registry (product.md, "Tool registry and policies") ------------------
#
# The tools declare, the server holds the line: runs/registry.py keeps the
# declarations, runs/policies.py evaluates the rules, runs/calls.py applies them.


class ToolState(models.TextChoices):
    # Registered by its first declaration (or first call), not confirmed by an admin.
    REGISTERED = "registered"
    # An admin confirmed the declaration in force.
    CONFIRMED = "confirmed"
    # A later declaration differs from the one in force: recorded, shown, not adopted
    # where it would loosen (``adopted`` keeps the stricter of the two).
    CHANGED = "changed"


class Tool(models.Model):
    """A tool of an agent: (agent, name), its latest declaration and the one in force.

    ``declaration`` is what the agent declared last (its ``fingerprint``, SHA-256 of
    its canonical JSON); ``adopted`` is the declaration in force, which a change
    never loosens: it is the first declaration, made stricter by each change, until
    an admin confirms the latest one (runs/registry.py).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by tool_name_unique_per_agent, which leads with it.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tools", db_index=False)
    name = models.CharField(max_length=100)
    declaration = models.JSONField()
    fingerprint = models.CharField(max_length=64)
    adopted = models.JSONField()
    adopted_fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=12, choices=ToolState.choices, default=ToolState.REGISTERED)
    confirmed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    confirmed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["agent", "name"]
        constraints = [
            # Concurrent first declarations (or first calls) of one tool make one row.
            models.UniqueConstraint(fields=["agent", "name"], name="tool_name_unique_per_agent"),
        ]

    def __str__(self) -> str:
        return self.name


class ToolDeclaration(models.Model):
    """One distinct declaration a tool was ever given: its history."""

    # Indexed by tool_declaration_unique_fingerprint, which leads with it.
    tool = models.ForeignKey(
        Tool, on_delete=models.CASCADE, related_name="declarations", db_index=False
    )
    fingerprint = models.CharField(max_length=64)
    declaration = models.JSONField()
    # "call" when the first call of an undeclared tool registered it, else "declared".
    source = models.CharField(max_length=10, default="declared")
    first_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["tool", "first_seen_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tool", "fingerprint"], name="tool_declaration_unique_fingerprint"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_id} {self.fingerprint[:12]}"


class ToolPolicy(models.Model):
    """An admin's rules for one tool; the stricter of these and the declaration
    applies, except an argument rule's automatic approval (runs/policies.py).

    ``rules``: argument rules tried in order, the first match winning, each
    ``{"id", "pointer" (JSON Pointer), "op" (= ≠ < ≤ > ≥ in contains matches),
    "value", "action" (require|block|approve), "approvals" (1–3, for require)}``.
    """

    tool = models.OneToOneField(Tool, on_delete=models.CASCADE, related_name="policy")
    # Null: the declaration's kind. "effect" makes a tool declared read an effect.
    kind = models.CharField(max_length=10, choices=CallKind.choices, null=True, blank=True)
    needs_approval = models.BooleanField(default=False)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    # Seconds; null: the effect's own (or the settings' default).
    approval_ttl = models.PositiveIntegerField(null=True, blank=True)
    on_expiry = models.CharField(max_length=10, choices=OnExpiry.choices, default=OnExpiry.EXPIRE)
    rules = models.JSONField(default=list, blank=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "tool policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(approvals_required__gte=1) & Q(approvals_required__lte=3),
                name="tool_policy_approvals_required_1_to_3",
            ),
            models.CheckConstraint(
                condition=Q(approval_ttl__isnull=True)
                | (Q(approval_ttl__gte=60) & Q(approval_ttl__lte=2_592_000)),
                name="tool_policy_approval_ttl_range",
            ),
        ]

    def __str__(self) -> str:
        return f"policy of {self.tool}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from runs.policies import rule_errors

        errors = rule_errors(self.rules)
        if errors:
            raise ValidationError({"rules": errors})


class IdempotentRequest(models.Model):
    """A POST's ``Idempotency-Key`` and the answer kept with the work (runs/api/idempotency.py).

    A repeat with the same key gets the stored answer; a different body is refused
    (422); a repeat while the first is still being processed is refused (409: the
    key's advisory lock is held). Rows are written with their answer; a row without
    one (claimed before the work by the earlier design) is in progress until
    ``locked_until`` passes.
    """

    # Indexed by idempotency_key_unique_per_agent, which leads with it.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=500)
    # SHA-256 of the canonical JSON of the body (or of the raw bytes if not JSON).
    request_hash = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    locked_until = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "key"], name="idempotency_key_unique_per_agent"
            ),
        ]
        indexes = [
            # Pruning answers older than the retention (24 hours at least).
            models.Index(fields=["created_at"], name="idempotency_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.key}"


class KeyTombstone(models.Model):
    """What a keyed effect came to, kept after ``prune`` deleted its run.

    Dedupe must outlive retention: a key redelivered after pruning is answered
    ``skip`` with the recorded result (see ``record_call``), so the tombstone keeps
    just enough of the effect to rebuild a ``done`` one.
    """

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    tool = models.CharField(max_length=100)
    key_source = models.CharField(max_length=10, choices=KeySource.choices)
    status = models.CharField(max_length=20, choices=EffectStatus.choices)
    result = models.JSONField(null=True, blank=True)
    args = models.JSONField(null=True, blank=True)
    args_hash = models.CharField(max_length=64)
    # The deleted effect's id and run key, so the audit trail can still be followed.
    effect_id = models.UUIDField()
    run_key = models.CharField(max_length=200)
    pruned_at = models.DateTimeField()

    class Meta:
        ordering = ["-pruned_at"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "key"], name="tombstone_key_unique_per_agent"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.key} ({self.status})"


# --- The background work's own rows ----------------------------------------------
#
# Outboxes written in the same transaction as the event they tell about, then sent
# by a periodic task that claims them with a compare-and-set update. A broker that
# loses a message (the filesystem transport after a crash, a worker killed with
# SIGKILL) loses nothing: the row is still due and the next sweep sends it.


class OutboxStatus(models.TextChoices):
    PENDING = "pending"
    # Claimed by one worker until ``due_at``; past it a crashed try is taken over.
    SENDING = "sending"
    SENT = "sent"
    # Nothing to send any more (the run started again, the effect was decided).
    OBSOLETE = "obsolete"
    # Every try failed up to the cap; kept with its last answer for operators.
    GIVEN_UP = "given_up"


ACTIVE_OUTBOX_STATUSES = (OutboxStatus.PENDING, OutboxStatus.SENDING)


class RestartHandoff(models.Model):
    """The hand-off of attempt ``attempt`` of a run to its runtime's ``restart_url``.

    One row per (run, attempt): delivering it twice is the same POST with the same
    ``Idempotency-Key``. Every try and its answer is also an audit event
    (``handoff_try``), which the run page shows.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="handoffs")
    attempt = models.PositiveIntegerField()
    status = models.CharField(
        max_length=10, choices=OutboxStatus.choices, default=OutboxStatus.PENDING
    )
    # Pending: when the next try may start (back-off). Sending: the claim's lease.
    due_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    last_answer = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        # Created by the approvals app, moved here with its rows (migration runs 0010).
        db_table = "approvals_restarthandoff"
        constraints = [
            models.UniqueConstraint(fields=["run", "attempt"], name="handoff_unique_per_attempt"),
        ]
        indexes = [
            # The sweep's dispatch: active hand-offs whose time has come.
            models.Index(
                fields=["due_at"],
                name="handoff_due_idx",
                condition=models.Q(status__in=["pending", "sending"]),
            ),
        ]

    def __str__(self) -> str:
        return f"hand-off {self.run_id} #{self.attempt} {self.status}"


class TaskState(models.Model):
    """The last run of a periodic task, shared by every process (``/metrics``, ``/healthz``)."""

    name = models.CharField(max_length=50, primary_key=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_duration = models.FloatField(default=0.0)
    last_error = models.TextField(blank=True, default="")
    runs_total = models.PositiveBigIntegerField(default=0)
    errors_total = models.PositiveBigIntegerField(default=0)
    # Counters a task keeps for the metrics (e.g. webhook failures).
    counters = models.JSONField(default=dict, blank=True)

    class Meta:
        # The table the approvals app created before the model moved here (migration
        # runs 0010): moving a model's code does not move its rows.
        db_table = "approvals_taskstate"

    def __str__(self) -> str:
        return self.name


def record_task_run(name: str, started_at, duration: float, *, error: str = "", **counts) -> None:
    """Add one run of a periodic task to its shared state (a single-row upsert)."""
    with transaction.atomic():
        state, _ = TaskState.objects.select_for_update().get_or_create(name=name)
        state.last_started_at = started_at
        state.last_duration = duration
        state.runs_total += 1
        if error:
            state.errors_total += 1
            state.last_error = error[:2000]
        for key, value in counts.items():
            if value:
                state.counters[key] = state.counters.get(key, 0) + value
        state.save()
