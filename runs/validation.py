"""What the journal can hold: the checks the agent API and the console's forms share.

Neither face imports the other: the API's schemas (``runs/api/schemas.py``) and the
console's forms (``approvals/forms.py``) both validate through these. Each check
raises ``ValueError`` with a message that reads after the field's name ("args is
nested too deeply...").
"""

from __future__ import annotations

import math
from typing import Any

from runs.canonical import NotCanonicalizable, canonical_json

MAX_JSON_VALUE = 256 * 1024  # input, args, result: canonical JSON bytes
MAX_SAFE_INTEGER = 2**53 - 1


class PayloadTooLarge(ValueError):
    """A JSON value over its size limit: answered 413 by the API, not 400."""


def check_text(value: str) -> str:
    """Valid Unicode without U+0000: what PostgreSQL can store."""
    if "\x00" in value:
        raise ValueError("must not contain U+0000")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def check_json_value(value: Any, depth: int = 0) -> None:
    """Refuse what RFC 8785 or PostgreSQL cannot hold, before it reaches the database."""
    if depth > 100:
        raise ValueError("is nested too deeply (over 100 levels)")
    if isinstance(value, str):
        check_text(value)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise ValueError("has an integer beyond ±(2^53−1): send large ids as strings")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("has a number that is not finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key)
            check_json_value(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_json_value(item, depth + 1)


def check_json_object(value: dict) -> dict:
    """A JSON object the journal can hold, at most 256 KiB as canonical JSON."""
    check_json_value(value)
    try:
        size = len(canonical_json(value))
    except NotCanonicalizable as exc:
        raise ValueError(f"cannot be represented as canonical JSON ({exc})") from None
    if size > MAX_JSON_VALUE:
        raise PayloadTooLarge(f"is {size} bytes as canonical JSON, over the 256 KiB limit")
    return value
