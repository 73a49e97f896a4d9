"""The baseline's one view and its one URL."""

from __future__ import annotations

from django.http import Http404, JsonResponse
from django.urls import path

from bench.baseline.models import Effect


def effect(request, effect_id):
    row = Effect.objects.filter(pk=effect_id).values("id", "status", "revision").first()
    if row is None:
        raise Http404
    return JsonResponse(
        {"id": str(row["id"]), "status": row["status"], "revision": row["revision"]}
    )


urlpatterns = [path("baseline/<uuid:effect_id>", effect)]
