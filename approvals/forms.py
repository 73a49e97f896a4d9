"""Reading the console's action forms (product.md, "Console addresses and forms").

Each reader raises ``InvalidRequest`` (400) for a missing required field or
invalid JSON; the views call them before any permission or state check, because a
malformed form is wrong whoever sends it and whatever the state.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest

from runs.errors import InvalidRequest

_MISSING = object()
TRUE_VALUES = ("on", "1", "true", "yes")


def required_text(request: HttpRequest, name: str) -> str:
    value = request.POST.get(name, "").strip()
    if not value:
        message = "A note is required." if name == "note" else f"{name} is required."
        raise InvalidRequest(message, {"fields": {name: "required"}})
    return value


def optional_text(request: HttpRequest, name: str) -> str:
    return request.POST.get(name, "").strip()


def checkbox(request: HttpRequest, name: str) -> bool:
    return request.POST.get(name, "").strip().lower() in TRUE_VALUES


def optional_json(request: HttpRequest, name: str, *, object_only: bool = False) -> Any:
    """The field parsed as JSON, or ``None`` when it is absent or blank."""
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    return parse_json(raw, name, object_only=object_only)


def parse_json(raw: str, name: str, *, object_only: bool = False) -> Any:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(
            f"{name} is not valid JSON: {exc}", {"fields": {name: "invalid JSON"}}
        ) from None
    if object_only and not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be a JSON object ({{…}}).", {"fields": {name: "object"}})
    return value
