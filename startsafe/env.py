"""Strict helpers that read settings from the environment.

A bad value is an ``ImproperlyConfigured`` naming the variable and what it
expected, raised while settings load, not a confusing crash later.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None, *, required: bool = False) -> str | None:
    value = os.environ.get(name)
    if value is None or value == "":
        if required:
            raise ImproperlyConfigured(f"The environment variable {name} is required.")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={value!r} is not a boolean: use one of 1/0, true/false, yes/no, on/off."
    )


def env_int(
    name: str, default: int | None, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below its minimum {minimum}.")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above its maximum {maximum}.")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = float(value.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below its minimum {minimum}.")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


_PERIODS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def parse_rate(value: str | None) -> tuple[int, int] | None:
    """``"600/minute"`` → (600, 60); ``""`` or ``"0"`` (or ``"0/minute"``) → None (off).

    Raises ``ValueError`` on anything else. Periods: second, minute, hour, day (or
    their first letter).
    """
    text = (value or "").strip().lower()
    if text in ("", "0", "off"):
        return None
    count, slash, period = text.partition("/")
    seconds = next((s for name, s in _PERIODS.items() if period in (name, name[0])), None)
    if not slash or seconds is None or not count.isdigit():
        raise ValueError(f"{value!r} is not a rate like 600/minute")
    return (int(count), seconds) if int(count) > 0 else None


def env_rate(name: str, default: str) -> str:
    """A rate such as ``600/minute`` (``0`` or empty: off), checked while settings load."""
    value = os.environ.get(name, default)
    try:
        parse_rate(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc} (or 0 to turn it off).") from None
    return value.strip()
