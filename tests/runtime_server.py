"""A loopback HTTP server standing in for an agent runtime's restart URL."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RuntimeServer:
    """Records every POST (headers, JSON body); ``respond`` decides each answer.

    ``respond(delivery) -> int`` (or ``(int, headers)``) runs in the request's own
    thread, so it may block (to hold a request open) or start the run like a runtime
    would. ``reply`` is the body of every answer.
    """

    def __init__(
        self,
        respond: Callable[[dict], int | tuple] | None = None,
        *,
        reply: bytes = b'{"ok": true}',
    ):
        self.deliveries: list[dict] = []
        self.respond = respond or (lambda delivery: 200)
        self.arrived = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                delivery = {
                    "key": self.headers.get("Idempotency-Key"),
                    "host": self.headers.get("Host"),
                    "body": body,
                }
                with server.arrived:
                    server.deliveries.append(delivery)
                    server.arrived.notify_all()
                answer = server.respond(delivery)
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(reply)
                except OSError:
                    pass  # the caller went away (a killed worker); nothing to answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/restart"

    def wait_for(self, count: int, timeout: float) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.deliveries) >= count, timeout)

    def __enter__(self) -> RuntimeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
