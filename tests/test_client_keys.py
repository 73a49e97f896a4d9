"""The key helpers build keys from stable intent and refuse to build one from nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from startsafe_client import Key, content_key, content_key_of_file, intent_key, provider_key


def test_a_provider_key_names_the_provider_the_kind_and_the_identity():
    key = provider_key("outlook", "message", "<CAF-4812@mail.example.com>")

    assert key == Key("outlook:message:<CAF-4812@mail.example.com>", "provider")
    assert str(key) == key.value


@pytest.mark.parametrize("identity", [None, "", "   "])
def test_a_provider_key_refuses_a_missing_identity(identity):
    with pytest.raises(ValueError, match="identity"):
        provider_key("outlook", "message", identity)


def test_a_provider_key_refuses_a_missing_provider_or_kind():
    with pytest.raises(ValueError):
        provider_key("", "message", "m-1")
    with pytest.raises(ValueError):
        provider_key("outlook", None, "m-1")


def test_a_content_key_is_the_sha256_of_the_bytes():
    key = content_key(b"test")

    assert key.value == "sha256:" + hashlib.sha256(b"test").hexdigest()
    assert key.source == "content"


def test_a_content_key_refuses_empty_content_and_text():
    with pytest.raises(ValueError):
        content_key(b"")
    with pytest.raises(TypeError):
        content_key("text is encoded deliberately")  # type: ignore[arg-type]


def test_a_file_and_its_bytes_give_the_same_content_key(tmp_path: Path):
    path = tmp_path / "segment.csv"
    data = b"email,country\n" + b"ana@example.com,PT\n" * 10_000
    path.write_bytes(data)

    assert content_key_of_file(path) == content_key(data)


def test_an_empty_file_gives_no_key(tmp_path: Path):
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")

    with pytest.raises(ValueError, match="empty"):
        content_key_of_file(path)


def test_an_intent_key_joins_the_name_and_the_named_fields():
    key = intent_key("campaign", campaign_id="2026-winter-eu")

    assert key == Key("campaign:2026-winter-eu", "intent")


def test_an_intent_key_orders_its_fields_by_name_whatever_the_call_order():
    one = intent_key("invoice", period="2026-01", customer="c-42")
    two = intent_key("invoice", customer="c-42", period="2026-01")

    assert one == two == Key("invoice:c-42:2026-01", "intent")


@pytest.mark.parametrize("fields", [{}, {"campaign_id": None}, {"campaign_id": ""}])
def test_an_intent_key_refuses_missing_fields(fields):
    with pytest.raises(ValueError):
        intent_key("campaign", **fields)


def test_a_key_is_at_most_255_printable_characters():
    with pytest.raises(ValueError):
        provider_key("outlook", "message", "x" * 300)
    with pytest.raises(ValueError):
        provider_key("outlook", "message", "line\nbreak")
