"""LangChain and LangGraph: journal every call of an agent's tools through a startsafe run.

::

    from langchain.agents import create_agent
    from startsafe_client import Client, effect, intent_key, read
    from startsafe_client.langchain import journaled, run_key_for

    specs = {
        "lookup_customer": read(),
        "send_campaign": effect(
            key=lambda a: intent_key("campaign", campaign_id=a["campaign_id"]),
            needs_approval=True,
        ),
    }
    config = {"configurable": {"thread_id": "ticket-4812"}}
    with client.run(run_key_for(config), supersede="stale") as run:
        tools = journaled(run, [lookup_customer, send_campaign], specs)
        create_agent(model, tools).invoke({"messages": [...]}, config)
        tools.raise_if_waiting()  # a decision handed to the model waits for a person

``journaled`` gives back LangChain ``BaseTool`` s with the same names, descriptions
and argument schemas, for LangGraph's ``ToolNode`` or ``create_agent``. Each call
goes through :meth:`Run.call_spec <startsafe_client.run.Run.call_spec>` (the
protocol core decides what every answer means), and the model hears the outcome
the LangChain way:

- ``execute``: the tool runs with ``effect.args`` from the answer (an operator may
  have edited them), not with what the model generated; ``skip`` returns the
  recorded result, so a replay answers what the first execution answered;
- ``blocked``: the tool's output (a ``ToolMessage``) is the operator's note,
  ``"rejected by an operator: <note>"``, so the model can change course;
- a decision still pending past the client's ``approval_timeout``, an outcome a
  person must settle (``review`` without an answer from the reconcile lookup), or
  a key the rule cannot build: a ``ToolMessage`` with ``status="error"`` naming
  the console page (``for_model``). The first two are kept in
  :attr:`JournaledTools.waiting`: end the attempt ``failed`` (``raise_if_waiting``)
  so that the run is started again once a person decided;
- any other exception goes on, as without the adapter. **An exception is not proof
  that nothing happened**: an effect's tool that raises is not reported, and the
  attempt ends. For that reason an effect's own ``handle_tool_error`` does not
  turn its exceptions into output here: a ``done`` recorded for an error would
  skip the effect forever.

Sync and async: with a :class:`~startsafe_client.Client` run, ``invoke`` and
``ainvoke`` both work (``ainvoke`` runs the blocking calls in a worker thread, as
LangChain does for sync tools). With an :class:`~startsafe_client.AsyncClient`
run, use ``ainvoke`` / ``astream``: nothing blocks the loop, async tools are
awaited, and parallel tool calls are in flight at once.

A tool with no spec is an unkeyed effect, unless the framework marks it read-only:
LangChain has no such mark of its own, so ``metadata["readOnlyHint"]`` (MCP's
annotation, which ``langchain-mcp-adapters`` copies into the tool's metadata)
counts. Only the arguments the model writes (the tool-call schema) are journaled;
injected ones (``InjectedState``, ``InjectedStore``...) are passed through as they
are. A ``content_and_artifact`` tool's artifact is not kept, only its content.

This module imports ``langchain_core``; ``import startsafe_client`` does not
(install the extra: ``pip install 'startsafe-client[langchain]'``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.tools import BaseTool, ToolException
from langchain_core.utils.pydantic import get_fields
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from .errors import (
    ApprovalTimeout,
    EffectBlocked,
    EffectError,
    KeyRefused,
    NotPerformed,
    OutcomeUnknown,
)
from .specs import ToolSpec, effect, from_result, read

__all__ = ["JournaledTool", "JournaledTools", "NeedsPerson", "journaled", "run_key_for"]


class NeedsPerson(Exception):
    """Raised by :meth:`JournaledTools.raise_if_waiting`: decisions wait for a person.

    ``waiting`` holds the :class:`ApprovalTimeout` / :class:`OutcomeUnknown` handed
    to the model (each with ``.url``, the console page). Raised inside the run
    context, it finishes the attempt ``failed``; start the run again once decided.
    """

    def __init__(self, waiting: list[EffectError]) -> None:
        self.waiting = list(waiting)
        where = "; ".join(f"{e.tool or 'effect'} at {e.url}" for e in self.waiting)
        super().__init__(f"waiting for a person: {where}")


class JournaledTools(list[BaseTool]):
    """The wrapped tools (a list of ``BaseTool``), and what they told the model waits.

    Attributes:
        waiting: every :class:`ApprovalTimeout` or :class:`OutcomeUnknown` a tool
            handed to the model as an error, in order: a person decides at ``.url``.
    """

    def __init__(self, tools: Iterable[BaseTool] = ()) -> None:
        super().__init__(tools)
        self.waiting: list[EffectError] = []

    def raise_if_waiting(self) -> None:
        """Raise :class:`NeedsPerson` when a call ended waiting for a person.

        The run context then finishes the attempt ``failed`` instead of
        ``completed``, so that a later start resumes the wait (or the settled effect).
        """
        if self.waiting:
            raise NeedsPerson(self.waiting)


class _ForModel(ToolException):
    """An outcome told to the model as a tool error (``status="error"``)."""


def _only_ours(error: ToolException) -> str:
    """The wrapper's ``handle_tool_error``: our own errors become the tool's output;
    any other ``ToolException`` goes on, as the tool itself declared."""
    if isinstance(error, _ForModel):
        return str(error)
    raise error


class JournaledTool(BaseTool):
    """A LangChain tool whose every call is journaled through a startsafe run.

    Made by :func:`journaled`; it has the wrapped tool's name, description,
    argument schema, metadata and tags, so the model sees the same tool.
    """

    inner: Any
    """The wrapped ``BaseTool``, run with the journal's arguments."""
    spec: Any
    """Its declaration (a :class:`ToolSpec`: :func:`read` or :func:`effect`)."""
    startsafe_run: Any
    """The run (``Run``; ``AsyncRun`` for ``ainvoke``) that journals the calls."""
    waiting: Any
    """The list shared with the :class:`JournaledTools` this tool belongs to."""
    handle_tool_error: Any = _only_ours

    def _run(self, **kwargs: Any) -> Any:
        run = self.startsafe_run
        if run.client.awaits_tools:
            raise TypeError(
                f"tool {self.name!r} journals through an AsyncClient run: call the agent "
                "with ainvoke or astream (or journal through a Client run)"
            )
        args, injected = self._split(kwargs)

        def perform(given: dict[str, Any]) -> Any:
            tool, tool_input = self._prepare(given, injected)
            return self._recordable(tool.invoke(tool_input))

        try:
            value = run.call_spec(self.name, self.spec, args, perform)
        except (EffectBlocked, ApprovalTimeout, OutcomeUnknown, KeyRefused) as error:
            return self._told(error)
        return self._outcome(value)

    async def _arun(self, **kwargs: Any) -> Any:
        run = self.startsafe_run
        if not run.client.awaits_tools:
            return await super()._arun(**kwargs)  # a Client run: in a worker thread
        args, injected = self._split(kwargs)

        async def perform(given: dict[str, Any]) -> Any:
            tool, tool_input = self._prepare(given, injected)
            return self._recordable(await tool.ainvoke(tool_input))

        try:
            value = await run.call_spec(self.name, self.spec, args, perform)
        except (EffectBlocked, ApprovalTimeout, OutcomeUnknown, KeyRefused) as error:
            return self._told(error)
        return self._outcome(value)

    # --- what the model wrote, what runs, what the model hears ----------------------

    def _split(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's arguments (as JSON, for the journal) and the injected ones."""
        visible = _model_fields(self.inner)
        args = {k: v for k, v in kwargs.items() if visible is None or k in visible}
        injected = {k: v for k, v in kwargs.items() if k not in args}
        return to_jsonable_python(args, fallback=str), injected

    def _prepare(
        self, given: dict[str, Any], injected: dict[str, Any]
    ) -> tuple[BaseTool, dict[str, Any]]:
        """The tool to invoke and its input: the journal's arguments, plus injected ones.

        An effect's arguments (an operator's edit, say) that do not fit the tool's
        schema raise :class:`NotPerformed`: nothing ran. An effect's tool runs
        without its own ``handle_tool_error``, so that its exceptions reach the core.
        """
        tool_input = {**given, **injected}
        if self.spec.kind == "read":
            return self.inner, tool_input
        schema = self.inner.args_schema
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            try:
                schema.model_validate(tool_input)
            except ValidationError as wrong:
                raise NotPerformed(f"{self.name}: the arguments do not fit: {wrong}") from wrong
        return self.inner.model_copy(update={"handle_tool_error": False}), tool_input

    def _recordable(self, output: Any) -> Any:
        """An effect's output as JSON: it is recorded, and a replay answers it."""
        if self.spec.kind == "read":
            return output
        return to_jsonable_python(output, fallback=str)

    def _outcome(self, value: Any) -> Any:
        return value if self.spec.kind == "read" else from_result(value)

    def _told(self, error: EffectError | KeyRefused) -> str:
        """What the model hears: a rejection is the tool's output; the rest, an error."""
        if isinstance(error, EffectBlocked):
            return error.for_model
        if isinstance(error, (ApprovalTimeout, OutcomeUnknown)):
            self.waiting.append(error)
        raise _ForModel(error.for_model) from error


def journaled(
    run: Any, tools: Iterable[BaseTool], specs: Mapping[str, ToolSpec] | None = None
) -> JournaledTools:
    """Wrap LangChain tools so that every call is journaled through ``run``.

    Args:
        run: the run context (``with client.run(...) as run`` with a ``Client``, or
            ``async with`` with an ``AsyncClient``).
        tools: LangChain ``BaseTool`` s (``@tool`` functions, ``StructuredTool`` ,
            MCP tools...).
        specs: each tool's declaration by name, written beside the tools. A tool
            without one is an unkeyed effect, or a read when its
            ``metadata["readOnlyHint"]`` is true.

    Returns:
        A :class:`JournaledTools`: the wrapped tools, in order, for ``ToolNode`` or
        ``create_agent``.
    """
    specs = dict(specs or {})
    given = list(tools)
    for tool in given:
        if not isinstance(tool, BaseTool):
            raise TypeError(f"journaled takes LangChain BaseTools, not {tool!r}")
    names = {t.name for t in given}
    unknown = sorted(set(specs) - names)
    if unknown:
        raise ValueError(f"specs name tools that are not given: {', '.join(unknown)}")
    wrapped = JournaledTools()
    # Declared with their schemas before the run's first call (once per process).
    run.client._adopt(
        (specs.get(t.name) or _undeclared(t)).declaration(t.name, schema=_json_schema(t))
        for t in given
    )
    for tool in given:
        spec = specs.get(tool.name) or _undeclared(tool)
        wrapped.append(
            JournaledTool(
                name=tool.name,
                description=tool.description,
                args_schema=tool.args_schema
                if tool.args_schema is not None
                else tool.get_input_schema(),
                return_direct=tool.return_direct,
                metadata=tool.metadata,
                tags=tool.tags,
                extras=tool.extras,
                handle_validation_error=tool.handle_validation_error,
                inner=tool,
                spec=spec,
                startsafe_run=run,
                waiting=wrapped.waiting,
            )
        )
    return wrapped


def run_key_for(config: Mapping[str, Any] | None, run_key: str | None = None) -> str:
    """The run's key: the caller's ``run_key``, else LangGraph's thread.

    A LangGraph thread (``config["configurable"]["thread_id"]``) is the
    conversation a checkpointer resumes, so it is the same run across restarts:
    it gives ``"langgraph-thread:<thread_id>"``. LangChain's ``run_id`` is not
    used: it is new on every invocation. With neither, it raises ``ValueError``
    (a key is never made from nothing).
    """
    if run_key:
        return run_key
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    if thread is None or not str(thread).strip():
        raise ValueError(
            "no run_key, and no thread_id in config['configurable']: name the run "
            "(client.run('ticket-4812')) or give the graph a thread"
        )
    return f"langgraph-thread:{thread}"


def _undeclared(tool: BaseTool) -> ToolSpec:
    """A tool without a spec: a read if the framework marks it read-only, else an
    unkeyed effect (it runs, and blocks automatic restarts under ``keyed``)."""
    if (tool.metadata or {}).get("readOnlyHint") is True:
        return read()
    return effect()


def _json_schema(tool: BaseTool) -> dict[str, Any] | None:
    """The JSON Schema of the arguments the model writes (the tool-call schema)."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    return None


def _model_fields(tool: BaseTool) -> frozenset[str] | None:
    """The names of the arguments the model writes (``None``: unknown, take all)."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        properties = schema.get("properties")
        return frozenset(properties) if isinstance(properties, dict) else None
    return frozenset(get_fields(schema))
