"""May startsafe send a request to this URL? The one rule for every outbound POST.

startsafe POSTs to URLs that others choose: a run's ``restart_url`` (an agent's) and
the notification webhook (an administrator's). Unchecked, an agent could make the
server POST to its own Redis, to a cloud's metadata service (169.254.169.254) or
to any port of the private network, and read the answers on the run page. So:

1. Only public addresses are reached: never loopback, private, shared (100.64/10),
   link-local, multicast, unspecified, reserved or documentation addresses, in any
   notation. ``STARTSAFE_OUTBOUND_ALLOW`` names the hosts and networks that are
   reached anyway (a runtime on the same host or in the same VPC).
2. Judged from the URL's text alone (the API, without DNS): a host that names this
   machine (``localhost``, ``*.localhost``), an IP address written in any notation
   but four decimal numbers (``2130706433``, ``0x7f000001``, ``0177.0.0.1``,
   ``127.1``: what ``inet_aton`` reads), and a dotted IPv4 address that is not
   public. ``REFUSED_URL_PATTERN`` says the same as a pattern, for the OpenAPI schema.
3. When sending: every address the host resolves to must be allowed, and the POST
   goes to the address that was checked (the Host header and TLS SNI keep the name),
   so a DNS answer that changes between the check and the connection (rebinding)
   is never reached. Redirects are not followed: a 3xx is an answer like any other.
4. What the sender keeps (``Outcome``) is the status code and a reason from a small
   fixed vocabulary: never the peer's body, never the connection-level detail
   (refused, reset, timed out, not HTTP) that would map a private network. That
   detail goes to the server's log, for administrators.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings

from startsafe.logs import kv

logger = logging.getLogger("startsafe.outbound")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# The fixed vocabulary of what a viewer is told about one POST.
REFUSED = "address not allowed"
NO_ANSWER = "no HTTP answer (could not connect or timed out)"


def http_reason(status: int) -> str:
    return f"HTTP {status}"


# --- The text of a URL (no DNS) -------------------------------------------------------

# The host as httpx reads it: after the authority's last "@", up to ":" (the port).
_URL_HOST = re.compile(r"https?://(?:[^/?#]*@)?(?P<host>[^:/?#@]*)")
# What inet_aton reads as an IPv4 address (and a little more: "1.2.3.4.5", "08"),
# parts in decimal, octal (leading 0) or hex (0x). No DNS name looks like this.
_NUMERIC = r"(?:0[xX][0-9a-fA-F]*|[0-9]+)(?:\.(?:0[xX][0-9a-fA-F]*|[0-9]+))*\.?"
_NUMERIC_HOST = re.compile(_NUMERIC)


def _normal_name(host: str) -> str:
    """A host name as compared: lower case, without the root's trailing dot."""
    host = host.lower()
    return host[:-1] if host.endswith(".") else host


def _names_this_machine(name: str) -> bool:
    # RFC 6761: "localhost" and every name under it are this machine.
    return name == "localhost" or name.endswith(".localhost")


def text_refusal(url: str, allow: Allowed | None = None) -> str | None:
    """Why ``url`` is refused, judged from its text alone (no DNS); None if it is not.

    A host name is judged when sending, after DNS: at the API, a lookup would hold a
    request for seconds on a slow resolver, and its answer may change by then.
    ``allow`` is ``STARTSAFE_OUTBOUND_ALLOW``'s (given while the settings load).
    """
    match = _URL_HOST.match(url)
    if match is None:
        return None  # not an http(s) URL: the URL's own pattern refuses it
    host = match["host"]
    allow = allow or allowed()
    name = _normal_name(host)
    if name in allow.names:
        return None
    if _names_this_machine(name):
        return f"names this machine ({host}); {_ALLOW_HINT}"
    if _NUMERIC_HOST.fullmatch(host):
        try:
            address = ipaddress.IPv4Address(host)
        except ValueError:
            return "names an IP address in a notation other than four decimal numbers (a.b.c.d)"
        if not address_allowed(address, allow):
            return f"names {address}, {kind_of(address)}; {_ALLOW_HINT}"
    return None


_ALLOW_HINT = "startsafe sends only to public addresses unless STARTSAFE_OUTBOUND_ALLOW allows it"


# --- Addresses ------------------------------------------------------------------------

# IETF protocol assignments: Python 3.11 calls only parts of it not global, later
# versions nearly all of it; the whole /24 is refused whatever the Python.
_PROTOCOL_ASSIGNMENTS = ipaddress.IPv4Network("192.0.0.0/24")


def _unwrapped(address: IPAddress) -> IPAddress:
    # ::ffff:127.0.0.1 reaches 127.0.0.1, yet Python calls it neither loopback nor
    # (on 3.11) anything but private: judge the IPv4 address it carries.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_public(address: IPAddress) -> bool:
    """Globally reachable unicast: what startsafe sends to without being told."""
    address = _unwrapped(address)
    # is_global is True for multicast (224/4, ff00::/8): refused on its own. IPv6's
    # is_global lets the reserved ::/8 (IPv4-compatible ::127.0.0.1) and the old
    # site-local fec0::/10 through.
    return (
        address.is_global
        and not address.is_multicast
        and not address.is_reserved
        and not getattr(address, "is_site_local", False)
        and address not in _PROTOCOL_ASSIGNMENTS
    )


def kind_of(address: IPAddress) -> str:
    """Why an address is not public, in a few words."""
    address = _unwrapped(address)
    for kind, yes in (
        ("the unspecified address", address.is_unspecified),
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("a multicast address", address.is_multicast),
        ("a reserved address", address.is_reserved),
        ("a private address", address.is_private),
    ):
        if yes:
            return kind
    return "an address that is not public"


@dataclass(frozen=True)
class Allowed:
    names: frozenset[str]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?")


@functools.lru_cache(maxsize=8)
def parse_allow(entries: tuple[str, ...]) -> Allowed:
    """``STARTSAFE_OUTBOUND_ALLOW``'s entries: host names and CIDR networks.

    Raises ``ValueError`` naming a bad entry. An address alone is a network of one.
    """
    names: set[str] = set()
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        name = entry.lower()
        if _NUMERIC_HOST.fullmatch(name) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{entry!r} is neither a host name nor a network such as 10.0.0.0/8 or fd00::/8"
            )
        names.add(_normal_name(name))
    return Allowed(frozenset(names), tuple(networks))


def allowed() -> Allowed:
    return parse_allow(tuple(settings.STARTSAFE["OUTBOUND_ALLOW"]))


def address_allowed(address: IPAddress, allow: Allowed | None = None) -> bool:
    networks = (allow or allowed()).networks
    return is_public(address) or any(
        _unwrapped(address) in network or address in network for network in networks
    )


# --- Sending --------------------------------------------------------------------------


class Refused(Exception):
    """startsafe does not send to this URL (the detail is for the log, not for viewers)."""


@dataclass(frozen=True)
class Outcome:
    """What a sender keeps of one POST: the status code and a fixed reason."""

    status: int | None
    reason: str
    refused: bool = False

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (any notation getaddrinfo reads), in its order.

    Raises ``Refused`` if any of them is not allowed: a name with one private
    address among public ones could be connected to through it.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise httpx.ConnectError(f"cannot resolve {host!r}: {exc}") from None
    addresses: list[IPAddress] = []
    for *_, sockaddr in infos:
        # An IPv6 sockaddr may carry a scope ("fe80::1%eth0"): the address is before it.
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    name_allowed = _normal_name(host) in allowed().names
    refused = [a for a in addresses if not (name_allowed or address_allowed(a))]
    if refused:
        raise Refused(f"{host} resolves to {', '.join(map(str, refused))}")
    return addresses


def checked_addresses(url: httpx.URL) -> list[IPAddress]:
    """The addresses ``url`` may be sent to; ``Refused`` if it may not."""
    if url.scheme not in ("http", "https") or not url.host:
        raise Refused("not an http or https URL with a host")
    refusal = text_refusal(str(url))
    if refusal:
        raise Refused(refusal)
    return resolve(url.host, url.port or (443 if url.scheme == "https" else 80))


def post_json(
    url: str, payload: Any, *, timeout: float, headers: dict | None = None, purpose: str
) -> Outcome:
    """POST ``payload`` as JSON to ``url`` at a checked address; never raises.

    The reply's body is not read. ``purpose`` names the sender in the log line that
    carries the detail of a failure.
    """
    try:
        target = httpx.URL(url)
        addresses = checked_addresses(target)
    except (httpx.InvalidURL, Refused) as exc:
        logger.warning(kv("outbound_refused", purpose=purpose, url=url, detail=str(exc)))
        return Outcome(None, REFUSED, refused=True)
    except httpx.HTTPError as exc:
        logger.warning(kv("outbound_failed", purpose=purpose, url=url, detail=_detail(exc)))
        return Outcome(None, NO_ANSWER)

    request_headers = {**(headers or {}), "Host": target.netloc.decode("ascii")}
    extensions = {}
    if target.scheme == "https" and not _is_address(target.host):
        extensions["sni_hostname"] = target.host  # the certificate is the name's
    # An explicit transport: no proxy from the environment, which would connect by
    # itself to whatever the name resolves to then.
    with httpx.Client(
        transport=httpx.HTTPTransport(), follow_redirects=False, timeout=timeout
    ) as client:
        for address in addresses:
            try:
                with client.stream(
                    "POST",
                    target.copy_with(host=str(address)),
                    json=payload,
                    headers=request_headers,
                    extensions=extensions,
                ) as response:
                    return Outcome(response.status_code, http_reason(response.status_code))
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                error: httpx.HTTPError = exc  # try the name's next address, as clients do
            except httpx.HTTPError as exc:
                error = exc
                break
    logger.warning(
        kv("outbound_failed", purpose=purpose, url=url, address=address, detail=_detail(error))
    )
    return Outcome(None, NO_ANSWER)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _detail(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


# --- The same rule as a pattern (the OpenAPI schema) ----------------------------------

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED = rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}"
# The IPv4 networks is_public() refuses, as dotted decimal (tests/test_outbound_addresses.py
# checks that the two agree on every boundary and on random addresses).
_NOT_PUBLIC_DOTTED = "|".join(
    [
        rf"0\.{_OCTET}\.{_OCTET}\.{_OCTET}",  # 0/8, "this network"
        rf"10\.{_OCTET}\.{_OCTET}\.{_OCTET}",  # 10/8
        rf"100\.(?:6[4-9]|[7-9][0-9]|1[01][0-9]|12[0-7])\.{_OCTET}\.{_OCTET}",  # 100.64/10
        rf"127\.{_OCTET}\.{_OCTET}\.{_OCTET}",  # 127/8
        rf"169\.254\.{_OCTET}\.{_OCTET}",  # 169.254/16
        rf"172\.(?:1[6-9]|2[0-9]|3[01])\.{_OCTET}\.{_OCTET}",  # 172.16/12
        rf"192\.0\.[02]\.{_OCTET}",  # 192.0.0/24, 192.0.2/24
        rf"192\.168\.{_OCTET}\.{_OCTET}",  # 192.168/16
        rf"198\.1[89]\.{_OCTET}\.{_OCTET}",  # 198.18/15
        rf"198\.51\.100\.{_OCTET}",  # 198.51.100/24
        rf"203\.0\.113\.{_OCTET}",  # 203.0.113/24
        rf"(?:22[4-9]|2[3-4][0-9]|25[0-5])\.{_OCTET}\.{_OCTET}\.{_OCTET}",  # 224/4, 240/4
    ]
)
_LOCALHOST = r"(?:[^:/?#@]*\.)?[lL][oO][cC][aA][lL][hH][oO][sS][tT]\.?"
# After the host: a port (anything but "@", which would make the host userinfo), then
# the path, query or fragment, or the end.
_AFTER_HOST = r"(?::[^/?#@]*)?(?:[/?#]|$)"
# An http(s) URL whose host text_refusal() refuses when nothing is allowed.
_REFUSED_HOST = rf"{_LOCALHOST}|(?!{_DOTTED}{_AFTER_HOST}){_NUMERIC}|{_NOT_PUBLIC_DOTTED}"
REFUSED_URL_PATTERN = rf"^https?://(?:[^/?#]*@)?(?:{_REFUSED_HOST}){_AFTER_HOST}"
