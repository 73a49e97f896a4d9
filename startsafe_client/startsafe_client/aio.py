"""The asyncio client: the protocol core (:mod:`startsafe_client.protocol`) over
``httpx.AsyncClient``, with tools awaited (``async def``) or run in a worker thread.

::

    client = AsyncClient("http://127.0.0.1:8000", token)

    @client.tool(effect(key=lambda a: provider_key("outlook", "message", a["message_id"])))
    async def send_reply(message_id: str, body: str) -> dict: ...

    @client.tool(read())
    def lookup_customer(email: str) -> dict: ...  # plain: runs in a worker thread

    async with client.run("ticket-4812", supersede="stale") as run:
        customer = await run.call(lookup_customer, email="ana@example.eu")
        await asyncio.gather(
            run.call(send_reply, message_id=m1, body=text1),
            run.call(send_reply, message_id=m2, body=text2),
        )

Same options, decorator, answers, exceptions and retries as :class:`Client`: both
drive the same steps. Nothing here blocks the event loop: HTTP goes through
``httpx.AsyncClient``, pauses through ``asyncio.sleep``, heartbeats from an asyncio
task, and a plain (not ``async def``) tool or reconcile lookup runs in a worker
thread (``asyncio.to_thread``, so the loop's default executor bounds how many run at
once). Key rules and previews are called on the loop: keep them quick, as the key
helpers are.

Several calls of one run may be in flight at once (``asyncio.gather``): each is
its own journal entry, and the server orders them.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from typing import TYPE_CHECKING, Any, Literal

import httpx

from .attempt import RunCore, _is_async
from .protocol import ClientCore, Driven, Invoke, Op, Send, Sleep, Steps, T

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from .specs import Tool, ToolSpec

# The lock of each event loop around "declare what the process has not sent" (an
# asyncio lock belongs to one loop; protocol.py's ``_DECLARED`` is the process's).
_DECLARING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


class AsyncRun(RunCore):
    """One attempt of a run, as an async context manager (made by :meth:`AsyncClient.run`).

    ``async with client.run(run_key, ...) as run:`` behaves as :class:`Run`'s
    ``with``: it starts (or restarts) the run, heartbeats from an asyncio task every
    ``heartbeat_timeout / 3`` seconds, and finishes the attempt ``completed``, or
    ``failed`` when the block raises (a cancelled task included). ``run.call`` and
    ``run.call_spec`` are awaited.
    """

    if TYPE_CHECKING:

        async def call(self, tool: Tool, /, **args: Any) -> Any: ...

        async def call_spec(
            self,
            name: str,
            spec: ToolSpec,
            args: Mapping[str, Any],
            perform: Callable[[dict[str, Any]], Any],
        ) -> Any: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._heartbeat_task: asyncio.Task[None] | None = None

    async def start(self) -> AsyncRun:
        """Start (or restart) the run and begin heartbeating; ``__aenter__`` calls it."""
        await self.client._drive(self._start())
        self._heartbeat_task = asyncio.create_task(
            self._heartbeat_loop(), name=f"startsafe-heartbeat-{self.id}"
        )
        return self

    async def finish(
        self, outcome: Literal["completed", "failed"], error: str | None = None
    ) -> None:
        """Finish this attempt (``__aexit__`` calls it); stops the heartbeat first."""
        await self._stop_heartbeats()
        await self.client._drive(self._finish(outcome, error))

    async def __aenter__(self) -> AsyncRun:
        return await self.start()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        await self._stop_heartbeats()
        await self.client._drive(self._leave(exc))
        return False

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            if not await self.client._drive(self._beat()):
                return

    async def _stop_heartbeats(self) -> None:
        task = self._heartbeat_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])  # raises nothing of the task's; our own cancel still goes


class AsyncClient(ClientCore):
    """A startsafe client for one agent, on an asyncio event loop.

    Takes the options of :class:`Client`; ``transport`` is an
    ``httpx.AsyncBaseTransport`` and ``sleep`` an ``async`` function (default
    ``asyncio.sleep``). Every method of the contract (``post``, ``get_run``,
    ``poll_effect``…) is awaited; ``client.run(...)`` is entered with ``async with``.
    Close it with ``await client.aclose()`` or ``async with AsyncClient(...)``.
    """

    _default_sleep = staticmethod(asyncio.sleep)
    _http_class = httpx.AsyncClient
    _gate_class = asyncio.Semaphore
    _run_class = AsyncRun
    awaits_tools = True

    if TYPE_CHECKING:

        async def request(self, method: str, path: str, **options: Any) -> httpx.Response: ...
        async def get(self, path: str, **params: Any) -> dict[str, Any]: ...
        async def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
        async def get_run(self, run_id: str) -> dict[str, Any]: ...
        async def list_runs(self, **filters: Any) -> dict[str, Any]: ...
        async def get_effect(self, effect_id: str) -> dict[str, Any]: ...
        async def list_effects(self, **filters: Any) -> dict[str, Any]: ...
        async def poll_effect(
            self, effect_id: str, etag: str | None
        ) -> tuple[dict[str, Any] | None, str]: ...
        def run(self, run_key: str, **options: Any) -> AsyncRun: ...
        async def declare_tools(
            self,
            tools: Mapping[str, ToolSpec] | Iterable[Tool],
            *,
            schemas: Mapping[str, Mapping[str, Any]] | None = None,
        ) -> list[dict[str, Any]]: ...

    async def _drive(self, steps: Steps[T]) -> T:
        driven = Driven(steps)
        for op in driven:
            with driven.answering() as answer:
                answer(await self._perform(op))
        return driven.result

    async def _perform(self, op: Op) -> Any:
        if isinstance(op, Send):
            async with self._sending:
                return await self._http.request(**op.request_args())
        if isinstance(op, Sleep):
            return await _settled(self.sleep(op.seconds))
        return await _call_off_the_loop(op)

    async def _call_declared(self, tool: Tool, steps: Steps[T]) -> T:
        """Declare this client's tools the process has not sent (once: the other tasks
        of the loop wait on its lock), then the call."""
        if self._needs_declaring(tool):
            loop = asyncio.get_running_loop()
            lock = _DECLARING.get(loop) or _DECLARING.setdefault(loop, asyncio.Lock())
            async with lock:
                waiting = self._declaring(tool)
                if waiting:
                    self._say(await self._drive(self._declare(waiting, lenient=True)))
        return await self._drive(steps)

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _call_off_the_loop(op: Invoke) -> Any:
    """Await the agent's ``async def`` code; run its plain blocking code in a worker thread."""
    if op.blocking and not _is_async(op.fn):
        value = await asyncio.to_thread(op.fn, *op.args, **op.kwargs)
    else:
        value = op.fn(*op.args, **op.kwargs)
    return await _settled(value)


async def _settled(value: Any) -> Any:
    """The value, awaited when it is awaitable."""
    return await value if inspect.isawaitable(value) else value
