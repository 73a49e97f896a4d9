"""Pydantic AI: journal every tool call of an agent through a startsafe run.

Install with the extra: ``pip install 'startsafe-client[pydantic-ai]'``.

::

    from pydantic_ai import Agent, FunctionToolset
    from startsafe_client.pydantic_ai import JournaledToolset

    tools = FunctionToolset([lookup_customer, send_reply, send_campaign])
    with client.run("ticket-4812", supersede="stale") as run:  # or AsyncClient + agent.run
        journaled = JournaledToolset(run, tools, specs)
        result = agent.run_sync(prompt, toolsets=[journaled])
        if journaled.waiting:  # a person decides first: end the attempt failed, run again later
            raise RuntimeError(journaled.waiting[0].for_model)

:class:`JournaledToolset` wraps any toolset (a ``FunctionToolset``, an MCP server, a
prefixed or filtered one) and sends each call through ``run.call_spec``: the
protocol core decides what it means. What the model sees:

- ``execute``: the tool runs with ``effect.args`` from the answer (an operator may
  have edited them; they are validated against the tool's schema again), and the
  model gets the recorded result;
- ``skip``: the recorded result, and the tool does not run;
- ``blocked``: the tool's output ``"rejected by an operator: <note>"``, so the model
  can change course;
- still waiting past the client's ``approval_timeout``, or an outcome that only a
  person can settle: a failed tool result (``ToolFailed``) naming the effect's
  console page, listed in :attr:`JournaledToolset.waiting`. ``ToolFailed``, not
  ``ModelRetry``: the model's arguments were not wrong, so it must not be told to
  fix them and call again (which would wait again and spend its retries);
- a key the rule cannot build from the arguments: ``ModelRetry`` with
  ``KeyRefused.for_model``: there the model's arguments *are* what to fix.

A tool without a spec is an unkeyed effect, unless it is an MCP tool whose
``readOnlyHint`` is true and ``trust_annotations=True``: the MCP specification calls
annotations untrusted hints, so a server that lies must not make a write replay.

The run is the caller's (``JournaledToolset(run, ...)``), or, given a client instead
of a run, the toolset starts one per agent run with the run key
``"pydantic-ai:<run_id>"``: Pydantic AI's ``run_id``, which the caller passes to
``agent.run(..., run_id=...)`` and durable execution keeps across re-executions. It
finishes that attempt when the agent run ends: ``completed``, or ``failed`` when the
run raised or a call waits for a person, so that starting it again resumes.

Either client works: a ``Run`` (``Client``, blocking) is driven from a worker thread
so the event loop is never blocked, under ``agent.run_sync`` and ``agent.run`` alike;
an ``AsyncRun`` (``AsyncClient``) is awaited on the loop it was started on, so use it
with ``agent.run`` inside its ``async with``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError
from pydantic_ai import ModelRetry, ToolFailed
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset
from pydantic_core import to_jsonable_python

from .aio import AsyncRun
from .attempt import RunCore
from .errors import (
    ApprovalTimeout,
    EffectBlocked,
    EffectError,
    KeyRefused,
    NotPerformed,
    OutcomeUnknown,
)
from .protocol import ClientCore
from .specs import ToolSpec, effect, from_result, read

__all__ = ["RUN_KEY_PREFIX", "JournaledToolset"]

RUN_KEY_PREFIX = "pydantic-ai:"


@dataclass(init=False)
class JournaledToolset(WrapperToolset[Any]):
    """A toolset whose every call goes through a startsafe run's journal.

    Args:
        run: a started ``Run`` or ``AsyncRun`` (``with client.run(key) as run``), or a
            ``Client`` / ``AsyncClient``: then each agent run starts the run
            ``"pydantic-ai:<run_id>"`` and finishes it (module doc).
        wrapped: the toolset whose tools are journaled.
        specs: each tool's declaration by the name the model calls it
            (:func:`~startsafe_client.read`, :func:`~startsafe_client.effect`).
        trust_annotations: take an MCP tool's ``readOnlyHint`` for a read.
        run_options: with a client, the options of ``client.run`` (``title``,
            ``heartbeat_timeout``, ``supersede``...).

    Attributes:
        waiting: the calls handed to the model as waiting for a person
            (:class:`ApprovalTimeout`, :class:`OutcomeUnknown`), with ``.url``.
    """

    run: Any
    specs: Mapping[str, ToolSpec]
    trust_annotations: bool
    run_options: dict[str, Any]
    waiting: list[EffectError]
    _attempt: _Attempt | None = field(default=None, repr=False)

    def __init__(
        self,
        run: RunCore | ClientCore,
        wrapped: AbstractToolset[Any],
        specs: Mapping[str, ToolSpec] | None = None,
        *,
        trust_annotations: bool = False,
        run_options: dict[str, Any] | None = None,
        waiting: list[EffectError] | None = None,
        _attempt: _Attempt | None = None,
    ) -> None:
        if not isinstance(run, (RunCore, ClientCore)):
            raise TypeError("JournaledToolset takes a run (client.run(...)) or a client")
        if run_options and not isinstance(run, ClientCore):
            raise TypeError("run_options are for a client: a started run has its own")
        self.run = run
        self.wrapped = wrapped
        self.specs = dict(specs or {})
        self.trust_annotations = trust_annotations
        self.run_options = dict(run_options or {})
        self.waiting = [] if waiting is None else waiting
        self._attempt = _attempt  # set on the copy that started its own run

    # --- the run: the caller's, or one per agent run named after its run_id -------------

    async def for_run(self, ctx: Any) -> AbstractToolset[Any]:
        toolset = await super().for_run(ctx)
        if not isinstance(self.run, ClientCore):
            return toolset
        run = self.run.run(RUN_KEY_PREFIX + ctx.run_id, **self.run_options)
        return replace(toolset, run=run, run_options={}, waiting=[], _attempt=_Attempt())

    async def __aenter__(self) -> JournaledToolset:
        if self._attempt is not None:
            if isinstance(self.run, AsyncRun):
                await self.run.start()
            else:
                await asyncio.to_thread(self.run.start)
        try:
            await super().__aenter__()
        except BaseException as exc:
            await self._leave(exc)
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        try:
            return await super().__aexit__(*exc_info)
        finally:
            if self._attempt is not None:
                await self._leave(self._attempt.failure(exc_info, self.waiting))

    async def _leave(self, exc: BaseException | None) -> None:
        """Finish the attempt this toolset started: the run context's own exit."""
        if self._attempt is None:
            return
        if isinstance(self.run, AsyncRun):
            await self.run.__aexit__(type(exc) if exc else None, exc, None)
        else:
            await asyncio.to_thread(self.run.__exit__, type(exc) if exc else None, exc, None)

    # --- each call ---------------------------------------------------------------------

    async def get_tools(self, ctx: Any) -> dict[str, ToolsetTool[Any]]:
        """The wrapped toolset's tools; each declared with its JSON Schema before the
        run's first call (once per process, by the client)."""
        tools = await super().get_tools(ctx)
        client = self.run if isinstance(self.run, ClientCore) else self.run.client
        client._adopt(
            self.spec_for(name, tool).declaration(name, schema=tool.tool_def.parameters_json_schema)
            for name, tool in tools.items()
        )
        return tools

    def spec_for(self, name: str, tool: ToolsetTool[Any]) -> ToolSpec:
        """The tool's declaration; an unkeyed effect when it has none (module doc)."""
        if name in self.specs:
            return self.specs[name]
        annotations = (tool.tool_def.metadata or {}).get("annotations") or {}
        if self.trust_annotations and annotations.get("readOnlyHint") is True:
            return read()
        return effect()

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: Any, tool: ToolsetTool[Any]
    ) -> Any:
        if not isinstance(self.run, RunCore):
            raise TypeError("JournaledToolset: a client's run starts with an agent run")
        spec = self.spec_for(name, tool)
        args = to_jsonable_python(tool_args)  # what is recorded, and what a key rule reads

        async def perform(given: dict[str, Any]) -> Any:
            try:
                valid = tool.args_validator.validate_python(given, context=ctx.validation_context)
            except ValidationError as invalid:  # an operator's edit the schema refuses
                raise NotPerformed(
                    f"{name}: the arguments to run do not fit: {invalid}"
                ) from invalid
            value = await self.wrapped.call_tool(name, valid, ctx, tool)
            return value if spec.kind == "read" else to_jsonable_python(value)

        try:
            result = await self._call(name, spec, args, perform)
        except EffectBlocked as blocked:
            return blocked.for_model
        except (ApprovalTimeout, OutcomeUnknown) as for_a_person:
            self.waiting.append(for_a_person)
            raise ToolFailed(for_a_person.for_model) from None
        except KeyRefused as refused:
            raise ModelRetry(refused.for_model) from None
        except BaseException as error:  # the tool's own, or the attempt must stop
            if self._attempt is not None:
                self._attempt.error = error
            raise
        return result if spec.kind == "read" else from_result(result)

    async def _call(self, name: str, spec: ToolSpec, args: dict[str, Any], perform: Any) -> Any:
        """``run.call_spec``: awaited under ``AsyncRun``; a ``Run`` blocks a worker thread,
        and the tool itself still runs on this loop."""
        if isinstance(self.run, AsyncRun):
            return await self.run.call_spec(name, spec, args, perform)
        loop = asyncio.get_running_loop()

        def perform_on_the_loop(given: dict[str, Any]) -> Any:
            return asyncio.run_coroutine_threadsafe(perform(given), loop).result()

        return await asyncio.to_thread(self.run.call_spec, name, spec, args, perform_on_the_loop)


class _WaitingForAPerson(Exception):
    """Why an attempt the toolset started ends ``failed``: a call waits for a person."""


@dataclass
class _Attempt:
    """How the agent run ended, for the attempt the toolset started (shared by its copies)."""

    error: BaseException | None = None  # the last exception a call let through

    def failure(
        self, exc_info: tuple[Any, ...], waiting: list[EffectError]
    ) -> BaseException | None:
        """Why the attempt ends ``failed``, or ``None`` for ``completed``.

        The agent exits its toolsets through a ``CombinedToolset``, which does not hand
        them the run's exception (it closes an exit stack). So: the exception given,
        else one that a call let through, else the one being handled while the agent
        run unwinds, else a call that waits for a person. A wrong "failed" costs a
        restart; a wrong "completed" would close a run whose work is not done.
        """
        given = exc_info[1] if len(exc_info) > 1 else None
        exc = given or self.error or sys.exc_info()[1]
        if exc is None and waiting:
            exc = _WaitingForAPerson("; ".join(w.for_model for w in waiting))
        return exc
