"""The client's address behind reverse proxies, for the whole app (startsafe/wsgi.py).

Sign-in throttling counts failures per address (startsafe/login_throttle.py), so
the address must be the client's, not the proxy's (every client would share one
lock), and never one the client chose (it would get a fresh count per request).
"""

from __future__ import annotations

from django.conf import settings
from werkzeug.middleware.proxy_fix import ProxyFix


def behind_trusted_proxies(app):
    """Set REMOTE_ADDR to the client's address as the trusted proxies saw it.

    Behind STARTSAFE_TRUSTED_PROXIES proxies that each append the address they were
    called from to X-Forwarded-For, the client is that many entries from the right:
    whatever a client wrote into the header itself stays on the left, unread. With
    0 (the default), the header is ignored and the client is the TCP peer. Only the
    address is taken: SECURE_PROXY_SSL_HEADER decides the scheme, ALLOWED_HOSTS the host.
    """
    trusted = settings.STARTSAFE["TRUSTED_PROXIES"]
    if not trusted:
        return app
    return ProxyFix(app, x_for=trusted, x_proto=0, x_host=0, x_port=0, x_prefix=0)
