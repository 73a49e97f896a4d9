"""docker-compose.yml, the production-shaped stack, read as docker compose reads it."""

from __future__ import annotations

import re

import pytest
from fault_helpers import NGINX_CONF, compose

from startsafe.settings import _cache_settings


def _value(text: str) -> str:
    """What compose makes of ``${NAME:-default}`` when NAME is empty or unset."""
    match = re.fullmatch(r"\$\{\w+:-(.*)\}", text)
    return match.group(1) if match else text


def test_only_the_proxy_is_published_and_gunicorn_is_behind_it():
    services = compose()["services"]
    published = {name for name, service in services.items() if service.get("ports")}
    assert published == {"proxy"}
    proxy = services["proxy"]
    assert re.fullmatch(r"nginx:[\d.]+-alpine", proxy["image"])  # the official image
    assert "./deploy/nginx.conf:/etc/nginx/conf.d/default.conf:ro" in proxy["volumes"]
    # A stuck request is gunicorn's to end (its --timeout restarts the worker; nginx
    # answers 502), not nginx's to give up on while the worker goes on.
    gunicorn_timeout = int(re.search(r"--timeout (\d+)", services["web"]["command"]).group(1))
    nginx_timeout = int(re.search(r"proxy_read_timeout (\d+)s;", NGINX_CONF.read_text()).group(1))
    assert nginx_timeout > gunicorn_timeout


@pytest.mark.parametrize("service", ["web", "worker", "beat"])
def test_the_rate_limit_is_counted_in_the_stacks_redis(service, monkeypatch):
    # Four web processes share one count; without it each counts alone (4x the limit).
    services = compose()["services"]
    url = _value(services[service]["environment"]["CACHE_URL"])
    host = re.match(r"redis://([^:/]+)", url)
    assert host and host.group(1) in services and services[host.group(1)]["image"] == "redis:7"
    # Not the broker's database (.env.example's CELERY_BROKER_URL: redis://redis:6379/0).
    assert not url.endswith("/0")
    monkeypatch.setenv("CACHE_URL", url)
    assert _cache_settings() == {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": url,
    }


def test_sign_in_throttling_counts_the_client_behind_the_proxy():
    # The one nginx in front appends the client's address; with 0 trusted proxies
    # every client would be nginx's address, and one guesser would lock out everyone.
    services = compose()["services"]
    assert _value(services["web"]["environment"]["STARTSAFE_TRUSTED_PROXIES"]) == "1"
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in (
        NGINX_CONF.read_text()
    )
