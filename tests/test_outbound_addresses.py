"""No server-side request forgery: the addresses startsafe refuses to POST to, in every
notation, for a run's ``restart_url`` (at the API and when handing off) and for the
notification webhook (startsafe/outbound.py).

No connection here leaves the loopback range: every TCP connection goes through a
guard that refuses (and records) any other address, and names are answered by a
stand-in DNS, so the tests hold offline and on the unfixed code too.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.urls import reverse
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from approvals.models import Notification
from approvals.notifications import notify
from runs.api.schemas import URL_PATTERN
from runs.handoff import deliver_restart_handoff
from runs.lifecycle import start_run
from runs.models import AuditEvent, RestartHandoff, Run
from runs.sweep import sweep
from startsafe.outbound import (
    NO_ANSWER,
    REFUSED,
    REFUSED_URL_PATTERN,
    is_public,
    parse_allow,
    text_refusal,
)
from tests.api_client import Api
from tests.console_helpers import awaiting_campaign
from tests.runtime_server import RuntimeServer

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- The network, held to loopback --------------------------------------------------


def _is_loopback(host: str) -> bool:
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback


@pytest.fixture
def dns(monkeypatch):
    """A stand-in DNS: ``answers[name]`` is the list of answers, one per lookup (the
    last one repeats), as a rebinding attacker's server could give; ``lookups`` lists
    each lookup of those names. Other names go to the real resolver."""
    answers: dict[str, list[list[str]]] = {}
    lookups: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in answers:
            return real(host, port, family, type, proto, flags)
        lookups.append(name)
        queue = answers[name]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        port = int(port or 0)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port, 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return SimpleNamespace(answers=answers, lookups=lookups)


@pytest.fixture(autouse=True)
def connections(monkeypatch, dns):
    """Every TCP connection: ``outside`` lists the addresses outside loopback it was
    asked for (refused here), ``by_name`` the names it was asked to connect to (which
    a rebinding DNS could answer differently from the check)."""
    seen = SimpleNamespace(outside=[], by_name=[])
    real = socket.create_connection

    def create_connection(address, *args, **kwargs):
        host, port = address[0], address[1]
        try:
            ipaddress.ip_address(host)
        except ValueError:
            seen.by_name.append(host)
        resolved = [info[4][0] for info in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)]
        outside = [a for a in resolved if not _is_loopback(a)]
        if outside:
            seen.outside.extend(outside)
            raise ConnectionRefusedError(f"the test refuses to connect to {outside}")
        return real((resolved[0], port), *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return seen


@pytest.fixture
def queued(monkeypatch):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda *a, **kw: None)


def _handed_back(agent, url: str) -> Run:
    """A run made without the API (so with any restart_url), interrupted and handed back."""
    run = start_run(agent, "job-1", heartbeat_timeout=5, restart_url=url, now=T0).run
    sweep(now=later(6))
    run.refresh_from_db()
    assert run.restart_ready
    return run


# --- Refused at the API, from the URL's text ------------------------------------------

# (URL, what details.fields.restart_url says)
REFUSED_AT_THE_API = [
    ("http://127.0.0.1:6379/", "127.0.0.1, a loopback address"),
    ("http://2130706433/", "four decimal numbers"),  # decimal
    ("http://0x7f000001/", "four decimal numbers"),  # hex
    ("http://0177.0.0.1/", "four decimal numbers"),  # octal
    ("http://127.1/", "four decimal numbers"),  # short form
    ("http://0/", "four decimal numbers"),
    ("http://0.0.0.0:8000/", "the unspecified address"),
    ("http://169.254.169.254/latest/meta-data/", "a link-local address"),
    ("http://10.0.0.1/", "a private address"),
    ("http://192.168.1.1/", "a private address"),
    ("http://172.16.0.1/", "a private address"),
    ("http://172.31.255.255/", "a private address"),
    ("http://100.64.0.1/", "not public"),
    ("http://224.0.0.1/", "a multicast address"),
    ("http://255.255.255.255/", "a reserved address"),
    ("http://user:pw@127.0.0.1:80/restart", "a loopback address"),
    ("http://localhost:8000/restart", "this machine"),
    ("http://LOCALHOST./", "this machine"),
    ("http://runtime.localhost/", "this machine"),
    # IPv6 literals: the URL's pattern takes none (a runtime on IPv6 is named).
    ("http://[::1]/", "should match pattern"),
    ("http://[::ffff:127.0.0.1]/", "should match pattern"),
    ("http://[::ffff:7f00:1]/", "should match pattern"),
    ("http://[fe80::1]/", "should match pattern"),
    ("http://[::]/", "should match pattern"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("url", "why"), REFUSED_AT_THE_API)
def test_the_api_refuses_a_restart_url_that_names_a_refused_address(agent, url, why):
    answer = Api(agent.token).start("job-1", restart_url=url)

    assert answer.status == 400 and answer.code == "invalid_request"
    assert why in answer.body["error"]["details"]["fields"]["restart_url"]
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_later_start_still_validates_the_restart_url(agent):
    api = Api(agent.token)
    assert api.start("job-1", restart_url="https://runtime.example.com/restart").status == 201
    api.post(f"/runs/{Run.objects.get().pk}/finish", {"attempt": 1, "outcome": "failed"})

    answer = api.start("job-1", restart_url="http://169.254.169.254/")

    assert answer.status == 400 and "restart_url" in answer.body["error"]["details"]["fields"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "https://runtime.example.com/restart",
        "http://8.8.8.8:8080/restart",
        "http://203.0.114.1/",  # next to a documentation network
        "http://10.0.0.1:secret@runtime.example.com/",  # userinfo, not the host
        "http://localhost.example.com/",
    ],
)
def test_the_api_takes_public_addresses_and_names(agent, url):
    assert Api(agent.token).start("job-1", restart_url=url).status == 201


@pytest.mark.django_db
def test_the_api_takes_what_the_allow_setting_allows(agent, settings):
    settings.STARTSAFE = {**settings.STARTSAFE, "OUTBOUND_ALLOW": ["127.0.0.1", "localhost"]}
    api = Api(agent.token)

    assert api.start("a", restart_url="http://127.0.0.1:8000/restart").status == 201
    assert api.start("b", restart_url="http://localhost:8000/restart").status == 201
    # Not 127.0.0.2, and no other notation even of an allowed address.
    assert api.start("c", restart_url="http://127.0.0.2:8000/restart").status == 400
    assert api.start("d", restart_url="http://2130706433:8000/restart").status == 400


# --- Refused when sending: restart hand-off and webhook -------------------------------

# Each reaches the loopback runtime at {port} if it is not refused...
REACH_THE_RUNTIME = [
    "http://127.0.0.1:{port}/restart",
    "http://2130706433:{port}/restart",  # decimal
    "http://0x7f000001:{port}/restart",  # hex
    "http://0177.0.0.1:{port}/restart",  # octal
    "http://127.1:{port}/restart",  # short form
    "http://localhost:{port}/restart",
    "http://LocalHost.:{port}/restart",
    "http://[::ffff:127.0.0.1]:{port}/restart",  # IPv4-mapped IPv6
    "http://[::ffff:7f00:1]:{port}/restart",  # the same in hex
    "http://runtime.test:{port}/restart",  # a name that resolves to loopback
]
# ... and these would leave loopback (the guard would refuse them: none is tried).
ELSEWHERE = [
    "http://[::1]:{port}/restart",
    "http://[::]:{port}/restart",
    "http://0.0.0.0:{port}/restart",
    "http://[fe80::1]:{port}/restart",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/restart",
    "http://192.168.1.1/restart",
    "http://172.16.0.1/restart",
    "http://100.64.0.1/restart",
    "http://224.0.0.1/restart",
    "http://[ff02::1]/restart",  # IPv6 multicast
    "http://private.test/restart",  # a name that resolves to 10.1.2.3
    "http://mixed.test/restart",  # one public address and one private
]


@pytest.fixture
def names(dns):
    dns.answers["runtime.test"] = [["127.0.0.1"]]
    dns.answers["private.test"] = [["10.1.2.3"]]
    dns.answers["mixed.test"] = [["93.184.215.14", "10.1.2.3"]]
    return dns


@pytest.mark.django_db
@pytest.mark.parametrize("url", REACH_THE_RUNTIME + ELSEWHERE)
def test_a_handoff_to_a_refused_address_sends_nothing_and_gives_up(
    agent, queued, names, connections, url
):
    with RuntimeServer() as runtime:
        run = _handed_back(agent, url.format(port=runtime.port))

        outcome = deliver_restart_handoff(str(run.pk), 2, now=later(7))

    # Nothing reached the runtime, nor any address outside loopback.
    assert runtime.deliveries == [] and connections.outside == []
    # Refused again on every try: given up at once, and a person is told.
    assert outcome == "given_up"
    answer = RestartHandoff.objects.get(run=run).last_answer
    assert answer == {
        "try": 1,
        "attempt": 2,
        "url": run.restart_url,
        "reason": REFUSED,
        "delivered": False,
        "refused": True,
    }
    assert Notification.objects.filter(kind="needs_person", run=run).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("url", REACH_THE_RUNTIME + ELSEWHERE)
def test_a_webhook_to_a_refused_address_sends_nothing(
    agent, operator, queued, settings, names, connections, url
):
    awaiting_campaign(agent)
    with RuntimeServer() as hook:
        settings.STARTSAFE = {
            **settings.STARTSAFE,
            "NOTIFY_WEBHOOK_URL": url.format(port=hook.port),
        }

        report = notify(now=timezone.now() + timedelta(seconds=5))

    assert hook.deliveries == [] and connections.outside == []
    assert report.webhook_failures == 1
    assert Notification.objects.get().last_error == f"webhook: {REFUSED}"


# --- Allowed, and reached at the address that was checked -----------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("allow", [["127.0.0.1"], ["127.0.0.0/8"], ["runtime.test"]])
def test_the_allow_setting_lets_a_runtime_on_this_host_through(
    agent, queued, settings, names, allow
):
    settings.STARTSAFE = {**settings.STARTSAFE, "OUTBOUND_ALLOW": allow}
    with RuntimeServer() as runtime:
        run = _handed_back(agent, f"http://runtime.test:{runtime.port}/restart")

        assert deliver_restart_handoff(str(run.pk), 2, now=later(7)) == "sent"

    (delivery,) = runtime.deliveries
    # Sent to the address, under the name: the runtime sees the Host it was given.
    assert delivery["host"] == f"runtime.test:{runtime.port}"


@pytest.mark.django_db
def test_the_address_checked_is_the_address_connected_to(
    agent, queued, allow_loopback, names, connections
):
    # A rebinding DNS: loopback (allowed) when checked, a private address after.
    names.answers["runtime.test"] = [["127.0.0.1"], ["10.9.9.9"]]
    with RuntimeServer() as runtime:
        run = _handed_back(agent, f"http://runtime.test:{runtime.port}/restart")

        assert deliver_restart_handoff(str(run.pk), 2, now=later(7)) == "sent"

    assert len(runtime.deliveries) == 1
    # One lookup, and the connection went to its answer, not to the name again.
    assert names.lookups == ["runtime.test"]
    assert connections.by_name == [] and connections.outside == []


@pytest.mark.django_db
def test_one_refused_address_among_a_names_addresses_refuses_it(
    agent, queued, allow_loopback, names, connections
):
    names.answers["runtime.test"] = [["127.0.0.1", "10.1.2.3"]]
    with RuntimeServer() as runtime:
        run = _handed_back(agent, f"http://runtime.test:{runtime.port}/restart")

        assert deliver_restart_handoff(str(run.pk), 2, now=later(7)) == "given_up"

    assert runtime.deliveries == [] and connections.outside == []


@pytest.mark.django_db
def test_a_redirect_is_an_answer_not_followed(agent, queued, allow_loopback):
    with RuntimeServer() as elsewhere:
        to_elsewhere = (302, {"Location": elsewhere.url})
        with RuntimeServer(lambda d: to_elsewhere) as runtime:
            run = _handed_back(agent, runtime.url)

            assert deliver_restart_handoff(str(run.pk), 2, now=later(7)) == "pending"

    assert len(runtime.deliveries) == 1 and elsewhere.deliveries == []
    assert RestartHandoff.objects.get(run=run).last_answer["reason"] == "HTTP 302"


# --- What a viewer is shown: the outcome, never the reply or the connection -----------


class NotHttp:
    """A loopback port that answers like Redis, not HTTP."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"-ERR unknown command 'POST', redis_version:7.2.4\r\n")

    def close(self):
        self.sock.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.django_db
def test_the_run_page_shows_no_reply_and_no_connection_detail(
    agent, queued, allow_loopback, client, viewer
):
    not_http = NotHttp()
    try:
        with RuntimeServer(lambda d: 503, reply=b'{"secret": "redis_version:7.2.4"}') as runtime:
            answers = {}
            for key, url in [
                ("replied", runtime.url),
                ("closed", f"http://127.0.0.1:{_closed_port()}/restart"),
                ("not-http", f"http://127.0.0.1:{not_http.port}/restart"),
            ]:
                run = start_run(agent, key, heartbeat_timeout=5, restart_url=url, now=T0).run
                sweep(now=later(6))
                deliver_restart_handoff(str(run.pk), 2, now=later(7))
                answers[key] = (run, RestartHandoff.objects.get(run=run).last_answer)
    finally:
        not_http.close()

    # Kept: the status code, or that no HTTP answer came; never the reply's body.
    replied = answers["replied"][1]
    assert (replied["status"], replied["reason"]) == (503, "HTTP 503")
    assert "body" not in replied
    # A closed port and a port that is not HTTP look the same.
    closed, not_an_http_port = answers["closed"][1], answers["not-http"][1]
    assert closed["reason"] == not_an_http_port["reason"] == NO_ANSWER
    assert set(closed) == set(not_an_http_port) == {"try", "attempt", "url", "reason", "delivered"}
    for run, answer in answers.values():
        event = AuditEvent.objects.get(run=run, verb="handoff_try")
        assert event.data == answer
    # And the page any viewer sees.
    client.force_login(viewer)
    for key, (run, _) in answers.items():
        html = client.get(reverse("console:run", args=[run.pk])).content.decode()
        assert "Restart hand-offs" in html
        for detail in ("redis_version", "secret", "Error", "refused", "reset", "Connection"):
            assert detail not in html, (key, detail)
    html = client.get(reverse("console:run", args=[answers["replied"][0].pk])).content.decode()
    assert "HTTP 503" in html
    html = client.get(reverse("console:run", args=[answers["closed"][0].pk])).content.decode()
    assert NO_ANSWER in html


@pytest.mark.django_db
def test_the_webhook_failure_keeps_no_reply(agent, operator, queued, settings, allow_loopback):
    awaiting_campaign(agent)
    with RuntimeServer(lambda d: 500, reply=b'{"secret": "internal"}') as hook:
        settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_WEBHOOK_URL": hook.url}
        notify(now=timezone.now() + timedelta(seconds=5))

    assert Notification.objects.get().last_error == "webhook: HTTP 500"


# --- The OpenAPI schema says exactly what the API refuses -----------------------------


def test_the_schema_states_the_refusal(client):
    schema = client.get("/api/v1/openapi.json").json()
    field = schema["components"]["schemas"]["StartIn"]["properties"]["restart_url"]
    (string,) = [s for s in field["anyOf"] if s.get("type") == "string"]
    assert string["pattern"] == URL_PATTERN
    assert string["not"] == {"pattern": REFUSED_URL_PATTERN}


def _refused_by_the_schema(url: str) -> bool:
    return re.fullmatch(URL_PATTERN, url) is not None and re.search(REFUSED_URL_PATTERN, url)


def _refused_by_the_server(url: str) -> bool:
    return re.fullmatch(URL_PATTERN, url) is not None and text_refusal(url) is not None


def _notations(address: ipaddress.IPv4Address) -> list[str]:
    """The ways inet_aton reads an IPv4 address."""
    n = int(address)
    a, b, c, d = address.packed
    return [
        str(address),
        str(n),
        hex(n),
        f"0{n:o}",
        f"{a}.{(b << 16) | (c << 8) | d}",
        f"{a}.{b}.{(c << 8) | d}",
        ".".join(f"0{x:o}" for x in address.packed),
        ".".join(hex(x) for x in address.packed),
        f"{a}.{b}.{c}.{d}.",
        f"{a:03d}.{b}.{c}.{d}",
    ]


@given(
    address=st.ip_addresses(v=4),
    userinfo=st.sampled_from(["", "user@", "u:p@", "127.0.0.1@", "a@b@"]),
    port=st.sampled_from(["", ":80", ":8080", ":", ":x@example.com"]),
    rest=st.sampled_from(["", "/", "/restart?x=1", "#f", "?"]),
)
def test_the_schema_and_the_server_refuse_the_same_addresses(address, userinfo, port, rest):
    for host in _notations(address):
        url = f"http://{userinfo}{host}{port}{rest}"
        assert bool(_refused_by_the_schema(url)) == _refused_by_the_server(url), url


@given(url=st.from_regex(URL_PATTERN, fullmatch=True))
def test_the_schema_and_the_server_agree_on_any_url(url):
    assert bool(_refused_by_the_schema(url)) == _refused_by_the_server(url)


@given(
    host=st.from_regex(r"[0-9a-fA-FxX.]{1,20}", fullmatch=True)
    | st.from_regex(
        r"(?:[a-zA-Z0-9.-]{0,8}\.)?[lL][oO][cC][aA][lL][hH][oO][sS][tT]\.{0,2}", fullmatch=True
    )
)
def test_the_schema_and_the_server_agree_on_numeric_and_localhost_hosts(host):
    for url in (f"http://{host}/", f"https://x@{host}:1/"):
        assert bool(_refused_by_the_schema(url)) == _refused_by_the_server(url), url


NOT_PUBLIC = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
]


@pytest.mark.parametrize("network", NOT_PUBLIC)
def test_every_non_public_network_is_refused_to_its_edges_and_no_further(network):
    network = ipaddress.IPv4Network(network)
    for inside in (network[0], network[1], network[-2], network[-1]):
        assert not is_public(inside)
        assert _refused_by_the_schema(f"http://{inside}/")
    edges = [int(network[0]) - 1, int(network[-1]) + 1]
    for outside in [ipaddress.IPv4Address(n) for n in edges if 0 <= n < 2**32]:
        if not any(outside in ipaddress.IPv4Network(n) for n in NOT_PUBLIC):
            assert is_public(outside), outside
            assert not _refused_by_the_schema(f"http://{outside}/"), outside


@pytest.mark.parametrize(
    "address",
    [
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd12::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::127.0.0.1",
        "2001:db8::1",
        "64:ff9b::7f00:1",
        "fec0::1",
    ],
)
def test_ipv6_addresses_that_are_not_public_are_refused(address):
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["2606:4700::1111", "::ffff:8.8.8.8", "8.8.8.8"])
def test_public_addresses_are_public(address):
    assert is_public(ipaddress.ip_address(address))


# --- The setting ------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "not a host!", "0x7f000001", "a/b"])
def test_a_bad_allow_entry_is_refused(entry):
    with pytest.raises(ValueError, match=re.escape(repr(entry))):
        parse_allow((entry,))


def test_allow_entries_are_names_and_networks():
    allow = parse_allow(("Runtime.Internal.", "10.1.0.0/16", "127.0.0.1", "fd00::/8"))
    assert allow.names == frozenset({"runtime.internal"})
    assert [str(n) for n in allow.networks] == ["10.1.0.0/16", "127.0.0.1/32", "fd00::/8"]


def _check(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "DEBUG": "1",
            "STARTSAFE_VAR_DIR": str(tmp_path / "var"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_refused_webhook_url_or_a_bad_allow_entry_stops_the_start(tmp_path):
    hook = "http://127.0.0.1:9000/hook"
    refused = _check(tmp_path, STARTSAFE_NOTIFY_WEBHOOK_URL=hook)
    assert refused.returncode != 0
    assert "STARTSAFE_NOTIFY_WEBHOOK_URL names 127.0.0.1, a loopback address" in refused.stderr

    allowed = _check(
        tmp_path, STARTSAFE_NOTIFY_WEBHOOK_URL=hook, STARTSAFE_OUTBOUND_ALLOW="127.0.0.1"
    )
    assert allowed.returncode == 0, allowed.stderr

    bad = _check(tmp_path, STARTSAFE_OUTBOUND_ALLOW="10.0.0.0/8,not a host!")
    assert bad.returncode != 0 and "STARTSAFE_OUTBOUND_ALLOW" in bad.stderr
