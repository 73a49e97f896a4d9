"""A loopback stand-in for Slack's Web API, and interaction requests signed as Slack
signs them, for the Slack tests (approvals/slack.py, approvals/views_slack.py).

``FakeSlack`` answers the methods startsafe calls with Slack-shaped JSON and records
every call; ``fail_next`` makes the next call of a method fail as Slack fails (a 429
with Retry-After, an ``ok: false`` error), and ``drop_next`` closes the connection of
the next call unanswered, after doing it or before. It keeps each channel's messages
(with their metadata) and answers ``conversations.history`` as Slack does: by channel
id, newest first, ``oldest`` / ``latest`` / ``limit`` and cursor paging, metadata
only with ``include_all_metadata``, ``missing_scope`` without its scopes. The
``slack`` fixture turns Slack on with slack_sdk's ``base_url`` pointed at it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from django.utils import timezone

from tests.lifecycle_helpers import send, start

TOKEN = "xoxb-test-token"
SECRET = "test-signing-secret"
CHANNEL = "#approvals"
ESCALATION_CHANNEL = "#escalations"
# What Slack answers as the channel id of each channel name.
CHANNEL_IDS = {CHANNEL: "C0APPROVALS", ESCALATION_CHANNEL: "C0ESCALATE"}
# The bot token's scopes: conversations.history needs a history one.
SCOPES = {"chat:write", "users:read", "users:read.email", "channels:history", "groups:history"}
INTERACTIONS = "/integrations/slack/interactions"


class FakeSlack:
    def __init__(self):
        self.calls: list[dict] = []
        # users.info answers: Slack member id -> the user object.
        self.members: dict[str, dict] = {}
        # method -> [(status, body, headers)], each used once.
        self.failures: dict[str, list[tuple[int, dict, dict]]] = {}
        # method -> ["after" | "before"]: the connection closed unanswered, each once.
        self.drops: dict[str, list[str]] = {}
        # channel id -> its messages, oldest first.
        self.history: dict[str, list[dict]] = {}
        self.scopes = set(SCOPES)
        self.lock = threading.Lock()
        self.next_ts = 1
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, params: dict):
                method = urlsplit(self.path).path.rsplit("/", 1)[-1]
                with fake.lock:
                    fake.calls.append(
                        {
                            "method": method,
                            "params": params,
                            "auth": self.headers.get("Authorization"),
                        }
                    )
                    dropped = fake.drops.get(method)
                    drop = dropped.pop(0) if dropped else ""
                    queued = fake.failures.get(method)
                    if drop == "before":
                        answer = None
                    elif queued:
                        answer = queued.pop(0)
                    else:
                        answer = (200, fake.reply(method, params), {})
                if drop:
                    # Done or not, the caller never hears: as a timeout, a reset.
                    self.close_connection = True
                    return
                status, body, headers = answer
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(dict(parse_qsl(urlsplit(self.path).query)))

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    params = json.loads(raw or b"{}")
                else:
                    params = dict(parse_qsl(raw.decode()))
                self._answer(params)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def reply(self, method: str, params: dict) -> dict:
        """Slack's answer to a successful call (called under the lock)."""
        if method == "chat.postMessage":
            # Slack's ts: the time it was posted, unique in its channel.
            ts = f"{int(time.time())}.{self.next_ts:06d}"
            self.next_ts += 1
            channel = CHANNEL_IDS.get(params["channel"], params["channel"])
            message = {
                "type": "message",
                "ts": ts,
                "bot_id": "B0STARTSAFE",
                "app_id": "A0APP",
                "text": params.get("text", ""),
                "blocks": params.get("blocks") or [],
            }
            if params.get("metadata"):
                message["metadata"] = params["metadata"]
            self.history.setdefault(channel, []).append(message)
            return {"ok": True, "channel": channel, "ts": ts, "message": message}
        if method == "chat.update":
            for message in self.history.get(params["channel"], []):
                if message["ts"] == params["ts"]:
                    message.update(text=params.get("text", ""), blocks=params.get("blocks") or [])
            return {"ok": True, "channel": params["channel"], "ts": params["ts"]}
        if method == "conversations.history":
            return self.read_history(params)
        if method == "chat.postEphemeral":
            return {"ok": True, "message_ts": "1700000000.999999"}
        if method == "views.open":
            return {"ok": True, "view": {"id": "V0MODAL", **params["view"]}}
        if method == "users.info":
            member = self.members.get(params.get("user", ""))
            return (
                {"ok": True, "user": member} if member else {"ok": False, "error": "user_not_found"}
            )
        return {"ok": False, "error": "unknown_method"}

    def read_history(self, params: dict) -> dict:
        """conversations.history: newest first, ``oldest`` < ts < ``latest``."""
        if not self.scopes & {"channels:history", "groups:history"}:
            return {
                "ok": False,
                "error": "missing_scope",
                "needed": "channels:history,groups:history",
                "provided": ",".join(sorted(self.scopes)),
            }
        if params.get("channel") not in CHANNEL_IDS.values():  # by id only, as Slack
            return {"ok": False, "error": "channel_not_found"}
        oldest = float(params.get("oldest") or 0)
        latest = float(params.get("latest") or time.time() + 1)
        everything = str(params.get("include_all_metadata")).lower() in ("1", "true")
        shown = []
        for message in reversed(self.history.get(params["channel"], [])):
            if oldest < float(message["ts"]) < latest:
                message = dict(message)
                if "metadata" in message and not everything:
                    message["metadata"] = {"event_type": message["metadata"]["event_type"]}
                shown.append(message)
        start = int(base64.b64decode(params["cursor"])) if params.get("cursor") else 0
        limit = min(int(params.get("limit") or 100), 999)
        page = shown[start : start + limit]
        more = start + limit < len(shown)
        cursor = base64.b64encode(str(start + limit).encode()).decode() if more else ""
        return {
            "ok": True,
            "messages": page,
            "has_more": more,
            "response_metadata": {"next_cursor": cursor},
        }

    def fail_next(self, method: str, status: int, body: dict, headers: dict | None = None):
        self.failures.setdefault(method, []).append((status, body, headers or {}))

    def drop_next(self, method: str, *, done: bool):
        """Close the next call of ``method`` unanswered: ``done`` after doing it (the
        answer lost), else before (the call never reached Slack)."""
        self.drops.setdefault(method, []).append("after" if done else "before")

    def messages(self, channel: str) -> list[dict]:
        """The messages in ``channel`` (its id), oldest first."""
        with self.lock:
            return list(self.history.get(channel, []))

    def made(self, method: str) -> list[dict]:
        """The parameters of every call of ``method``, in order."""
        with self.lock:
            return [call["params"] for call in self.calls if call["method"] == method]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/api/"

    def __enter__(self) -> FakeSlack:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def member(user_id: str, email: str, **fields) -> dict:
    """A users.info user object as Slack gives it (the fields startsafe reads)."""
    return {
        "id": user_id,
        "team_id": "T0TEAM",
        "name": email.split("@")[0],
        "deleted": False,
        "is_bot": False,
        "is_email_confirmed": True,
        "profile": {"email": email, "real_name": email.split("@")[0]},
        **fields,
    }


@pytest.fixture
def slack(settings):
    """Slack on, its Web API on loopback."""
    with FakeSlack() as fake:
        settings.STARTSAFE = {
            **settings.STARTSAFE,
            "SLACK_BOT_TOKEN": TOKEN,
            "SLACK_SIGNING_SECRET": SECRET,
            "SLACK_CHANNEL": CHANNEL,
            "SLACK_ESCALATION_CHANNEL": ESCALATION_CHANNEL,
            "SLACK_API_URL": fake.url,
            "PUBLIC_URL": "https://startsafe.example.com",
        }
        yield fake


def awaiting_effect(agent, n: int = 1, *, args=None, preview: str = "", **kwargs):
    """An effect of a run of its own, awaiting approval since now (the Slack tests
    read the audit log's recent window, so not a fixed date)."""
    now = timezone.now()
    run = start(agent, f"refunds-{n}", heartbeat_timeout=3600, now=now).run
    args = args if args is not None else {"order": n, "amount": 120}
    preview = preview or f"Refund order {n}"
    return send(
        agent, run, tool="refund", args=args, key=f"refund:{n}", key_source="intent",
        needs_approval=True, preview=preview, now=now, **kwargs,
    ).effect  # fmt: skip


# --- Interaction requests, as Slack sends them ------------------------------------


def sign(body: str, timestamp: str, secret: str = SECRET) -> str:
    """Slack's v0 signature: HMAC-SHA256 of ``v0:<timestamp>:<body>`` with the secret."""
    base = f"v0:{timestamp}:{body}".encode()
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def post_interaction(client, payload: dict, *, secret: str = SECRET, age: float = 0):
    """POST ``payload`` form-encoded as Slack does, signed ``age`` seconds ago."""
    body = urlencode({"payload": json.dumps(payload)})
    timestamp = str(int(time.time() - age))
    return client.post(
        INTERACTIONS,
        data=body,
        content_type="application/x-www-form-urlencoded",
        HTTP_X_SLACK_REQUEST_TIMESTAMP=timestamp,
        HTTP_X_SLACK_SIGNATURE=sign(body, timestamp, secret),
    )


def click(value: str, action_id: str = "approve", slack_user: str = "U0OLIVIA") -> dict:
    """A block_actions payload: ``slack_user`` clicked a button of a message."""
    return {
        "type": "block_actions",
        "user": {"id": slack_user, "username": "someone", "team_id": "T0TEAM"},
        "api_app_id": "A0APP",
        "team": {"id": "T0TEAM", "domain": "example"},
        "container": {
            "type": "message",
            "message_ts": "1700000000.000001",
            "channel_id": "C0APPROVALS",
            "is_ephemeral": False,
        },
        "trigger_id": "1234.5678.abcdef",
        "channel": {"id": "C0APPROVALS", "name": "approvals"},
        "message": {"ts": "1700000000.000001", "type": "message"},
        "response_url": "https://hooks.slack.com/actions/T0TEAM/1/abc",
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "decide",
                "value": value,
                "action_ts": "1700000001.000001",
            }
        ],
    }


def submission(private_metadata: str, note: str | None, slack_user: str = "U0OLIVIA") -> dict:
    """A view_submission payload: the reject modal submitted with ``note``."""
    return {
        "type": "view_submission",
        "user": {"id": slack_user, "username": "someone", "team_id": "T0TEAM"},
        "team": {"id": "T0TEAM", "domain": "example"},
        "view": {
            "id": "V0MODAL",
            "type": "modal",
            "callback_id": "startsafe_reject",
            "private_metadata": private_metadata,
            "state": {"values": {"note": {"note": {"type": "plain_text_input", "value": note}}}},
        },
    }
