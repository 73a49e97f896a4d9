"""The Content-Security-Policy header (Django 5.2 has none built in).

The console's scripts are files served from this origin (htmx vendored by
django-htmx, console.js), with no inline script and no ``eval``, so
``script-src 'self'`` holds: a script that slipped through escaping would not run.
The API's browsable docs (``/api/v1/docs``) are left out: Swagger UI starts
with an inline script, and the JSON answers of the API are not documents.
"""

from __future__ import annotations

from django.conf import settings

EXEMPT_PREFIXES = ("/api/v1/docs",)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        policy = getattr(settings, "CONTENT_SECURITY_POLICY", "")
        if policy and not request.path.startswith(EXEMPT_PREFIXES):
            response.headers.setdefault("Content-Security-Policy", policy)
        return response
