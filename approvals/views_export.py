"""The audit log's export (admins, like ``/history/``): streamed, constant memory."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from approvals.audit_export import EXPORT_FORMATS, audit_events, audit_filters, audit_rows
from approvals.views_common import HISTORY_PERMISSION


@require_GET
@login_required
@permission_required(HISTORY_PERMISSION, raise_exception=True)
def history_export(request: HttpRequest, fmt: str) -> StreamingHttpResponse:
    """``/history/export.<fmt>``: the history page's audit log, with its filters, whole.

    Streamed: rows are read in chunks and written as they come, so a million rows
    never sit in memory (tests/test_export.py, bench/export_memory.py)."""
    encode, content_type = EXPORT_FORMATS[fmt]
    rows = audit_rows(audit_events(audit_filters(request.GET)))
    response = StreamingHttpResponse(encode(rows), content_type=content_type)
    filename = f"startsafe-audit-{timezone.now():%Y-%m-%d}.{fmt}"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
