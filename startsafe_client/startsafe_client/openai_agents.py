"""The OpenAI Agents SDK adapter: every call of a function tool goes through a run's journal.

::

    from agents import Agent, Runner, function_tool
    from startsafe_client import AsyncClient, effect, intent_key, read
    from startsafe_client.openai_agents import journaled

    specs = {
        "lookup_customer": read(),
        "send_campaign": effect(
            key=lambda a: intent_key("campaign", campaign_id=a["campaign_id"]),
            needs_approval=True,
        ),
    }
    async with client.run("ticket-4812", supersede="stale") as run:
        tools = journaled(run, [lookup_customer, send_campaign], specs)
        result = await Runner.run(Agent(name="support", tools=tools), ticket_text)
        if tools.waiting:  # handed to a person: end the attempt failed, run again later
            raise RuntimeError("decide at " + ", ".join(w.url for w in tools.waiting))

Installed with the ``openai-agents`` extra (``pip install 'startsafe-client[openai-agents]'``);
importing :mod:`startsafe_client` alone never imports the SDK.

What each wrapped tool does, on the protocol core (:meth:`Run.call_spec`):

- the model's arguments (the call's JSON) give the key; an effect runs with
  ``effect.args`` from the ``execute`` answer (an operator may have edited them),
  passed to the tool as its JSON arguments;
- ``skip`` returns the recorded result (:func:`from_result`), without running the tool;
- ``review`` runs the spec's reconcile lookup;
- ``blocked``: the tool's output is ``"rejected by an operator: <note>"``, so the
  model hears the note on its next turn;
- still waiting past the client's ``approval_timeout``, an unknown outcome with no
  lookup, or a refused key: a tool error whose text (``for_model``) names the
  console page (or the missing argument). The first two are also listed in
  ``tools.waiting``: a person must decide before the run can go on;
- ``NotPerformed`` from the tool: it is reported ``failed`` and the model sees the
  tool's own error text (the SDK's ``failure_error_function``; "Please try again"
  by default);
- any other exception of an effect's tool (a ``ToolTimeoutError`` included) is not
  proof that nothing happened: it is not reported and it fails the SDK run
  (``UserError``), so the run context ends the attempt and the next one reconciles.
  A read keeps the SDK's own error handling.

A tool error is what the SDK gives the model for a failed tool: a text as the tool's
output (a function call's output has no error flag), with the error on the tool's
trace span. The tool's own ``timeout`` applies to its run, not to a wait for a
person. ``ToolContext.tool_arguments`` stays what the model generated; the tool's
arguments are the recorded ones.

Both of the SDK's paths work: ``await Runner.run(...)`` with :class:`AsyncClient`'s
run, and ``Runner.run_sync(...)`` (or ``Runner.run``) with :class:`Client`'s run,
whose blocking calls go to a worker thread while the tool itself runs on the SDK's
event loop.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from agents import FunctionTool
from agents.tool import (
    invoke_function_tool,
    maybe_invoke_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext
from agents.tracing import SpanError, get_current_span
from pydantic_core import to_jsonable_python

from .aio import AsyncRun
from .errors import ApprovalTimeout, EffectBlocked, EffectError, KeyRefused, OutcomeUnknown
from .run import Run
from .specs import ToolSpec, effect, from_result, read

__all__ = ["JournaledTools", "journaled", "run_key_for"]


class JournaledTools(list[FunctionTool]):
    """The wrapped tools (a list of ``FunctionTool``), and what waits for a person.

    ``waiting`` lists the :class:`ApprovalTimeout` and :class:`OutcomeUnknown` the
    model was told about (each with ``.url``, the console page): the SDK run goes on,
    but the attempt should end ``failed`` so that a later one resumes once a person
    decided (a completed run is finished for good).
    """

    def __init__(self, tools: Iterable[FunctionTool] = ()) -> None:
        super().__init__(tools)
        self.waiting: list[EffectError] = []


def journaled(
    run: Run | AsyncRun,
    tools: Iterable[FunctionTool],
    specs: Mapping[str, ToolSpec] | None = None,
    *,
    trust_read_only_hints: bool = False,
) -> JournaledTools:
    """Wrap the SDK's function tools so that every call goes through ``run``'s journal.

    Args:
        run: the attempt, inside ``with client.run(...)`` (:class:`Client`) or
            ``async with client.run(...)`` (:class:`AsyncClient`).
        tools: ``FunctionTool``s (``@function_tool`` functions, or built by hand).
        specs: each tool's declaration by its name, :func:`read` or :func:`effect`.
            A tool without one is an unkeyed effect (it runs, and blocks automatic
            restarts under ``keyed``), unless ``trust_read_only_hints`` is set and
            the tool carries MCP's ``readOnlyHint``: the SDK calls those hints the
            server's claims, not proof, so trusting them is the caller's choice.

    Returns:
        A :class:`JournaledTools`: the tools to give the ``Agent``, same names,
        descriptions, schemas, guardrails and approvals, each journaled.
    """
    tools = list(tools)
    specs = dict(specs or {})
    strangers = [t for t in tools if not isinstance(t, FunctionTool)]
    if strangers:
        raise TypeError(f"journaled() wraps FunctionTools only, not {strangers[0]!r}")
    unknown = sorted(set(specs) - {t.name for t in tools})
    if unknown:
        raise ValueError(f"specs name tools that are not given: {', '.join(unknown)}")
    wrapped = JournaledTools()
    declarations = []
    for tool in tools:
        spec = specs.get(tool.name) or _undeclared(tool, trust_read_only_hints)
        wrapped.append(_journaled_tool(run, tool, spec, wrapped.waiting))
        declarations.append(spec.declaration(tool.name, schema=tool.params_json_schema))
    run.client._adopt(declarations)  # declared with their schemas before the first call
    return wrapped


def run_key_for(
    *, session: Any = None, conversation_id: str | None = None, run_config: Any = None
) -> str:
    """A run key from the SDK's own identity of the conversation, for a caller with none.

    In this order: the ``Session``'s ``session_id``, the server-side
    ``conversation_id``, then ``RunConfig.group_id`` (the SDK's "chat thread id"
    for traces). The caller's own run key always wins:
    ``client.run(run_key or run_key_for(session=session))``. A trace id is never
    used: it changes on every attempt, and a run key is never built from nothing
    (``ValueError``).
    """
    for source, value in (
        ("session", getattr(session, "session_id", None)),
        ("conversation", conversation_id),
        ("group", getattr(run_config, "group_id", None)),
    ):
        if value:
            return f"openai-agents:{source}:{value}"
    raise ValueError(
        "no identity to key the run on: give a run key, or a session, conversation_id "
        "or run_config.group_id that stays the same across attempts"
    )


def _undeclared(tool: FunctionTool, trust_read_only_hints: bool) -> ToolSpec:
    hints = tool.mcp_annotations
    # The installed MCP SDK's own names: read_only_hint in 2.x, readOnlyHint before.
    read_only = getattr(hints, "read_only_hint", getattr(hints, "readOnlyHint", None))
    return read() if trust_read_only_hints and read_only is True else effect()


def _journaled_tool(
    run: Run | AsyncRun, tool: FunctionTool, spec: ToolSpec, waiting: list[EffectError]
) -> FunctionTool:
    """The tool as the model sees it, its invocation journaled (see the module doc)."""
    body = tool if spec.kind == "read" else _raising_copy(tool)

    async def invoke(ctx: ToolContext[Any], input: str) -> Any:
        try:
            args = json.loads(input or "{}")
        except ValueError as bad:
            return _tool_error(f"the arguments are not JSON ({bad}); nothing was done")
        if not isinstance(args, dict):
            return _tool_error("the arguments must be a JSON object; nothing was done")

        async def perform(given: dict[str, Any]) -> Any:
            output = await invoke_function_tool(
                function_tool=body, context=ctx, arguments=json.dumps(given)
            )
            return output if spec.kind == "read" else to_jsonable_python(output)

        try:
            result = await _call(run, tool.name, spec, args, perform)
        except EffectBlocked as blocked:
            return blocked.for_model
        except (ApprovalTimeout, OutcomeUnknown) as person:
            waiting.append(person)
            return _tool_error(person.for_model)
        except KeyRefused as refused:
            return _tool_error(refused.for_model)
        except Exception as error:
            if spec.kind == "read" or not spec.performed_nothing(error):
                raise
            # Reported failed: the tool's own error text, as the SDK would give it.
            told = await maybe_invoke_function_tool_failure_error_function(
                function_tool=tool, context=ctx, error=error
            )
            if told is None:
                raise
            return _tool_error(told)
        return result if spec.kind == "read" else from_result(result)

    return dataclasses.replace(tool, on_invoke_tool=invoke, timeout_seconds=None)


def _raising_copy(tool: FunctionTool) -> FunctionTool:
    """The tool for an effect's body: its exceptions raise, a timeout included.

    The SDK turns a tool's exception into a text for the model by default, and a
    timeout into a text too: reported ``done``, either would record an outcome
    nobody knows. The journaled tool keeps the SDK's own timeout off (a wait for a
    person is not the tool's run time); this copy applies it to the tool's body.
    """
    body = copy.copy(tool)
    set_function_tool_failure_error_function(body, None)
    if body.timeout_seconds is not None:
        body.timeout_behavior = "raise_exception"
    return body


async def _call(
    run: Run | AsyncRun, name: str, spec: ToolSpec, args: dict[str, Any], perform: Any
) -> Any:
    """``run.call_spec`` awaited on the loop, or (a sync :class:`Run`) in a worker thread.

    The sync run's blocking HTTP goes to the thread; the tool itself still runs on
    the SDK's event loop, where ``perform`` is sent back to.
    """
    if isinstance(run, AsyncRun):
        return await run.call_spec(name, spec, args, perform)
    loop = asyncio.get_running_loop()

    def perform_on_the_loop(given: dict[str, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(perform(given), loop).result()

    return await asyncio.to_thread(run.call_spec, name, spec, args, perform_on_the_loop)


def _tool_error(text: str) -> str:
    """A tool error the model sees: its text as the output, and the error on the span."""
    span = get_current_span()
    if span is not None:
        span.set_error(SpanError(message="startsafe: not performed", data={"error": text}))
    return text
