"""Structured log lines: ``event=<name> key=value ...``, one per state change or task."""

from __future__ import annotations

from typing import Any


def _value(value: Any) -> str:
    text = "" if value is None else str(value)
    if text == "" or any(c in text for c in ' ="\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def kv(event: str, **fields: Any) -> str:
    """``event=sweep interrupted=2 duration=0.013``: greppable and parseable by log tools."""
    return " ".join([f"event={_value(event)}"] + [f"{k}={_value(v)}" for k, v in fields.items()])
