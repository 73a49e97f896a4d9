"""Declarations beside the tools: a read, or an effect with its key rule and approvals.

::

    from startsafe_client import effect, intent_key, provider_key, read

    specs = {
        "lookup_customer": read(),
        "send_reply": effect(
            key=lambda a: provider_key("outlook", "message", a["message_id"]),
            reconcile=find_reply_in_sent_items,
        ),
        "send_campaign": effect(
            key=lambda a: intent_key("campaign", campaign_id=a["campaign_id"]),
            needs_approval=True,
        ),
    }

A spec says what a tool *is*, never how it runs: ``@client.tool(spec)`` pairs it
with a function (a :class:`Tool`), and a framework adapter pairs it with the
framework's own tool through :meth:`Run.call_spec`. The tools' code does not change.

**A key is never built from nothing.** The key rule receives the arguments the
model generated; when a field it needs is missing, ``None`` or empty, the rule (or
the key helpers it calls) refuses, and the call is refused with
:class:`~startsafe_client.errors.KeyRefused` before anything is recorded.

**An exception is not proof that nothing happened.** An effect's tool that raises
leaves the effect's outcome unknown (the client does not report it); only
:class:`~startsafe_client.errors.NotPerformed`, or a type listed in
``not_performed``, reports it ``failed`` so that it may run again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .errors import KeyRefused, NotPerformed
from .keys import Key

Args = dict[str, Any]
Result = dict[str, Any]


@dataclass(frozen=True)
class Reconciliation:
    """What a reconcile lookup found at the provider.

    Build it with :meth:`done` or :meth:`not_done`; a lookup that cannot tell
    returns ``None`` instead.

    **Only a lookup that sees the provider's latest state may answer
    ``not_done``.** ``not_done`` releases the effect so it runs again; a search
    index that lags behind (a sent-items search that takes minutes to show a new
    message) would release an effect that happened, and it would happen twice.
    When in doubt, return ``None`` and let a person decide.
    """

    outcome: Literal["done", "not_done"]
    evidence: str
    result: Result | None = None

    @classmethod
    def done(cls, evidence: str, result: Result | None = None) -> Reconciliation:
        """It happened: ``evidence`` says what was looked up and found."""
        return cls("done", evidence, result)

    @classmethod
    def not_done(cls, evidence: str) -> Reconciliation:
        """It did not happen (authoritative, up-to-date lookup only: see the class doc)."""
        return cls("not_done", evidence)

    def __post_init__(self) -> None:
        if self.outcome not in ("done", "not_done"):
            raise ValueError("outcome must be 'done' or 'not_done'")
        if not self.evidence or not self.evidence.strip():
            raise ValueError("a reconciliation needs evidence: what was looked up and found")


# ``(args, key) -> Reconciliation | None``; an ``async def`` lookup is awaited by AsyncClient.
ReconcileLookup = Callable[[Args, "str | None"], Any]


@dataclass(frozen=True)
class ToolSpec:
    """How a tool is journaled; made by :func:`read` or :func:`effect`.

    Attributes:
        kind: ``"read"`` (journaled, never gated) or ``"effect"``.
        key: ``args -> Key`` built from stable intent, or ``None`` for an unkeyed
            effect (allowed, but it blocks automatic restarts of the run).
        needs_approval, approvals_required, approval_ttl, timeout: declared with the
            effect's first call (api.md, ``POST /runs/{id}/calls``).
        preview: ``args -> str`` (or a fixed text) shown to the approving person.
        reconcile: ``(args, key) -> Reconciliation | None``, looking the effect up
            at the provider when its outcome is unknown.
        not_performed: exception types the tool raises only before anything was
            sent; they are reported ``failed`` like :class:`NotPerformed`.
    """

    kind: Literal["read", "effect"]
    key: Callable[[Args], Key] | None = None
    needs_approval: bool = False
    approvals_required: int = 1
    approval_ttl: int | None = None
    timeout: int | None = None
    preview: Callable[[Args], str] | str | None = None
    reconcile: ReconcileLookup | None = None
    not_performed: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "not_performed", tuple(self.not_performed))
        if self.kind not in ("read", "effect"):
            raise ValueError("kind must be 'read' or 'effect'")
        effect_only = (
            self.key,
            self.needs_approval,
            self.reconcile,
            self.preview,
            self.not_performed,
        )
        if self.kind == "read" and any(effect_only):
            raise ValueError(
                "a read takes no key, approval, preview, reconcile lookup or not_performed"
            )
        if not 1 <= self.approvals_required <= 3:
            raise ValueError("approvals_required must be 1, 2 or 3")
        if self.approvals_required > 1 and not self.needs_approval:
            raise ValueError("approvals_required needs needs_approval=True")
        if not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in self.not_performed
        ):
            raise TypeError("not_performed takes a tuple of exception types")

    def key_for(self, tool: str, args: Args) -> Key | None:
        """The key for these arguments (``None`` for reads and unkeyed effects).

        Raises:
            KeyRefused: the rule found no key (a missing, ``None`` or empty field, or
                a file it keys on that cannot be read): the call must not be recorded.
            TypeError: the rule returned something other than a :class:`Key`.
        """
        if self.key is None:
            return None
        try:
            key = self.key(args)
        except (KeyError, ValueError, OSError) as missing:
            raise KeyRefused(
                f"{tool}: no key in these arguments ({type(missing).__name__}: {missing}); "
                "a key is never built from nothing, so the call was not made",
                details={"tool": tool},
            ) from missing
        if key is None:
            raise KeyRefused(
                f"{tool}: the key rule found no key in these arguments; the call was not made",
                details={"tool": tool},
            )
        if not isinstance(key, Key):
            raise TypeError(
                f"tool {tool!r}: the key rule must return a Key (use provider_key, "
                f"content_key or intent_key), not {key!r}"
            )
        return key

    def preview_for(self, args: Args) -> str | None:
        """The preview text for these arguments, if the spec declares one."""
        if self.preview is None:
            return None
        text = self.preview if isinstance(self.preview, str) else self.preview(args)
        return str(text)[:4000]

    def declaration(
        self,
        name: str,
        *,
        schema: dict[str, Any] | None = None,
        annotations: dict[str, Any] | None = None,
        key_source: str | None = None,
    ) -> dict[str, Any]:
        """The tool's declaration as ``POST /api/v1/tools`` takes it (api.md, "Additions
        in v1"): its kind and approval, with the argument schema, MCP annotations and
        key source where the caller knows them. A key rule's source is known only once
        it built a key, so a spec alone declares none (its calls send it)."""
        declared: dict[str, Any] = {"name": name, "kind": self.kind}
        if key_source is not None:
            declared["key_source"] = key_source
        if self.needs_approval:
            declared["needs_approval"] = True
            declared["approvals_required"] = self.approvals_required
        if schema is not None:
            declared["schema"] = schema
        if annotations is not None:
            declared["annotations"] = annotations
        return declared

    def performed_nothing(self, error: BaseException) -> bool:
        """Whether the tool's exception says that nothing was sent (so report ``failed``)."""
        return isinstance(error, (NotPerformed, *self.not_performed))


def read() -> ToolSpec:
    """A read: journaled, never gated, run again on every call."""
    return ToolSpec(kind="read")


def effect(
    *,
    key: Callable[[Args], Key] | None = None,
    needs_approval: bool = False,
    approvals_required: int = 1,
    approval_ttl: int | None = None,
    timeout: int | None = None,
    preview: Callable[[Args], str] | str | None = None,
    reconcile: ReconcileLookup | None = None,
    not_performed: tuple[type[BaseException], ...] = (),
) -> ToolSpec:
    """An effect: recorded before it runs, executed once per key.

    ``key`` receives the arguments the model generated and builds the key from
    stable intent only (:mod:`startsafe_client.keys`), never from generated content.
    A reconcile lookup receives the effect's recorded arguments and key; **only a
    lookup that sees the provider's latest state may answer**
    :meth:`Reconciliation.not_done`. ``not_performed`` lists the exception types
    the tool raises only before anything was sent (``(httpx.ConnectError,)``).
    """
    return ToolSpec(
        kind="effect",
        key=key,
        needs_approval=needs_approval,
        approvals_required=approvals_required,
        approval_ttl=approval_ttl,
        timeout=timeout,
        preview=preview,
        reconcile=reconcile,
        not_performed=tuple(not_performed),
    )


@dataclass(frozen=True)
class Tool:
    """A function paired with its spec, made by :meth:`Client.tool`; call it with ``run.call``.

    Calling a ``Tool`` directly runs nothing: every call goes through a run, so it
    is recorded before it is made.

    Attributes:
        fn: the function doing the work (``async def`` under :class:`AsyncClient`).
            It receives the arguments as keyword arguments (or, with
            ``args_as_dict``, as one dict) and returns its result: a dict, or any
            JSON value (recorded as ``{"value": ...}``), ``None`` meaning ``{}``.
        name: the tool's name in the journal.
        spec: its declaration (:func:`read` or :func:`effect`).
    """

    fn: Callable[..., Any]
    name: str
    spec: ToolSpec
    args_as_dict: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"tool {self.name!r} is called through a run, so it is journaled first: "
            f"run.call({self.name}, **args)"
        )

    @property
    def kind(self) -> str:
        return self.spec.kind


def as_result(value: Any) -> Result:
    """A tool's return value as the effect's result object: ``None`` → ``{}``, a dict
    as it is, anything else → ``{"value": value}``."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    return {"value": value}


def from_result(result: Result) -> Any:
    """The value a tool returned, from its recorded result (the inverse of :func:`as_result`).

    An adapter returns it to the framework on ``skip``, so a replay answers what
    the first execution answered.
    """
    if isinstance(result, dict) and set(result) == {"value"}:
        return result["value"]
    return result
