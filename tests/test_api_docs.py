"""The API's OpenAPI schema is valid JSON for every parser, and its docs page renders.

Swagger UI parses the schema with a YAML parser, which refuses a key written twice in
one object ("duplicated mapping key") and then shows nothing else: Python's json
module keeps the last of two equal keys silently, so the tests parse strictly.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from runs.api.views import api

pytestmark = pytest.mark.django_db


def _refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"duplicated keys {repeated} in an object with keys {keys}")
    return dict(pairs)


def _operations(schema: dict) -> list[tuple[str, str]]:
    methods = {"get", "post", "put", "patch", "delete"}
    return [
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in methods
    ]


def test_the_openapi_schema_has_no_key_written_twice():
    body = Client().get("/api/v1/openapi.json").content
    schema = json.loads(body, object_pairs_hook=_refuse_duplicate_keys)
    # The links a start's and a call's answers carry sit beside their schemas.
    start = schema["paths"]["/api/v1/runs"]["post"]["responses"]
    assert {"200", "201"} <= set(start)
    assert "links" in start["201"] and "content" in start["201"]
    call = schema["paths"]["/api/v1/runs/{run_id}/calls"]["post"]["responses"]["201"]
    assert "links" in call and "content" in call


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_docs_page_shows_every_operation(page, live_server):
    schema = api.get_openapi_schema()
    operations = _operations(schema)
    page.goto(f"{live_server.url}/api/v1/docs")
    page.locator(".opblock").first.wait_for()
    shown = page.locator(".opblock")
    assert shown.count() == len(operations)
    for method, path in operations:
        block = page.locator(f".opblock-{method.lower()}", has_text=path)
        assert block.count() >= 1, f"{method} {path} is not shown"
    assert "duplicated mapping key" not in page.content()
    assert page.locator(".errors-wrapper").count() == 0
