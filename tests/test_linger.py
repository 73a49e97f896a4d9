"""The lingering close's bounds (startsafe/linger.py): it reads on while a body
arrives, never longer than LINGER_SECONDS, and never waits for bytes that gunicorn
may already hold in its own buffer. End to end through gunicorn: tests/test_proxy.py."""

from __future__ import annotations

import itertools
import socket
import threading

from startsafe.linger import LINGER_SECONDS, READ_AHEAD, drain


def test_a_body_that_keeps_arriving_is_read_for_linger_seconds_at_most():
    server, client = socket.socketpair()
    stop = threading.Event()

    def trickle():
        # A client that keeps sending after its answer, as slowly as it likes.
        while not stop.is_set():
            try:
                client.sendall(b"x" * 100)
            except OSError:
                return
            stop.wait(0.001)

    sender = threading.Thread(target=trickle)
    sender.start()
    # A clock that moves a tenth of the linger time at each look: the read stops
    # once the deadline is behind it, however much is still to come.
    clock = (step * LINGER_SECONDS / 10 for step in itertools.count())
    try:
        taken = drain(server, 10 * 1024 * 1024, now=lambda: next(clock))
    finally:
        stop.set()
        sender.join()
        server.close()
        client.close()
    assert 0 < taken < 10 * 1024 * 1024


def test_what_has_arrived_is_read_and_nothing_more_is_waited_for():
    server, client = socket.socketpair()
    server.settimeout(30)  # were it to wait for the missing bytes, it would hang here
    with server, client:
        client.sendall(b"x" * 5000)
        # 8,000 bytes unread by the app, 5,000 here: the other 3,000 may be in
        # gunicorn's read-ahead buffer, so they are not waited for.
        assert READ_AHEAD >= 8000
        assert drain(server, 8000) == 5000
        assert server.gettimeout() == 30  # the socket is left as it was


def test_a_peer_that_has_closed_ends_the_read():
    server, client = socket.socketpair()
    with server:
        client.sendall(b"x" * 100_000)
        client.close()
        assert drain(server, 1_000_000) == 100_000
