"""Sign-in throttling (startsafe/login_throttle.py on django-axes) and the password reset.

Every sign-in goes through the real forms (the console's and the admin's), with
Django's test client, axes' real backend and the real database; the clock moves
with time_machine. The settings' defaults: 5 failures, a first lock of 300 s.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import time_machine
from axes.models import AccessAttempt
from django.core import mail
from django.core.handlers.wsgi import WSGIHandler
from django.core.mail.backends.locmem import EmailBackend as LocmemBackend
from django.core.management import call_command
from django.test import Client
from werkzeug.test import Client as WsgiClient

from startsafe.accounts import email_is_configured
from startsafe.proxies import behind_trusted_proxies

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
ADMIN_LOGIN = "/admin/login/?next=/admin/"
LIMIT = 5
COOLOFF = 300
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LOCKED = "Too many failed sign-ins for this username or from this address."


def sign_in(username, password, address="198.51.100.1", path=LOGIN):
    """One sign-in from ``address``, as a browser with no session yet would post it."""
    client = Client(REMOTE_ADDR=address)
    response = client.post(path, {"username": username, "password": password})
    response.signed_in = "_auth_user_id" in client.session
    return response


def assert_locked(response, wait: str, seconds: int):
    assert response.status_code == 429
    html = response.content.decode()
    assert LOCKED in html
    assert f"Try again in {wait}." in html
    assert response["Retry-After"] == str(seconds)
    assert not response.signed_in


def assert_refused_but_not_locked(response):
    assert response.status_code == 200  # the form again, with its error
    assert "didn't match" in response.content.decode()
    assert not response.signed_in


def fail(username, times, address="198.51.100.1", path=LOGIN):
    return [sign_in(username, "wrong", address, path) for _ in range(times)]


def test_failures_for_one_username_from_many_addresses_lock_that_username(
    operator, second_operator
):
    for number in range(LIMIT - 1):
        assert_refused_but_not_locked(sign_in("olivia", "wrong", f"198.51.100.{number}"))

    assert_locked(sign_in("olivia", "wrong", "198.51.100.9"), "5\xa0minutes", COOLOFF)

    # The username is locked from an address it never failed from...
    assert_locked(sign_in("olivia", "pw-olivia", "203.0.113.50"), "5\xa0minutes", COOLOFF)
    # ...and only the username: another account signs in from the same addresses.
    assert sign_in("oscar", "pw-oscar", "198.51.100.1").signed_in


def test_failures_from_one_address_for_many_usernames_lock_that_address(operator):
    for name in ["ana", "bo", "cy", "di"]:
        assert_refused_but_not_locked(sign_in(name, "wrong", "198.51.100.7"))

    assert_locked(sign_in("ed", "wrong", "198.51.100.7"), "5\xa0minutes", COOLOFF)

    # The address is locked for an account that never failed...
    assert_locked(sign_in("olivia", "pw-olivia", "198.51.100.7"), "5\xa0minutes", COOLOFF)
    # ...and only the address: that account signs in from elsewhere.
    assert sign_in("olivia", "pw-olivia", "198.51.100.8").signed_in


def test_a_locked_user_with_the_right_password_is_refused_and_told_how_long_to_wait(operator):
    fail("olivia", LIMIT)

    response = sign_in("olivia", "pw-olivia")

    assert_locked(response, "5\xa0minutes", COOLOFF)
    # Not signed in: the console still sends this browser to the sign-in page.
    client = Client(REMOTE_ADDR="198.51.100.1")
    client.post(LOGIN, {"username": "olivia", "password": "pw-olivia"})
    assert client.get("/").status_code == 302


def test_after_the_cool_off_the_right_password_signs_in(operator):
    with time_machine.travel(T0, tick=False) as clock:
        fail("olivia", LIMIT)

        clock.shift(COOLOFF + 1)
        assert sign_in("olivia", "pw-olivia").signed_in

    # The sign-in cleared the account's failures.
    assert not AccessAttempt.objects.filter(username="olivia").exists()


def test_each_try_while_locked_starts_the_wait_again(operator):
    with time_machine.travel(T0, tick=False) as clock:
        fail("olivia", LIMIT)

        clock.shift(COOLOFF - 1)
        assert_locked(sign_in("olivia", "pw-olivia"), "5\xa0minutes", COOLOFF)
        clock.shift(2)  # past the first lock, not past the one that try started
        assert_locked(sign_in("olivia", "pw-olivia"), "5\xa0minutes", COOLOFF)

        clock.shift(COOLOFF + 1)
        assert sign_in("olivia", "pw-olivia").signed_in


def test_past_the_limit_each_failure_locks_again_and_the_lock_doubles(operator):
    """Slowed, then refused for a while: one try per lock, and longer locks."""
    with time_machine.travel(T0, tick=False) as clock:
        assert_locked(fail("olivia", LIMIT)[-1], "5\xa0minutes", COOLOFF)

        for _ in range(LIMIT - 1):  # failures 6 to 9: one try each time, then locked again
            clock.shift(COOLOFF + 1)
            assert_locked(sign_in("olivia", "wrong"), "5\xa0minutes", COOLOFF)

        clock.shift(COOLOFF + 1)  # failure 10: twice the limit, twice the lock
        assert_locked(sign_in("olivia", "wrong"), "10\xa0minutes", 2 * COOLOFF)

        clock.shift(COOLOFF + 1)  # the first lock's length is not enough now
        assert_locked(sign_in("olivia", "pw-olivia"), "10\xa0minutes", 2 * COOLOFF)
        clock.shift(2 * COOLOFF + 1)
        assert sign_in("olivia", "pw-olivia").signed_in


def test_the_lock_grows_to_the_longest_and_no_further(operator):
    with time_machine.travel(T0, tick=False) as clock:
        fail("olivia", 10 * LIMIT)  # tries while locked count too

        assert_locked(sign_in("olivia", "wrong"), "1\xa0day", 86_400)
        clock.shift(86_400 + 1)
        assert sign_in("olivia", "pw-olivia").signed_in


def test_failures_are_remembered_for_a_day_after_the_last_one(operator):
    with time_machine.travel(T0, tick=False) as clock:
        fail("olivia", LIMIT - 1)

        clock.shift(86_400 - 60)  # a fifth failure the next morning still counts
        assert_locked(sign_in("olivia", "wrong"), "5\xa0minutes", COOLOFF)

        clock.shift(86_400 + 1)  # a day after the last one, they are forgotten
        for response in fail("olivia", LIMIT - 1):
            assert_refused_but_not_locked(response)


def test_a_success_clears_the_accounts_failures(operator):
    fail("olivia", LIMIT - 1)
    assert sign_in("olivia", "pw-olivia").signed_in

    for response in fail("olivia", LIMIT - 1):
        assert_refused_but_not_locked(response)


def test_signing_in_to_ones_own_account_does_not_clear_the_addresss_failures(
    operator, second_operator
):
    """Else anyone with an account could guess at others' without end, signing in to
    their own between guesses (axes' default reset clears the whole address)."""
    fail("olivia", LIMIT - 1, address="198.51.100.66")
    assert sign_in("oscar", "pw-oscar", "198.51.100.66").signed_in

    assert_locked(sign_in("olivia", "wrong", "198.51.100.66"), "5\xa0minutes", COOLOFF)


def test_a_lock_from_a_short_cool_off_survives_another_clients_clean_up(operator, second_operator):
    """Axes cleans up with the cool-off of whichever request cleans: a first-lock one
    must not end a longer lock."""
    with time_machine.travel(T0, tick=False) as clock:
        fail("olivia", 2 * LIMIT)  # a 10-minute lock

        clock.shift(COOLOFF + 1)
        assert sign_in("oscar", "pw-oscar", "203.0.113.9").signed_in  # cleans up

        assert_locked(sign_in("olivia", "pw-olivia"), "10\xa0minutes", 2 * COOLOFF)


def test_the_admin_sign_in_is_throttled_too(admin_user):
    for response in fail("ada", LIMIT - 1, path=ADMIN_LOGIN):
        assert response.status_code == 200  # the admin's form again

    assert_locked(sign_in("ada", "wrong", path=ADMIN_LOGIN), "5\xa0minutes", COOLOFF)

    assert_locked(sign_in("ada", "pw-ada", path=ADMIN_LOGIN), "5\xa0minutes", COOLOFF)
    # One count for both forms: the console's is locked for that username too.
    assert_locked(sign_in("ada", "pw-ada"), "5\xa0minutes", COOLOFF)


def test_the_lockout_page_links_back_to_the_form_it_came_from(admin_user):
    response = fail("ada", LIMIT, path=ADMIN_LOGIN)[-1]

    assert 'href="/admin/login/"' in response.content.decode()
    assert response["Content-Security-Policy"]  # the console's headers, as any page


def test_an_admin_lifts_a_lock_with_axes_reset_username(operator):
    fail("olivia", 3 * LIMIT)

    call_command("axes_reset_username", "olivia")

    assert sign_in("olivia", "pw-olivia").signed_in


def test_a_longest_lock_shorter_than_the_first_stops_the_start(tmp_path):
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "DEBUG": "1",
        "STARTSAFE_VAR_DIR": str(tmp_path / "var"),
        "STARTSAFE_LOGIN_COOLOFF": "600",
        "STARTSAFE_LOGIN_COOLOFF_MAX": "60",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode != 0
    assert "STARTSAFE_LOGIN_COOLOFF_MAX=60 is below STARTSAFE_LOGIN_COOLOFF=600" in done.stderr


# --- The client's address behind reverse proxies ------------------------------------


def _wsgi_sign_in(app, peer, username, password, forwarded_for):
    """Post the sign-in form through the WSGI app, as gunicorn would call it when
    ``peer`` (the proxy, or the client itself) connects."""
    browser = WsgiClient(app)
    environ = {"REMOTE_ADDR": peer}
    page = browser.get(LOGIN, environ_base=environ).get_data(as_text=True)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    return browser.post(
        LOGIN,
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"X-Forwarded-For": forwarded_for},
        environ_base=environ,
    )


@pytest.fixture
def wsgi_app(settings):
    """The app as startsafe/wsgi.py builds it, for STARTSAFE_TRUSTED_PROXIES = trusted."""

    def build(trusted):
        settings.STARTSAFE = {**settings.STARTSAFE, "TRUSTED_PROXIES": trusted}
        return behind_trusted_proxies(WSGIHandler())

    return build


@pytest.mark.django_db(transaction=True)  # the WSGI handler ends each request's connection
def test_behind_one_trusted_proxy_the_address_is_the_one_it_saw_not_one_the_client_wrote(
    wsgi_app, operator
):
    app = wsgi_app(1)
    # nginx (172.18.0.5) appends the address it was called from; clients write
    # whatever they like before it, a new address on every try.
    for number, name in enumerate(["ana", "bo", "cy", "di", "ed"]):
        forwarded = f"10.0.0.{number}, 192.0.2.{number}, 203.0.113.7"
        response = _wsgi_sign_in(app, "172.18.0.5", name, "wrong", forwarded)

    assert response.status_code == 429
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"203.0.113.7"}
    assert _wsgi_sign_in(app, "172.18.0.5", "olivia", "pw-olivia", "203.0.113.7").status_code == 429
    # Another client behind the same proxy has its own count.
    assert _wsgi_sign_in(app, "172.18.0.5", "olivia", "pw-olivia", "203.0.113.8").status_code == 302


@pytest.mark.django_db(transaction=True)
def test_without_trusted_proxies_a_client_written_forwarded_for_is_ignored(wsgi_app, operator):
    app = wsgi_app(0)
    for number in range(LIMIT):
        response = _wsgi_sign_in(
            app, "198.51.100.20", f"user{number}", "wrong", f"192.0.2.{number}"
        )

    assert response.status_code == 429
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"198.51.100.20"}


# --- Password reset: only where e-mail reaches people -------------------------------

RESET_PAGES = [
    "/accounts/password_reset/",
    "/accounts/password_reset/done/",
    "/accounts/reset/MQ/set-password/",
    "/accounts/reset/done/",
]


class DeliveringBackend(LocmemBackend):
    """Stands in for a backend that sends (SMTP, or a provider's package): any
    backend but Django's console, file, in-memory and dummy ones."""


@pytest.mark.parametrize(
    ("backend", "configured"),
    [
        ("django.core.mail.backends.console.EmailBackend", False),  # startsafe's default
        ("django.core.mail.backends.filebased.EmailBackend", False),
        ("django.core.mail.backends.locmem.EmailBackend", False),
        ("django.core.mail.backends.dummy.EmailBackend", False),
        ("django.core.mail.backends.smtp.EmailBackend", True),
        ("anymail.backends.mailgun.EmailBackend", True),
    ],
)
def test_email_is_configured_when_its_backend_sends(settings, backend, configured):
    settings.EMAIL_BACKEND = backend

    assert email_is_configured() is configured


@pytest.mark.parametrize("path", RESET_PAGES)
def test_password_reset_is_not_found_without_email(settings, client, path):
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

    assert client.get(path).status_code == 404


def test_the_sign_in_page_offers_no_password_reset_without_email(settings, client):
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

    html = client.get(LOGIN).content.decode()

    assert "/accounts/password_reset/" not in html
    assert "Forgot your password?" not in html


def test_with_smtp_the_sign_in_page_offers_password_reset(settings, client):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "smtp.example.com"

    html = client.get(LOGIN).content.decode()

    assert 'href="/accounts/password_reset/"' in html
    assert client.get("/accounts/password_reset/").status_code == 200


def test_with_email_a_password_reset_sends_a_link_that_sets_a_new_password(
    settings, client, operator
):
    settings.EMAIL_BACKEND = f"{__name__}.DeliveringBackend"

    response = client.post("/accounts/password_reset/", {"email": "olivia@example.com"})

    assert response.status_code == 302
    assert len(mail.outbox) == 1
    link = re.search(r"http://testserver(/accounts/reset/\S+/)", mail.outbox[0].body).group(1)
    form = client.get(link, follow=True)
    assert form.status_code == 200
    new_password = "a-new-long-password-7"
    done = client.post(
        form.redirect_chain[-1][0],
        {"new_password1": new_password, "new_password2": new_password},
    )
    assert done.status_code == 302
    operator.refresh_from_db()
    assert operator.check_password(new_password)
