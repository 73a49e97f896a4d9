"""What only the asyncio client does: ``async def`` tools awaited on the loop and plain
ones in a worker thread, several calls of one run in flight at once, heartbeats from
an asyncio task, and a cancelled block that ends its attempt.

Everything the two clients share (each answer, retries, the exception rule) is
tested once for both in ``test_client_flow.py``, ``test_client_retries.py`` and
``test_client_live.py``. The server here is a scripted peer.
"""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from client_helpers import RUN, base_peer, call_answer, client_options, effect, refusal, started

import startsafe_client as ss


def async_client(peer, **options) -> ss.AsyncClient:
    return ss.AsyncClient("http://startsafe.test", "tok", **client_options(peer, **options))


def executing(peer, *ids: str):
    """The peer answers each recorded call with ``execute`` on its own effect, in order;
    effect ``n`` (from 0) is recorded with the arguments ``{"n": n}``."""
    answers = [
        call_answer("execute", effect("in_flight", id=i, args={"n": n})) for n, i in enumerate(ids)
    ]
    peer.on("POST /runs/run-1/calls", *[(201, a) for a in answers])
    for i in ids:
        peer.on(f"POST /effects/{i}/complete", (200, {"effect": {"id": i, "status": "done"}}))
    return peer


def keyed(name: str) -> dict:
    """The declaration of an effect keyed on its argument ``n``."""
    return {"kind": "effect", "key": lambda a: ss.intent_key(name, n=a["n"])}


def test_an_async_tool_runs_on_the_loop_and_a_plain_one_in_a_worker_thread():
    peer = executing(base_peer(), "eff-1", "eff-2")
    client = async_client(peer)
    threads: dict[str, threading.Thread] = {}

    @client.tool(**keyed("async"))
    async def send_async(n: int) -> dict:
        threads["async"] = threading.current_thread()
        await asyncio.sleep(0)
        return {"n": n}

    @client.tool(**keyed("plain"))
    def send_plain(n: int) -> dict:
        threads["plain"] = threading.current_thread()
        return {"n": n}

    async def main() -> None:
        async with client.run("t-1") as run:
            await run.call(send_async, n=1)
            await run.call(send_plain, n=2)

    asyncio.run(main())

    assert threads["async"] is threading.main_thread()  # the event loop's thread
    assert threads["plain"] is not threading.main_thread()  # asyncio.to_thread
    assert len(peer.bodies("POST", "/effects/eff-1/complete")) == 1
    assert len(peer.bodies("POST", "/effects/eff-2/complete")) == 1


def test_several_calls_of_one_run_are_in_flight_at_once():
    """Three calls gathered: each tool waits until all three are running, which only
    happens if the client runs them at once (one after the other, it would hang)."""
    peer = executing(base_peer(), "eff-1", "eff-2", "eff-3")
    client = async_client(peer)
    all_running = asyncio.Barrier(3)

    @client.tool(**keyed("reply"))
    async def send_reply(n: int) -> dict:
        await asyncio.wait_for(all_running.wait(), timeout=5)
        return {"n": n}

    async def main() -> list:
        async with client.run("t-1") as run:
            return await asyncio.gather(*(run.call(send_reply, n=n) for n in range(3)))

    results = asyncio.run(main())

    assert sorted(r["n"] for r in results) == [0, 1, 2]
    assert len(peer.bodies("POST", "/runs/run-1/calls")) == 3


def test_the_call_spec_of_an_adapter_awaits_an_async_perform():
    peer = executing(base_peer(), "eff-1")
    client = async_client(peer)
    performed: list[dict] = []

    async def perform(args: dict) -> str:
        performed.append(args)
        return "sent"

    async def main() -> dict:
        async with client.run("t-1") as run:
            spec = ss.effect(key=lambda a: ss.intent_key("reply", n=a["n"]))
            return await run.call_spec("send_reply", spec, {"n": 1}, perform)

    asyncio.run(main())

    assert performed == [{"n": 0}]  # effect.args from the answer, not the given n=1
    assert peer.bodies("POST", "/effects/eff-1/complete")[0]["result"] == {"value": "sent"}


def test_a_superseded_heartbeat_task_stops_the_block_at_the_next_call_without_finishing():
    peer = base_peer().on("POST /runs/run-1/heartbeat", refusal("attempt_superseded"))
    peer.on("POST /runs", (201, {**started(), "run": {**RUN, "heartbeat_timeout": 1.5}}))
    client, ran = async_client(peer), []

    @client.tool(**keyed("reply"))
    async def send_reply(n: int) -> dict:
        ran.append(n)
        return {}

    async def main() -> None:
        async with client.run("t-1") as run:
            # The heartbeat task beats every 0.5 s while the block awaits something else.
            for _ in range(50):
                if run.stopped is not None:
                    break
                await asyncio.sleep(0.1)
            assert isinstance(run.stopped, ss.AttemptSuperseded)
            await run.call(send_reply, n=1)

    with pytest.raises(ss.AttemptSuperseded):
        asyncio.run(main())

    assert ran == []
    assert len(peer.bodies("POST", "/runs/run-1/heartbeat")) == 1
    assert peer.bodies("POST", "/runs/run-1/calls") == []
    assert peer.bodies("POST", "/runs/run-1/finish") == []


def test_a_cancelled_block_ends_the_attempt_failed_and_reports_nothing():
    """A task cancelled while its tool runs is an exception like any other: the effect
    is not reported (it may have happened), and the attempt ends failed."""
    peer = executing(base_peer(), "eff-1")
    peer.on("POST /runs/run-1/finish", (200, {"run": {**RUN, "status": "failed"}}))
    client = async_client(peer)
    sending = asyncio.Event()

    @client.tool(**keyed("reply"))
    async def send_reply(n: int) -> dict:
        sending.set()
        await asyncio.sleep(30)  # the provider is slow to answer
        return {}

    async def agent() -> None:
        async with client.run("t-1") as run:
            await run.call(send_reply, n=1)

    async def main() -> None:
        task = asyncio.create_task(agent())
        await sending.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())

    assert peer.bodies("POST", "/effects/eff-1/complete") == []
    finish = peer.bodies("POST", "/runs/run-1/finish")
    assert [f["outcome"] for f in finish] == ["failed"] and "CancelledError" in finish[0]["error"]


def test_the_sync_client_refuses_an_async_tool_before_recording_it():
    peer = base_peer()
    client = ss.Client("http://startsafe.test", "tok", **client_options(peer))

    @client.tool(**keyed("reply"))
    async def send_reply(n: int) -> dict:
        return {}

    with client.run("t-1") as run, pytest.raises(TypeError, match="AsyncClient"):
        run.call(send_reply, n=1)

    assert peer.bodies("POST", "/runs/run-1/calls") == []


def test_the_async_client_closes_its_connections():
    client = ss.AsyncClient("http://startsafe.test", "tok", transport=httpx.MockTransport(print))

    async def main() -> None:
        async with client:
            pass

    asyncio.run(main())

    assert client._http.is_closed
