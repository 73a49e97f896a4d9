"""A thin JSON client over Django's test client, for the API tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.test import Client


@dataclass
class Answer:
    status: int
    body: Any
    headers: Any

    @property
    def code(self) -> str | None:
        return (
            (self.body or {}).get("error", {}).get("code") if isinstance(self.body, dict) else None
        )


class Api:
    def __init__(self, token: str | None, client: Client | None = None):
        self.client = client or Client()
        self.token = token

    def _headers(self, extra: dict | None) -> dict:
        headers = {}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    def _answer(self, response) -> Answer:
        try:
            body = json.loads(response.content) if response.content else None
        except ValueError:
            body = response.content
        return Answer(response.status_code, body, response.headers)

    def post(
        self, path: str, body: Any = None, *, raw: bytes | None = None, headers=None
    ) -> Answer:
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        response = self.client.post(
            "/api/v1" + path,
            data=data,
            content_type="application/json",
            headers=self._headers(headers),
        )
        return self._answer(response)

    def get(self, path: str, headers=None, **params) -> Answer:
        response = self.client.get("/api/v1" + path, params, headers=self._headers(headers))
        return self._answer(response)

    # Shortcuts for the common protocol steps.
    def start(self, run_key: str = "ticket-1", **fields) -> Answer:
        return self.post("/runs", {"run_key": run_key, **fields})

    def call(self, run_id: str, attempt: int = 1, **fields) -> Answer:
        body = {"attempt": attempt, "kind": "effect", "args": {}, **fields}
        return self.post(f"/runs/{run_id}/calls", body)
