"""The agent API v1 (api.md)."""

from __future__ import annotations

from ninja import NinjaAPI

api = NinjaAPI(title="startsafe agent API", version="1", urls_namespace="api")
