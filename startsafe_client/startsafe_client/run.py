"""The run context of :class:`Client`: start or restart a run, heartbeat, call tools, finish.

::

    with client.run("ticket-4812", title="Answer ticket 4812", supersede="stale") as run:
        customer = run.call(lookup_customer, email="ana@example.com")
        run.call(send_reply, message_id=msg_id, body="Hello Ana, ...")

What each answer means, and the rule for a tool's exceptions, are the protocol
core's (:mod:`startsafe_client.attempt`); this module adds the context manager and
the heartbeat thread.

**When the attempt is stopped.** The heartbeat thread learns that this attempt was
superseded (or the run finished) from the server. It cannot interrupt your code,
so it sets a flag: the next ``run.call`` (or :meth:`Run.check`, for loops that
call no tool) raises :class:`AttemptSuperseded` (or :class:`RunFinished`). The
block then ends without finishing the run, since it is no longer this attempt's.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

from .attempt import RunCore


class Run(RunCore):
    """One attempt of a run, as a context manager (made by :meth:`Client.run`).

    Entering it starts the run (or starts it again), superseding a live attempt
    only when told to (``supersede=True``, or ``"stale"`` once its heartbeat is
    older than the run's ``heartbeat_timeout``), then a daemon thread heartbeats
    every ``heartbeat_timeout / 3`` seconds.

    Leaving it: a normal exit finishes the attempt ``completed``; an exception
    finishes it ``failed`` with the error text and is re-raised; an
    :class:`AttemptStopped` (superseded, or run finished) is re-raised without
    finishing, because the attempt is no longer this process's to finish.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop_heartbeat = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None

    def start(self) -> Run:
        """Start (or restart) the run and begin heartbeating; ``__enter__`` calls it."""
        self.client._drive(self._start())
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"startsafe-heartbeat-{self.id}", daemon=True
        )
        self._heartbeat_thread.start()
        return self

    def finish(self, outcome: Literal["completed", "failed"], error: str | None = None) -> None:
        """Finish this attempt (``__exit__`` calls it); stops the heartbeat first."""
        self._stop_heartbeats()
        self.client._drive(self._finish(outcome, error))

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        self._stop_heartbeats()
        self.client._drive(self._leave(exc))
        return False

    def _heartbeat_loop(self) -> None:
        while not self._stop_heartbeat.wait(self.heartbeat_interval):
            if not self.client._drive(self._beat()):
                return

    def _stop_heartbeats(self) -> None:
        self._stop_heartbeat.set()
        thread = self._heartbeat_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
