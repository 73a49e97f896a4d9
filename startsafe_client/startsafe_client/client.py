"""The synchronous client: the protocol core (:mod:`startsafe_client.protocol`) over
``httpx.Client``, with tools called in the caller's thread.

::

    client = Client("http://127.0.0.1:8000", token)

    @client.tool(effect(key=lambda a: provider_key("outlook", "message", a["message_id"])))
    def send_reply(message_id: str, body: str) -> dict: ...

    with client.run("ticket-4812", supersede="stale") as run:
        run.call(send_reply, message_id=msg_id, body=text)
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

import httpx

from .protocol import _DECLARING, ClientCore, Driven, Invoke, Op, Send, Sleep, Steps, T
from .run import Run
from .specs import Tool


class Client(ClientCore):
    """A startsafe client for one agent, for code without an event loop.

    Takes the options of :class:`~startsafe_client.protocol.ClientCore` (``base_url``,
    ``token``, ``timeout``, ``max_retries``, ``backoff``, ``backoff_max``,
    ``poll_interval``, ``poll_max_interval``, ``approval_timeout``,
    ``max_connections``, ``on_wait``, ``transport``, ``sleep``, ``clock``); every
    method of the contract answers directly. :class:`AsyncClient` is the same client
    for ``asyncio``.

    The client is thread-safe: the run context's heartbeat thread shares it.
    """

    _default_sleep = staticmethod(time.sleep)
    _http_class = httpx.Client
    _gate_class = threading.BoundedSemaphore
    _run_class = Run

    def _drive(self, steps: Steps[T]) -> T:
        driven = Driven(steps)
        for op in driven:
            with driven.answering() as answer:
                answer(self._perform(op))
        return driven.result

    def _perform(self, op: Op) -> Any:
        if isinstance(op, Send):
            with self._sending:
                return self._http.request(**op.request_args())
        if isinstance(op, Sleep):
            return self.sleep(op.seconds)
        return _call_here(op)

    def _call_declared(self, tool: Tool, steps: Steps[T]) -> T:
        """Declare this client's tools the process has not sent (once, whichever thread
        comes first: the others wait on the process's lock), then the call."""
        if self._needs_declaring(tool):
            with _DECLARING:
                waiting = self._declaring(tool)
                if waiting:
                    self._say(self._drive(self._declare(waiting, lenient=True)))
        return self._drive(steps)

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call_here(op: Invoke) -> Any:
    """Run the agent's code in this thread; an awaitable means it needed AsyncClient."""
    value = op.fn(*op.args, **op.kwargs)
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # it never ran: no "never awaited" warning
        raise TypeError(f"{op.fn!r} returned an awaitable: call it through AsyncClient")
    return value
