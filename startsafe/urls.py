from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from approvals.views_slack import interactions as slack_interactions
from runs.api.views import api
from startsafe import health

# The API's own error body where Django answers before (or instead of) the API.
handler400 = "runs.api.middleware.bad_request"
handler500 = "runs.api.middleware.server_error"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("startsafe.accounts")),
    # OpenID Connect sign-in (startsafe/oidc.py): 404 unless a provider is set.
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("api/v1/", api.urls),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", health.metrics, name="metrics"),
    # Slack's interactivity request URL (docs/slack.md), outside the console's addresses.
    path("integrations/slack/interactions", slack_interactions, name="slack-interactions"),
    path("", include("approvals.urls")),
]
