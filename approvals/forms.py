"""Reading the console's action forms (product.md, "Console addresses and forms").

Each reader raises ``InvalidRequest`` (400) for a missing required field or
invalid JSON; the views call them before any permission or state check, because a
malformed form is wrong whoever sends it and whatever the state.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest

from runs.validation import MAX_JSON_VALUE, check_json_value
from runs.canonical import NotCanonicalizable, canonical_json
from runs.errors import InvalidRequest

_MISSING = object()
TRUE_VALUES = ("on", "1", "true", "yes")
# api.md's limit for notes and evidence; other fields (hashes) are far shorter.
MAX_NOTE = 2000
MAX_TEXT = {"note": MAX_NOTE}


def _checked_text(name: str, value: str) -> str:
    """Refuse what PostgreSQL cannot store (U+0000) and what is over its limit: a 400,
    never a 500 from the database."""
    if "\x00" in value:
        raise InvalidRequest(f"{name} must not contain U+0000.", {"fields": {name: "U+0000"}})
    limit = MAX_TEXT.get(name, MAX_NOTE)
    if len(value) > limit:
        raise InvalidRequest(
            f"{name} is {len(value)} characters, over the limit of {limit}.",
            {"fields": {name: f"at most {limit} characters"}},
        )
    return value


def required_text(request: HttpRequest, name: str) -> str:
    value = request.POST.get(name, "").strip()
    if not value:
        message = "A note is required." if name == "note" else f"{name} is required."
        raise InvalidRequest(message, {"fields": {name: "required"}})
    return _checked_text(name, value)


def optional_text(request: HttpRequest, name: str) -> str:
    return _checked_text(name, request.POST.get(name, "").strip())


def checkbox(request: HttpRequest, name: str) -> bool:
    return request.POST.get(name, "").strip().lower() in TRUE_VALUES


def optional_json(request: HttpRequest, name: str, *, object_only: bool = False) -> Any:
    """The field parsed as JSON, or ``None`` when it is absent or blank."""
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    return parse_json(raw, name, object_only=object_only)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: str, name: str, *, object_only: bool = False) -> Any:
    """JSON the journal can hold, with the API's rules: no NaN or Infinity, no U+0000,
    integers within ±(2^53−1), at most 100 levels and 256 KiB as canonical JSON."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(
            f"{name} is not valid JSON: {exc}", {"fields": {name: "invalid JSON"}}
        ) from None
    if object_only and not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be a JSON object ({{…}}).", {"fields": {name: "object"}})
    try:
        check_json_value(value)
        encoded = canonical_json(value)
        # It must read back canonically too: 1e17 is a float here but an integer
        # beyond ±(2^53−1) once stored, whose hash could never be recomputed.
        canonical_json(json.loads(encoded))
        size = len(encoded)
    except (ValueError, NotCanonicalizable, RecursionError) as exc:
        raise InvalidRequest(f"{name} {exc}.", {"fields": {name: str(exc)}}) from None
    if size > MAX_JSON_VALUE:
        raise InvalidRequest(
            f"{name} is {size} bytes as canonical JSON, over the 256 KiB limit.",
            {"fields": {name: "at most 256 KiB"}},
        )
    return value
