"""startsafe-mcp against a live server, driven by the MCP SDK's own client over stdio and
over streamable HTTP, in front of real MCP servers of the SDK (mcp_helpers.py).

1. The example's story (stdio): the proxy is SIGKILLed after the mailbox sent the
   reply and before it reported it; a proxy started at once finds the attempt alive
   and takes nothing over; once that attempt is stale, the next one reconciles the
   reply through ``mail.find_reply``, and the campaign waits for approval and runs
   with what the operator approved: each effect once.
2. A call whose response stream is dropped and that the client re-issues with a new
   request id executes once (streamable HTTP, both protocol eras).
3. Reads are never gated; a tool with no rule and no annotations, or with a
   ``readOnlyHint`` from an untrusted server, is an unkeyed effect, and the verdict
   refuses the restart.
4. What the agent reads: a key that cannot be built, a failed tool, a wait past the
   approval timeout, a rejection; the run key of ``_meta``; the token never reaches
   a server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from agent_process import approve_with_an_edit, drive
from django.utils import timezone
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_helpers import EXAMPLES, connect, http_proxy, proxy_env, stdio_proxy, text, write_config

from approvals.decisions import reject_effect
from runs.models import Attempt, Call, Effect, Run
from runs.verdict import restart_verdict

sys.path.insert(0, str(EXAMPLES))

import ledger  # noqa: E402 (examples/ledger.py: what the servers did)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EDIT = {"subject": "Winter offer: 15% off (edited by an operator)", "recipients": 200}
NOTE = "Hold it: the spring prices are not final yet."
NOTE_TEXT = "Ticket 4812: replied, campaign pending"
SEE_ERRORS, PROXY_DIED = 3, 137


# --- 1. The example's story, over stdio ------------------------------------------------


def _story(live_server, token: str, tmp_path: Path, decide=None) -> tuple[int, str]:
    """``examples/mcp/agent.py`` (it starts the proxy over stdio) run to its end, while
    ``decide()`` plays the operator."""
    config = write_config(tmp_path, live_server.url, servers=("mail", "crm"))
    command = [
        sys.executable,
        str(EXAMPLES / "mcp" / "agent.py"),
        *("--ticket", "ticket-4812", "--config", str(config)),
        *("--transcript", str(tmp_path / "transcript.jsonl")),
    ]
    return drive(command, decide, env=proxy_env(token), cwd=tmp_path, timeout=180)


def _answers(tmp_path: Path, attempt: int) -> dict[str, dict[str, Any]]:
    """What each tool answered the agent in one of its attempts."""
    lines = (tmp_path / "transcript.jsonl").read_text().splitlines()
    return {
        line["tool"]: line
        for line in map(json.loads, lines)
        if line["attempt"] == attempt and line["tool"]
    }


def test_a_reply_sent_before_the_proxy_was_killed_is_reconciled_and_never_sent_again(
    live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    (tmp_path / "crash-after-send").touch()  # the mailbox kills the proxy once it sent

    # Attempt 1: the reply is sent, and the proxy dies by SIGKILL before reporting it.
    code, output = _story(live_server, agent.token, tmp_path)
    assert code == PROXY_DIED, output
    assert [e["kind"] for e in ledger.entries(ledger_path)] == ["reply"]
    reply = Effect.objects.get(tool="mail.send_reply")
    assert reply.status == "in_flight"  # claimed by attempt 1, never reported

    # A proxy started at once finds attempt 1 alive (its heartbeat is fresh): it takes
    # nothing over and forwards nothing.
    code, output = _story(live_server, agent.token, tmp_path)
    assert code == SEE_ERRORS, output
    assert "already has a running attempt 1" in output
    assert len(ledger.entries(ledger_path)) == 1
    assert Run.objects.get().current_attempt == 1

    # Its last heartbeat is now older than the run's heartbeat_timeout: presumed dead.
    Run.objects.update(heartbeat_at=timezone.now() - timedelta(seconds=60))

    # The next proxy supersedes it; the model reorders and rewrites its calls. The
    # reply's outcome is unknown: find_reply finds it, nothing is sent. The campaign
    # waits for the operator, who edits it and approves.
    operator_edits = lambda: approve_with_an_edit(operator, EDIT, "opted-in only")  # noqa: E731
    code, output = _story(live_server, agent.token, tmp_path, operator_edits)
    assert code == 0, output
    first, third = _answers(tmp_path, 1), _answers(tmp_path, 3)
    assert list(third) == ["crm.lookup_customer", "crm.send_campaign", "mail.send_reply"]
    assert not any(answer["is_error"] for answer in third.values()), third
    assert "mail.find_reply answered" in third["mail.send_reply"]["text"]
    sent = ledger.find(ledger_path, "reply", "<ticket-4812.inbound@mail.example.com>")[1]
    assert third["mail.send_reply"]["structured"]["subject"] == sent["details"]["subject"]
    assert third["crm.send_campaign"]["args"]["subject"] != EDIT["subject"]  # the model's
    assert third["crm.send_campaign"]["structured"]["subject"] == EDIT["subject"]  # what ran

    # Each effect once; the campaign as the operator approved it.
    counts = ledger.counts(ledger_path)
    assert sorted(kind for kind, _ in counts) == ["campaign", "reply"]
    assert set(counts.values()) == {1}, counts
    campaign = ledger.find(ledger_path, "campaign", "2026-winter-eu")[1]["details"]
    assert (campaign["subject"], campaign["recipients"]) == (EDIT["subject"], 200)
    assert "crm.lookup_customer" in first  # attempt 1 looked the customer up first

    reply.refresh_from_db()
    assert (reply.status, reply.decision["verb"]) == ("done", "reconciled")
    assert Effect.objects.get(tool="crm.send_campaign").status == "done"
    attempts = {a.number: a.status for a in Attempt.objects.all()}
    assert attempts == {1: "superseded", 2: "failed"}  # 2: its session ended
    assert Attempt.objects.get(number=2).error.startswith("startsafe-mcp stopped")

    # Once more: everything is skipped, and nothing is done twice.
    code, output = _story(live_server, agent.token, tmp_path)
    assert code == 0, output
    assert ledger.counts(ledger_path) == counts
    counted = subprocess.run(
        [sys.executable, str(EXAMPLES / "count_ledger.py"), str(ledger_path)],
        capture_output=True,
        text=True,
    )
    assert counted.returncode == 0 and "duplicates: 0" in counted.stdout


# --- 2. A dropped stream, re-issued with a new request id --------------------------------


class DropTheFirstCall(httpx2.AsyncBaseTransport):
    """The agent's HTTP: the first ``tools/call``'s response is lost half a second after
    the proxy got the request (a broken connection), as networks do."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.call_ids: list[Any] = []
        self.dropped: list[Any] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(await request.aread() or b"{}") if request.method == "POST" else {}
        if not (isinstance(body, dict) and body.get("method") == "tools/call"):
            return await self.inner.handle_async_request(request)
        self.call_ids.append(body["id"])
        if self.dropped:
            return await self.inner.handle_async_request(request)
        self.dropped.append(body["id"])
        with anyio.move_on_after(0.5):
            response = await self.inner.handle_async_request(request)
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                return httpx2.Response(  # the stream opened: it breaks before the answer
                    response.status_code, headers=response.headers, stream=_Broken(response)
                )
            await response.aclose()
        raise httpx2.ReadError("connection reset by peer")


class _Broken(httpx2.AsyncByteStream):
    def __init__(self, response: httpx2.Response) -> None:
        self.response = response

    async def __aiter__(self):
        await anyio.sleep(0.5)
        await self.response.aclose()
        raise httpx2.ReadError("connection reset by peer")
        yield b""  # an async generator


async def _drop_then_reissue(url: str, mode: str) -> tuple[Any, DropTheFirstCall, str]:
    """Call ``post_note``; its response is dropped; call it again, as a new request.

    In the 2026 era the SDK's session does not survive a broken POST, so the agent
    connects again; in the handshake era the same session re-issues it.
    """
    transport = DropTheFirstCall()
    args = {"note_id": "n-1", "text": NOTE_TEXT}
    async with httpx2.AsyncClient(transport=transport, timeout=60) as http:
        failure = ""
        try:
            async with Client(
                streamable_http_client(url, http_client=http), cache=None, mode=mode
            ) as client:
                try:
                    await client.call_tool("post_note", args)
                except Exception as error:  # noqa: BLE001 (what the agent sees)
                    failure = f"{type(error).__name__}: {error}"
                    again = await client.call_tool("post_note", args)
                    return again, transport, failure
        except Exception as error:  # noqa: BLE001 (the session broke with the stream)
            failure = f"{type(error).__name__}: {error}"
        async with Client(
            streamable_http_client(url, http_client=http), cache=None, mode=mode
        ) as client:
            return await client.call_tool("post_note", args), transport, failure


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_a_dropped_call_re_issued_with_a_new_request_id_executes_once(
    live_server, agent, tmp_path, mode
):
    config = write_config(tmp_path, live_server.url, servers=("notes",), notes_delay=2)
    with http_proxy(config, agent.token, "--run-key", "ticket-4812") as url:
        answer, transport, failure = anyio.run(_drop_then_reissue, url, mode)

    assert failure, "the first call must have failed for the agent"
    assert len(transport.call_ids) == 2 and transport.dropped == transport.call_ids[:1]
    assert not answer.is_error, text(answer)
    assert answer.structured_content == {"note_id": "n-1", "text": NOTE_TEXT}
    assert [e["kind"] for e in ledger.entries(tmp_path / "ledger.jsonl")] == ["post"]

    # One effect, executed once; the re-issued call waited for it (or skipped it).
    effect = Effect.objects.get(tool="notes.post_note")
    assert (effect.status, effect.key) == ("done", "note:n-1")
    actions = list(Call.objects.filter(effect=effect).values_list("action", flat=True))
    assert actions[0] == "execute" and actions[1] in ("wait", "skip"), actions
    assert len(actions) == 2


# --- 3. Reads, unkeyed effects, lying annotations, the verdict -------------------------


def test_reads_are_never_gated_and_an_undeclared_tool_is_an_unkeyed_effect(
    live_server, agent, tmp_path
):
    config = write_config(tmp_path, live_server.url)
    ledger_path = tmp_path / "ledger.jsonl"
    with http_proxy(config, agent.token, "--run-key", "ticket-7") as url, connect(url) as mcp:
        # Reads: a trusted readOnlyHint (mail.find_reply) and a rule (crm.lookup_customer).
        found = mcp.call("mail.find_reply", message_id="<nothing>")
        customer = mcp.call("crm.lookup_customer", email="ana.silva@example.eu")
        assert found.structured_content == {"found": False, "searched": "the sent items, in full"}
        assert customer.structured_content["name"] == "Ana"
        assert list(Call.objects.values_list("kind", "action")) == [("read", "execute")] * 2
        assert not Effect.objects.exists()  # never gated: no effect, nothing to approve

        # No rule, no annotations; and a readOnlyHint from a server nobody trusts.
        assert not mcp.call("notes.add_note", customer="ana", text="asked twice").is_error
        assert not mcp.call("notes.purge_notes", customer="ana").is_error

    effects = {e.tool: e for e in Effect.objects.all()}
    assert set(effects) == {"notes.add_note", "notes.purge_notes"}
    assert all(e.key is None and e.status == "done" for e in effects.values())
    verdict = restart_verdict(Run.objects.get(run_key="ticket-7"))
    assert verdict.safe is False
    assert {b["reason"] for b in verdict.blocking} == {"unkeyed_effect"}
    assert {b["tool"] for b in verdict.blocking} == set(effects)

    # The first proxy finished its attempt when it stopped; the next one may not restart.
    with http_proxy(config, agent.token, "--run-key", "ticket-7") as url, connect(url) as mcp:
        refused = mcp.call("crm.lookup_customer", email="ana.silva@example.eu")
    run = Run.objects.get(run_key="ticket-7")
    assert refused.is_error
    assert "The restart is not safe" in text(refused)
    assert f"{live_server.url}/runs/{run.id}/" in text(refused)
    assert [e["kind"] for e in ledger.entries(ledger_path)] == ["note", "purge"]  # once each


# --- 4. What the agent reads, the run key, the token -----------------------------------


def test_what_the_agent_reads_when_a_call_is_refused_waits_fails_or_is_rejected(
    live_server, agent, operator, tmp_path
):
    config = write_config(tmp_path, live_server.url, approval_timeout=1)
    ledger_path = tmp_path / "ledger.jsonl"
    with connect(stdio_proxy(config, agent.token, "--run-key", "ticket-9")) as mcp:
        names = {tool.name for tool in mcp.tools()}
        assert {"mail.send_reply", "crm.send_campaign", "notes.post_note"} <= names

        # A key with nothing to be built from: refused, not recorded, not forwarded.
        refused = mcp.call("mail.send_reply", message_id=" ", to="ana", subject="Hi", body="…")
        assert refused.is_error and "message_id is empty" in text(refused)
        assert not Call.objects.exists() and not ledger_path.exists()

        # The tool says isError: reported failed; the next call of its key runs it.
        failed = mcp.call("notes.post_note", note_id="n-2", text="fail")
        assert failed.is_error and "the board is read-only today" in text(failed)
        assert Effect.objects.get(key="note:n-2").status == "failed"
        posted = mcp.call("notes.post_note", note_id="n-2", text="posted")
        assert posted.structured_content == {"note_id": "n-2", "text": "posted"}
        assert Effect.objects.get(key="note:n-2").status == "done"

        # Nobody decides within approval_timeout: an error naming the console page.
        campaign = {"campaign_id": "2026-spring-eu", "segment": "EU", "subject": "Spring"}
        waiting = mcp.call("crm.send_campaign", **campaign, recipients=90)
        effect = Effect.objects.get(tool="crm.send_campaign")
        assert waiting.is_error and effect.status == "awaiting_approval"
        assert f"{live_server.url}/effects/{effect.id}/" in text(waiting)
        assert "waits (awaiting_approval) for a person's decision" in text(waiting)

        # The operator rejects it: the agent reads the note.
        reject_effect(operator, effect.id, args_hash=effect.args_hash, note=NOTE)
        rejected = mcp.call("crm.send_campaign", **campaign, recipients=90)
        assert rejected.is_error and text(rejected) == f"rejected by an operator: {NOTE}"

        # The run key of a call's _meta wins over --run-key.
        mcp.call("notes.environment", "ticket-10")

    assert [e["kind"] for e in ledger.entries(ledger_path)] == ["post"]  # never the campaign
    assert set(Run.objects.values_list("run_key", flat=True)) == {"ticket-9", "ticket-10"}
    assert list(Call.objects.filter(run__run_key="ticket-10").values_list("tool", flat=True)) == [
        "notes.environment"
    ]


def test_the_token_never_reaches_a_server(live_server, agent, tmp_path):
    config = write_config(tmp_path, live_server.url, servers=("notes",))
    with connect(stdio_proxy(config, agent.token, "--run-key", "ticket-11")) as mcp:
        seen = mcp.call("environment").structured_content  # one server: no prefix

    assert "STARTSAFE_TOKEN" not in seen["names"]
    assert agent.token not in seen["values"]
    assert "configured" in seen["values"]  # the configuration's env does arrive
    safe = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"}  # the SDK's defaults
    configured = {"LEDGER", "MAILBOX_CRASH_FLAG", "NOTES_DELAY", "NOTES_MARK"}
    coerced = {"LC_CTYPE"}  # set by the server's own Python in a C locale (PEP 538)
    assert set(seen["names"]) <= safe | configured | coerced


def test_a_stopped_proxy_finishes_its_attempt_so_the_next_one_goes_on(live_server, agent, tmp_path):
    config = write_config(tmp_path, live_server.url, servers=("notes",))
    with http_proxy(config, agent.token, "--run-key", "ticket-12") as url, connect(url) as mcp:
        mcp.call("post_note", note_id="n-3", text="first")  # one server: no prefix
    assert Attempt.objects.get().status == "failed"  # SIGTERM: the attempt was finished

    with http_proxy(config, agent.token, "--run-key", "ticket-12") as url, connect(url) as mcp:
        again = mcp.call("post_note", note_id="n-3", text="rewritten")
    assert again.structured_content == {"note_id": "n-3", "text": "first"}  # the recorded one
    assert sorted(Attempt.objects.values_list("number", "status")) == [
        (1, "failed"),
        (2, "failed"),
    ]
    assert len(ledger.entries(tmp_path / "ledger.jsonl")) == 1


def test_a_proxy_whose_attempt_another_took_over_stops_calling_tools(live_server, agent, tmp_path):
    config = write_config(tmp_path, live_server.url, servers=("notes",))
    taking_over = write_config(
        tmp_path / "second",
        live_server.url,
        servers=("notes",),
        supersede="true",
        ledger_path=tmp_path / "ledger.jsonl",
    )
    with (
        http_proxy(config, agent.token, "--run-key", "ticket-13") as first,
        connect(first) as old,
    ):
        old.call("post_note", note_id="n-4", text="from the first proxy")
        with http_proxy(taking_over, agent.token, "--run-key", "ticket-13") as second:
            with connect(second) as new:  # supersede = true: it takes the live attempt over
                again = new.call("post_note", note_id="n-4", text="from the second")
            refused = old.call("post_note", note_id="n-5", text="from the first, later")

    assert again.structured_content == {"note_id": "n-4", "text": "from the first proxy"}
    assert refused.is_error and "another attempt took run 'ticket-13' over" in text(refused)
    assert [e["identity"] for e in ledger.entries(tmp_path / "ledger.jsonl")] == ["n-4"]
    assert sorted(Attempt.objects.values_list("number", "status")) == [
        (1, "superseded"),
        (2, "failed"),  # the second proxy's, finished when it stopped
    ]
