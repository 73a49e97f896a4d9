"""A hypothesis state machine drives the journal at random and checks its invariants.

Random starts, superseding restarts, calls with a few keys and argument variants,
claims, completions, reconciles, decisions by two operators, finishes, sweeps and
a moving clock; tool declarations, admins' policies (argument rules included),
the agent's tool mode and tool confirmations. After every step: a claim only from
a claimable status, ``done`` never left, rejected or expired never claimed, frozen
arguments never changed, an audit event for every status change, a verdict that
agrees with the journal, and no effect executing with less approval than its
rule asks.
Each example uses its own agent, so examples never see each other's keys.
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from approvals.decisions import (
    abandon_run,
    allow_restart,
    approve_effect,
    mark_effect_done,
    reject_effect,
    release_effect,
)
from approvals.models import Approval
from runs.calls import record_call
from runs.errors import JournalError
from runs.lifecycle import finish_run, heartbeat, start_run
from runs.models import (
    CLAIMABLE_STATUSES,
    Agent,
    AuditEvent,
    Call,
    Effect,
    EffectStatus,
    Run,
    RunStatus,
    Tool,
    ToolMode,
    ToolPolicy,
)
from runs.outcomes import claim_effect, complete_effect, reconcile_effect
from runs.registry import confirm_tool, declare_tools
from runs.sweep import sweep
from runs.verdict import restart_verdict

RUN_KEYS = ["r0", "r1", "r2"]
# key, tool, needs_approval, approvals_required; None is an unkeyed effect.
EFFECT_KINDS = [
    ("k:plain", "reply", False, 1),
    ("k:approve", "campaign", True, 1),
    ("k:two", "wire", True, 2),
    (None, "log", False, 1),
]
TOOLS = ["reply", "campaign", "wire", "log", "search"]
# Argument rules an admin may set: on the call's variant (args {"v": 0|1|2}).
POLICY_RULES = [
    [],
    [{"id": "auto", "pointer": "/v", "op": "=", "value": 0, "action": "approve"}],
    [{"id": "stop", "pointer": "/v", "op": "=", "value": 1, "action": "block"}],
    [
        {"id": "two", "pointer": "/v", "op": "≥", "value": 1, "action": "require", "approvals": 2},
        {"id": "auto", "pointer": "/v", "op": "<", "value": 1, "action": "approve"},
    ],
]
FROZEN = {EffectStatus.APPROVED, EffectStatus.IN_FLIGHT, EffectStatus.DONE, EffectStatus.UNKNOWN}
REVISABLE = {
    EffectStatus.PENDING,
    EffectStatus.AWAITING_APPROVAL,
    EffectStatus.FAILED,
    EffectStatus.REJECTED,
    EffectStatus.EXPIRED,
}


class JournalMachine(RuleBasedStateMachine):
    operators: list = []

    def __init__(self):
        super().__init__()
        self.agent = Agent(name=f"sm-{uuid.uuid4().hex[:12]}")
        self.agent.set_new_token()
        self.agent.save()
        self.now = timezone.now()
        # Effects whose rejection was final: their arguments never change again.
        self.final_hashes: dict = {}

    # --- helpers -------------------------------------------------------------

    def _run(self, i):
        return Run.objects.filter(agent=self.agent, run_key=RUN_KEYS[i]).first()

    def _effects(self):
        return list(Effect.objects.filter(agent=self.agent).order_by("created_at"))

    def _effect(self, i):
        effects = self._effects()
        return effects[i % len(effects)] if effects else None

    def _tick(self, seconds=1):
        self.now += timedelta(seconds=seconds)
        return self.now

    # --- rules -----------------------------------------------------------------

    @initialize()
    def three_runs_are_started(self):
        # Two keyed runs and a blunt one, so calls have somewhere to go from step one.
        for run_key, policy in zip(RUN_KEYS, ["keyed", "keyed", "blunt"], strict=True):
            start_run(self.agent, run_key, restart_policy=policy, now=self._tick())

    @rule(i=st.integers(0, 2), policy=st.sampled_from(["keyed", "keyed", "blunt"]))
    def start(self, i, policy):
        with contextlib.suppress(JournalError):
            start_run(
                self.agent,
                RUN_KEYS[i],
                restart_policy=policy,
                heartbeat_timeout=60,
                now=self._tick(),
            )

    @rule(i=st.integers(0, 2))
    def restart_superseding(self, i):
        run = self._run(i)
        if run is None:
            return
        with contextlib.suppress(JournalError):
            start_run(self.agent, run.run_key, supersede=run.current_attempt, now=self._tick())

    @rule(
        i=st.integers(0, 2),
        kind=st.integers(0, len(EFFECT_KINDS) - 1),
        variant=st.integers(0, 2),
        read=st.booleans(),
    )
    def record(self, i, kind, variant, read):
        run = self._run(i)
        if run is None:
            return
        key, tool, needs_approval, required = EFFECT_KINDS[kind]
        now = self._tick()
        # What the tool's registered declaration and policy ask, before the call.
        registered = Tool.objects.filter(agent=self.agent, name=tool).first()
        policy = ToolPolicy.objects.filter(tool=registered).first() if registered else None
        asked = needs_approval or bool(
            (registered and registered.adopted["needs_approval"])
            or (policy and policy.needs_approval)
        )
        try:
            if read:
                record_call(
                    self.agent,
                    run.pk,
                    attempt=run.current_attempt,
                    tool="search",
                    kind="read",
                    args={"q": variant},
                    now=now,
                )
                return
            recorded = record_call(
                self.agent,
                run.pk,
                attempt=run.current_attempt,
                tool=tool,
                kind="effect",
                args={"v": variant},
                key=key,
                key_source="intent" if key else None,
                needs_approval=needs_approval,
                approvals_required=required,
                approval_ttl=120,
                timeout=90 if key == "k:plain" else None,
                now=now,
            )
        except JournalError:
            return
        effect = recorded.effect
        effect.refresh_from_db()
        if recorded.action == "execute":
            # What the agent executes is the effect's args, claimed by this attempt.
            assert effect.status == EffectStatus.IN_FLIGHT
            assert effect.claimed_by == {"run_id": str(run.pk), "attempt": run.current_attempt}
            # Never with less approval than the call, the declaration or the policy
            # asks: a person's, or an admin's automatic approval (policy:<rule>).
            if asked:
                assert effect.needs_approval, (tool, effect.decision)
        if asked:
            assert effect.needs_approval or effect.status not in (
                EffectStatus.PENDING,
                EffectStatus.IN_FLIGHT,
            )

    @rule(
        i=st.integers(0, 2), kind=st.integers(0, len(EFFECT_KINDS) - 1), variant=st.integers(0, 2)
    )
    def record_effect(self, i, kind, variant):
        self.record(i, kind, variant, read=False)

    @rule(e=st.integers(0, 10), i=st.integers(0, 2))
    def claim(self, e, i):
        effect, run = self._effect(e), self._run(i)
        if effect is None or run is None:
            return
        with contextlib.suppress(JournalError):
            claim_effect(
                self.agent,
                effect.pk,
                run_id=run.pk,
                attempt=run.current_attempt,
                now=self._tick(),
            )

    @rule(e=st.integers(0, 10), outcome=st.sampled_from(["done", "failed"]), holder=st.booleans())
    def complete(self, e, outcome, holder):
        effect = self._effect(e)
        if effect is None or effect.claimed_run_id is None:
            return
        run = Run.objects.get(pk=effect.claimed_run_id)
        attempt = effect.claimed_attempt if holder else run.current_attempt
        with contextlib.suppress(JournalError):
            complete_effect(
                self.agent,
                effect.pk,
                run_id=run.pk,
                attempt=attempt,
                outcome=outcome,
                result={"ok": True} if outcome == "done" else None,
                now=self._tick(),
            )

    @rule(e=st.integers(0, 10), i=st.integers(0, 2), outcome=st.sampled_from(["done", "not_done"]))
    def reconcile(self, e, i, outcome):
        effect, run = self._effect(e), self._run(i)
        if effect is None or run is None:
            return
        with contextlib.suppress(JournalError):
            reconcile_effect(
                self.agent,
                effect.pk,
                run_id=run.pk,
                attempt=run.current_attempt,
                outcome=outcome,
                evidence="looked it up",
                now=self._tick(),
            )

    @rule(
        e=st.integers(0, 10),
        who=st.integers(0, 1),
        verb=st.sampled_from(["approve", "approve", "edit", "reject", "done", "release"]),
        stale=st.booleans(),
        final=st.booleans(),
    )
    def decide(self, e, who, verb, stale, final):
        effect = self._effect(e)
        if effect is None:
            return
        user = self.operators[who]
        shown = "0" * 64 if stale else effect.args_hash
        now = self._tick()
        try:
            if verb == "approve":
                approve_effect(user, effect.pk, args_hash=shown, now=now)
            elif verb == "edit":
                approve_effect(
                    user, effect.pk, args_hash=shown, edited_args={"v": "edited"}, now=now
                )
            elif verb == "reject":
                reject_effect(user, effect.pk, args_hash=shown, note="no", final=final, now=now)
                if final:
                    self.final_hashes[effect.pk] = effect.args_hash
            elif verb == "done":
                mark_effect_done(user, effect.pk, args_hash=shown, note="by hand", now=now)
            else:
                release_effect(user, effect.pk, args_hash=shown, note="did not happen", now=now)
        except JournalError:
            pass

    @rule(i=st.integers(0, 2), verb=st.sampled_from(["allow", "allow", "abandon"]))
    def decide_run(self, i, verb):
        run = self._run(i)
        if run is None:
            return
        decide = allow_restart if verb == "allow" else abandon_run
        with contextlib.suppress(JournalError):
            decide(self.operators[0], run.pk, note="decided", now=self._tick())

    @rule(i=st.integers(0, 2), outcome=st.sampled_from(["completed", "failed"]))
    def finish(self, i, outcome):
        run = self._run(i)
        if run is None:
            return
        with contextlib.suppress(JournalError):
            finish_run(
                self.agent,
                run.pk,
                attempt=run.current_attempt,
                outcome=outcome,
                now=self._tick(),
            )

    @rule(i=st.integers(0, 2))
    def beat(self, i):
        run = self._run(i)
        if run is None:
            return
        with contextlib.suppress(JournalError):
            heartbeat(self.agent, run.pk, attempt=run.current_attempt, now=self._tick())

    @rule(seconds=st.sampled_from([5, 70, 200]))
    def time_passes_and_the_sweep_runs(self, seconds):
        sweep(now=self._tick(seconds))

    # --- invariants ----------------------------------------------------------------

    @invariant()
    def every_status_change_is_audited_and_follows_the_rules(self):
        for effect in self._effects():
            events = list(AuditEvent.objects.filter(effect=effect).order_by("id"))
            assert events and events[0].verb == "recorded" and events[0].old_status == ""
            status = events[0].new_status
            args_hash = events[0].data["args_hash"]
            for event in events[1:]:
                # The chain of old -> new is unbroken: no change went unrecorded.
                assert event.old_status == status, (effect.pk, event.verb, status)
                new = event.new_status
                if new == EffectStatus.IN_FLIGHT and status != EffectStatus.IN_FLIGHT:
                    # A claim only from a claimable status: never rejected, expired,
                    # unknown, done, or already in flight.
                    assert status in CLAIMABLE_STATUSES, (status, event.verb)
                if status == EffectStatus.DONE:
                    assert new == EffectStatus.DONE, event.verb
                if status in (EffectStatus.REJECTED, EffectStatus.EXPIRED) and new != status:
                    assert new == EffectStatus.AWAITING_APPROVAL  # only a revision
                if event.verb == "args_revised":
                    assert status in REVISABLE, status
                    args_hash = event.data["args_hash"]
                elif event.verb == "args_edited":
                    assert (event.actor_kind, status) == ("operator", "awaiting_approval")
                    args_hash = event.data["args_hash"]
                status = new
            assert status == effect.status
            # Arguments changed only through the events above (frozen otherwise).
            assert args_hash == effect.args_hash
            if effect.pk in self.final_hashes:
                assert effect.args_hash == self.final_hashes[effect.pk]

    @invariant()
    def an_effect_in_flight_is_held_by_a_running_attempt(self):
        for effect in Effect.objects.filter(agent=self.agent, status=EffectStatus.IN_FLIGHT):
            run = Run.objects.get(pk=effect.claimed_run_id)
            assert run.status == RunStatus.RUNNING
            assert run.current_attempt == effect.claimed_attempt
            if effect.needs_approval:
                # What runs is what enough people approved, or what an admin's rule
                # approved in advance (policy:<rule id>, for these very arguments).
                decision = effect.decision or {}
                by_policy = (
                    decision.get("verb") == "approved"
                    and decision.get("by", "").startswith("policy:")
                    and decision.get("args_hash") == effect.args_hash
                )
                approvers = Approval.objects.filter(effect=effect, args_hash=effect.args_hash)
                people = approvers.values("user").distinct().count()
                assert by_policy or people >= effect.approvals_required

    @invariant()
    def the_verdict_agrees_with_the_journal(self):
        for run in Run.objects.filter(agent=self.agent):
            verdict = restart_verdict(run)
            if run.restart_policy == "keyed":
                started_unkeyed = Effect.objects.filter(
                    run=run, key__isnull=True, first_claimed_at__isnull=False
                ).exists()
                assert verdict.safe is not started_unkeyed
            else:
                assert verdict.safe is not Call.objects.filter(run=run).exists()


@pytest.mark.django_db(transaction=True)
def test_the_journal_keeps_its_invariants_under_random_sequences(operator, second_operator):
    JournalMachine.operators = [
        User.objects.get(pk=operator.pk),
        User.objects.get(pk=second_operator.pk),
    ]
    run_state_machine_as_test(
        JournalMachine,
        settings=settings(
            max_examples=20,
            stateful_step_count=30,
            deadline=None,
            # A fixed walk, so CI is stable and its coverage check means something.
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
    # The random walks reached far into the lifecycle (rows of every example stay
    # until the test ends), so the invariants were checked where they matter.
    effect_verbs = set(
        AuditEvent.objects.filter(effect__isnull=False).values_list("verb", flat=True)
    )
    assert {"recorded", "claimed"} <= effect_verbs, effect_verbs
    assert effect_verbs & {"completed", "completed_late", "reconciled_done"}, effect_verbs
    assert len(effect_verbs) >= 8, effect_verbs


class RegistryMachine(JournalMachine):
    """The same walk and invariants, with the tool registry in play: declarations,
    admins' policies with argument rules, the agent's tool mode, confirmations. A
    machine of its own, so the journal's walk above keeps reaching as far as it did."""

    @initialize()
    def the_effect_tools_are_declared(self):
        # As the clients do, so admins' policies have tools to be set on from step
        # one; "search" registers by its first call.
        effect_tools = [{"name": name, "kind": "effect"} for name in TOOLS if name != "search"]
        declare_tools(self.agent, effect_tools, now=self._tick())
        # And one policy from the start, whose rules every call of "log" meets (two
        # approvers from v=1 on, automatic approval below): admins change it later.
        ToolPolicy.objects.create(
            tool=Tool.objects.get(agent=self.agent, name="log"),
            rules=POLICY_RULES[3],
            updated_at=self._tick(),
        )

    @rule(
        t=st.integers(0, len(TOOLS) - 1),
        effect=st.booleans(),
        needs_approval=st.booleans(),
        required=st.integers(1, 2),
    )
    def declare(self, t, effect, needs_approval, required):
        declared = {
            "name": TOOLS[t],
            "kind": "effect" if effect else "read",
            "needs_approval": needs_approval,
            "approvals_required": required,
        }
        with contextlib.suppress(JournalError):
            declare_tools(self.agent, [declared], now=self._tick())

    @rule(
        # "log" most: unkeyed, each of its calls is a new effect for the rules to meet.
        name=st.sampled_from(["log", "log", "campaign", "wire", "reply"]),
        needs_approval=st.booleans(),
        required=st.integers(1, 2),
        rules=st.integers(1, len(POLICY_RULES) - 1),
        on_expiry=st.sampled_from(["expire", "reject"]),
    )
    def admin_sets_a_policy(self, name, needs_approval, required, rules, on_expiry):
        tool = Tool.objects.filter(agent=self.agent, name=name).first()
        if tool is None:
            return
        ToolPolicy.objects.update_or_create(
            tool=tool,
            defaults={
                "needs_approval": needs_approval,
                "approvals_required": required,
                "rules": POLICY_RULES[rules],
                "on_expiry": on_expiry,
                "updated_at": self._tick(),
            },
        )

    @rule(mode=st.sampled_from([ToolMode.OPEN, ToolMode.OPEN, ToolMode.CONFIRM, ToolMode.CLOSED]))
    def admin_sets_the_tool_mode(self, mode):
        self.agent.tool_mode = mode
        self.agent.save(update_fields=["tool_mode"])

    @rule(t=st.integers(0, len(TOOLS) - 1))
    def admin_confirms_a_tool(self, t):
        tool = Tool.objects.filter(agent=self.agent, name=TOOLS[t]).first()
        if tool is not None:
            confirm_tool(self.operators[0], tool.pk, now=self._tick())


@pytest.mark.django_db(transaction=True)
def test_the_journal_keeps_its_invariants_with_tool_registry_and_policies(
    operator, second_operator
):
    JournalMachine.operators = [
        User.objects.get(pk=operator.pk),
        User.objects.get(pk=second_operator.pk),
    ]
    run_state_machine_as_test(
        RegistryMachine,
        settings=settings(
            max_examples=20,
            stateful_step_count=30,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
    # The registry's rules were reached: effects decided by a policy's rule (approved
    # or blocked, audited as policy:<rule id>), held effects, tools confirmed.
    assert AuditEvent.objects.filter(actor__startswith="policy:").exists()
    assert Effect.objects.filter(hold__isnull=False).exists()
    assert AuditEvent.objects.filter(verb="tool_confirmed").exists()
    assert AuditEvent.objects.filter(verb="claimed").exists()
