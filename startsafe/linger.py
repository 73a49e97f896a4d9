"""Lingering close: after an answer given without reading the request's body, the
body's bytes still on their way are read and dropped, briefly, before the
connection closes.

Why: the API answers some requests without reading their body, on purpose (a
missing or wrong token is ``401`` before the body is read, so that a client
without a token cannot hold a worker by sending a body slowly: runs/api/idempotency.py).
gunicorn's sync worker then closes the socket with those bytes unread, and the
kernel answers unread bytes with a TCP reset, which can reach the peer before it
has read the answer: a client sees "connection reset" instead of its ``401``,
and nginx in front answers ``502`` (its retryable "unavailable" error) instead.
Web servers read on for a while before they close for this reason (nginx's
``lingering_close``; Django's runserver reads the rest of every body); gunicorn's
sync worker does not, so this WSGI middleware does, on gunicorn's socket:

1. Only when the app read less than the ``Content-Length`` (a body without one is
   refused with ``411`` and never lingered over).
2. First, with a short timeout per read, while the body keeps arriving and more
   of it than gunicorn's own read-ahead (8 KiB) may still be on its way; then,
   without waiting, what is already there. A body that had arrived whole costs no
   wait at all.
3. Never longer than ``LINGER_SECONDS`` in all: a client that sends slowly after
   its answer holds the worker that long at most, not the 30 s of gunicorn's
   timeout.
"""

from __future__ import annotations

import contextlib
import socket
import time

from werkzeug.wsgi import ClosingIterator

# The longest a worker reads on after an answer, and the longest pause in a body
# still arriving (from nginx on the same network, a body comes without pauses).
LINGER_SECONDS = 2.0
QUIET_SECONDS = 0.25
# gunicorn reads a request's head in pieces of this size (SocketUnreader): up to
# this much of the body may already be in its buffer, out of the kernel's.
READ_AHEAD = 8192


class _CountingInput:
    """``wsgi.input``, counting the bytes the app read through it."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.bytes_read = 0

    def read(self, *args):
        data = self.stream.read(*args)
        self.bytes_read += len(data)
        return data

    def readline(self, *args):
        data = self.stream.readline(*args)
        self.bytes_read += len(data)
        return data

    def readlines(self, *args):
        lines = self.stream.readlines(*args)
        self.bytes_read += sum(map(len, lines))
        return lines

    def __iter__(self):
        for line in self.stream:
            self.bytes_read += len(line)
            yield line


def _content_length(environ) -> int:
    try:
        return max(int(environ.get("CONTENT_LENGTH") or 0), 0)
    except ValueError:
        return 0


def drain(sock: socket.socket, unread: int, *, now=time.monotonic) -> int:
    """Read and drop up to ``unread`` bytes from ``sock`` (steps 2 and 3 above);
    returns how many were read. Never raises for the socket's errors."""
    deadline = now() + LINGER_SECONDS
    taken = 0
    previous_timeout = sock.gettimeout()
    try:
        # While more than gunicorn's read-ahead may still be on its way: wait for it.
        while taken < unread - READ_AHEAD:
            left = deadline - now()
            if left <= 0:
                return taken
            sock.settimeout(min(QUIET_SECONDS, left))
            data = sock.recv(min(65536, unread - taken))
            if not data:
                return taken
            taken += len(data)
        # The rest, if any, is in gunicorn's buffer or already here: take what is here.
        sock.setblocking(False)
        while taken < unread:
            data = sock.recv(min(65536, unread - taken))
            if not data:
                break
            taken += len(data)
    except OSError:  # a timeout, nothing more here yet, or the peer went away
        pass
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(previous_timeout)
    return taken


def lingering_close(app):
    """Wrap a WSGI app so that gunicorn reads an unread body on before it closes."""

    def application(environ, start_response):
        sock = environ.get("gunicorn.socket")
        length = _content_length(environ)
        if sock is None or length == 0:
            return app(environ, start_response)
        counted = _CountingInput(environ["wsgi.input"])
        environ["wsgi.input"] = counted
        result = app(environ, start_response)
        if counted.bytes_read >= length:
            return result
        # After the answer is written (gunicorn calls close() last), not before it.
        return ClosingIterator(result, [lambda: drain(sock, length - counted.bytes_read)])

    return application
