"""Health and metrics endpoints (filled in by the background-work issue)."""

from __future__ import annotations

from django.db import connection
from django.http import HttpResponse, JsonResponse


def healthz(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"database": "ok"})


def metrics(request):
    return HttpResponse("", content_type="text/plain; version=0.0.4")
