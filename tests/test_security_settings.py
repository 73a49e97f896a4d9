"""Production settings, security headers, tokens and the API's rate limit."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import time_machine
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from runs import models as run_models
from runs.models import Agent, hash_token
from startsafe.env import env_rate, parse_rate
from tests.api_client import Api
from tests.redis_helpers import REDIS_URL, Namespace, redis_namespace, someone_elses_key

ROOT = Path(__file__).resolve().parent.parent


def readme_production_env() -> dict[str, str]:
    """The variables README's "Production" block lists, as an operator sets them: its
    comments dropped, each ``<placeholder>`` replaced by random characters."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Production\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert block, "README's Production section has no ```sh block"
    env = {}
    for line in block.group(1).splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if not line:
            continue
        name, equals, value = line.partition("=")
        assert equals and re.fullmatch(r"[A-Z][A-Z0-9_]*", name), line
        env[name] = secrets.token_urlsafe(60) if re.fullmatch(r"<.+>", value) else value
    assert env["DEBUG"] == "0" and len(env["SECRET_KEY"]) >= 50, env
    return env


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """manage.py with ``env`` and PATH only: nothing of the test's own environment."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_with_exactly_the_readmes_production_settings():
    done = _manage("check", "--deploy", "--fail-level", "WARNING", env=readme_production_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_production_settings_refuse_to_start_without_a_secret_key():
    env = readme_production_env()
    env.pop("SECRET_KEY")
    done = _manage("check", env=env)
    assert done.returncode != 0 and "SECRET_KEY is required" in done.stderr


# --- Headers --------------------------------------------------------------------


@pytest.mark.django_db
def test_console_pages_carry_the_security_headers(client, viewer):
    client.force_login(viewer)
    response = client.get("/")
    assert response.status_code == 200
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    policy = response["Content-Security-Policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


@pytest.mark.django_db
def test_the_sign_in_page_and_the_api_carry_them_too():
    assert "Content-Security-Policy" in Client().get("/accounts/login/")
    answer = Client().get("/api/v1/runs")
    assert answer["X-Content-Type-Options"] == "nosniff"


def test_the_api_docs_are_left_out_of_the_policy(client):
    # Swagger UI starts with an inline script.
    assert "Content-Security-Policy" not in client.get("/api/v1/docs")


@pytest.mark.django_db
@override_settings(SECURE_HSTS_SECONDS=31536000, SECURE_HSTS_INCLUDE_SUBDOMAINS=True)
def test_hsts_is_sent_over_https_when_configured(client):
    response = client.get("/accounts/login/", secure=True)
    assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"


def test_no_template_has_an_inline_script_or_event_handler():
    # script-src 'self' only holds while every script is a file.
    for template in (ROOT / "templates").rglob("*.html"):
        text = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag, (template, tag)
        assert not re.search(r"\son[a-z]+\s*=", text), template
        assert "hx-on" not in text and "javascript:" not in text, template


def test_cookies_are_secure_and_not_for_scripts():
    from django.conf import settings

    assert settings.SESSION_COOKIE_HTTPONLY and settings.CSRF_COOKIE_HTTPONLY
    assert settings.SESSION_COOKIE_SAMESITE == "Lax" == settings.CSRF_COOKIE_SAMESITE
    assert settings.SESSION_COOKIE_AGE <= 24 * 3600


# --- Tokens ---------------------------------------------------------------------


@pytest.mark.django_db
def test_tokens_are_stored_hashed_and_compared_in_constant_time(agent, monkeypatch):
    stored = Agent.objects.get(pk=agent.pk)
    assert agent.token not in (stored.token_hash, stored.token_hint)
    assert stored.token_hash == hash_token(agent.token) and len(stored.token_hash) == 64

    compared = []
    real = run_models.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(run_models.hmac, "compare_digest", spy)
    assert Api(agent.token).get("/runs").status == 200
    assert compared == [(stored.token_hash, hash_token(agent.token))]


@pytest.mark.django_db
def test_a_deactivated_agent_is_refused_on_its_very_next_request(agent):
    api = Api(agent.token)
    run_id = api.start("t").body["run"]["id"]
    Agent.objects.filter(pk=agent.pk).update(is_active=False)

    answer = api.post(f"/runs/{run_id}/heartbeat", {"attempt": 1})

    assert answer.status == 401 and answer.code == "unauthorized"


@pytest.mark.django_db
def test_a_rotated_token_stops_working_at_once(agent):
    old = agent.token
    agent.set_new_token()
    agent.save()
    assert Api(old).get("/runs").status == 401


# --- Rate limit -----------------------------------------------------------------


def _limited(rate: str):
    from django.conf import settings

    return override_settings(STARTSAFE={**settings.STARTSAFE, "RATE_LIMIT": rate})


@pytest.mark.django_db
def test_a_token_over_its_rate_gets_429_with_retry_after(agent, other_agent):
    api = Api(agent.token)
    with _limited("3/minute"), time_machine.travel("2026-03-01 12:00:10Z", tick=False):
        assert [api.get("/runs").status for _ in range(3)] == [200, 200, 200]

        answer = api.get("/runs")

        assert answer.status == 429 and answer.code == "rate_limited"
        assert answer.headers["Retry-After"] == "50"  # the seconds left in the minute
        assert answer.body["error"]["details"] == {"limit": 3, "period": 60, "retry_after": 50}
        # Per token: another agent is not slowed down by this one.
        assert Api(other_agent.token).get("/runs").status == 200


@contextmanager
def _redis_cache() -> Iterator[Namespace]:
    """The rate limit's counters in Redis, as production keeps them (CACHE_URL), on
    the machine's shared Redis: under a key prefix of this test's own, whose keys
    alone are deleted afterwards (tests/redis_helpers.py)."""
    with redis_namespace("cache") as namespace:
        redis_settings = {
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": REDIS_URL,
                # Django adds ":<version>:" after it.
                "KEY_PREFIX": namespace.prefix.rstrip(":"),
            }
        }
        with override_settings(CACHES=redis_settings):
            yield namespace


@pytest.fixture
def redis_cache() -> Iterator[Namespace]:
    with _redis_cache() as namespace:
        yield namespace


@pytest.mark.django_db
def test_the_redis_cache_deletes_its_own_keys_and_leaves_everyone_elses(agent):
    with someone_elses_key() as theirs:
        with _redis_cache() as namespace:
            assert Api(agent.token).get("/runs").status == 200
            (counter,) = namespace.keys("*startsafe:rate:*")  # counted under the prefix
            # Someone else's key in the same database, named much like the counters.
            lookalike = f"{namespace.prefix.split(':')[0]}:other-run:1:startsafe:rate:x"
            namespace.server.set(lookalike, 1, ex=60)
        assert not namespace.server.exists(counter)
        assert namespace.server.exists(theirs)
        assert namespace.server.delete(lookalike) == 1  # it was still there


def _command_names(packed) -> list[str]:
    """The command names in what redis-py writes to the socket (RESP arrays)."""
    data = b"".join(packed) if isinstance(packed, list | tuple) else bytes(packed)
    names, at = [], 0
    while at < len(data):
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2  # "*<count>"
        for i in range(count):
            end = data.index(b"\r\n", at)
            length = int(data[at + 1 : end])  # "$<length>"
            if i == 0:
                names.append(data[end + 2 : end + 2 + length].decode().upper())
            at = end + 2 + length + 2
    return names


@pytest.fixture
def redis_sent(monkeypatch) -> list[list[str]]:
    """The command names this process sends to Redis, a list per write to the
    socket, i.e. per round trip (a pipeline is written whole)."""
    from redis.connection import Connection

    sent: list[list[str]] = []
    send_packed_command = Connection.send_packed_command

    def send(self, command, *args, **kwargs):
        sent.append(_command_names(command))
        return send_packed_command(self, command, *args, **kwargs)

    monkeypatch.setattr(Connection, "send_packed_command", send)
    return sent


@pytest.mark.django_db
def test_in_redis_the_limit_holds_and_each_request_costs_one_round_trip(
    agent, redis_cache, redis_sent
):
    api = Api(agent.token)
    with _limited("3/minute"), time_machine.travel("2026-03-01 12:00:10Z", tick=False):
        assert api.get("/runs").status == 200
        redis_sent.clear()  # and with it the connection's opening handshake
        assert [api.get("/runs").status for _ in range(2)] == [200, 200]

        answer = api.get("/runs")

    assert answer.status == 429 and answer.headers["Retry-After"] == "50"
    # One MULTI/EXEC a request, written whole: no EXISTS, no separate SET.
    assert redis_sent == [["MULTI", "INCRBY", "EXPIRE", "EXEC"]] * 3
    (key,) = redis_cache.keys("*startsafe:rate:*")
    assert int(redis_cache.server.get(key)) == 4  # the refused request counted too
    # The counter expires a little after its window (60 s + 5): never a key for ever.
    assert 0 < redis_cache.server.ttl(key) <= 65


@pytest.mark.django_db
def test_in_redis_a_new_window_starts_a_new_counter(agent, redis_cache):
    api = Api(agent.token)
    with _limited("1/minute"), time_machine.travel("2026-03-01 12:00:30Z", tick=False) as clock:
        assert api.get("/runs").status == 200
        assert api.get("/runs").status == 429
        clock.shift(30)
        assert api.get("/runs").status == 200
    assert len(redis_cache.keys("*startsafe:rate:*")) == 2


@pytest.mark.django_db
def test_the_limit_lifts_when_the_window_ends(agent):
    api = Api(agent.token)
    with _limited("2/minute"), time_machine.travel("2026-03-01 12:00:30Z", tick=False) as clock:
        api.get("/runs"), api.get("/runs")
        assert api.get("/runs").status == 429
        clock.shift(30)
        assert api.get("/runs").status == 200


@pytest.mark.django_db
def test_a_refused_post_does_not_keep_its_idempotency_key(agent):
    # Otherwise the client's retry with the same key would get the 429 forever.
    api = Api(agent.token)
    key = {"Idempotency-Key": "start-t-1"}
    with _limited("1/minute"), time_machine.travel("2026-03-01 12:00:00Z", tick=False) as clock:
        assert api.get("/runs").status == 200
        refused = api.post("/runs", {"run_key": "t"}, headers=key)
        assert refused.status == 429 and refused.headers["Retry-After"] == "60"
        clock.shift(60)
        assert api.post("/runs", {"run_key": "t"}, headers=key).status == 201


@pytest.mark.django_db
def test_unauthenticated_requests_are_not_counted_against_a_token(agent):
    with _limited("1/minute"), time_machine.travel("2026-03-01 12:00:00Z", tick=False):
        for _ in range(5):
            assert Api("ss_wrong").get("/runs").status == 401
        assert Api(agent.token).get("/runs").status == 200


@pytest.mark.django_db
@pytest.mark.parametrize("rate", ["0", ""])
def test_a_zero_or_empty_rate_turns_the_limit_off(agent, rate):
    api = Api(agent.token)
    with _limited(rate):
        assert all(api.get("/runs").status == 200 for _ in range(20))


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("600/minute", (600, 60)),
        ("10/s", (10, 1)),
        ("5000/hour", (5000, 3600)),
        ("1/day", (1, 86400)),
        ("0", None),
        ("", None),
        ("0/minute", None),
        (None, None),
    ],
)
def test_rates_are_read_strictly(text, parsed):
    assert parse_rate(text) == parsed


@pytest.mark.parametrize("text", ["fast", "10/fortnight", "-1/minute", "1.5/minute", "600"])
def test_a_bad_rate_stops_the_start(monkeypatch, text):
    monkeypatch.setenv("STARTSAFE_RATE_LIMIT", text)
    with pytest.raises(ImproperlyConfigured, match="STARTSAFE_RATE_LIMIT"):
        env_rate("STARTSAFE_RATE_LIMIT", "600/minute")


def test_the_default_rate_is_generous():
    from django.conf import settings

    assert parse_rate(settings.STARTSAFE["RATE_LIMIT"]) == (600, 60)


def test_the_openapi_schema_documents_429(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert "rate_limited" in schema["info"]["description"]
    for item in schema["paths"].values():
        for operation in item.values():
            assert "429" in operation["responses"]


@pytest.mark.django_db
def test_the_poll_counts_for_the_rate_as_every_request_does(agent, other_agent):
    # The poll authenticates in its own statement (runs/api/poll.py): its 200, 304 and
    # 404 count for the token, a malformed id too; a wrong token's 401 counts for none.
    api = Api(agent.token)
    run_id = api.start("t").body["run"]["id"]
    recorded = api.call(run_id, tool="crm.note", key="n-1", key_source="intent")
    effect_id = recorded.body["effect"]["id"]
    with _limited("5/minute"), time_machine.travel("2026-03-01 12:00:10Z", tick=False):
        etag = api.get(f"/effects/{effect_id}").headers["ETag"]
        counted = [
            api.get(f"/effects/{effect_id}", {"If-None-Match": etag}).status,
            api.get("/effects/01a2431b-288a-7e30-9748-82ee8f9ec007").status,
            api.get("/effects/not-an-id").status,
            api.get("/runs").status,
        ]
        assert counted == [304, 404, 404, 200]
        unauthorized = Api("ss_wrong").get(f"/effects/{effect_id}")
        assert unauthorized.status == 401
        assert unauthorized.headers["WWW-Authenticate"] == 'Bearer realm="startsafe"'

        answer = api.get(f"/effects/{effect_id}")

        assert answer.status == 429 and answer.headers["Retry-After"] == "50"
        assert api.get("/effects/not-an-id").status == 429
        assert Api(other_agent.token).get(f"/effects/{effect_id}").status == 404
