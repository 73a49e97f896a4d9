"""The declaration of a tool: a read, or an effect with its key rule and approvals.

``@client.tool(...)`` builds a :class:`ToolSpec` from its keywords and pairs it with
the function (a :class:`Tool`).

**An exception is not proof that nothing happened.** An effect's tool that raises
leaves the effect's outcome unknown (the client does not report it); only
:class:`~startsafe_client.errors.NotPerformed`, or a type listed in
``not_performed``, reports it ``failed`` so that it may run again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .errors import NotPerformed
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
            ValueError: the key helpers refuse a key from nothing (an empty part).
            TypeError: the rule returned something other than a :class:`Key`.
        """
        if self.key is None:
            return None
        key = self.key(args)
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

    def performed_nothing(self, error: BaseException) -> bool:
        """Whether the tool's exception says that nothing was sent (so report ``failed``)."""
        return isinstance(error, (NotPerformed, *self.not_performed))


@dataclass(frozen=True)
class Tool:
    """A function paired with its spec, made by :meth:`Client.tool`; call it with ``run.call``.

    Calling a ``Tool`` directly runs nothing: every call goes through a run, so it
    is recorded before it is made.

    Attributes:
        fn: the function doing the work (``async def`` under :class:`AsyncClient`).
            It receives the arguments as keyword arguments and returns its result: a
            dict, or any JSON value (recorded as ``{"value": ...}``), ``None``
            meaning ``{}``.
        name: the tool's name in the journal.
        spec: its declaration.
    """

    fn: Callable[..., Any]
    name: str
    spec: ToolSpec

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
