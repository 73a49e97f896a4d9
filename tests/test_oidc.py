"""OpenID Connect sign-in (startsafe/oidc.py) against a real provider on loopback.

The provider is django-oauth-toolkit's, run as a second Django process
(tests/oidc_provider/) with its own SQLite file and an RSA key made here; its user
alice's ``groups`` claim lists her Django groups there. startsafe's side is the
test client on the real database; the authorization code flow's browser part at
the provider is httpx. Groups: "sre" gives operators, "security" admins, "staff"
a viewer's role.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import jwt
import pytest
from axes.models import AccessAttempt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import authenticate
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory

from approvals.models import OidcIdentity
from startsafe.oidc import Backend, discover

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
CLIENT_ID = "startsafe-test"
CLIENT_SECRET = "provider-side-secret-for-the-test"
REDIRECT_URI = "http://testserver/oidc/callback/"
SIGNED_OUT_URI = "http://testserver/accounts/login/"
AXES = "axes.backends.AxesStandaloneBackend"
OIDC = "startsafe.oidc.Backend"
PASSWORDS = "django.contrib.auth.backends.ModelBackend"


def _pem(key) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


class Provider:
    def __init__(self, tmp: Path):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.issuer = f"{self.url}/o"
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
            "PYTHONPATH": str(ROOT),
            "OIDC_PROVIDER_DB": str(tmp / "provider.sqlite3"),
            "OIDC_PROVIDER_ISSUER": self.issuer,
            "OIDC_PROVIDER_KEY": _pem(self.key),
            "OIDC_PROVIDER_CLIENT_ID": CLIENT_ID,
            "OIDC_PROVIDER_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_PROVIDER_REDIRECT_URI": REDIRECT_URI,
            "OIDC_PROVIDER_LOGOUT_REDIRECT_URI": SIGNED_OUT_URI,
        }
        self.django("migrate", "--verbosity=0")
        self.shell((ROOT / "tests/oidc_provider/setup.py").read_text())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "provider.log", "w"),  # noqa: SIM115 (the process keeps it)
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.issuer}/.well-known/openid-configuration").is_success:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp / "provider.log").read_text()
            time.sleep(0.2)

    def django(self, *args):
        subprocess.run([sys.executable, "-m", "django", *args], env=self.env, cwd=ROOT, check=True)

    def shell(self, code: str):
        self.django("shell", "-c", code)

    def set_groups(self, *names):
        self.shell(
            "from django.contrib.auth.models import Group, User\n"
            f"groups = [Group.objects.get_or_create(name=n)[0] for n in {list(names)!r}]\n"
            "User.objects.get(username='alice').groups.set(groups)"
        )

    def kid(self) -> str:
        jwks = httpx.get(discover(self.issuer)["jwks_uri"]).json()
        return jwks["keys"][0]["kid"]

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    started = Provider(tmp_path_factory.mktemp("oidc-provider"))
    yield started
    started.stop()


@pytest.fixture
def oidc(settings, provider):
    settings.STARTSAFE = {
        **settings.STARTSAFE,
        "OIDC_ISSUER": provider.issuer,
        "OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_PROVIDER_NAME": "Test IdP",
        "OIDC_VIEWER_GROUPS": ["staff"],
        "OIDC_OPERATOR_GROUPS": ["sre"],
        "OIDC_ADMIN_GROUPS": ["security", "root"],
    }
    settings.AUTHENTICATION_BACKENDS = [AXES, OIDC, PASSWORDS]
    provider.set_groups("sre", "security")
    return provider


def sign_in_with_provider(
    client: Client, provider: Provider, password="provider-password", browser=None
):
    """The authorization code flow: startsafe sends the browser to the provider, the
    user signs in there, the provider sends the browser back to /oidc/callback/.
    ``browser``: the httpx client that keeps the provider's cookies (a new one by
    default)."""
    start = client.get("/accounts/login/")
    assert 'href="/oidc/authenticate/">Sign in with Test IdP</a>' in start.content.decode()
    to_provider = client.get("/oidc/authenticate/")
    assert to_provider.status_code == 302
    authorize = to_provider["Location"]
    assert authorize.startswith(f"{provider.issuer}/authorize/")
    query = parse_qs(urlsplit(authorize).query)
    assert query["code_challenge_method"] == ["S256"] and query["nonce"][0]
    with nullcontext(browser) if browser else httpx.Client() as browser:
        to_login = browser.get(authorize)
        assert to_login.status_code == 302
        login_url = urljoin(provider.url, to_login.headers["location"])
        form = browser.get(login_url)
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)[1]
        signed_in = browser.post(
            login_url,
            data={
                "csrfmiddlewaretoken": csrf,
                "username": "alice",
                "password": password,
                "next": parse_qs(urlsplit(login_url).query)["next"][0],
            },
        )
        assert signed_in.status_code == 302, signed_in.text
        back = browser.get(urljoin(provider.url, signed_in.headers["location"]))
        assert back.status_code == 302
        callback = back.headers["location"]
    assert callback.startswith(REDIRECT_URI)
    return client.get(urlsplit(callback).path, query_string_of(callback))


def query_string_of(url: str) -> dict:
    return {name: values[0] for name, values in parse_qs(urlsplit(url).query).items()}


def roles(user: User) -> set[str]:
    return set(user.groups.values_list("name", flat=True))


def test_the_group_claim_gives_the_role_and_losing_the_group_loses_it(oidc, provider):
    # A local account with alice's username and e-mail: never the provider's alice.
    local = User.objects.create_user("alice", "alice@example.com", "local-password")

    client = Client()
    answer = sign_in_with_provider(client, provider)
    assert (answer.status_code, answer["Location"]) == (302, "/")
    user = User.objects.get(oidc_identity__issuer=provider.issuer)
    assert client.session["_auth_user_id"] == str(user.pk)
    assert user.username == "alice-2" and user.email == "alice@example.com"
    assert not user.has_usable_password()
    assert roles(user) == {"operators", "admins"}
    assert roles(local) == set()
    page = client.get("/")
    assert page.status_code == 200 and "alice-2 · operator" in page.content.decode()

    # The provider drops "security": at the next sign-in the admin role is gone.
    provider.set_groups("sre", "other")
    client = Client()
    assert sign_in_with_provider(client, provider)["Location"] == "/"
    assert roles(User.objects.get(pk=user.pk)) == {"operators"}
    assert OidcIdentity.objects.count() == 1  # the same account, found by its sub

    # Only "staff": a viewer, no role group.
    provider.set_groups("staff")
    client = Client()
    assert sign_in_with_provider(client, provider)["Location"] == "/"
    assert roles(User.objects.get(pk=user.pk)) == set()
    assert "alice-2 · viewer" in client.get("/").content.decode()

    # No mapped group at all: refused, and the sign-in page says so.
    provider.set_groups("other")
    client = Client()
    refused = sign_in_with_provider(client, provider)
    assert refused["Location"] == "/accounts/login/?sso=failed"
    assert "_auth_user_id" not in client.session
    assert AccessAttempt.objects.get(ip_address="127.0.0.1").failures_since_start == 1
    assert "did not sign you in" in client.get(refused["Location"]).content.decode()


def test_signing_out_ends_the_providers_session_too(oidc, provider):
    """RP-initiated logout: startsafe's sign-out sends the browser to the provider's
    end_session_endpoint with the ID token, the provider ends its session and sends
    the browser back to the sign-in page; the next sign-in asks for the password."""
    client = Client()
    with httpx.Client() as browser:
        assert sign_in_with_provider(client, provider, browser=browser)["Location"] == "/"
        id_token = client.session["oidc_id_token"]

        out = client.post("/accounts/logout/")

        assert out.status_code == 302 and "_auth_user_id" not in client.session
        end_session = discover(provider.issuer)["end_session_endpoint"]
        assert out["Location"].startswith(end_session + "?")
        assert query_string_of(out["Location"]) == {
            "id_token_hint": id_token,
            "client_id": CLIENT_ID,
            "post_logout_redirect_uri": SIGNED_OUT_URI,
        }
        at_provider = browser.get(out["Location"])
        assert (at_provider.status_code, at_provider.headers["location"]) == (302, SIGNED_OUT_URI)
        # The provider asks for the password again: its session is gone.
        again = browser.get(client.get("/oidc/authenticate/")["Location"])
        assert again.status_code == 302 and "/accounts/login/" in again.headers["location"]


def test_a_local_users_sign_out_stays_here(oidc, operator):
    client = Client()
    client.force_login(operator)

    out = client.post("/accounts/logout/")

    assert (out.status_code, out["Location"]) == (302, "/accounts/login/")
    assert "_auth_user_id" not in client.session


def _token(provider: Provider, key=None, **claims) -> str:
    now = int(time.time())
    payload = {
        "iss": provider.issuer,
        "aud": CLIENT_ID,
        "sub": "42",
        "iat": now,
        "exp": now + 300,
        "nonce": "the-nonce",
        **claims,
    }
    payload = {name: value for name, value in payload.items() if value is not None}
    return jwt.encode(
        payload, _pem(key or provider.key), algorithm="RS256", headers={"kid": provider.kid()}
    )


def test_a_forged_expired_or_misaddressed_id_token_is_refused(oidc, provider):
    backend = Backend()
    backend.configure()
    # The provider's own key, every claim right: accepted (the check itself works).
    assert backend.verify_token(_token(provider), nonce="the-nonce")["sub"] == "42"

    another_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    refused = {
        "forged (another key, the provider's kid)": _token(provider, key=another_key),
        "expired": _token(provider, iat=now - 3600, exp=now - 60),
        "for another client": _token(provider, aud="another-client"),
        "from another issuer": _token(provider, iss="http://127.0.0.1:1/o"),
        "without an expiry": _token(provider, exp=None),
        "for another sign-in": _token(provider, nonce="another-nonce"),
    }
    for why, token in refused.items():
        with pytest.raises(PermissionDenied):
            backend.verify_token(token, nonce="the-nonce")
            pytest.fail(f"accepted an ID token {why}")


def test_a_discovery_document_for_another_issuer_is_refused(oidc, provider):
    assert discover(provider.issuer)["issuer"] == provider.issuer
    # The same provider reached as localhost: its document names 127.0.0.1's issuer.
    with pytest.raises(PermissionDenied):
        discover(provider.issuer.replace("127.0.0.1", "localhost"))


def test_local_sign_in_off_refuses_the_form(oidc, provider, settings):
    # An operator: the admin's form would let lou in with a password were it on.
    lou = User.objects.create_user("lou", password="local-password")
    lou.groups.add(Group.objects.get(name="operators"))
    settings.STARTSAFE = {**settings.STARTSAFE, "LOCAL_LOGIN": False}
    settings.AUTHENTICATION_BACKENDS = [AXES, OIDC]  # as settings.py builds them
    client = Client()
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Test IdP" in page and 'name="password"' not in page
    posted = client.post("/accounts/login/", {"username": "lou", "password": "local-password"})
    assert posted.status_code == 403 and "_auth_user_id" not in client.session
    assert client.get("/accounts/password_reset/").status_code == 404
    # No password backend: the admin's form (or any other) takes no password either.
    admin_form = client.post(
        "/admin/login/?next=/admin/", {"username": "lou", "password": "local-password"}
    )
    assert "_auth_user_id" not in client.session
    assert admin_form["Location"] == "/accounts/login/?next=/admin/"  # to the provider's button
    # And no backend takes a password, whatever form would ask (OIDC's ignores one).
    # (A code and state in the query: the OIDC backend must still leave a password
    # sign-in to the next backend, not try them at the provider and refuse.)
    request = RequestFactory().post("/elsewhere/?code=abc&state=def")
    assert authenticate(request, username="lou", password="local-password") is None
    settings.AUTHENTICATION_BACKENDS = [AXES, OIDC, PASSWORDS]
    assert authenticate(request, username="lou", password="local-password") == lou
    settings.AUTHENTICATION_BACKENDS = [AXES, OIDC]
    # The provider still signs people in.
    assert sign_in_with_provider(client, provider)["Location"] == "/"


def test_local_sign_in_on_works_beside_the_provider_and_stays_throttled(oidc):
    User.objects.create_user("lou", password="local-password")
    client = Client()
    page = client.get("/accounts/login/").content.decode()
    assert 'name="password"' in page and "Sign in with Test IdP" in page
    failed = [
        client.post("/accounts/login/", {"username": "lou", "password": "wrong"}).status_code
        for _ in range(5)
    ]
    assert failed == [200, 200, 200, 200, 429]  # the fifth failure locks (the default limit)
    locked = client.post("/accounts/login/", {"username": "lou", "password": "local-password"})
    assert locked.status_code == 429

    AccessAttempt.objects.all().delete()
    signed_in = client.post("/accounts/login/", {"username": "lou", "password": "local-password"})
    assert signed_in.status_code == 302 and client.session["_auth_user_id"]


def _settings_with(**env) -> subprocess.CompletedProcess:
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.AUTHENTICATION_BACKENDS)"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "startsafe.settings", **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_the_settings_build_the_backends_from_the_environment():
    provider = {
        "STARTSAFE_OIDC_ISSUER": "https://idp.example.com/",
        "STARTSAFE_OIDC_CLIENT_ID": "startsafe",
        "STARTSAFE_OIDC_CLIENT_SECRET": "secret",
    }
    assert _settings_with().stdout.strip() == repr([AXES, PASSWORDS])
    assert _settings_with(**provider).stdout.strip() == repr([AXES, OIDC, PASSWORDS])
    off = _settings_with(**provider, STARTSAFE_LOCAL_LOGIN="0")
    assert off.stdout.strip() == repr([AXES, OIDC])
    # Half a provider, or nobody able to sign in, stops the start.
    half = _settings_with(STARTSAFE_OIDC_ISSUER="https://idp.example.com")
    assert "needs STARTSAFE_OIDC_CLIENT_ID" in half.stderr
    assert "nobody could sign in" in _settings_with(STARTSAFE_LOCAL_LOGIN="0").stderr
