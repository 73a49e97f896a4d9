"""The client against the real API on a live server (PostgreSQL): the run context, each
action, a network error between the server's answer and the client, and the rule for
a tool's exceptions (for both clients, through their one protocol core).

Decisions a person takes are made through ``approvals.decisions`` from the client's
``sleep`` hook, so the poll sees them without threads.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import startsafe_client as ss
from approvals.decisions import approve_effect, mark_effect_done, reject_effect
from runs.models import Attempt, Call, Effect, Run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import ledger  # noqa: E402 (examples/ledger.py: the provider's log the tools write)

pytestmark = pytest.mark.django_db(transaction=True)


def make_client(live_server, agent, *, transport=None, on_sleep=None, **options) -> ss.Client:
    def sleep(seconds: float) -> None:
        if on_sleep is not None:
            on_sleep()
        time.sleep(min(seconds, 0.05))

    options.setdefault("poll_interval", 0.05)
    options.setdefault("approval_timeout", 10)
    return ss.Client(
        live_server.url, agent.token, transport=transport, sleep=sleep, backoff=0.01, **options
    )


def declare(client: ss.Client, ran: list, **options) -> ss.Tool:
    @client.tool(
        kind="effect",
        key=lambda a: ss.provider_key("outlook", "message", a["mid"]),
        preview=lambda a: f"Reply {a['subject']!r}",
        **options,
    )
    def send_reply(mid: str, subject: str) -> dict:
        ran.append(subject)
        return {"sent": subject}

    return send_reply


def effect_now(key: str) -> Effect:
    return Effect.objects.get(key=key)


class LoseAnswers(httpx.BaseTransport):
    """The real transport, except that the first answer to a matching request is lost
    after the server handled it (a reset connection): the client sees a network error."""

    def __init__(self, matches: Callable[[httpx.Request], bool], times: int = 1) -> None:
        self.inner = httpx.HTTPTransport()
        self.matches = matches
        self.times = times
        self.lost: list[str | None] = []
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        response = self.inner.handle_request(request)
        if self.matches(request) and len(self.lost) < self.times:
            response.read()
            response.close()
            self.lost.append(request.headers.get("Idempotency-Key"))
            raise httpx.ReadError("connection reset after the server answered", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def test_a_run_records_a_read_and_an_effect_then_completes(live_server, agent):
    client, ran = make_client(live_server, agent), []
    send_reply = declare(client, ran)

    @client.tool(kind="read")
    def lookup_customer(email: str) -> dict:
        return {"email": email, "name": "Ana"}

    with client.run("ticket-1", title="Ticket 1", input={"n": 1}) as run:
        assert run.attempt == 1 and run.verdict["safe"] is True
        assert run.call(lookup_customer, email="ana@x")["name"] == "Ana"
        assert run.call(send_reply, mid="m-1", subject="Hello") == {"sent": "Hello"}

    assert ran == ["Hello"]
    db_run = Run.objects.get(pk=run.id)
    assert db_run.status == "completed"
    effect = effect_now("outlook:message:m-1")
    assert (effect.status, effect.result, effect.key_source) == (
        "done",
        {"sent": "Hello"},
        "provider",
    )
    assert [c.kind for c in Call.objects.filter(run=db_run).order_by("seq")] == ["read", "effect"]


def test_a_replay_with_rewritten_args_is_skipped_with_the_recorded_result(live_server, agent):
    client, ran = make_client(live_server, agent), []
    send_reply = declare(client, ran)
    with client.run("ticket-2") as run:
        run.call(send_reply, mid="m-2", subject="First wording")

    # Another run woken by the same inbound message: the model rewrote the subject.
    with client.run("ticket-2-redelivered") as run:
        assert run.call(send_reply, mid="m-2", subject="Second wording") == {
            "sent": "First wording"
        }
        assert run.journal[-1]["action"] == "skip"

    assert ran == ["First wording"]
    assert effect_now("outlook:message:m-2").args == {"mid": "m-2", "subject": "First wording"}


def test_an_exception_in_the_block_finishes_the_attempt_failed(live_server, agent):
    client = make_client(live_server, agent)

    with pytest.raises(RuntimeError, match="model crashed"), client.run("ticket-3") as run:
        raise RuntimeError("model crashed")

    attempt = Attempt.objects.get(run_id=run.id, number=1)
    assert attempt.status == "failed"
    assert "model crashed" in attempt.error
    assert Run.objects.get(pk=run.id).status == "failed"


def test_a_wait_polls_until_approved_then_claims_and_executes_the_approved_args(
    live_server, agent, operator
):
    sleeps = {"n": 0}
    statuses: list[int] = []

    class Recording(httpx.HTTPTransport):
        def handle_request(self, request):
            response = super().handle_request(request)
            if request.method == "GET":
                statuses.append(response.status_code)
            return response

    def decide_on_third_sleep() -> None:
        sleeps["n"] += 1
        if sleeps["n"] == 3:
            effect = effect_now("outlook:message:m-4")
            # The operator fixes the subject line before approving it.
            approve_effect(
                operator,
                effect.id,
                args_hash=effect.args_hash,
                note="ok with a better subject",
                edited_args={"mid": "m-4", "subject": "Edited by olivia"},
            )

    ran: list = []
    client = make_client(live_server, agent, transport=Recording(), on_sleep=decide_on_third_sleep)
    send_reply = declare(client, ran, needs_approval=True)

    with client.run("ticket-4") as run:
        assert run.call(send_reply, mid="m-4", subject="Model wording") == {
            "sent": "Edited by olivia"
        }

    assert ran == ["Edited by olivia"]  # effect.args from the answer, not the model's
    assert 304 in statuses  # the unchanged polls were answered from the ETag
    assert effect_now("outlook:message:m-4").status == "done"


def test_a_wait_with_nobody_deciding_raises_approval_timeout(live_server, agent):
    client, ran = make_client(live_server, agent, approval_timeout=0.3), []
    send_reply = declare(client, ran, needs_approval=True)

    with pytest.raises(ss.ApprovalTimeout) as raised, client.run("ticket-5") as run:
        run.call(send_reply, mid="m-5", subject="Hi")

    assert raised.value.effect["status"] == "awaiting_approval"
    assert ran == []
    assert Run.objects.get(pk=run.id).status == "failed"


def test_a_rejection_raises_effect_blocked_with_the_note(live_server, agent, operator):
    def reject() -> None:
        effect = effect_now("outlook:message:m-6")
        if effect.status == "awaiting_approval":
            reject_effect(
                operator, effect.id, args_hash=effect.args_hash, note="Do not promise refunds"
            )

    client, ran = make_client(live_server, agent, on_sleep=reject), []
    send_reply = declare(client, ran, needs_approval=True)

    with client.run("ticket-6") as run:
        with pytest.raises(ss.EffectBlocked) as raised:
            run.call(send_reply, mid="m-6", subject="We refund everything")
        assert raised.value.note == "Do not promise refunds"

    assert ran == []


def _leave_in_flight(client: ss.Client, run_key: str, key: str, args: dict) -> str:
    """Attempt 1 records and claims the effect, then 'dies' without reporting it."""
    client.post("/runs", {"run_key": run_key, "heartbeat_timeout": 60})
    answer = client.post(
        f"/runs/{Run.objects.get(run_key=run_key).pk}/calls",
        {
            "attempt": 1,
            "tool": "send_reply",
            "kind": "effect",
            "args": args,
            "key": key,
            "key_source": "provider",
        },
    )
    assert answer["action"] == "execute"
    return answer["effect"]["id"]


def test_review_is_settled_by_the_reconcile_lookup(live_server, agent):
    client, ran, looked = make_client(live_server, agent), [], []
    _leave_in_flight(client, "ticket-7", "outlook:message:m-7", {"mid": "m-7", "subject": "A"})

    def found_in_sent_items(args, key):
        looked.append(key)
        return ss.Reconciliation.done("sent items: reply to m-7 found", {"sent": "A"})

    send_reply = declare(client, ran, reconcile=found_in_sent_items)
    with client.run("ticket-7", supersede=True) as run:
        assert run.attempt == 2
        assert run.call(send_reply, mid="m-7", subject="B") == {"sent": "A"}

    assert ran == [] and looked == ["outlook:message:m-7"]
    effect = effect_now("outlook:message:m-7")
    assert effect.status == "done"
    assert effect.decision["verb"] == "reconciled"


def test_review_released_by_the_lookup_executes_once(live_server, agent):
    client, ran = make_client(live_server, agent), []
    _leave_in_flight(client, "ticket-8", "outlook:message:m-8", {"mid": "m-8", "subject": "A"})
    send_reply = declare(
        client, ran, reconcile=lambda a, k: ss.Reconciliation.not_done("mailbox: no reply")
    )

    with client.run("ticket-8", supersede=True) as run:
        run.call(send_reply, mid="m-8", subject="B")

    assert ran == ["A"]  # the recorded args: the effect was frozen when claimed
    assert effect_now("outlook:message:m-8").status == "done"


def test_review_without_a_lookup_is_outcome_unknown_until_a_person_decides(
    live_server, agent, operator
):
    client, ran = make_client(live_server, agent), []
    effect_id = _leave_in_flight(
        client, "ticket-9", "outlook:message:m-9", {"mid": "m-9", "subject": "A"}
    )
    send_reply = declare(client, ran)

    with pytest.raises(ss.OutcomeUnknown) as raised, client.run("ticket-9", supersede=True) as run:
        run.call(send_reply, mid="m-9", subject="B")
    assert raised.value.effect_id == effect_id

    effect = effect_now("outlook:message:m-9")
    mark_effect_done(operator, effect.id, args_hash=effect.args_hash, note="I see it in Outlook")
    with client.run("ticket-9") as run:  # the run failed: this starts attempt 3
        assert run.attempt == 3
        run.call(send_reply, mid="m-9", subject="C")
        assert run.journal[-1]["action"] == "skip"
    assert ran == []


def test_a_live_attempt_is_superseded_only_when_told(live_server, agent):
    client = make_client(live_server, agent)
    client.post("/runs", {"run_key": "ticket-10"})

    with pytest.raises(ss.AlreadyRunning) as raised, client.run("ticket-10"):
        pass
    assert raised.value.attempt == 1
    # Said in the client's terms, with the run's default heartbeat_timeout.
    assert "pass supersede=True to take over now" in raised.value.message
    assert "once its heartbeat is older than 60 s" in raised.value.message
    with pytest.raises(ss.AlreadyRunning), client.run("ticket-10", supersede="stale"):
        pass  # its heartbeat is fresh

    with client.run("ticket-10", supersede=True) as run:
        assert run.attempt == 2
    assert Attempt.objects.get(run_id=run.id, number=1).status == "superseded"


def test_a_superseded_attempt_is_stopped_by_its_heartbeat(live_server, agent):
    client, ran = make_client(live_server, agent), []
    send_reply = declare(client, ran)

    with pytest.raises(ss.AttemptSuperseded), client.run("ticket-11", heartbeat_timeout=5) as run:
        # Another process takes over (it judged this attempt dead).
        client.post("/runs", {"run_key": "ticket-11", "supersede": 1})
        deadline = time.monotonic() + 10
        while run.stopped is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert isinstance(run.stopped, ss.AttemptSuperseded)
        run.call(send_reply, mid="m-11", subject="too late")

    assert ran == []
    assert not Call.objects.filter(run_id=run.id, attempt__number=1).exists()
    assert Run.objects.get(pk=run.id).current_attempt == 2


def test_an_unkeyed_effect_in_flight_blocks_the_restart(live_server, agent):
    client = make_client(live_server, agent)
    client.post("/runs", {"run_key": "ticket-12"})
    run_id = str(Run.objects.get(run_key="ticket-12").pk)
    client.post(
        f"/runs/{run_id}/calls",
        {"attempt": 1, "tool": "charge_card", "kind": "effect", "args": {"amount": 5}},
    )

    with pytest.raises(ss.RestartBlocked) as raised, client.run("ticket-12", supersede=True):
        pass

    assert raised.value.verdict["safe"] is False
    assert raised.value.verdict["blocking"][0]["reason"] == "unkeyed_effect"


def test_a_lost_answer_to_a_call_is_retried_without_recording_it_twice(live_server, agent):
    lose = LoseAnswers(lambda r: r.method == "POST" and r.url.path.endswith("/calls"))
    client, ran = make_client(live_server, agent, transport=lose), []
    send_reply = declare(client, ran)

    with client.run("ticket-13") as run:
        assert run.call(send_reply, mid="m-13", subject="Once") == {"sent": "Once"}

    # The server handled the first try; the retry repeated its Idempotency-Key and
    # got the first answer again: one call, one execute, one effect.
    assert len(lose.lost) == 1
    call_keys = [r.headers["Idempotency-Key"] for r in lose.sent if r.url.path.endswith("/calls")]
    assert call_keys == [lose.lost[0], lose.lost[0]]
    assert Call.objects.filter(run_id=run.id).count() == 1
    assert ran == ["Once"]
    assert effect_now("outlook:message:m-13").status == "done"


def test_a_lost_answer_to_a_start_does_not_start_two_attempts(live_server, agent):
    lose = LoseAnswers(lambda r: r.method == "POST" and r.url.path.endswith("/api/v1/runs"))
    client = make_client(live_server, agent, transport=lose)

    with client.run("ticket-14") as run:
        assert run.attempt == 1

    assert len(lose.lost) == 1
    assert Attempt.objects.filter(run_id=run.id).count() == 1
    assert Run.objects.get(pk=run.id).status == "completed"


def test_a_lost_answer_to_a_completion_keeps_the_first_result(live_server, agent):
    lose = LoseAnswers(lambda r: r.method == "POST" and r.url.path.endswith("/complete"))
    client, ran = make_client(live_server, agent, transport=lose), []
    send_reply = declare(client, ran)

    with client.run("ticket-15") as run:
        assert run.call(send_reply, mid="m-15", subject="Once") == {"sent": "Once"}

    assert len(lose.lost) == 1 and ran == ["Once"]
    assert effect_now("outlook:message:m-15").result == {"sent": "Once"}


def test_over_the_rate_limit_the_client_waits_retry_after_and_nothing_runs_twice(
    live_server, agent, settings
):
    """A token limited to 4 requests a second makes ~14 requests: the 429s are waited
    out (Retry-After, with the same Idempotency-Key) and each effect runs once."""
    settings.STARTSAFE = {**settings.STARTSAFE, "RATE_LIMIT": "4/second"}
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    client = ss.Client(live_server.url, agent.token, sleep=sleep, backoff=0.01, max_retries=8)
    ran: list = []
    send_reply = declare(client, ran)
    with client.run("ticket-rate") as run:
        for n in range(5):
            run.call(send_reply, mid=f"m-{n}", subject=f"S{n}")

    assert ran == [f"S{n}" for n in range(5)]
    assert Effect.objects.filter(status="done").count() == 5
    assert Call.objects.filter(run_id=run.id).count() == 5
    # Refused at least once, and each wait was the server's advice (a whole second).
    assert any(w >= 1 for w in waits)


def test_the_example_prints_the_console_address_of_the_effect_it_waits_for_once(
    live_server, agent, operator, tmp_path
):
    """The support agent waits for the campaign's approval: while it waits it has said,
    once, where a person decides (the client's ``on_wait``), though it polls many times."""
    command = [
        sys.executable,
        str(ROOT / "examples" / "support_agent.py"),
        *("--base-url", live_server.url, "--token", agent.token, "--ticket", "ticket-wait"),
        *("--ledger", str(tmp_path / "ledger.jsonl"), "--seed", "1"),
        *("--poll-interval", "0.05", "--approval-timeout", "30"),
    ]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    agent_process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    try:
        lines: list[str] = []
        # Bounded by --approval-timeout: without the line, the agent gives up and exits.
        for line in agent_process.stdout:
            lines.append(line)
            if "waiting" in line:
                break
        campaign = Effect.objects.get(tool="send_campaign")
        address = f"{live_server.url}/effects/{campaign.pk}/"
        assert campaign.status == "awaiting_approval", lines
        assert address in lines[-1], lines

        time.sleep(0.5)  # several polls go by: none of them repeats the line
        approve_effect(operator, campaign.pk, args_hash=campaign.args_hash, note="ok")
        rest = agent_process.communicate(timeout=30)[0]
    finally:
        if agent_process.poll() is None:
            agent_process.kill()
            agent_process.wait()

    assert agent_process.returncode == 0, "".join(lines) + rest
    output = "".join(lines) + rest
    assert output.count(address) == 1, output
    assert "send_campaign: waiting (awaiting_approval, up to 30 s) for a decision at" in output
    assert Effect.objects.get(pk=campaign.pk).status == "done"


# --- An exception is not proof that nothing happened (both clients) ------------------


def campaign_key(args: dict) -> ss.Key:
    return ss.intent_key("campaign", campaign_id=args["campaign_id"])


@pytest.mark.parametrize("settled_by", ["its lookup", "a person"])
def test_a_tool_that_raises_after_its_effect_is_not_run_again_by_the_next_attempt(
    settled_by, live_server, agent, operator, new_client, tmp_path
):
    """The ESP took the campaign (its log has the line), then the answer timed out.
    The exception is not reported: the attempt ends failed, the effect becomes unknown,
    and the next attempt reconciles it, or waits for a person: it never sends twice."""
    esp_log = tmp_path / "ledger.jsonl"
    client = new_client(live_server.url, agent.token, backoff=0.01, poll_interval=0.05)
    timeouts = [TimeoutError("the ESP took the campaign, then its answer timed out")]

    def in_the_esp_log(args: dict, key: str | None) -> ss.Reconciliation:
        found = ledger.find(esp_log, "campaign", args["campaign_id"])
        if found:
            return ss.Reconciliation.done(f"ESP log line {found[0]}", {"line": found[0]})
        return ss.Reconciliation.not_done("ESP log read in full: not sent")

    lookup = in_the_esp_log if settled_by == "its lookup" else None

    @client.tool(kind="effect", key=campaign_key, reconcile=lookup)
    def send_campaign(campaign_id: str, subject: str) -> dict:
        ledger.append(esp_log, "campaign", campaign_id, {"subject": subject})
        if timeouts:
            raise timeouts.pop()
        return {"sent": subject}

    with pytest.raises(TimeoutError), client.run("ticket-raise") as run:
        run.call(send_campaign, campaign_id="winter", subject="Winter sale")

    effect = effect_now("campaign:winter")
    assert effect.status == "unknown"  # not failed: nothing said it did not happen
    assert Attempt.objects.get(run_id=run.id, number=1).status == "failed"

    if settled_by == "its lookup":
        with client.run("ticket-raise") as run:
            assert run.attempt == 2
            result = run.call(send_campaign, campaign_id="winter", subject="Winter sale!")
        assert result == {"line": 1}
        assert effect_now("campaign:winter").decision["verb"] == "reconciled"
    else:
        with pytest.raises(ss.OutcomeUnknown), client.run("ticket-raise") as run:
            run.call(send_campaign, campaign_id="winter", subject="Winter sale!")
        effect = effect_now("campaign:winter")
        assert effect.status == "unknown"
        mark_effect_done(operator, effect.id, args_hash=effect.args_hash, note="in the ESP log")
        with client.run("ticket-raise") as run:
            run.call(send_campaign, campaign_id="winter", subject="Winter sale, again")
            assert run.journal[-1]["action"] == "skip"

    assert ledger.counts(esp_log) == {("campaign", "winter"): 1}
    assert effect_now("campaign:winter").status == "done"


@pytest.mark.parametrize(
    ("refusal", "options"),
    [
        (ss.NotPerformed("the ESP refused the connection"), {}),
        (ConnectionRefusedError("the ESP refused"), {"not_performed": (ConnectionRefusedError,)}),
    ],
    ids=["NotPerformed", "a declared type"],
)
def test_a_tool_that_says_it_sent_nothing_is_run_again_by_the_next_attempt(
    refusal, options, live_server, agent, new_client, tmp_path
):
    esp_log = tmp_path / "ledger.jsonl"
    client = new_client(live_server.url, agent.token, backoff=0.01)
    refusals = [refusal]

    @client.tool(kind="effect", key=campaign_key, **options)
    def send_campaign(campaign_id: str, subject: str) -> dict:
        if refusals:
            raise refusals.pop()  # refused before anything was sent
        ledger.append(esp_log, "campaign", campaign_id, {"subject": subject})
        return {"sent": subject}

    with pytest.raises(type(refusal)), client.run("ticket-refused") as run:
        run.call(send_campaign, campaign_id="winter", subject="Winter sale")
    effect = effect_now("campaign:winter")
    assert effect.status == "failed" and "refused" in effect.error

    with client.run("ticket-refused") as run:
        # It runs again, with this call's arguments: a failed effect takes a revision.
        assert run.call(send_campaign, campaign_id="winter", subject="Winter sale!") == {
            "sent": "Winter sale!"
        }

    assert ledger.counts(esp_log) == {("campaign", "winter"): 1}
    assert effect_now("campaign:winter").status == "done"
