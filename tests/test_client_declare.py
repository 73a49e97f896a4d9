"""The clients declare their tools once per process, before the first call (api.md,
"Additions in v1": ``POST /api/v1/tools``), against the real API on a live server
(PostgreSQL): however many runs and clients the process has, each declaration is
sent once; the registry holds it (kind, approval, schema); another process's identical
declaration changes nothing; under the agent's ``closed`` mode an unregistered tool's
call is :class:`ToolNotRegistered` naming it, and the registered tools still run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from langchain_core.tools import tool as langchain_tool
from startsafe_client.langchain import journaled

import startsafe_client as ss
from runs import registry
from runs.models import Call, Tool, ToolDeclaration, ToolMode

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)


class Counting(httpx.HTTPTransport):
    """The real transport, counting the declarations (``POST /api/v1/tools``) sent."""

    def __init__(self, declared: list[dict] | None = None) -> None:
        super().__init__()
        self.declared: list[dict] = [] if declared is None else declared

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if (request.method, request.url.path) == ("POST", "/api/v1/tools"):
            self.declared.append(json.loads(request.content))
        return super().handle_request(request)


class AsyncCounting(httpx.AsyncHTTPTransport):
    def __init__(self, declared: list[dict]) -> None:
        super().__init__()
        self.declared = declared

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if (request.method, request.url.path) == ("POST", "/api/v1/tools"):
            self.declared.append(json.loads(request.content))
        return await super().handle_async_request(request)


def tools_of(client) -> tuple[ss.Tool, ss.Tool]:
    @client.tool(ss.read())
    def lookup_customer(email: str) -> dict:
        return {"email": email}

    @client.tool(
        ss.effect(
            key=lambda a: ss.intent_key("campaign", campaign_id=a["campaign_id"]),
            needs_approval=True,
            approvals_required=2,
        )
    )
    def send_campaign(campaign_id: str) -> dict:
        return {"sent": campaign_id}

    return lookup_customer, send_campaign


def declared_names(bodies: list[dict]) -> list[str]:
    return sorted(t["name"] for body in bodies for t in body["tools"])


def test_a_process_declares_its_tools_once_across_runs_and_clients(live_server, agent):
    transport = Counting()
    for ticket in ("t-1", "t-2", "t-3"):  # a client per run, as a worker would make
        client = ss.Client(live_server.url, agent.token, transport=transport)
        lookup, _ = tools_of(client)
        with client.run(ticket) as run:
            run.call(lookup, email="ana@example.eu")
            run.call(lookup, email="bo@example.eu")

    assert declared_names(transport.declared) == ["lookup_customer", "send_campaign"]
    assert len(transport.declared) == 1  # before the first call, then never again
    campaign = Tool.objects.get(agent=agent, name="send_campaign")
    assert campaign.declaration["kind"] == "effect"
    assert (campaign.declaration["needs_approval"], campaign.declaration["approvals_required"]) == (
        True,
        2,
    )
    assert ToolDeclaration.objects.get(tool=campaign).source == "declared"  # not from a call
    assert Tool.objects.get(agent=agent, name="lookup_customer").declaration["kind"] == "read"


def test_the_async_client_declares_once_for_calls_in_flight_together(live_server, agent):
    declared: list[dict] = []

    async def two_runs() -> None:
        for ticket in ("a-1", "a-2"):  # a client each, closed after its run
            transport = AsyncCounting(declared)
            async with ss.AsyncClient(live_server.url, agent.token, transport=transport) as client:
                lookup, _ = tools_of(client)
                async with client.run(ticket) as run:
                    await asyncio.gather(
                        *(run.call(lookup, email=f"{n}@example.eu") for n in range(4))
                    )

    asyncio.run(two_runs())

    assert len(declared) == 1
    assert declared_names(declared) == ["lookup_customer", "send_campaign"]
    assert Call.objects.count() == 8


def test_threads_making_their_first_call_together_declare_once(live_server, agent):
    transport = Counting()
    client = ss.Client(live_server.url, agent.token, transport=transport)
    lookup, _ = tools_of(client)
    errors: list[BaseException] = []

    def one_run(ticket: str) -> None:
        try:
            with client.run(ticket) as run:
                run.call(lookup, email="ana@example.eu")
        except BaseException as error:  # noqa: BLE001 (the assertion below shows it)
            errors.append(error)

    threads = [threading.Thread(target=one_run, args=(f"th-{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert errors == []
    assert len(transport.declared) == 1


def test_a_new_tool_or_declaration_in_the_process_is_declared_alone(live_server, agent):
    transport = Counting()
    client = ss.Client(live_server.url, agent.token, transport=transport)
    lookup, _ = tools_of(client)
    with client.run("n-1") as run:
        run.call(lookup, email="ana@example.eu")

    @client.tool(ss.read())
    def lookup_order(order_id: str) -> dict:
        return {"order": order_id}

    with client.run("n-2") as run:
        run.call(lookup_order, order_id="o-1")
        run.call(lookup, email="ana@example.eu")

    assert [declared_names([body]) for body in transport.declared] == [
        ["lookup_customer", "send_campaign"],
        ["lookup_order"],
    ]


def test_declare_tools_sends_now_with_the_schemas_and_the_first_call_sends_nothing(
    live_server, agent
):
    transport = Counting()
    client = ss.Client(live_server.url, agent.token, transport=transport)
    lookup, send_campaign = tools_of(client)
    schema = {"type": "object", "properties": {"email": {"type": "string"}}}

    answered = client.declare_tools([lookup, send_campaign], schemas={"lookup_customer": schema})
    with client.run("d-1") as run:
        run.call(lookup, email="ana@example.eu")

    assert [t["name"] for t in answered] == ["lookup_customer", "send_campaign"]
    assert answered[1]["effective"]["approvals_required"] == 2
    assert len(transport.declared) == 1
    assert Tool.objects.get(agent=agent, name="lookup_customer").declaration["schema"] == schema


def test_an_adapter_declares_its_tools_with_the_frameworks_schema(live_server, agent):
    transport = Counting()
    client = ss.Client(live_server.url, agent.token, transport=transport)

    @langchain_tool
    def find_invoice(invoice_id: str, year: int) -> str:
        """Find an invoice."""
        return f"{invoice_id}/{year}"

    with client.run("lc-1") as run:
        (wrapped,) = journaled(run, [find_invoice], {"find_invoice": ss.read()})
        assert wrapped.invoke({"invoice_id": "F-1", "year": 2026}) == "F-1/2026"
        wrapped.invoke({"invoice_id": "F-2", "year": 2026})

    assert len(transport.declared) == 1
    row = Tool.objects.get(agent=agent, name="find_invoice")
    assert row.declaration["kind"] == "read"
    assert row.declaration["schema"]["required"] == ["invoice_id", "year"]
    assert row.declaration["schema"]["properties"]["year"]["type"] == "integer"


def test_the_openai_agents_adapter_declares_its_tools_with_their_schema(live_server, agent):
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call
    from startsafe_client.openai_agents import journaled as openai_journaled

    set_tracing_disabled(True)  # offline: the SDK exports no trace

    @function_tool
    def find_order(order_id: str, year: int) -> str:
        """Find an order."""
        return f"{order_id}/{year}"

    transport = Counting()
    client = ss.Client(live_server.url, agent.token, transport=transport)
    model = ScriptedModel(
        [
            [function_call("find_order", {"order_id": "o-1", "year": 2026}, call_id="c1")],
            [assistant_message("done")],
        ]
    )
    with client.run("oa-1") as run:
        tools = openai_journaled(run, [find_order], {"find_order": ss.read()})
        Runner.run_sync(Agent(name="a", model=model, tools=tools), "go")

    assert len(transport.declared) == 1
    row = Tool.objects.get(agent=agent, name="find_order").declaration
    assert (row["kind"], row["schema"]) == ("read", find_order.params_json_schema)
    assert row["schema"]["required"] == ["order_id", "year"]


def test_the_pydantic_ai_toolset_declares_every_tool_with_its_schema(live_server, agent):
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from startsafe_client.pydantic_ai import JournaledToolset

    def find_order(order_id: str, year: int) -> str:
        return f"{order_id}/{year}"

    def cancel_order(order_id: str) -> str:  # never called: declared all the same
        return "cancelled"

    turns = [ToolCallPart("find_order", {"order_id": "o-1", "year": 2026}, tool_call_id="c1")]

    def model(messages, info) -> ModelResponse:
        return ModelResponse(parts=[turns.pop()] if turns else [TextPart("done")])

    transport = Counting()
    specs = {
        "find_order": ss.read(),
        "cancel_order": ss.effect(key=lambda a: ss.intent_key("cancel", order_id=a["order_id"])),
    }
    with ss.Client(live_server.url, agent.token, transport=transport) as client:
        toolset = JournaledToolset(client, FunctionToolset([find_order, cancel_order]), specs)
        for run_id in ("pa-1", "pa-2"):
            Agent(FunctionModel(model)).run_sync("go", toolsets=[toolset], run_id=run_id)
            turns.append(
                ToolCallPart("find_order", {"order_id": "o-2", "year": 2026}, tool_call_id="c2")
            )

    assert len(transport.declared) == 1
    assert declared_names(transport.declared) == ["cancel_order", "find_order"]
    cancel = Tool.objects.get(agent=agent, name="cancel_order").declaration
    assert (cancel["kind"], cancel["schema"]["required"]) == ("effect", ["order_id"])
    assert Call.objects.filter(tool="find_order").count() == 2


AGENT_PROCESS = """
import json, sys
import httpx
import startsafe_client as ss

url, token = sys.argv[1], sys.argv[2]
declared = []

class Counting(httpx.HTTPTransport):
    def handle_request(self, request):
        if request.url.path == "/api/v1/tools":
            declared.append(json.loads(request.content))
        return super().handle_request(request)

client = ss.Client(url, token, transport=Counting())

@client.tool(ss.effect(key=lambda a: ss.intent_key("campaign", campaign_id=a["campaign_id"]),
                       needs_approval=True, approvals_required=2))
def send_campaign(campaign_id: str) -> dict:
    return {"sent": campaign_id}

@client.tool(ss.read())
def lookup_customer(email: str) -> dict:
    return {"email": email}

for ticket in ("p-1", "p-2"):
    with client.run(ticket + "-" + sys.argv[3]) as run:
        run.call(lookup_customer, email="ana@example.eu")
print(json.dumps(declared))
"""


def _agent_process(live_server, agent, name: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-c", AGENT_PROCESS, live_server.url, agent.token, name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_second_process_declares_again_and_its_identical_declaration_changes_nothing(
    live_server, agent
):
    first = _agent_process(live_server, agent, "one")
    rows = {t.name: (t.fingerprint, t.state, t.updated_at) for t in Tool.objects.all()}
    history = ToolDeclaration.objects.count()

    second = _agent_process(live_server, agent, "two")

    assert len(first) == len(second) == 1  # each process once, for its two runs
    assert first == second
    assert {t.name: (t.fingerprint, t.state, t.updated_at) for t in Tool.objects.all()} == rows
    assert ToolDeclaration.objects.count() == history == 2
    assert set(rows) == {"lookup_customer", "send_campaign"}
    assert {state for _, state, _ in rows.values()} == {"registered"}


def test_closed_mode_refuses_an_unregistered_tool_by_name_and_runs_the_registered(
    live_server, agent
):
    client = ss.Client(live_server.url, agent.token, transport=Counting())
    lookup, send_campaign = tools_of(client)
    client.declare_tools([lookup])  # registered while the agent was open
    agent.tool_mode = ToolMode.CLOSED
    agent.save(update_fields=["tool_mode"])

    with pytest.raises(ss.ToolNotRegistered) as refused:
        client.declare_tools([lookup, send_campaign])
    assert (refused.value.tool, refused.value.status) == ("send_campaign", 409)

    with client.run("c-1") as run:
        assert run.call(lookup, email="ana@example.eu") == {"email": "ana@example.eu"}
        with pytest.raises(ss.ToolNotRegistered) as call_refused:
            run.call(send_campaign, campaign_id="spring")

    assert call_refused.value.tool == "send_campaign"
    assert "send_campaign" in str(call_refused.value)
    assert list(Call.objects.values_list("tool", flat=True)) == ["lookup_customer"]
    assert not Tool.objects.filter(agent=agent, name="send_campaign").exists()


def test_a_failed_declaration_is_raised_not_swallowed_and_sent_again(live_server, agent):
    class Refusing(Counting):
        refuse = True

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/api/v1/tools" and self.refuse:
                self.declared.append({"tools": []})
                return httpx.Response(
                    400,
                    json={"error": {"code": "invalid_request", "message": "no", "details": {}}},
                )
            return super().handle_request(request)

    transport = Refusing()
    client = ss.Client(live_server.url, agent.token, transport=transport, backoff=0.01)
    lookup, _ = tools_of(client)
    with pytest.raises(ss.InvalidRequest), client.run("f-1") as run:
        run.call(lookup, email="ana@example.eu")
    assert Call.objects.count() == 0  # the call was not made

    transport.refuse = False
    with client.run("f-2") as run:
        run.call(lookup, email="ana@example.eu")
    assert len(transport.declared) == 2  # not counted as sent: declared at the next call
    assert Tool.objects.filter(agent=agent).count() == 2


# --- startsafe-mcp: the servers' tools declared once, with schemas and annotations ---


def _proxy_calls(live_server, agent, tmp_path, *calls: tuple[str, dict]) -> tuple[list, list]:
    """Start startsafe-mcp over the notes server against the live server, make the
    calls; the declarations it sent and the calls' results."""
    from mcp_helpers import write_config
    from startsafe_client.mcp import load_config, open_proxy

    declared: list[dict] = []

    async def run() -> list:
        config = load_config(write_config(tmp_path, live_server.url, servers=("notes",)))
        async with open_proxy(
            config,
            url=live_server.url,
            token=agent.token,
            run_key="mcp-1",
            transport=AsyncCounting(declared),
        ) as proxy:
            return [await proxy.call_tool(name, args) for name, args in calls]

    return declared, asyncio.run(run())


@pytest.mark.slow
def test_the_mcp_proxy_declares_its_servers_tools_once_before_the_first_call(
    live_server, agent, tmp_path
):
    post = ("post_note", {"note_id": "n-1", "text": "hello"})
    declared, results = _proxy_calls(live_server, agent, tmp_path, post, post)

    assert [r.is_error for r in results] == [False, False]
    assert len(declared) == 1  # at start; the calls declare nothing more
    assert declared_names(declared) == [
        "notes.add_note",
        "notes.environment",
        "notes.post_note",
        "notes.purge_notes",
    ]
    post_note = Tool.objects.get(agent=agent, name="notes.post_note")
    assert (post_note.declaration["kind"], post_note.declaration["key_source"]) == (
        "effect",
        "intent",
    )
    assert post_note.declaration["schema"]["required"] == ["note_id", "text"]
    purge = Tool.objects.get(agent=agent, name="notes.purge_notes").declaration
    assert (purge["kind"], purge["annotations"]) == ("effect", {"readOnlyHint": True})
    assert ToolDeclaration.objects.filter(tool=post_note).count() == 1


@pytest.mark.slow
def test_under_closed_mode_the_proxy_starts_and_refuses_the_unregistered_tools_call(
    live_server, agent, tmp_path
):
    registry.declare_tools(agent, [{"name": "notes.post_note", "kind": "effect"}])  # an admin's
    agent.tool_mode = ToolMode.CLOSED
    agent.save(update_fields=["tool_mode"])

    declared, (posted, added) = _proxy_calls(
        live_server,
        agent,
        tmp_path,
        ("post_note", {"note_id": "n-1", "text": "hello"}),
        ("add_note", {"customer": "ana", "text": "hello"}),
    )

    assert not posted.is_error  # registered: it runs
    assert added.is_error
    text = added.content[0].text
    assert "tool_not_registered" in text and "notes.add_note" in text
    # All four refused at once; then the registered one alone, with its schema.
    assert [declared_names([body]) for body in declared] == [
        ["notes.add_note", "notes.environment", "notes.post_note", "notes.purge_notes"],
        ["notes.post_note"],
    ]
    assert list(Tool.objects.values_list("name", flat=True)) == ["notes.post_note"]
    assert Tool.objects.get().declaration["schema"]["required"] == ["note_id", "text"]
    assert list(Call.objects.values_list("tool", flat=True)) == ["notes.post_note"]
