"""startsafe settings: one file, every value from the environment.

Every variable read here is listed, with its default, in ``.env.example`` and in
the README. The embedded default (no variables set) is SQLite and a Celery
transport that needs no server, so ``make run`` works on a fresh machine.
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from startsafe import devenv
from startsafe.env import env_bool, env_float, env_int, env_list, env_rate, env_str
from startsafe.outbound import parse_allow, text_refusal

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = devenv.var_dir()
# var/dev.env, which `make run` writes (DEBUG=1 and a SECRET_KEY of this clone's own),
# fills in the variables the environment does not set, so that manage.py in another
# terminal works as make run's processes do; the environment always wins. None when
# there is no such file, as in a deployment (check --deploy warns when there is one:
# startsafe/checks.py).
DEV_ENV_FILE = devenv.load(VAR_DIR)

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is required when DEBUG is off (set DEBUG=1 for local development)."
        )
    SECRET_KEY = "insecure-development-key-only-for-debug"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "startsafe.apps.StartsafeAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # its own templates serve the API docs from local static files, no CDN
    "django_htmx",
    "template_partials",
    "axes",  # sign-in throttling (startsafe/login_throttle.py)
    "runs",
    "approvals",
]

MIDDLEWARE = [
    # /api/ requests skip CONSOLE_ONLY_MIDDLEWARE below (runs/api/middleware.py).
    "runs.api.middleware.ApiMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (console CSS, htmx, admin, API docs) served by the app itself.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The console's Content-Security-Policy header.
    "startsafe.security.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Turns a refused sign-in into the lockout page (startsafe/login_throttle.py);
    # inside the security headers' middleware, so that page carries them too.
    "axes.middleware.AxesMiddleware",
    # The console's statements are planned with their values, never prepared
    # (startsafe/postgresql/plans.py).
    "startsafe.postgresql.plans.ConsoleQueriesMiddleware",
    # Idempotency-Key and the 1 MiB body limit of the agent API (runs/api/idempotency.py).
    "runs.api.idempotency.IdempotencyMiddleware",
]

# What a bearer-token JSON API never uses: the agent API's requests go through
# MIDDLEWARE without these (a poll costs less; docs/performance.md).
CONSOLE_ONLY_MIDDLEWARE = [
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",
    "startsafe.postgresql.plans.ConsoleQueriesMiddleware",
]

ROOT_URLCONF = "startsafe.urls"
WSGI_APPLICATION = "startsafe.wsgi.application"
ASGI_APPLICATION = "startsafe.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


# --- Database -----------------------------------------------------------------


def _database_settings() -> dict:
    url = env_str("DATABASE_URL")
    if not url:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "startsafe.sqlite3",
            "OPTIONS": {
                # WAL lets readers go on while one writer writes; IMMEDIATE takes the
                # write lock at BEGIN, so two concurrent writers queue on busy_timeout
                # instead of failing with "database is locked" half-way.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    try:
        config = dj_database_url.parse(url)
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL: {exc}") from None
    if config["ENGINE"] == "django.db.backends.postgresql":
        config["ENGINE"] = "startsafe.postgresql"
        options = config.setdefault("OPTIONS", {})
        # No JIT: its compile time (100+ ms) is paid by any query the planner thinks
        # costly, such as the runs page's counts over 100,000 runs, which then run
        # in 40 ms without it (docs/performance.md). Behind PgBouncer, which refuses
        # this startup option, set it on the role instead (docs/scaling.md).
        options["options"] = " ".join(filter(None, [options.get("options"), "-c jit=off"]))
        if env_bool("DATABASE_PREPARE", True):
            # Parameters bound by the server, and prepared statements: PostgreSQL
            # parses and plans a statement the fifth time a connection sends it, then
            # only runs it. The ORM sends the same SQL for the same query shape, so
            # the API's hot statements are prepared after a few requests.
            # Behind a PgBouncer older than 1.21 in transaction mode, set
            # DATABASE_PREPARE=0 (docs/scaling.md).
            options["server_side_binding"] = True
            options["prepare_threshold"] = 5
        if env_bool("DATABASE_POOL", True):
            # psycopg 3's pool; Django requires CONN_MAX_AGE = 0 with it.
            options["pool"] = {
                "min_size": env_int("DATABASE_POOL_MIN", 1, minimum=0),
                "max_size": env_int("DATABASE_POOL_MAX", 10, minimum=1),
                "timeout": env_float("DATABASE_POOL_TIMEOUT", 10.0, minimum=0.1),
            }
            config["CONN_MAX_AGE"] = 0
            # Check each connection as it leaves the pool: after a PostgreSQL restart
            # or a pg_terminate_backend, the pool's idle connections are dead, and
            # without the check each would fail a request with a 500. Our backend's
            # check sweeps them all at the first dead one (startsafe/postgresql).
            config["CONN_HEALTH_CHECKS"] = True
        else:
            config["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
            config["CONN_HEALTH_CHECKS"] = True
    return config


DATABASES = {"default": _database_settings()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


# --- Auth, i18n, static -------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# Axes' backend first: it refuses a locked-out username or address before the
# password is even checked, for every form that calls authenticate() (the console's
# sign-in and the admin's).
# Then the OpenID Connect backend when a provider is set (startsafe/oidc.py), and
# Django's password backend while local sign-in is on: without it no form anywhere
# (the console's or the admin's) accepts a password. The OIDC backend also answers
# permission checks (it is a ModelBackend), so roles work with local sign-in off.
# AUTHENTICATION_BACKENDS is set below, once STARTSAFE is read.

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# The console and the API speak English only (no LocaleMiddleware, no translated
# strings). Without translation machinery every {% url %} and relative time skips its
# per-call lookup of the active language: a sixth of the queue page's render
# (docs/performance.md).
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# collectstatic fills it in production; WhiteNoise wants the folder to exist.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").is_dir() else []
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Without collectstatic (make run, tests), serve from the apps' static folders.
WHITENOISE_USE_FINDERS = True

# Requests up to the API's 1 MiB limit plus headroom; the API checks its own limit
# first so that it can answer with the contract's 413 body.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024


# --- Security (production values unless DEBUG) ---------------------------------

SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("SECURE_PROXY_SSL_HEADER", False) else None
)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# HSTS covers subdomains by default (check --deploy asks for it); preload is a
# commitment to browsers' built-in lists, so it is the operator's choice.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Cookies: the session dies after 12 hours (an operator's working day) and is never
# sent by a cross-site request that could change state; JavaScript reads neither
# cookie (htmx takes the CSRF token from the page, not from the cookie).
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600, minimum=60)
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"
# The console's Content-Security-Policy (startsafe/security.py): everything from
# this origin only, no inline script, no framing, forms post only here.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
)


# --- Cache (the API's rate limit) ---------------------------------------------


def _cache_settings() -> dict:
    """Redis when ``CACHE_URL`` (or ``REDIS_URL``) is set, else local memory.

    The rate limit's counters must be shared by every web process to be exact, so
    production points this at Redis (it is already in the stack as the broker).
    The embedded default runs one web process, where local memory is exact and
    costs nothing; the database cache would add a write to SQLite's single writer
    on every API request, and needs createcachetable.
    """
    url = env_str("CACHE_URL") or env_str("REDIS_URL")
    if not url:
        return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"CACHE_URL must be a redis:// URL, not {url!r}.")
    return {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url}


CACHES = {"default": _cache_settings()}


# --- E-mail -------------------------------------------------------------------

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "startsafe <startsafe@localhost>")


# --- Celery -------------------------------------------------------------------

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
if CELERY_BROKER_URL == "filesystem://":
    # Kombu's filesystem transport: a folder of message files, no server at all.
    _queue_dir = VAR_DIR / "celery" / "queue"
    _processed_dir = VAR_DIR / "celery" / "processed"
    # The exchange tables of fanout exchanges (the worker's remote control, pidbox);
    # kombu's default is "control" in the current folder, which left an untracked
    # control/ at the top of a clone. Kombu creates it without its parents.
    _control_dir = VAR_DIR / "celery" / "control"
    for _folder in (_queue_dir, _processed_dir, _control_dir):
        _folder.mkdir(parents=True, exist_ok=True)
    # Kombu's transport with a message file written whole before a worker sees it
    # (startsafe/broker.py: kombu's own let make run's worker die on a half-written one).
    CELERY_BROKER_TRANSPORT = "startsafe.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_processed_dir),
        "control_folder": str(_control_dir),
        "store_processed": False,
    }
# A prefix on every key and channel the broker uses in Redis (kombu's
# global_keyprefix), so several deployments, or a test run, can share one Redis
# database without seeing each other's queues; each can then clear its own keys
# without flushing anyone else's (the tests do: tests/redis_helpers.py).
_broker_key_prefix = env_str("CELERY_BROKER_KEY_PREFIX", "")
if _broker_key_prefix:
    if not CELERY_BROKER_URL.startswith(("redis://", "rediss://", "redis+socket://")):
        raise ImproperlyConfigured("CELERY_BROKER_KEY_PREFIX needs a redis:// CELERY_BROKER_URL.")
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        **CELERY_BROKER_TRANSPORT_OPTIONS,
        "global_keyprefix": _broker_key_prefix,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Django's LOGGING (key=value lines) stays in charge of the worker's logs too.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False


# --- startsafe ----------------------------------------------------------------


def _metrics_token() -> str:
    """The bearer token a Prometheus scraper sends to ``/metrics`` (startsafe/health.py).

    Unset, ``/metrics`` answers only a development server (``DEBUG``): its counts say
    what waits for whom and what failed, which is nobody else's business. A token
    short enough to guess is refused at the start, as a bad value should be."""
    token = env_str("STARTSAFE_METRICS_TOKEN", "")
    if token and (len(token) < 32 or not token.isprintable() or " " in token):
        raise ImproperlyConfigured(
            "STARTSAFE_METRICS_TOKEN must be 32 or more printable characters without spaces: "
            'python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    return token


# Hosts and networks the restart hand-off and the webhook may reach though they are
# not public (startsafe/outbound.py): a runtime on this host or in this VPC. Empty:
# public addresses only, so an agent's restart_url cannot reach the private network.
_OUTBOUND_ALLOW = env_list("STARTSAFE_OUTBOUND_ALLOW", [])
try:
    _outbound_allowed = parse_allow(tuple(_OUTBOUND_ALLOW))
except ValueError as exc:
    raise ImproperlyConfigured(f"STARTSAFE_OUTBOUND_ALLOW: {exc}") from None
_NOTIFY_WEBHOOK_URL = env_str("STARTSAFE_NOTIFY_WEBHOOK_URL", "")
if _NOTIFY_WEBHOOK_URL and (refusal := text_refusal(_NOTIFY_WEBHOOK_URL, _outbound_allowed)):
    raise ImproperlyConfigured(f"STARTSAFE_NOTIFY_WEBHOOK_URL {refusal}.")


def _slack_settings() -> dict:
    """Slack (docs/slack.md): on when both the bot token and the signing secret are set.

    Half a configuration is refused at the start: a token without the secret would
    post buttons whose clicks are all refused, a secret without the token nothing."""
    token = env_str("STARTSAFE_SLACK_BOT_TOKEN", "")
    secret = env_str("STARTSAFE_SLACK_SIGNING_SECRET", "")
    channel = env_str("STARTSAFE_SLACK_CHANNEL", "")
    if bool(token) != bool(secret):
        raise ImproperlyConfigured(
            "Slack needs both STARTSAFE_SLACK_BOT_TOKEN and STARTSAFE_SLACK_SIGNING_SECRET."
        )
    if token and not channel:
        raise ImproperlyConfigured("STARTSAFE_SLACK_CHANNEL is required when Slack is on.")
    return {
        "SLACK_BOT_TOKEN": token,
        "SLACK_SIGNING_SECRET": secret,
        # Where each effect awaiting approval is posted: a channel id or #name.
        "SLACK_CHANNEL": channel,
        # Where escalations go; empty: they go only by e-mail.
        "SLACK_ESCALATION_CHANNEL": env_str("STARTSAFE_SLACK_ESCALATION_CHANNEL", ""),
        # The Web API's address (slack_sdk's base_url); tests point it at a fake.
        "SLACK_API_URL": env_str("STARTSAFE_SLACK_API_URL", "https://slack.com/api/"),
    }


def _oidc_settings() -> dict:
    """OpenID Connect sign-in (docs/oidc.md): on when STARTSAFE_OIDC_ISSUER is set.

    The endpoints are not settings: they come from the issuer's discovery document,
    read at the first sign-in and kept for the process (startsafe/oidc.py), so the
    provider being down at the start stops only single sign-on, not the console."""
    issuer = (env_str("STARTSAFE_OIDC_ISSUER", "") or "").rstrip("/")
    client_id = env_str("STARTSAFE_OIDC_CLIENT_ID", "")
    secret = env_str("STARTSAFE_OIDC_CLIENT_SECRET", "")
    if issuer and not (client_id and secret):
        raise ImproperlyConfigured(
            "STARTSAFE_OIDC_ISSUER needs STARTSAFE_OIDC_CLIENT_ID and STARTSAFE_OIDC_CLIENT_SECRET."
        )
    if issuer and not issuer.startswith(("https://", "http://")):
        raise ImproperlyConfigured(f"STARTSAFE_OIDC_ISSUER={issuer!r} is not an http(s) URL.")
    local_login = env_bool("STARTSAFE_LOCAL_LOGIN", True)
    if not (issuer or local_login):
        raise ImproperlyConfigured(
            "STARTSAFE_LOCAL_LOGIN=0 needs STARTSAFE_OIDC_ISSUER: nobody could sign in."
        )
    return {
        "OIDC_ISSUER": issuer,
        "OIDC_CLIENT_ID": client_id,
        "OIDC_CLIENT_SECRET": secret,
        # The sign-in page's button: "Sign in with <name>".
        "OIDC_PROVIDER_NAME": env_str("STARTSAFE_OIDC_PROVIDER_NAME", "single sign-on"),
        # The claim (ID token or userinfo) that lists the user's groups at the provider.
        "OIDC_GROUPS_CLAIM": env_str("STARTSAFE_OIDC_GROUPS_CLAIM", "groups"),
        # Provider groups that give each role; a user in none of them is refused.
        "OIDC_VIEWER_GROUPS": env_list("STARTSAFE_OIDC_VIEWER_GROUPS", []),
        "OIDC_OPERATOR_GROUPS": env_list("STARTSAFE_OIDC_OPERATOR_GROUPS", []),
        "OIDC_ADMIN_GROUPS": env_list("STARTSAFE_OIDC_ADMIN_GROUPS", []),
        # Username and password sign-in (console and admin); off: only the provider.
        "LOCAL_LOGIN": local_login,
    }


STARTSAFE = {
    # Default approval deadline when a call does not send approval_ttl (seconds).
    "APPROVAL_TTL": env_int("STARTSAFE_APPROVAL_TTL", 86_400, minimum=60, maximum=2_592_000),
    # Automatic hand-backs to a runtime per run before a person must decide.
    "AUTO_RESTART_CAP": env_int("STARTSAFE_AUTO_RESTART_CAP", 5, minimum=0),
    # Seconds between sweeps on the Celery beat schedule.
    "SWEEP_INTERVAL": env_float("STARTSAFE_SWEEP_INTERVAL", 5.0, minimum=0.5),
    # Seconds one hand-off POST may take (per phase: connect, send, answer).
    "RESTART_HANDOFF_TIMEOUT": env_float("STARTSAFE_RESTART_HANDOFF_TIMEOUT", 10.0, minimum=0.5),
    # Tries of the restart hand-off before it is given up (shown on the run).
    "RESTART_HANDOFF_MAX_TRIES": env_int("STARTSAFE_RESTART_HANDOFF_MAX_TRIES", 8, minimum=1),
    # Optional generic JSON webhook told of what waits for operators.
    "NOTIFY_WEBHOOK_URL": _NOTIFY_WEBHOOK_URL,
    # Who gets e-mail; empty means every active member of the operators group.
    "NOTIFY_EMAILS": env_list("STARTSAFE_NOTIFY_EMAILS", []),
    # Seconds between notification batches: everything that happened in between is
    # one e-mail (and one webhook POST).
    "NOTIFY_INTERVAL": env_float("STARTSAFE_NOTIFY_INTERVAL", 30.0, minimum=0.5),
    # Warn operators this many seconds before an approval's deadline (at most a
    # quarter of the approval's own TTL).
    "NOTIFY_DEADLINE_WARNING": env_int("STARTSAFE_NOTIFY_DEADLINE_WARNING", 3600, minimum=0),
    # How far back the audit log is read for effects that started awaiting approval.
    "NOTIFY_LOOKBACK": env_int("STARTSAFE_NOTIFY_LOOKBACK", 900, minimum=60),
    # Retention on the schedule (once a day): finished runs unchanged for this many
    # days are pruned, their keys kept as tombstones. Unset: nothing is deleted
    # unless someone runs `manage.py prune`.
    # (At most 100,000 days, as `manage.py prune` takes: more is out of the calendar.)
    "PRUNE_OLDER_THAN_DAYS": env_int(
        "STARTSAFE_PRUNE_OLDER_THAN_DAYS", None, minimum=1, maximum=100_000
    ),
    # Seconds one sender holds its claim on a batch before another may take over.
    "NOTIFY_LEASE": env_int("STARTSAFE_NOTIFY_LEASE", 120, minimum=5),
    "NOTIFY_MAX_TRIES": env_int("STARTSAFE_NOTIFY_MAX_TRIES", 10, minimum=1),
    "NOTIFY_WEBHOOK_TIMEOUT": env_float("STARTSAFE_NOTIFY_WEBHOOK_TIMEOUT", 10.0, minimum=0.5),
    # The console's address, for links in notifications (https://startsafe.example.com).
    "PUBLIC_URL": env_str("STARTSAFE_PUBLIC_URL", ""),
    # Seconds a signed action link in an e-mail (approve, reject, mark done) stays
    # valid; never past the effect's own deadline (approvals/links.py).
    "EMAIL_LINK_TTL": env_int("STARTSAFE_EMAIL_LINK_TTL", 86_400, minimum=60),
    # Who hears of an effect still awaiting approval when its SLA passed: addresses of
    # a second group (their console accounts get signed links; others the page's).
    # Empty: no escalation.
    "ESCALATE_EMAILS": env_list("STARTSAFE_ESCALATE_EMAILS", []),
    # When: this share of the effect's deadline window (from when it started awaiting
    # to its deadline) has passed; 0.5 is half way, 1 would be the deadline itself.
    "ESCALATION_SLA": env_float("STARTSAFE_ESCALATION_SLA", 0.5, minimum=0.01),
    # Requests per token and window on the agent API ("600/minute"; 0 or empty: off).
    "RATE_LIMIT": env_rate("STARTSAFE_RATE_LIMIT", "600/minute"),
    # Sign-in throttling: failed sign-ins are counted per username and, apart, per
    # client address; LOGIN_FAILURE_LIMIT of either locks it for LOGIN_COOLOFF
    # seconds. Past the limit every further failure locks it again at once, for twice
    # as long after each further LIMIT failures, up to LOGIN_COOLOFF_MAX: slowed, then
    # refused for a while. Failures are forgotten LOGIN_COOLOFF_MAX seconds after the
    # last one, or when that account signs in.
    "LOGIN_FAILURE_LIMIT": env_int("STARTSAFE_LOGIN_FAILURE_LIMIT", 5, minimum=1),
    "LOGIN_COOLOFF": env_int("STARTSAFE_LOGIN_COOLOFF", 300, minimum=1),
    "LOGIN_COOLOFF_MAX": env_int("STARTSAFE_LOGIN_COOLOFF_MAX", 86_400, minimum=1),
    # Reverse proxies in front of the web server that append the client's address to
    # X-Forwarded-For (nginx: 1). 0: the client is the TCP peer (REMOTE_ADDR), and
    # the header, which any client can write, is ignored (startsafe/proxies.py).
    "TRUSTED_PROXIES": env_int("STARTSAFE_TRUSTED_PROXIES", 0, minimum=0, maximum=10),
    # Seconds /healthz waits for the broker before answering 503.
    "HEALTH_BROKER_TIMEOUT": env_float("STARTSAFE_HEALTH_BROKER_TIMEOUT", 2.0, minimum=0.1),
    # /metrics for a scraper with this bearer token; empty: only under DEBUG.
    "METRICS_TOKEN": _metrics_token(),
    # Host names and CIDR networks reached though not public (see above).
    "OUTBOUND_ALLOW": _OUTBOUND_ALLOW,
    **_slack_settings(),
    **_oidc_settings(),
}

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    *(["startsafe.oidc.Backend"] if STARTSAFE["OIDC_ISSUER"] else []),
    *(["django.contrib.auth.backends.ModelBackend"] if STARTSAFE["LOCAL_LOGIN"] else []),
]
# mozilla-django-oidc's own settings; the provider's, client's and endpoints' values
# come from STARTSAFE above (startsafe.oidc.setting).
OIDC_RP_SIGN_ALGO = "RS256"  # the provider's keys from its JWKS, never a shared secret
OIDC_RP_SCOPES = "openid email profile"
OIDC_USE_NONCE = True
# Kept in the session for the provider's sign-out (startsafe/oidc.py, id_token_hint).
OIDC_STORE_ID_TOKEN = True
# PKCE as well as the client secret (RFC 9700): every provider in docs/oidc.md has it.
OIDC_USE_PKCE = True
OIDC_TIMEOUT = 10
# The client authenticates to the token endpoint with HTTP Basic (client_secret_basic):
# OpenID Connect's default, which every provider must accept; some (Okta) refuse the
# other method unless the client was registered for it.
OIDC_TOKEN_USE_BASIC_AUTH = True
OIDC_AUTHENTICATE_CLASS = "startsafe.oidc.AuthenticationRequestView"
OIDC_CALLBACK_CLASS = "startsafe.oidc.CallbackView"
# A refused sign-in at the provider's end comes back to the sign-in page, which says so.
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?sso=failed"

if STARTSAFE["ESCALATION_SLA"] >= 1:
    raise ImproperlyConfigured(
        f"STARTSAFE_ESCALATION_SLA={STARTSAFE['ESCALATION_SLA']} is a share of the deadline "
        "window: below 1 (at 1 the effect expires as it escalates)."
    )

# --- Sign-in throttling (django-axes; startsafe/login_throttle.py) ---------------

if STARTSAFE["LOGIN_COOLOFF_MAX"] < STARTSAFE["LOGIN_COOLOFF"]:
    raise ImproperlyConfigured(
        f"STARTSAFE_LOGIN_COOLOFF_MAX={STARTSAFE['LOGIN_COOLOFF_MAX']} is below "
        f"STARTSAFE_LOGIN_COOLOFF={STARTSAFE['LOGIN_COOLOFF']}."
    )

AXES_FAILURE_LIMIT = STARTSAFE["LOGIN_FAILURE_LIMIT"]
# Either parameter alone locks: a username (from any address), or an address (for
# any username).
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# The lock's length grows with the failures (startsafe/login_throttle.py).
AXES_COOLOFF_TIME = "startsafe.login_throttle.cool_off"
AXES_HANDLER = "startsafe.login_throttle.ThrottleHandler"
AXES_LOCKOUT_CALLABLE = "startsafe.login_throttle.lockout_response"
# A sign-in clears that account's own failures (ThrottleHandler says which).
AXES_RESET_ON_SUCCESS = True
# No row per successful sign-in: nothing would ever prune them.
AXES_DISABLE_ACCESS_LOG = True
# The client's address is REMOTE_ADDR, which startsafe/proxies.py takes from
# X-Forwarded-For only behind STARTSAFE_TRUSTED_PROXIES proxies: axes must not read
# the header itself (with django-ipware installed, it would, by ipware's rules).
AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Celery's own "received"/"succeeded" lines repeat startsafe.tasks' key=value line.
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
    },
}

# Each scheduled message expires after its interval: with no worker running, beat's
# messages do not pile up into a backlog of identical sweeps.
CELERY_BEAT_SCHEDULE = {
    "sweep": {
        "task": "runs.tasks.sweep",
        "schedule": STARTSAFE["SWEEP_INTERVAL"],
        "options": {"expires": max(STARTSAFE["SWEEP_INTERVAL"], 5.0)},
    },
    "notify": {
        "task": "approvals.tasks.notify",
        "schedule": STARTSAFE["NOTIFY_INTERVAL"],
        "options": {"expires": max(STARTSAFE["NOTIFY_INTERVAL"], 5.0)},
    },
    # Idempotency-Key answers are kept 24 hours (api.md); every hour the older go.
    "prune-idempotency-answers": {
        "task": "runs.tasks.prune_idempotency_answers",
        "schedule": 3_600.0,
        "options": {"expires": 3_600.0},
    },
}
if STARTSAFE["SLACK_BOT_TOKEN"]:
    # Posts what the prompt task queued on each change missed (a broker that was
    # down), and retries what Slack refused or rate-limited.
    CELERY_BEAT_SCHEDULE["slack"] = {
        "task": "approvals.tasks.slack",
        "schedule": STARTSAFE["NOTIFY_INTERVAL"],
        "options": {"expires": max(STARTSAFE["NOTIFY_INTERVAL"], 5.0)},
    }
if STARTSAFE["PRUNE_OLDER_THAN_DAYS"] is not None:
    CELERY_BEAT_SCHEDULE["prune"] = {
        "task": "runs.tasks.prune",
        "schedule": 86_400.0,
        "options": {"expires": 3_600.0},
    }
