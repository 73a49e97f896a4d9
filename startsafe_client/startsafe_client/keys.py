"""Idempotency keys from stable intent: the three sources, and nothing else.

A key says *what* an effect is about to do, so that a replay of the run (where the
model may have rewritten every argument) lands on the same key and is skipped.
It must come from stable intent, **never from generated content**: a key hashed
from the arguments breaks the moment the model rewrites a subject line.

- :func:`provider_key` — the provider's identity of the thing acted on
  (``outlook:message:<internetMessageId>``);
- :func:`content_key` / :func:`content_key_of_file` — a SHA-256 of the content
  (``sha256:9f86d0…``);
- :func:`intent_key` — named stable fields the tool declares
  (``campaign:2026-winter-eu``).

Every helper refuses to build a key from nothing: an empty or ``None`` part is a
``ValueError``, never a key like ``"outlook:message:"`` that every call would share.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

KEY_SOURCES = ("provider", "content", "intent")
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class Key:
    """An idempotency key and where it came from.

    Attributes:
        value: the key itself (1–255 printable characters).
        source: ``"provider"``, ``"content"`` or ``"intent"`` (the API's ``key_source``).
    """

    value: str
    source: str

    def __post_init__(self) -> None:
        if self.source not in KEY_SOURCES:
            raise ValueError(f"key source must be one of {KEY_SOURCES}, not {self.source!r}")
        if not self.value or not self.value.isprintable():
            raise ValueError("a key must be non-empty printable text")
        if len(self.value) > MAX_KEY_LENGTH:
            raise ValueError(f"a key is at most {MAX_KEY_LENGTH} characters ({len(self.value)})")

    def __str__(self) -> str:
        return self.value


def _part(name: str, value: Any) -> str:
    """One part of a key, as text; refuses ``None``, empty and blank values."""
    if value is None or isinstance(value, bool):
        raise ValueError(f"cannot build a key: {name} is {value!r}")
    if isinstance(value, (int, float)):
        text = str(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise ValueError(f"cannot build a key: {name} must be text or a number, not {value!r}")
    if not text:
        raise ValueError(f"cannot build a key: {name} is empty")
    return text


def provider_key(provider: str, kind: str, identity: str | int) -> Key:
    """A key from the provider's own identity of the thing acted on.

    ``provider_key("outlook", "message", internet_message_id)`` gives
    ``Key("outlook:message:<internet_message_id>", "provider")``: two runs woken by
    the same inbound message share one reply.

    Raises:
        ValueError: when any part is ``None``, empty or blank.
    """
    return Key(
        f"{_part('provider', provider)}:{_part('kind', kind)}:{_part('identity', identity)}",
        "provider",
    )


def content_key(content: bytes) -> Key:
    """A key from the SHA-256 of the content: ``Key("sha256:<hex>", "content")``.

    Raises:
        ValueError: when ``content`` is empty (nothing to import is not an effect).
        TypeError: when ``content`` is not bytes (encode text first, deliberately).
    """
    if not isinstance(content, (bytes, bytearray, memoryview)):
        raise TypeError("content_key takes bytes; encode text explicitly")
    if len(content) == 0:
        raise ValueError("cannot build a key from empty content")
    return Key("sha256:" + hashlib.sha256(content).hexdigest(), "content")


def content_key_of_file(path: str | os.PathLike[str]) -> Key:
    """A key from the SHA-256 of a file's bytes, read in chunks.

    Raises:
        ValueError: when the file is empty.
        OSError: when it cannot be read.
    """
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            digest.update(chunk)
            size += len(chunk)
    if size == 0:
        raise ValueError(f"cannot build a key from an empty file: {os.fspath(path)}")
    return Key("sha256:" + digest.hexdigest(), "content")


def intent_key(name: str, **fields: str | int) -> Key:
    """A key from a name and named stable fields the tool declares.

    ``intent_key("campaign", campaign_id="2026-winter-eu")`` gives
    ``Key("campaign:2026-winter-eu", "intent")``. With several fields their values
    follow in the order of the field names, so the same fields always give the
    same key whatever order they are passed in:
    ``intent_key("invoice", period="2026-01", customer="c-42")`` →
    ``"invoice:c-42:2026-01"``.

    Choose fields that name *what* the effect is for (a campaign id, a customer and
    a period), never text the model wrote.

    Raises:
        ValueError: without fields, or when any field is ``None``, empty or blank.
    """
    if not fields:
        raise ValueError("an intent key needs at least one named field")
    parts = [_part("name", name)] + [_part(field, fields[field]) for field in sorted(fields)]
    return Key(":".join(parts), "intent")
