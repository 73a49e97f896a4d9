"""The client's run context and tool calls against a scripted peer (``httpx.MockTransport``):
each action of the contract leads to the right requests and the right exception.

Each test runs for ``Client`` and for ``AsyncClient`` (the ``make`` fixture): what an
answer means is the protocol core's, written once for both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from client_helpers import (
    RUN,
    base_peer,
    call_answer,
    client_options,
    effect,
    refusal,
    started,
)

import startsafe_client as ss


@pytest.fixture
def make(new_client):
    """``make(peer, **options)``: a client of either kind talking to ``peer``, on a fake clock."""
    return lambda peer, **options: new_client(
        "http://startsafe.test", "tok", **client_options(peer, **options)
    )


def reply_tool(client: ss.Client, ran: list, **options) -> ss.Tool:
    @client.tool(
        kind="effect", key=lambda a: ss.provider_key("outlook", "message", a["mid"]), **options
    )
    def send_reply(mid: str, text: str) -> dict:
        ran.append({"mid": mid, "text": text})
        return {"sent": text}

    return send_reply


def test_execute_runs_the_recorded_args_and_reports_done(make):
    peer = base_peer()
    recorded = effect("in_flight", args={"mid": "m-1", "text": "edited by olivia"})
    peer.on("POST /runs/run-1/calls", (201, call_answer("execute", recorded)))
    peer.on(
        "POST /effects/eff-1/complete",
        (200, {"effect": {**recorded, "status": "done", "result": {"sent": "edited by olivia"}}}),
    )
    client, ran = make(peer), []
    send_reply = reply_tool(client, ran)

    with client.run("t-1", title="Ticket") as run:
        result = run.call(send_reply, mid="m-1", text="what the model wrote")

    # The function ran with effect.args from the answer, not the model's text.
    assert ran == [{"mid": "m-1", "text": "edited by olivia"}]
    assert result == {"sent": "edited by olivia"}
    call = peer.bodies("POST", "/runs/run-1/calls")[0]
    assert call == {
        "attempt": 1,
        "tool": "send_reply",
        "kind": "effect",
        "args": {"mid": "m-1", "text": "what the model wrote"},
        "key": "outlook:message:m-1",
        "key_source": "provider",
    }
    assert peer.bodies("POST", "/effects/eff-1/complete") == [
        {"run_id": "run-1", "attempt": 1, "outcome": "done", "result": {"sent": "edited by olivia"}}
    ]
    assert peer.bodies("POST", "/runs/run-1/finish") == [{"attempt": 1, "outcome": "completed"}]
    assert run.id == "run-1" and run.attempt == 1 and len(run.journal) == 1


def test_skip_returns_the_recorded_result_without_running_the_tool(make):
    peer = base_peer().on(
        "POST /runs/run-1/calls", (201, call_answer("skip", effect("done", result={"sent": "x"})))
    )
    client, ran = make(peer), []
    send_reply = reply_tool(client, ran)

    with client.run("t-1") as run:
        assert run.call(send_reply, mid="m-1", text="again") == {"sent": "x"}

    assert ran == []
    assert peer.bodies("POST", "/effects/eff-1/complete") == []


def test_a_read_is_recorded_then_run_with_the_given_args(make):
    peer = base_peer().on("POST /runs/run-1/calls", (201, call_answer("execute", None)))
    client = make(peer)

    @client.tool(kind="read")
    def lookup_customer(email: str) -> dict:
        return {"email": email, "plan": "pro"}

    with client.run("t-1") as run:
        assert run.call(lookup_customer, email="a@x") == {"email": "a@x", "plan": "pro"}

    assert peer.bodies("POST", "/runs/run-1/calls") == [
        {"attempt": 1, "tool": "lookup_customer", "kind": "read", "args": {"email": "a@x"}}
    ]


def test_wait_polls_with_etag_until_released_then_claims_and_executes(make):
    approved = effect("approved", args={"mid": "m-1", "text": "approved text"})
    peer = base_peer()
    peer.on("POST /runs/run-1/calls", (201, call_answer("wait", effect("awaiting_approval"))))
    peer.on(
        "GET /effects/eff-1",
        httpx.Response(
            200,
            json={"effect": effect("awaiting_approval"), "action": "wait"},
            headers={"ETag": '"r3"'},
        ),
        httpx.Response(304, headers={"ETag": '"r3"'}),
        httpx.Response(200, json={"effect": approved, "action": "claim"}, headers={"ETag": '"r4"'}),
    )
    peer.on("POST /effects/eff-1/claim", (200, {"effect": approved, "action": "execute"}))
    peer.on("POST /effects/eff-1/complete", (200, {"effect": {**approved, "status": "done"}}))
    client, ran = make(peer), []
    send_campaign = reply_tool(client, ran, needs_approval=True, approvals_required=2)

    with client.run("t-1") as run:
        run.call(send_campaign, mid="m-1", text="model text")

    assert ran == [{"mid": "m-1", "text": "approved text"}]
    polls = [r for m, p, _, r in peer.seen if (m, p) == ("GET", "/effects/eff-1")]
    assert [r.headers.get("If-None-Match") for r in polls] == [None, '"r3"', '"r3"']
    assert peer.bodies("POST", "/effects/eff-1/claim") == [{"run_id": "run-1", "attempt": 1}]
    call = peer.bodies("POST", "/runs/run-1/calls")[0]
    assert (call["needs_approval"], call["approvals_required"]) == (True, 2)


def test_on_wait_is_told_once_per_call_where_a_person_decides(make):
    # Three polls before the approval: the caller hears of the wait once, before them.
    approved = effect("approved", args={"mid": "m-1", "text": "approved text"})
    peer = base_peer()
    peer.on("POST /runs/run-1/calls", (201, call_answer("wait", effect("awaiting_approval"))))
    peer.on(
        "GET /effects/eff-1",
        httpx.Response(304),
        httpx.Response(304),
        httpx.Response(200, json={"effect": approved, "action": "claim"}),
    )
    peer.on("POST /effects/eff-1/claim", (200, {"effect": approved, "action": "execute"}))
    peer.on("POST /effects/eff-1/complete", (200, {"effect": {**approved, "status": "done"}}))
    heard: list[tuple[ss.Waiting, int]] = []

    def on_wait(waiting: ss.Waiting) -> None:
        heard.append((waiting, len(peer.bodies("GET", "/effects/eff-1"))))

    client, ran = make(peer, on_wait=on_wait, approval_timeout=120), []
    send_campaign = reply_tool(client, ran, needs_approval=True)

    with client.run("t-1") as run:
        run.call(send_campaign, mid="m-1", text="model text")

    assert len(heard) == 1
    waiting, polls_before = heard[0]
    assert polls_before == 0  # told as the wait began, not after it
    assert waiting.url == "http://startsafe.test/effects/eff-1/"
    assert (waiting.tool, waiting.effect_id, waiting.status) == (
        "send_reply",
        "eff-1",
        "awaiting_approval",
    )
    assert waiting.timeout == 120
    assert len(peer.bodies("GET", "/effects/eff-1")) == 3


def test_a_wait_that_outlasts_the_approval_timeout_raises_approval_timeout(make):
    peer = base_peer()
    peer.on("POST /runs/run-1/calls", (201, call_answer("wait", effect("awaiting_approval"))))
    peer.on("GET /effects/eff-1", httpx.Response(304))
    peer.on("POST /runs/run-1/finish", (200, {"run": {**RUN, "status": "failed"}}))
    client, ran = make(peer, approval_timeout=30), []
    send_campaign = reply_tool(client, ran, needs_approval=True)

    with pytest.raises(ss.ApprovalTimeout) as raised, client.run("t-1") as run:
        run.call(send_campaign, mid="m-1", text="x")

    assert raised.value.effect_id == "eff-1"
    assert raised.value.url == "http://startsafe.test/effects/eff-1/"
    assert raised.value.for_model == (
        "not performed yet: it waits (awaiting_approval) for a person's decision at "
        "http://startsafe.test/effects/eff-1/"
    )
    assert ran == []
    finish = peer.bodies("POST", "/runs/run-1/finish")[0]
    assert finish["outcome"] == "failed" and "approval_timeout" in finish["error"]


def test_blocked_raises_effect_blocked_with_the_note_for_the_model(make):
    rejected = effect(
        "rejected", decision={"verb": "rejected", "note": "Not to the EU list", "final": False}
    )
    peer = base_peer().on("POST /runs/run-1/calls", (201, call_answer("blocked", rejected)))
    peer.on("POST /runs/run-1/finish", (200, {"run": RUN}))
    client, ran = make(peer), []
    tool = reply_tool(client, ran)

    with client.run("t-1") as run:
        with pytest.raises(ss.EffectBlocked) as raised:
            run.call(tool, mid="m-1", text="x")
        assert raised.value.note == "Not to the EU list"
        assert raised.value.final is False
        # What an adapter hands the model as the tool's output.
        assert raised.value.for_model == "rejected by an operator: Not to the EU list"

    assert ran == []


def test_review_runs_the_reconcile_lookup_and_goes_on_with_its_answer(make):
    done = effect("done", result={"found": "ledger line 3"})
    peer = base_peer()
    peer.on("POST /runs/run-1/calls", (201, call_answer("review", effect("unknown", key="k"))))
    peer.on("POST /effects/eff-1/reconcile", (200, {"effect": done, "action": "skip"}))
    client, ran, looked = make(peer), [], []

    def lookup(args, key):
        looked.append((args, key))
        return ss.Reconciliation.done("found it in sent items", {"found": "ledger line 3"})

    tool = reply_tool(client, ran, reconcile=lookup)
    with client.run("t-1") as run:
        assert run.call(tool, mid="m-1", text="x") == {"found": "ledger line 3"}

    assert looked == [({"text": "recorded"}, "k")]
    assert ran == []
    assert peer.bodies("POST", "/effects/eff-1/reconcile") == [
        {
            "run_id": "run-1",
            "attempt": 1,
            "outcome": "done",
            "evidence": "found it in sent items",
            "result": {"found": "ledger line 3"},
        }
    ]


def test_review_released_by_the_lookup_is_claimed_and_executed(make):
    released = effect("pending", args={"mid": "m-1", "text": "recorded"})
    peer = base_peer()
    peer.on("POST /runs/run-1/calls", (201, call_answer("review", effect("unknown"))))
    peer.on("POST /effects/eff-1/reconcile", (200, {"effect": released, "action": "claim"}))
    peer.on("POST /effects/eff-1/claim", (200, {"effect": released, "action": "execute"}))
    peer.on("POST /effects/eff-1/complete", (200, {"effect": {**released, "status": "done"}}))
    client, ran = make(peer), []
    tool = reply_tool(
        client, ran, reconcile=lambda a, k: ss.Reconciliation.not_done("not in the mailbox")
    )

    with client.run("t-1") as run:
        run.call(tool, mid="m-1", text="x")

    assert ran == [{"mid": "m-1", "text": "recorded"}]


@pytest.mark.parametrize("lookup", [None, lambda args, key: None])
def test_review_without_a_lookup_or_with_one_that_cannot_tell_is_outcome_unknown(lookup, make):
    peer = base_peer().on("POST /runs/run-1/calls", (201, call_answer("review", effect("unknown"))))
    peer.on("POST /runs/run-1/finish", (200, {"run": RUN}))
    client, ran = make(peer), []
    tool = reply_tool(client, ran, reconcile=lookup)

    with pytest.raises(ss.OutcomeUnknown) as raised, client.run("t-1") as run:
        run.call(tool, mid="m-1", text="x")

    assert "/effects/eff-1/" in str(raised.value)
    assert raised.value.for_model.endswith(
        "a person decides at http://startsafe.test/effects/eff-1/"
    )
    assert peer.bodies("POST", "/effects/eff-1/reconcile") == []


def test_call_spec_journals_a_tool_known_by_name_and_spec_with_the_effect_args(make):
    """The adapters' entry: a framework's tool, its spec beside it; ``perform`` gets
    ``effect.args`` from the answer as one dict, and a replay gets the same value back."""
    recorded = effect("in_flight", args={"mid": "m-1", "text": "edited by olivia"})
    peer = base_peer()
    peer.on(
        "POST /runs/run-1/calls",
        (201, call_answer("execute", recorded)),
        (201, call_answer("skip", effect("done", result={"value": "sent: edited by olivia"}))),
    )
    done = {**recorded, "status": "done", "result": {"value": "sent: edited by olivia"}}
    peer.on("POST /effects/eff-1/complete", (200, {"effect": done}))
    client, performed = make(peer), []
    spec = ss.effect(key=lambda a: ss.provider_key("outlook", "message", a["mid"]))

    def perform(args: dict) -> str:
        performed.append(args)
        return f"sent: {args['text']}"

    with client.run("t-1") as run:
        first = run.call_spec("send_reply", spec, {"mid": "m-1", "text": "model"}, perform)
        again = run.call_spec("send_reply", spec, {"mid": "m-1", "text": "rewritten"}, perform)

    assert performed == [{"mid": "m-1", "text": "edited by olivia"}]
    assert ss.from_result(first) == ss.from_result(again) == "sent: edited by olivia"
    assert peer.bodies("POST", "/effects/eff-1/complete")[0]["result"] == {
        "value": "sent: edited by olivia"
    }
    assert [b["tool"] for b in peer.bodies("POST", "/runs/run-1/calls")] == ["send_reply"] * 2
    assert peer.bodies("POST", "/runs/run-1/calls")[1]["key"] == "outlook:message:m-1"


def campaign_tool(client, raises: BaseException, **options) -> ss.Tool:
    @client.tool(kind="effect", key=lambda a: ss.intent_key("campaign", campaign_id="c"), **options)
    def send_campaign(text: str) -> dict:
        raise raises

    return send_campaign


def test_a_tool_that_raises_is_not_reported_and_the_attempt_ends_failed(make):
    """An exception is not proof that nothing happened: the SMTP server may have taken
    the message before the connection dropped. Nothing is reported; the attempt ends
    failed, and the server makes the effect it held in flight unknown."""
    peer = base_peer()
    peer.on("POST /runs/run-1/calls", (201, call_answer("execute", effect("in_flight"))))
    client = make(peer)
    send_campaign = campaign_tool(client, TimeoutError("SMTP: no answer after DATA"))

    with pytest.raises(TimeoutError) as raised, client.run("t-1") as run:
        run.call(send_campaign, text="x")

    assert peer.bodies("POST", "/effects/eff-1/complete") == []
    finish = peer.bodies("POST", "/runs/run-1/finish")[0]
    assert finish["outcome"] == "failed" and "SMTP: no answer" in finish["error"]
    # The exception says why (Python 3.11 notes), for whoever reads the traceback.
    assert "was not reported" in " ".join(raised.value.__notes__)


@pytest.mark.parametrize(
    ("raises", "options"),
    [
        (ss.NotPerformed("the SMTP server refused the connection"), {}),
        (ConnectionRefusedError("refused"), {"not_performed": (ConnectionRefusedError,)}),
    ],
    ids=["NotPerformed", "a declared type"],
)
def test_a_tool_that_says_it_sent_nothing_is_reported_failed_and_re_raised(raises, options, make):
    peer = base_peer()
    peer.on("POST /runs/run-1/calls", (201, call_answer("execute", effect("in_flight"))))
    peer.on("POST /effects/eff-1/complete", (200, {"effect": effect("failed")}))
    client = make(peer)
    send_campaign = campaign_tool(client, raises, **options)

    with pytest.raises(type(raises)), client.run("t-1") as run:
        run.call(send_campaign, text="x")

    complete = peer.bodies("POST", "/effects/eff-1/complete")[0]
    assert complete["outcome"] == "failed" and "refused" in complete["error"]
    assert peer.bodies("POST", "/runs/run-1/finish")[0]["outcome"] == "failed"


def test_a_read_that_raises_reports_nothing_and_re_raises(make):
    peer = base_peer().on("POST /runs/run-1/calls", (201, call_answer("execute", None)))
    client = make(peer)

    @client.tool(kind="read")
    def lookup_customer(email: str) -> dict:
        raise KeyError(email)

    with pytest.raises(KeyError), client.run("t-1") as run:
        run.call(lookup_customer, email="a@x")

    assert [p for m, p, _, _ in peer.seen if p.startswith("/effects/")] == []


@pytest.mark.parametrize(
    "args", [{"mid": "", "text": "x"}, {"mid": None, "text": "x"}, {"text": "x"}]
)
def test_a_key_rule_that_finds_nothing_records_nothing(args, make):
    """A key is never built from nothing: an empty, None or missing field refuses the
    call before it is recorded (KeyRefused, a ValueError, with a text for the model)."""
    peer = base_peer()
    client, ran = make(peer), []
    tool = reply_tool(client, ran)

    with client.run("t-1") as run, pytest.raises(ValueError) as refused:
        run.call(tool, **args)

    assert isinstance(refused.value, ss.KeyRefused) and refused.value.tool == "send_reply"
    assert "send_reply: no key in these arguments" in refused.value.for_model
    assert peer.bodies("POST", "/runs/run-1/calls") == []
    assert ran == []


def test_a_tool_called_directly_refuses(make):
    client, ran = make(base_peer()), []
    tool = reply_tool(client, ran)

    with pytest.raises(TypeError, match="run.call"):
        tool(mid="m", text="x")


def test_a_live_attempt_is_not_superseded_unless_told(make):
    beat = (datetime.now(UTC) - timedelta(seconds=12.2)).isoformat()
    peer = base_peer().on("POST /runs", refusal("already_running", attempt=1, heartbeat_at=beat))
    peer.on("GET /runs", (200, {"items": [{**RUN, "heartbeat_timeout": 90}], "next_cursor": None}))
    client = make(peer)

    with pytest.raises(ss.AlreadyRunning) as raised, client.run("t-1"):
        pass

    assert raised.value.attempt == 1
    assert len(peer.bodies("POST", "/runs")) == 1
    # In the client's terms, with the run's own heartbeat_timeout (90 s, not the default).
    assert raised.value.message == (
        "run 't-1' already has a running attempt 1 (last heartbeat 12 s ago): pass "
        "supersede=True to take over now, or supersede='stale' to take over once its "
        "heartbeat is older than 90 s"
    )
    assert "send supersede" not in str(raised.value)
    assert (raised.value.code, raised.value.status) == ("already_running", 409)


def test_supersede_true_names_the_live_attempt(make):
    fresh = datetime.now(UTC).isoformat()
    peer = base_peer().on(
        "POST /runs", refusal("already_running", attempt=3, heartbeat_at=fresh), (200, started(4))
    )
    client = make(peer)

    with client.run("t-1", supersede=True) as run:
        assert run.attempt == 4

    starts = peer.bodies("POST", "/runs")
    assert "supersede" not in starts[0] and starts[1]["supersede"] == 3
    keys = [r.headers["Idempotency-Key"] for m, p, _, r in peer.seen if p == "/runs"]
    assert keys[0] != keys[1]  # two logical requests


@pytest.mark.parametrize(("age", "supersedes"), [(10, False), (120, True)])
def test_supersede_stale_supersedes_only_an_attempt_older_than_its_heartbeat_timeout(
    age, supersedes, make
):
    beat = (datetime.now(UTC) - timedelta(seconds=age)).isoformat()
    peer = base_peer().on(
        "POST /runs", refusal("already_running", attempt=1, heartbeat_at=beat), (200, started(2))
    )
    peer.on("GET /runs", (200, {"items": [{**RUN, "heartbeat_timeout": 60}], "next_cursor": None}))
    client = make(peer)

    if supersedes:
        with client.run("t-1", supersede="stale") as run:
            assert run.attempt == 2
    else:
        with pytest.raises(ss.AlreadyRunning) as raised, client.run("t-1", supersede="stale"):
            pass
        assert raised.value.message == (
            "run 't-1' already has a running attempt 1 (last heartbeat 10 s ago), not older "
            "than the run's heartbeat_timeout of 60 s: start again later, or pass "
            "supersede=True to take over now if you know that it died"
        )


def test_supersede_true_that_loses_to_another_start_says_so_in_the_clients_terms(make):
    fresh = datetime.now(UTC).isoformat()
    peer = base_peer().on(
        "POST /runs",
        refusal("already_running", attempt=3, heartbeat_at=fresh),
        refusal("already_running", attempt=4, heartbeat_at=fresh),
    )
    peer.on("GET /runs", (200, {"items": [RUN], "next_cursor": None}))
    client = make(peer)

    with pytest.raises(ss.AlreadyRunning) as raised, client.run("t-1", supersede=True):
        pass

    assert raised.value.attempt == 4
    assert raised.value.message == (
        "run 't-1' already has a running attempt 4 (last heartbeat 0 s ago): another start "
        "took the run over first"
    )


def test_a_blocked_restart_raises_restart_blocked_with_the_verdict(make):
    verdict = {"safe": False, "policy": "keyed", "blocking": [{"reason": "unkeyed_effect"}]}
    peer = base_peer().on("POST /runs", refusal("restart_blocked", verdict=verdict))
    client = make(peer)

    with pytest.raises(ss.RestartBlocked) as raised, client.run("t-1"):
        pass

    assert raised.value.verdict == verdict


def test_a_superseded_heartbeat_stops_the_block_at_the_next_call_without_finishing():
    peer = base_peer().on("POST /runs/run-1/heartbeat", refusal("attempt_superseded"))
    peer.on("POST /runs", (201, {**started(), "run": {**RUN, "heartbeat_timeout": 1.5}}))
    client, ran = ss.Client("http://startsafe.test", "tok", **client_options(peer)), []
    tool = reply_tool(client, ran)

    with pytest.raises(ss.AttemptSuperseded), client.run("t-1") as run:
        run._heartbeat_thread.join(timeout=5)  # the thread ends once it learns it
        assert isinstance(run.stopped, ss.AttemptSuperseded)
        run.call(tool, mid="m-1", text="x")

    assert ran == []
    assert peer.bodies("POST", "/runs/run-1/calls") == []
    assert peer.bodies("POST", "/runs/run-1/finish") == []


@pytest.mark.parametrize("token", ["", "   ", None])
@pytest.mark.parametrize("cls", [ss.Client, ss.AsyncClient])
def test_an_empty_token_is_refused_with_what_to_do(cls, token):
    """``STARTSAFE_TOKEN=$(manage.py create_agent ...)`` is empty when that command
    failed: the client says so instead of sending ``Bearer`` with nothing."""
    with pytest.raises(ValueError, match="create_agent") as refused:
        cls("http://127.0.0.1:8000", token)

    assert "empty" in str(refused.value)


@pytest.mark.parametrize("cls", [ss.Client, ss.AsyncClient])
def test_a_token_with_spaces_or_lines_is_refused(cls):
    """The whole output of create_agent pasted in, not only the token on its last line."""
    with pytest.raises(ValueError, match="only the token"):
        cls("http://127.0.0.1:8000", "Created agent x. Its token:\nss_abc")


@pytest.mark.parametrize("argv", [["--token", ""], []])
def test_the_example_refuses_an_empty_token_and_says_what_to_do(argv):
    """What the README's second terminal meets when create_agent failed."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "STARTSAFE_TOKEN": ""}

    done = subprocess.run(
        [sys.executable, str(root / "examples" / "support_agent.py"), *argv],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "the token is empty" in done.stderr and "create_agent" in done.stderr
