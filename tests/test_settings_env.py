"""The strict environment helpers (startsafe/env.py): a bad value names its variable."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from startsafe.env import env_bool, env_float, env_int, env_list, env_str


@pytest.mark.parametrize("value", ["maybe", "2", "yess"])
def test_a_bad_boolean_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("STARTSAFE_FLAG", value)

    with pytest.raises(ImproperlyConfigured, match="STARTSAFE_FLAG"):
        env_bool("STARTSAFE_FLAG", False)


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("Yes", True), ("off", False)])
def test_booleans_read_the_usual_spellings(monkeypatch, value, expected):
    monkeypatch.setenv("STARTSAFE_FLAG", value)

    assert env_bool("STARTSAFE_FLAG", not expected) is expected


def test_an_unset_boolean_is_its_default(monkeypatch):
    monkeypatch.delenv("STARTSAFE_FLAG", raising=False)

    assert env_bool("STARTSAFE_FLAG", True) is True


def test_a_bad_integer_names_the_variable(monkeypatch):
    monkeypatch.setenv("DATABASE_POOL_MAX", "ten")

    with pytest.raises(ImproperlyConfigured, match="DATABASE_POOL_MAX"):
        env_int("DATABASE_POOL_MAX", 10)


def test_an_integer_out_of_range_names_the_variable_and_the_bound(monkeypatch):
    monkeypatch.setenv("EMAIL_PORT", "70000")

    with pytest.raises(ImproperlyConfigured, match="EMAIL_PORT=70000 is above its maximum 65535"):
        env_int("EMAIL_PORT", 25, minimum=1, maximum=65535)
    monkeypatch.setenv("EMAIL_PORT", "0")
    with pytest.raises(ImproperlyConfigured, match="EMAIL_PORT"):
        env_int("EMAIL_PORT", 25, minimum=1, maximum=65535)


def test_a_bad_number_names_the_variable(monkeypatch):
    monkeypatch.setenv("DATABASE_POOL_TIMEOUT", "soon")

    with pytest.raises(ImproperlyConfigured, match="DATABASE_POOL_TIMEOUT"):
        env_float("DATABASE_POOL_TIMEOUT", 10.0)
    monkeypatch.setenv("DATABASE_POOL_TIMEOUT", "0.01")
    with pytest.raises(ImproperlyConfigured, match="below its minimum"):
        env_float("DATABASE_POOL_TIMEOUT", 10.0, minimum=0.1)


def test_a_required_string_that_is_missing_names_the_variable(monkeypatch):
    monkeypatch.delenv("SECRET_KEY", raising=False)

    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY"):
        env_str("SECRET_KEY", required=True)


def test_a_list_is_split_on_commas_and_trimmed(monkeypatch):
    monkeypatch.setenv("ALLOWED_HOSTS", " a.example , b.example,, ")

    assert env_list("ALLOWED_HOSTS", []) == ["a.example", "b.example"]


def test_a_bad_database_url_is_improperly_configured(monkeypatch):
    from startsafe import settings as project_settings

    monkeypatch.setenv("DATABASE_URL", "not a url at all")

    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        project_settings._database_settings()


def test_postgres_uses_the_psycopg_pool_sized_from_the_environment(monkeypatch):
    from startsafe import settings as project_settings

    monkeypatch.setenv("DATABASE_URL", "postgres://u@db:5432/x")
    monkeypatch.setenv("DATABASE_POOL_MAX", "25")

    config = project_settings._database_settings()

    assert config["OPTIONS"]["pool"]["max_size"] == 25
    assert config["CONN_MAX_AGE"] == 0
