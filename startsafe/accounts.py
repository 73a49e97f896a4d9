"""Sign-in and password pages: Django's own, with password reset only where e-mail is sent.

A reset link that goes to the console backend's output (startsafe's default) or
nowhere reaches nobody, so the reset pages answer 404 and the sign-in page does not
offer them unless ``email_is_configured()``. It is read on each request, from the
settings, so it follows EMAIL_BACKEND wherever that is set.
"""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth import urls as auth_urls
from django.contrib.auth import views as auth_views
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.urls import path

from startsafe.oidc import provider_logout_url

# Django's backends that keep a message on this machine (the console backend is
# startsafe's default; Django's test runner uses the in-memory one).
UNDELIVERED_EMAIL_BACKENDS = frozenset(
    {
        "django.core.mail.backends.console.EmailBackend",
        "django.core.mail.backends.filebased.EmailBackend",
        "django.core.mail.backends.locmem.EmailBackend",
        "django.core.mail.backends.dummy.EmailBackend",
    }
)


def email_is_configured() -> bool:
    """E-mail reaches people: EMAIL_BACKEND is one that sends (Django's SMTP backend,
    with EMAIL_HOST and the rest, or any other package's), not one that keeps it here."""
    return settings.EMAIL_BACKEND not in UNDELIVERED_EMAIL_BACKENDS


def _only_with_email(view):
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not email_is_configured():
            raise Http404("Password reset is off: e-mail is not configured.")
        if not settings.STARTSAFE["LOCAL_LOGIN"]:
            raise Http404("Password reset is off: sign-in with a password is off.")
        return view(request, *args, **kwargs)

    return wrapped


class LoginView(auth_views.LoginView):
    """Django's sign-in page; it offers the OpenID Connect provider when one is set,
    and with STARTSAFE_LOCAL_LOGIN off it neither shows nor takes a password (the
    backend that checks passwords is gone as well: settings.AUTHENTICATION_BACKENDS)."""

    def post(self, request, *args, **kwargs):
        if not settings.STARTSAFE["LOCAL_LOGIN"]:
            raise PermissionDenied("Sign-in with a username and password is off.")
        return super().post(request, *args, **kwargs)

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        config = settings.STARTSAFE
        context["password_reset"] = email_is_configured() and config["LOCAL_LOGIN"]
        context["local_login"] = config["LOCAL_LOGIN"]
        context["oidc_provider"] = config["OIDC_PROVIDER_NAME"] if config["OIDC_ISSUER"] else ""
        context["sso_failed"] = self.request.GET.get("sso") == "failed"
        return context


class LogoutView(auth_views.LogoutView):
    """Django's sign-out; a user who signed in through the OpenID Connect provider
    goes on to the provider's sign-out (startsafe/oidc.py, ``provider_logout_url``),
    which sends them back to the sign-in page."""

    def post(self, request, *args, **kwargs):
        at_provider = provider_logout_url(request)  # the session is flushed below
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(at_provider) if at_provider else response


def _accounts_urls():
    """Django's account addresses (django.contrib.auth.urls), each kept as it is,
    except the sign-in page (it knows whether to offer a reset), the sign-out (it
    signs out at the provider too) and the four reset pages (404 without e-mail)."""
    for pattern in auth_urls.urlpatterns:
        if pattern.name == "login":
            yield path(str(pattern.pattern), LoginView.as_view(), name=pattern.name)
        elif pattern.name == "logout":
            yield path(str(pattern.pattern), LogoutView.as_view(), name=pattern.name)
        elif pattern.name.startswith("password_reset"):
            yield path(str(pattern.pattern), _only_with_email(pattern.callback), name=pattern.name)
        else:
            yield pattern


urlpatterns = list(_accounts_urls())
