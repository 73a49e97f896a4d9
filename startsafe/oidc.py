"""OpenID Connect sign-in (docs/oidc.md): mozilla-django-oidc, with startsafe's rules.

The library runs the authorization code flow (state, nonce, PKCE, the token
request). What startsafe decides here:

1. Settings. The client's values come from ``settings.STARTSAFE``; the provider's
   endpoints from its discovery document (``<issuer>/.well-known/openid-configuration``),
   read at the first sign-in that needs them and kept for the process. Its ``issuer``
   must be the configured one (OpenID Connect Discovery 1.0, section 4.3).
2. The ID token. RS256 with a key from the provider's JWKS, and, beyond the
   library's checks (signature, nonce): ``iss`` is the issuer, ``aud`` holds our
   client id, and ``exp`` and ``iat`` are there. Any failure refuses the sign-in
   (the library lets an expired token through as a 500, and checks neither ``iss``
   nor ``aud``).
3. Who. An account is the provider's ``sub`` at that issuer (``OidcIdentity``),
   never an e-mail match, so no provider account becomes an existing local one.
4. Roles, at every sign-in: the groups claim (the ID token's, or the userinfo
   answer's, which wins) mapped to the operators and admins groups by the
   ``OIDC_*_GROUPS`` settings; a group the provider no longer lists is removed. A
   user in none of the mapped groups (viewer, operator or admin) is refused.
5. Sign-out. A user who signed in through the provider is sent on to its
   ``end_session_endpoint`` (OpenID Connect RP-Initiated Logout 1.0) with the ID
   token the sign-in kept in the session (``OIDC_STORE_ID_TOKEN``), so the
   provider's session ends too: otherwise "Sign in with …" on a shared computer
   signs the same person in again without asking. A provider without the endpoint
   only loses startsafe's session.
"""

from __future__ import annotations

import functools
import logging
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.db import transaction
from django.http import Http404, HttpRequest
from django.shortcuts import resolve_url
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from approvals.models import OidcIdentity
from approvals.roles import ROLES

log = logging.getLogger(__name__)

# mozilla-django-oidc's endpoint settings, and the discovery document's field for each.
_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
_CLIENT = {"OIDC_RP_CLIENT_ID": "OIDC_CLIENT_ID", "OIDC_RP_CLIENT_SECRET": "OIDC_CLIENT_SECRET"}


def is_on() -> bool:
    return bool(settings.STARTSAFE["OIDC_ISSUER"])


@functools.lru_cache(maxsize=4)
def discover(issuer: str) -> dict:
    """The issuer's discovery document (kept per process; a failure is not kept)."""
    response = requests.get(
        f"{issuer}/.well-known/openid-configuration", timeout=settings.OIDC_TIMEOUT
    )
    response.raise_for_status()
    document = response.json()
    if document.get("issuer", "").rstrip("/") != issuer:
        raise PermissionDenied(f"The discovery document names issuer {document.get('issuer')!r}.")
    missing = [field for field in _ENDPOINTS.values() if not document.get(field)]
    if missing:
        raise PermissionDenied(f"The discovery document has no {', '.join(missing)}.")
    return document


def setting(attr: str, *args):
    """mozilla-django-oidc's get_settings, reading startsafe's settings and discovery."""
    config = settings.STARTSAFE
    if attr in _ENDPOINTS:
        return discover(config["OIDC_ISSUER"])[_ENDPOINTS[attr]]
    if attr in _CLIENT:
        return config[_CLIENT[attr]]
    return import_from_settings(attr, *args)


def provider_logout_url(request: HttpRequest) -> str | None:
    """Where to send a user who signs out so the provider's session ends too, or None
    (a local sign-in, OIDC off, or a provider without an ``end_session_endpoint``).
    Read before the sign-out flushes the session that holds the ID token."""
    id_token = request.session.get("oidc_id_token")
    if not id_token or not is_on():
        return None
    try:
        endpoint = discover(settings.STARTSAFE["OIDC_ISSUER"]).get("end_session_endpoint")
    except (requests.RequestException, ValueError, PermissionDenied) as exc:
        log.warning("oidc discovery failed at sign-out: %s", exc)
        return None
    if not endpoint:
        return None
    query = {
        "id_token_hint": id_token,
        "client_id": settings.STARTSAFE["OIDC_CLIENT_ID"],
        "post_logout_redirect_uri": request.build_absolute_uri(
            resolve_url(settings.LOGOUT_REDIRECT_URL)
        ),
    }
    return f"{endpoint}?{urlencode(query)}"


def role_groups(claims: dict) -> set[str] | None:
    """The role groups (names in approvals.roles.ROLES) the claims give; None: no role
    at all, not even a viewer's."""
    config = settings.STARTSAFE
    listed = claims.get(config["OIDC_GROUPS_CLAIM"]) or []
    if isinstance(listed, str):
        listed = [listed]
    provider_groups = {str(name) for name in listed}
    roles = {
        role
        for role, key in (("operators", "OIDC_OPERATOR_GROUPS"), ("admins", "OIDC_ADMIN_GROUPS"))
        if provider_groups & set(config[key])
    }
    if not roles and not provider_groups & set(config["OIDC_VIEWER_GROUPS"]):
        return None
    return roles


def set_role_groups(user, roles: set[str]) -> None:
    """Make the user's role groups exactly ``roles``; other groups are left alone."""
    user.groups.remove(*Group.objects.filter(name__in=set(ROLES) - roles))
    user.groups.add(*Group.objects.filter(name__in=roles))


def _new_username(UserModel, claims: dict) -> str:
    base = (claims.get("preferred_username") or claims.get("email") or claims["sub"])[:120]
    username, n = base, 1
    while UserModel.objects.filter(username=username).exists():
        n += 1
        username = f"{base}-{n}"
    return username


class Backend(OIDCAuthenticationBackend):
    get_settings = staticmethod(setting)

    def __init__(self, *args, **kwargs):
        # No discovery here: Django builds every backend for each authenticate(), a
        # password sign-in's too, which must not wait for (or fail with) the provider.
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None

    def configure(self) -> None:
        """What the library's __init__ reads, read when a sign-in needs it."""
        for attr in (*_CLIENT, "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT"):
            setattr(self, attr, setting(attr))
        self.OIDC_OP_JWKS_ENDPOINT = setting("OIDC_OP_JWKS_ENDPOINT")

    def authenticate(self, request, **kwargs):
        # Only the callback's call (nonce, code_verifier), never a password form's.
        if "nonce" not in kwargs or not is_on():
            return None
        try:
            self.configure()
            return super().authenticate(request, **kwargs)
        except (requests.RequestException, ValueError) as exc:
            log.warning("oidc sign-in failed: %s", exc)
            raise PermissionDenied("The provider's answer was refused.") from exc

    def verify_token(self, token, **kwargs):
        """The ID token's claims, once signature, issuer, audience, expiry and nonce hold."""
        try:
            key = self.retrieve_matching_jwk(token)
            payload = jwt.decode(
                token,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.STARTSAFE["OIDC_ISSUER"],
                options={"require": ["iss", "aud", "sub", "exp", "iat"]},
            )
        except (jwt.InvalidTokenError, jwt.PyJWKError, KeyError, SuspiciousOperation) as exc:
            # SuspiciousOperation: the library found no key of the JWKS for this token.
            log.warning("oidc id token refused: %s", exc)
            raise PermissionDenied("The ID token was refused.") from exc
        if payload.get("nonce") != kwargs.get("nonce"):
            raise PermissionDenied("The ID token's nonce is not this sign-in's.")
        return payload

    def get_userinfo(self, access_token, id_token, payload):
        """The ID token's claims with the userinfo answer's over them (Entra ID sends
        groups only in the ID token; others only from userinfo)."""
        userinfo = super().get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload["sub"]:
            # OpenID Connect Core 1.0, 5.3.2: the answer is not about this user.
            raise PermissionDenied("The userinfo answer is about another subject.")
        return {**payload, **userinfo}

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        roles = role_groups(claims)
        if roles is None:
            log.info("oidc sign-in refused: sub=%s has no mapped group", claims["sub"])
            raise PermissionDenied("No role for this user's groups.")
        issuer = settings.STARTSAFE["OIDC_ISSUER"]
        with transaction.atomic():
            identity = (
                OidcIdentity.objects.select_related("user")
                .filter(issuer=issuer, subject=claims["sub"])
                .first()
            )
            if identity is None:
                user = self.UserModel(username=_new_username(self.UserModel, claims))
                user.set_unusable_password()
            else:
                user = identity.user
            user.email = claims.get("email", user.email) or ""
            user.first_name = (claims.get("given_name") or user.first_name)[:150]
            user.last_name = (claims.get("family_name") or user.last_name)[:150]
            user.save()
            if identity is None:
                OidcIdentity.objects.create(user=user, issuer=issuer, subject=claims["sub"])
            set_role_groups(user, roles)
        return user


def _only_when_on(view_class):
    class View(view_class):
        get_settings = staticmethod(setting)

        def dispatch(self, request, *args, **kwargs):
            if not is_on():
                raise Http404("OpenID Connect sign-in is off.")
            return super().dispatch(request, *args, **kwargs)

    View.__name__ = view_class.__name__
    return View


class AuthenticationRequestView(_only_when_on(OIDCAuthenticationRequestView)):
    def __init__(self, *args, **kwargs):
        # The library reads the endpoint here; we read it in get(), where OIDC is on.
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request):
        try:
            self.OIDC_OP_AUTH_ENDPOINT = setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except (requests.RequestException, ValueError, PermissionDenied) as exc:
            log.warning("oidc discovery failed: %s", exc)
            return CallbackView(request=request).login_failure()
        self.OIDC_RP_CLIENT_ID = setting("OIDC_RP_CLIENT_ID")
        return super().get(request)


CallbackView = _only_when_on(OIDCAuthenticationCallbackView)
