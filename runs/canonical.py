"""Canonical JSON (RFC 8785, JCS) and the ``args_hash`` built from it.

Any language computes the same hash for the same arguments, whatever the key
order or number formatting it serialised with.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


class NotCanonicalizable(ValueError):
    """The value cannot be represented in RFC 8785 JSON (NaN, huge ints, U+0000…)."""


def canonical_json(value: Any) -> bytes:
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise NotCanonicalizable(str(exc)) from None


def args_hash(args: Any) -> str:
    """SHA-256 (lowercase hex) of the canonical JSON of ``args``."""
    return hashlib.sha256(canonical_json(args)).hexdigest()
