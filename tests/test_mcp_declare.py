"""startsafe-mcp at start, against a stand-in for startsafe (httpx's MockTransport): it
checks the rules against the servers' tools, declares the tools once with their schema
and annotations (``POST /api/v1/tools``, api.md "Additions in v1") when the server
offers it, skips that step cleanly on a 404, and believes a ``readOnlyHint`` only from
a trusted server or a tool an admin confirmed in the registry."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp_helpers import RULES, write_config
from startsafe_client.mcp import ConfigError, load_config, open_proxy

pytestmark = pytest.mark.slow  # each test starts the servers of the SDK

URL = "http://startsafe.test"


def _start(config: Path, answer) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start the proxy with ``answer(request)`` standing in for startsafe; return each
    tool's kind and the bodies POSTed to /tools."""
    posted: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/tools", request.url  # nothing else at start
        posted.append(json.loads(request.content))
        return answer(request)

    async def start() -> dict[str, Any]:
        transport = httpx.MockTransport(handle)
        async with open_proxy(
            load_config(config), url=URL, token="ss_test", run_key=None, transport=transport
        ) as proxy:
            return {name: spec.kind for name, spec in proxy.specs.items()}

    return anyio.run(start), posted


def test_the_tools_are_declared_once_with_their_schema_and_annotations(tmp_path):
    def registry(request: httpx.Request) -> httpx.Response:
        tools = json.loads(request.content)["tools"]
        confirmed = {"notes.purge_notes"}  # an admin confirmed its annotations
        return httpx.Response(
            200,
            json={
                "tools": [
                    {**t, "state": "confirmed" if t["name"] in confirmed else "registered"}
                    for t in tools
                ]
            },
        )

    kinds, posted = _start(write_config(tmp_path, URL), registry)

    assert len(posted) == 1  # once per process
    declared = {t["name"]: t for t in posted[0]["tools"]}
    assert (
        set(declared)
        == set(kinds)
        == {
            "mail.send_reply",
            "mail.find_reply",
            "crm.lookup_customer",
            "crm.send_campaign",
            "notes.add_note",
            "notes.purge_notes",
            "notes.post_note",
            "notes.environment",
        }
    )
    campaign = declared["crm.send_campaign"]
    assert (campaign["kind"], campaign["key_source"], campaign["needs_approval"]) == (
        "effect",
        "intent",
        True,
    )
    assert campaign["schema"]["required"] == ["campaign_id", "segment", "subject", "recipients"]
    assert declared["mail.find_reply"]["annotations"] == {"readOnlyHint": True}
    assert declared["mail.find_reply"]["kind"] == "read"  # its server is trusted
    assert declared["notes.purge_notes"]["kind"] == "effect"  # not trusted when declared...
    assert kinds["notes.purge_notes"] == "read"  # ...but an admin confirmed it
    assert kinds["notes.add_note"] == "effect"  # no rule, no annotations


def test_a_server_without_the_registry_is_skipped_with_a_debug_line(tmp_path, caplog):
    def no_registry(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "No such"}})

    with caplog.at_level(logging.DEBUG, logger="startsafe_client.mcp"):
        kinds, posted = _start(write_config(tmp_path, URL, servers=("notes",)), no_registry)

    assert len(posted) == 1
    assert kinds["notes.purge_notes"] == "effect"  # a hint from an untrusted server
    assert kinds["notes.environment"] == "read"  # its rule
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert [r.getMessage() for r in debug] == [
        "POST /api/v1/tools answered 404: this startsafe server has no tool registry yet, "
        "so the tools are not declared"
    ]


def test_a_rule_for_a_tool_no_server_offers_is_refused_with_its_line(tmp_path):
    rules = RULES + '\n[tools."notes.send_fax"]\nkind = "read"\n'
    rules = rules.replace('reconcile = "mail.find_reply"', 'reconcile = "mail.search"')
    config = write_config(tmp_path, URL, servers=("mail", "notes"), rules=rules)
    lines = config.read_text().splitlines()

    with pytest.raises(ConfigError) as refused:
        _start(config, lambda request: pytest.fail("nothing is declared"))

    fax = lines.index('[tools."notes.send_fax"]') + 1
    search = lines.index('reconcile = "mail.search"') + 1
    assert str(refused.value).splitlines() == [
        f'{config}:{search}: tools."mail.send_reply".reconcile: no server offers mail.search',
        f'{config}:{fax}: tools."notes.send_fax": no server offers this tool',
    ]


def test_a_reconcile_tool_must_be_a_read(tmp_path):
    rules = RULES.replace('reconcile = "mail.find_reply"', 'reconcile = "notes.add_note"')
    config = write_config(tmp_path, URL, servers=("mail", "notes"), rules=rules)
    no_registry = httpx.Response(404, json={"error": {"code": "not_found", "message": "No"}})

    with pytest.raises(ConfigError) as refused:
        _start(config, lambda request: no_registry)

    assert "reconcile: notes.add_note is not a read" in str(refused.value)
