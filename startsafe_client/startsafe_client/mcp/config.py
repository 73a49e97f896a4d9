"""The startsafe-mcp configuration file (TOML), checked whole at start.

::

    [startsafe]
    url = "http://127.0.0.1:8000"      # or STARTSAFE_URL
    token_env = "STARTSAFE_TOKEN"      # the variable that holds the agent token
    run_key = "ticket-4812"            # or --run-key / STARTSAFE_RUN_KEY; a call's
                                       # _meta "startsafe/run_key" wins
    supersede = "stale"                # or true: take over a running attempt at once
    approval_timeout = 300

    [servers.mail]
    command = ["python", "mail_server.py"]
    env = { MAILBOX = "work" }         # what the server gets besides the SDK's safe variables
    trust_annotations = true           # its readOnlyHint makes a tool without a rule a read

    [tools."mail.send_reply"]
    kind = "effect"
    key = "outlook:message:{message_id}"
    key_source = "provider"
    reconcile = "mail.find_reply"
    preview = "Reply to {to}: {subject}"

The file is read with ``tomllib`` and validated with pydantic models; a file that
is wrong is refused with **the file, the line and what is wrong**, for each problem
found (:class:`ConfigError`). A rule names its tool as ``SERVER.TOOL`` (whatever the
agent sees), and whether that tool exists is checked once the servers list theirs
(:meth:`Config.problem`).

Templates (``key``, ``preview``) take ``{field}`` placeholders over the call's
argument fields (``{{`` and ``}}`` for braces). A key template needs at least one
field, and a field that is missing or empty refuses the call: a key is never built
from nothing (:meth:`Template.key`).
"""

from __future__ import annotations

import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from ..keys import Key, _part
from .toml_lines import KeyPath, key_lines, line_of

FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]+\Z")
HEARTBEAT_RANGE = (5, 86_400)  # api.md, POST /runs: heartbeat_timeout


class ConfigError(Exception):
    """The configuration is refused: each problem with the file and its line."""

    def __init__(self, path: Path | str, problems: list[tuple[int | None, str]]) -> None:
        self.path = Path(path)
        self.problems = problems
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(
            f"{self.path}:{line}: {what}" if line else f"{self.path}: {what}"
            for line, what in self.problems
        )


@dataclass(frozen=True)
class Template:
    """A ``key`` or ``preview`` template: text with ``{field}`` placeholders."""

    text: str
    fields: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Template:
        """Read a template; ``ValueError`` says what is wrong with it."""
        fields: list[str] = []
        try:
            parts = list(string.Formatter().parse(text))
        except ValueError as wrong:
            raise ValueError(
                f"{text!r} is not a template ({wrong}; write {{{{ for a brace)"
            ) from None
        for _, field, spec, conversion in parts:
            if field is None:
                continue
            if not FIELD.match(field) or spec or conversion:
                raise ValueError(
                    f"{{{field}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}} in {text!r}: a placeholder names one "
                    "argument field, as {message_id}"
                )
            fields.append(field)
        return cls(text, tuple(fields))

    def key(self, args: Mapping[str, Any], source: str) -> Key:
        """The key for these arguments.

        Raises:
            KeyError: a field is missing from the arguments.
            ValueError: a field is ``None``, empty, blank or not text or a number
                (the key helpers' rule), or the key is too long.
        """
        values = {field: _part(field, args[field]) for field in self.fields}
        return Key(self.text.format_map(values), source)

    def preview(self, args: Mapping[str, Any]) -> str:
        """The text for a person; a missing field shows as ``?``."""
        values = {field: args.get(field, "?") for field in self.fields}
        return self.text.format_map(values)


def _http_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// address")
    return url


HttpUrl = Annotated[str, AfterValidator(_http_url)]


def _supersede(value: Any) -> Any:
    if not (isinstance(value, bool) or value == "stale"):
        raise ValueError('must be true, false or "stale"')
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class StartsafeSettings(_Strict):
    """``[startsafe]``: the server, the token's variable, the run and its attempts."""

    url: HttpUrl | None = None
    token_env: str = Field("STARTSAFE_TOKEN", min_length=1)
    run_key: str | None = Field(None, min_length=1, max_length=200)
    supersede: Annotated[bool | str, BeforeValidator(_supersede)] = "stale"
    approval_timeout: float = Field(300, gt=0)
    heartbeat_timeout: int = Field(60, ge=HEARTBEAT_RANGE[0], le=HEARTBEAT_RANGE[1])
    poll_interval: float = Field(2.0, gt=0)


class ServerSettings(_Strict):
    """``[servers.NAME]``: one upstream MCP server, by stdio command or URL."""

    command: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)
    url: HttpUrl | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    trust_annotations: bool = False


class ToolRule(_Strict):
    """``[tools."SERVER.TOOL"]``: how one tool is journaled."""

    kind: Literal["read", "effect"] = "effect"
    key: str | None = None
    key_source: Literal["provider", "content", "intent"] | None = None
    needs_approval: bool = False
    approvals_required: int = Field(1, ge=1, le=3)
    approval_ttl: int | None = Field(None, ge=60, le=2_592_000)
    timeout: int | None = Field(None, ge=1, le=86_400)
    preview: str | None = Field(None, min_length=1)
    reconcile: str | None = None

    @field_validator("key", "preview")
    @classmethod
    def _template(cls, text: str | None) -> str | None:
        if text is not None:
            Template.parse(text)
        return text

    @property
    def key_template(self) -> Template | None:
        return Template.parse(self.key) if self.key is not None else None

    @property
    def preview_template(self) -> Template | None:
        return Template.parse(self.preview) if self.preview is not None else None


class _File(_Strict):
    startsafe: StartsafeSettings = Field(default_factory=StartsafeSettings)
    servers: dict[str, ServerSettings] = Field(min_length=1)
    tools: dict[str, ToolRule] = Field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    """A checked configuration, and where each of its keys stands in the file."""

    path: Path
    startsafe: StartsafeSettings
    servers: dict[str, ServerSettings]
    tools: dict[str, ToolRule]
    lines: dict[KeyPath, int]

    @property
    def folder(self) -> Path:
        """The file's folder: stdio servers start there (unless ``cwd`` says otherwise)."""
        return self.path.parent

    def cwd_of(self, server: str) -> Path:
        """The working directory of a stdio server (``cwd`` is relative to the file)."""
        cwd = self.servers[server].cwd
        return (self.folder / cwd).resolve() if cwd else self.folder

    def problem(self, path: tuple[str, ...], what: str) -> tuple[int | None, str]:
        """A problem found after loading (a rule for a tool no server offers), with its line."""
        return line_of(self.lines, path), f"{_dotted(path)}: {what}"

    def refuse(self, problems: list[tuple[int | None, str]]) -> ConfigError:
        return ConfigError(self.path, problems)


def load_config(path: str | Path) -> Config:
    """Read and check the file; raise :class:`ConfigError` with every problem found."""
    path = Path(path).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as unreadable:
        raise ConfigError(path, [(None, f"cannot read it: {unreadable}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as wrong:
        raise ConfigError(path, [_toml_problem(wrong)]) from None
    lines = key_lines(text)
    try:
        checked = _File.model_validate(data)
    except ValidationError as invalid:
        raise ConfigError(path, _pydantic_problems(invalid, lines)) from None
    config = Config(path, checked.startsafe, checked.servers, checked.tools, lines)
    problems = _cross_checks(config)
    if problems:
        raise ConfigError(path, problems)
    return config


def split_tool_name(qualified: str) -> tuple[str, str] | None:
    """``"mail.send_reply"`` → ``("mail", "send_reply")`` (``None`` without a server part)."""
    server, dot, tool = qualified.partition(".")
    return (server, tool) if dot and server and tool else None


def _cross_checks(config: Config) -> list[tuple[int | None, str]]:
    """What the models cannot see alone: names, and keys that only go together."""
    problems: list[tuple[int | None, str]] = []
    for name, server in config.servers.items():
        at = ("servers", name)
        if not SERVER_NAME.match(name):
            problems.append(
                config.problem(at, "a server name is letters, digits, _ and - (no dots)")
            )
        if server.command is None and server.url is None:
            problems.append(config.problem(at, "give the server's command or its url"))
        elif server.command is not None and server.url is not None:
            problems.append(config.problem(at, "give a command or a url, not both"))
        if server.url is not None and (server.env or server.cwd):
            field = "env" if server.env else "cwd"
            problems.append(
                config.problem((*at, field), "only a server started by command has one")
            )
    for name, rule in config.tools.items():
        problems.extend(_rule_problems(config, name, rule))
    return problems


def _rule_problems(config: Config, name: str, rule: ToolRule) -> list[tuple[int | None, str]]:
    at = ("tools", name)
    problems: list[tuple[int | None, str]] = []
    split = split_tool_name(name)
    if split is None:
        problems.append(config.problem(at, "name the tool as SERVER.TOOL, as mail.send_reply"))
    elif split[0] not in config.servers:
        problems.append(config.problem(at, f"there is no [servers.{split[0]}]"))
    if rule.kind == "read":
        for field in ("key", "key_source", "preview", "reconcile", "timeout", "approval_ttl"):
            if getattr(rule, field) is not None:
                problems.append(config.problem((*at, field), "a read takes none"))
        if rule.needs_approval:
            problems.append(config.problem((*at, "needs_approval"), "a read is never gated"))
        return problems
    if rule.key is not None and rule.key_source is None:
        problems.append(
            config.problem((*at, "key"), 'a key needs key_source ("provider", "content", "intent")')
        )
    if rule.key_source is not None and rule.key is None:
        problems.append(config.problem((*at, "key_source"), "key_source without a key"))
    template = rule.key_template
    if template is not None and not template.fields:
        problems.append(
            config.problem(
                (*at, "key"),
                "a key without a {field} would be the same for every call: "
                "name the argument fields that are stable intent",
            )
        )
    if rule.approvals_required > 1 and not rule.needs_approval:
        problems.append(config.problem((*at, "approvals_required"), "needs needs_approval = true"))
    if rule.reconcile is not None:
        target = split_tool_name(rule.reconcile)
        if target is None or target[0] not in config.servers:
            problems.append(
                config.problem((*at, "reconcile"), "name a tool of a server as SERVER.TOOL")
            )
    return problems


def _pydantic_problems(
    invalid: ValidationError, lines: dict[KeyPath, int]
) -> list[tuple[int | None, str]]:
    problems = []
    for error in invalid.errors():
        path = tuple(str(part) for part in error["loc"])
        what = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            what = "unknown key"
        elif error["type"] == "missing":
            what = "missing"
        problems.append((line_of(lines, path), f"{_dotted(path)}: {what}"))
    return problems


def _dotted(path: tuple[str, ...]) -> str:
    """``("tools", "mail.send_reply", "key")`` → ``tools."mail.send_reply".key``."""
    return ".".join(part if SERVER_NAME.match(part) else f'"{part}"' for part in path)


def _toml_problem(wrong: tomllib.TOMLDecodeError) -> tuple[int | None, str]:
    """tomllib's message and line: its "(at line N, column M)" becomes the line."""
    message = str(wrong)
    at = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if at is None:
        return None, message
    return int(at.group(1)), f"{message[: at.start()]} (column {at.group(2)})"
