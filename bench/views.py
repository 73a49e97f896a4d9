"""The benchmark's baseline: the cheapest useful Django view, to measure the API against.

Mounted only when ``STARTSAFE_BENCH_BASELINE=1`` (``startsafe/urls.py``), never in
production. It authenticates nothing and returns one row by primary key through
the ORM, through the same middleware and server as the API: the ratio poll ÷
baseline is then what the poll costs over Django's own floor on this machine.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, JsonResponse

from runs.models import Effect
from startsafe.postgresql.plans import prepared


def baseline(request: HttpRequest, effect_id) -> JsonResponse:
    # Not under /api/, so the console's middleware runs it unprepared; its one
    # statement is prepared as the API's are, so the ratios compare like with like.
    with prepared():
        row = Effect.objects.filter(pk=effect_id).values("id", "status", "revision").first()
    if row is None:
        raise Http404
    return JsonResponse(
        {"id": str(row["id"]), "status": row["status"], "revision": row["revision"]}
    )
