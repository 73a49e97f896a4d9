"""The production web stack as docker-compose.yml runs it: gunicorn with the compose
file's flags, and nginx with deploy/nginx.conf in front of it (issue 15, items 2, 3, 9).

gunicorn gets the web service's command line with two workers (this machine's two
cores) in place of ``WEB_CONCURRENCY``; nginx is Debian's (``make test`` and
``.ci/run`` install it) with the repository's file, two lines of it rewritten for a
run outside docker (``fault_helpers.nginx_config``). Every server is stopped by its
fixture, whatever the test did.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from fault_helpers import NGINX_CONF, Gunicorn, Nginx, free_port, nginx_binary, nginx_config

from runs.api.idempotency import MAX_BODY, _too_large
from runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gunicorn(tmp_path) -> Iterator[Gunicorn]:
    with Gunicorn(tmp_path, workers=2, compose_flags=True) as server:
        yield server


@pytest.fixture
def nginx(tmp_path, gunicorn) -> Iterator[Nginx]:
    with Nginx(tmp_path, f"127.0.0.1:{gunicorn.port}") as proxy:
        yield proxy


@contextlib.contextmanager
def slow_bodies(port: int, headers: list[str]) -> Iterator[None]:
    """One connection per entry of ``headers`` (extra header lines, "" for none): each
    sends a POST's headers announcing a 1,000-byte body, and never the body."""
    connections = []
    try:
        for extra in headers:
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            connection.sendall(
                (
                    "POST /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"{extra}Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                ).encode()
            )
            connections.append(connection)
        time.sleep(0.5)  # the server has read the headers and waits for the body
        yield
    finally:
        for connection in connections:
            connection.close()


def healthz_seconds(url: str, timeout: float) -> float:
    """How long ``/healthz`` took to answer 200 (a ReadTimeout past ``timeout``)."""
    started = time.monotonic()
    answer = httpx.get(f"{url}/healthz", timeout=timeout)
    assert answer.status_code == 200, answer.text
    return time.monotonic() - started


def bearer(token: str) -> str:
    return f"Authorization: Bearer {token}\r\n"


# --- The config -------------------------------------------------------------------


def test_nginx_accepts_the_repository_config(tmp_path):
    binary = nginx_binary()
    assert binary, "nginx is missing: apt-get install -y nginx (make test does it as root)"
    config = nginx_config(tmp_path, port=free_port(), upstream="127.0.0.1:8000")
    done = subprocess.run(
        [binary, "-t", "-c", str(config)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "test is successful" in done.stderr


def test_every_error_body_in_the_config_is_the_contracts():
    returns = re.findall(r"return (\d{3}) '(.*)';", NGINX_CONF.read_text())
    assert {status for status, _ in returns} == {"400", "413", "502", "503", "504"}
    for _, text in returns:
        body = json.loads(text.replace("\\n", ""))
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
        assert isinstance(body["error"]["details"], dict)


# --- Slow clients (item 2) ----------------------------------------------------------


@pytest.mark.slow
def test_behind_nginx_slow_bodies_hold_no_worker(gunicorn, nginx, agent):
    # Four slow bodies with a valid token, twice the workers: nginx waits for them.
    with slow_bodies(nginx.port, [bearer(agent.token)] * 4):
        took = [healthz_seconds(nginx.url, timeout=10) for _ in range(3)]
    assert max(took) < 2, took


@pytest.mark.slow
def test_without_nginx_two_slow_bodies_with_a_token_hold_both_workers(gunicorn, agent):
    # Why the proxy is there: gunicorn's sync workers read the body themselves, and
    # two slow bodies hold both until gunicorn's --timeout (30 s; measured 32.6 s).
    with (
        slow_bodies(gunicorn.port, [bearer(agent.token)] * 2),
        pytest.raises(httpx.ReadTimeout),
    ):
        healthz_seconds(gunicorn.url, timeout=3)


@pytest.mark.slow
def test_slow_bodies_without_a_valid_token_hold_no_worker_even_without_nginx(gunicorn):
    # The token is checked before the body is read: such a request answers 401 and
    # frees its worker at once (before: /healthz waited 36 s for the timeout).
    wrong = bearer("ss_wrong") + "Idempotency-Key: k\r\n"
    with slow_bodies(gunicorn.port, ["", "", wrong, wrong]):
        took = [healthz_seconds(gunicorn.url, timeout=5) for _ in range(3)]
    assert max(took) < 2, took


def _answer_of(connection: socket.socket) -> bytes:
    """One whole HTTP answer (head and Content-Length body) read from ``connection``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += connection.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
    while len(body) < length:
        body += connection.recv(65536)
    return head


def test_a_body_answered_before_it_was_read_is_read_on_not_reset(gunicorn):
    # A wrong token is answered 401 before the body is read. The rest of the body,
    # sent after the answer, must be read and dropped (a lingering close), not met
    # with a TCP reset: a reset can reach the client (or nginx: a 502) before the 401.
    with socket.create_connection(("127.0.0.1", gunicorn.port), timeout=10) as connection:
        connection.sendall(
            b"POST /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + bearer("ss_wrong").encode()
            + f"Content-Type: application/json\r\nContent-Length: {MAX_BODY}\r\n\r\n".encode()
            + b"x" * 65536
        )
        assert _answer_of(connection).startswith(b"HTTP/1.1 401 ")
        # Before: the worker had closed with the body unread, and this failed with
        # ConnectionResetError or BrokenPipeError.
        connection.sendall(b"x" * (MAX_BODY - 65536))
        assert connection.recv(65536) == b""  # closed cleanly, once the body was read


def test_through_nginx_answers_before_the_body_are_never_502(gunicorn, nginx):
    # nginx sends the whole (1 MiB) body on; gunicorn answers 401 before reading it.
    # Without the lingering close, gunicorn's reset reached nginx first now and then,
    # and the client got nginx's 502 (seen once in a full run) for a wrong token.
    statuses = [
        httpx.post(
            f"{nginx.url}/api/v1/runs",
            content=b"x" * MAX_BODY,
            headers={"Authorization": "Bearer ss_wrong"},
        ).status_code
        for _ in range(20)
    ]
    assert statuses == [401] * 20


# --- Bodies without Content-Length (item 3) -----------------------------------------


def _chunks() -> Iterator[bytes]:
    """A body that httpx sends chunked (Transfer-Encoding, no Content-Length)."""
    yield b'{"run_key": '
    yield b'"chunked-1"}'


def test_a_chunked_body_is_411_length_required_not_read_as_empty(gunicorn, agent):
    answer = httpx.post(
        f"{gunicorn.url}/api/v1/runs",
        content=_chunks(),
        headers={"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 411, answer.text
    assert answer.json()["error"] == {
        "code": "length_required",
        "message": "A request body must come with a Content-Length header (no chunked bodies).",
        "details": {},
    }
    assert not Run.objects.exists()


def test_through_nginx_a_chunked_body_arrives_whole(gunicorn, nginx, agent):
    # nginx reads it whole and sends it on with a Content-Length.
    answer = httpx.post(
        f"{nginx.url}/api/v1/runs",
        content=_chunks(),
        headers={"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 201, answer.text
    assert Run.objects.get().run_key == "chunked-1"


# --- Errors nginx answers itself (item 9) --------------------------------------------


def _is_contract_error(answer: httpx.Response, status: int, code: str) -> dict:
    assert answer.status_code == status, answer.text
    assert answer.headers["Content-Type"] == "application/json"
    body = answer.json()
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    return body


def test_nginx_refuses_a_body_over_one_mib_with_the_apis_own_413(gunicorn, nginx):
    over = httpx.post(f"{nginx.url}/api/v1/runs", content=b"x" * (MAX_BODY + 1))
    body = _is_contract_error(over, 413, "payload_too_large")
    assert body == json.loads(_too_large().content)  # word for word what Django says
    # Exactly 1 MiB goes through (Django answers: no token), as Django's limit says.
    at_limit = httpx.post(f"{nginx.url}/api/v1/runs", content=b"x" * MAX_BODY)
    assert at_limit.status_code == 401 and at_limit.headers["WWW-Authenticate"]
    # The console keeps nginx's own page.
    console = httpx.post(f"{nginx.url}/accounts/login/", content=b"x" * (MAX_BODY + 1))
    assert console.status_code == 413 and console.headers["Content-Type"] == "text/html"


def test_nginx_refuses_too_large_headers_with_the_contracts_400(gunicorn, nginx):
    big = {"X-Padding": "a" * 9000}
    answer = httpx.get(f"{nginx.url}/api/v1/runs", headers=big)
    _is_contract_error(answer, 400, "invalid_request")
    console = httpx.get(f"{nginx.url}/accounts/login/", headers=big)
    assert console.status_code == 400 and console.headers["Content-Type"] == "text/html"


def test_with_the_web_service_down_the_api_gets_the_contracts_502(tmp_path):
    with Nginx(tmp_path, f"127.0.0.1:{free_port()}") as proxy:  # nothing listens there
        answer = httpx.get(f"{proxy.url}/api/v1/runs")
        _is_contract_error(answer, 502, "unavailable")
        console = httpx.get(f"{proxy.url}/")
        assert console.status_code == 502 and console.headers["Content-Type"] == "text/html"


def test_a_worker_that_dies_mid_request_is_the_contracts_502(tmp_path):
    # What gunicorn does to a worker past its --timeout: the connection closes with
    # no answer. A listener that reads the request and closes stands in for it.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def close_every_connection() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listener.accept()
                connection.recv(65536)
                connection.close()

    threading.Thread(target=close_every_connection, daemon=True).start()
    try:
        with Nginx(tmp_path, f"127.0.0.1:{port}") as proxy:
            answer = httpx.post(f"{proxy.url}/api/v1/runs", json={"run_key": "t"})
            _is_contract_error(answer, 502, "unavailable")
    finally:
        listener.close()


def test_the_openapi_description_names_411(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert "411 `length_required`" in schema["info"]["description"]
