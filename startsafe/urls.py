from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from runs.api import api
from startsafe import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", api.urls),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", health.metrics, name="metrics"),
    path("", include("approvals.urls")),
]
