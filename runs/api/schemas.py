"""Pydantic schemas of the agent API v1: what it accepts and what it answers.

The OpenAPI schema at ``/api/v1/openapi.json`` is generated from these, so the
documentation and the validation are the same code. Limits are api.md's.
Input is strict: ``"5"`` is not an integer and ``1`` is not a boolean.

Each answer object (``RunOut``, ``AttemptOut``, ``CallOut``, ``EffectOut``) is the one
definition of its shape: runs/api/serialize.py builds the answers, the poll's included,
from these fields. Status values come from the models' ``TextChoices``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
)
from typing_extensions import TypeAliasType

from runs.models import (
    Action,
    AttemptStatus,
    CallKind,
    EffectStatus,
    KeySource,
    RestartPolicy,
    RunStatus,
)
from runs.validation import MAX_SAFE_INTEGER, check_json_object, check_text
from startsafe.outbound import REFUSED_URL_PATTERN, text_refusal


def _printable_ranges() -> str:
    """The code points ``str.isprintable()`` takes, as the ranges of a regex class.

    It refuses controls, format characters (U+202E right-to-left override, U+200B zero
    width space...), line and paragraph separators, spaces other than U+0020,
    private-use and unassigned code points: whatever displays differently from what
    it is. Derived from Python itself, so the pattern and the check never disagree.
    A class of what is taken, not a negated class of what is refused: a generator
    (schemathesis, hypothesis) builds the first in a second and the second, which
    covers a million code points, in several (the API's fuzz test took 340 s).
    Planes 4 to 13 (unassigned) and 15 to 16 (private use) hold nothing printable,
    and surrogates are never text, so the loop looks at a third of the code points.
    """
    spans: list[list[int]] = []
    for codes in (range(0xD800), range(0xE000, 0x40000), range(0xE0000, 0xF0000)):
        for code in codes:
            if chr(code).isprintable():
                if spans and spans[-1][1] == code - 1:
                    spans[-1][1] = code
                else:
                    spans.append([code, code])

    def escape(code: int) -> str:
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

    return "".join(
        escape(first) if first == last else f"{escape(first)}-{escape(last)}"
        for first, last in spans
    )


# "Printable", as ``str.isprintable()`` says (the Idempotency-Key header's rule too):
# a key an operator reads must display as what it is. Stated as a pattern so that
# the OpenAPI schema says exactly what the server accepts.
PRINTABLE = f"^[{_printable_ranges()}]+$"
NO_NUL = r"^[^\x00]*$"


def _check_printable(value: str) -> str:
    check_text(value)
    if not value.isprintable():
        raise ValueError(
            "must be printable characters only (no control, format or separator "
            "characters such as U+202E or U+200B, no spaces other than U+0020)"
        )
    return value


# An http(s) URL of printable ASCII with a host part; IPv6 literals are not taken.
URL_PATTERN = r"^https?://[A-Za-z0-9._~%!$&'()*+,;=:@-]+(?:[/?#][!-~]*)?$"


def _check_url(value: str) -> str:
    try:
        parts = urlsplit(value)
    except ValueError:
        raise ValueError("must be an http or https URL") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an http or https URL")
    refusal = text_refusal(value)
    if refusal:
        raise ValueError(refusal)
    return value


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer: 60 and 60.0 are both the integer 60; "60" and true are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def whole(minimum: int, maximum: int):
    """A strict integer within [minimum, maximum] (60.0 counts as 60)."""
    # Field before BeforeValidator: the other order drops the bounds from the schema.
    return Annotated[
        int, Field(strict=True, ge=minimum, le=maximum), BeforeValidator(_whole_number)
    ]


def _not_whole(value: float) -> float:
    if value.is_integer():
        raise ValueError("integer-valued numbers must be within ±(2^53−1)")
    return value


Text = Annotated[str, Field(pattern=NO_NUL), AfterValidator(check_text)]
Printable = Annotated[str, Field(pattern=PRINTABLE), AfterValidator(_check_printable)]

# pydantic states a key pattern as `patternProperties`, which by itself lets any
# other key through; closing the object to keys that do not match makes the schema
# refuse a key with U+0000 exactly as the server does (schemathesis checks it).
JsonKey = Annotated[str, Field(pattern=NO_NUL)]
CLOSED_TO_OTHER_KEYS = Field(json_schema_extra={"additionalProperties": False})

# Any JSON value PostgreSQL and RFC 8785 can hold: text without U+0000, integers
# within ±(2^53−1), finite numbers. Recursive, so the schema documents it exactly.
JsonValue = TypeAliasType(
    "JsonValue",
    Union[  # noqa: UP007 - a recursive alias needs the Union form
        Annotated[str, Field(pattern=NO_NUL)],
        whole(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
        Annotated[
            float,
            Field(strict=True, allow_inf_nan=False, json_schema_extra={"not": {"type": "integer"}}),
            AfterValidator(_not_whole),
        ],
        StrictBool,
        None,
        list["JsonValue"],
        Annotated[dict[JsonKey, "JsonValue"], CLOSED_TO_OTHER_KEYS],
    ],
)
JsonObject = Annotated[
    dict[JsonKey, JsonValue], CLOSED_TO_OTHER_KEYS, AfterValidator(check_json_object)
]
RunKey = Annotated[
    str, Field(min_length=1, max_length=200, pattern=PRINTABLE), AfterValidator(_check_printable)
]
ToolName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:\-]+$")]
EffectKey = Annotated[
    str, Field(min_length=1, max_length=255, pattern=PRINTABLE), AfterValidator(_check_printable)
]
AttemptNumber = whole(1, 2_147_483_647)
# A URL startsafe will POST to: not one that names this machine or an address that is
# not public (startsafe/outbound.py), stated in the schema too (for a server that
# allows none: STARTSAFE_OUTBOUND_ALLOW lets more through).
Url = Annotated[
    str,
    Field(
        max_length=2000,
        pattern=URL_PATTERN,
        json_schema_extra={
            "not": {"pattern": REFUSED_URL_PATTERN},
            "description": "An http or https URL. Not one whose host names this machine"
            " (localhost), nor an IP address that is not public (loopback, private,"
            " link-local, multicast...) or is not written as four decimal numbers,"
            " unless the server's STARTSAFE_OUTBOUND_ALLOW allows it.",
        },
    ),
    AfterValidator(_check_url),
]


def one_of(*values: str):
    """The ``Literal`` of these values: a status field takes its values from the
    model's ``TextChoices`` (``one_of(*EffectStatus.values)``), never retyped."""
    return Literal[tuple(str(value) for value in values)]


RunStatusName = one_of(*RunStatus.values)
AttemptStatusName = one_of(*AttemptStatus.values)
EffectStatusName = one_of(*EffectStatus.values)
RestartPolicyName = one_of(*RestartPolicy.values)
KeySourceName = one_of(*KeySource.values)
CallKindName = one_of(*CallKind.values)
ActionName = one_of(*Action.values)


class In(BaseModel):
    # Unknown fields are refused: a typo such as "needs_aproval" must not silently
    # release a campaign without approval.
    model_config = ConfigDict(strict=True, extra="forbid")


# --- Requests -------------------------------------------------------------------


class StartIn(In):
    run_key: RunKey
    title: Annotated[Text, Field(max_length=200)] | None = None
    input: JsonObject | None = None
    restart_policy: RestartPolicyName = RestartPolicy.KEYED.value
    heartbeat_timeout: whole(5, 86_400) = 60
    restart_url: Url | None = None
    supersede: AttemptNumber | None = Field(
        None, description="The run's current attempt number, to replace a running attempt."
    )
    agent_version: Annotated[Text, Field(max_length=100)] | None = None


class AttemptIn(In):
    attempt: AttemptNumber


class FinishIn(In):
    attempt: AttemptNumber
    outcome: one_of(RunStatus.COMPLETED, RunStatus.FAILED)
    error: Annotated[Text, Field(max_length=4000)] | None = None


class ReadCallIn(In):
    """A read: journaled, never gated, never keyed."""

    attempt: AttemptNumber
    tool: ToolName
    kind: one_of(CallKind.READ)
    args: JsonObject


class EffectCallIn(In):
    """An effect; the first call naming a key declares the effect's settings."""

    # A key needs its key_source; stated in the schema so generated clients know it.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"key": {"type": "string"}}, "required": ["key"]},
            "then": {"properties": {"key_source": {"type": "string"}}, "required": ["key_source"]},
        }
    )

    attempt: AttemptNumber
    tool: ToolName
    kind: one_of(CallKind.EFFECT)
    args: JsonObject
    key: EffectKey | None = None
    key_source: KeySourceName | None = Field(
        None, description="Required with key: where the key comes from."
    )
    needs_approval: StrictBool = False
    approvals_required: whole(1, 3) = Field(
        1, description="Distinct operators who must approve; only counts with needs_approval."
    )
    preview: Annotated[Text, Field(max_length=4000)] | None = None
    approval_ttl: whole(60, 2_592_000) | None = None
    timeout: whole(1, 86_400) | None = None


CallIn = Annotated[Union[ReadCallIn, EffectCallIn], Field(discriminator="kind")]  # noqa: UP007


class ToolIn(In):
    """One tool's declaration (api.md, "Additions in v1")."""

    # "schema" would shadow pydantic's BaseModel.schema: the field is named apart.
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=False)

    name: ToolName
    kind: CallKindName
    key_source: KeySourceName | None = None
    needs_approval: StrictBool = False
    approvals_required: whole(1, 3) = Field(
        1, description="Distinct operators who must approve; only counts with needs_approval."
    )
    schema_: JsonObject | None = Field(
        None, alias="schema", description="The tool's argument schema (JSON Schema)."
    )
    annotations: JsonObject | None = Field(None, description="The tool's MCP annotations.")


class ToolsIn(In):
    tools: list[ToolIn] = Field(min_length=1, max_length=500)


class ClaimIn(In):
    run_id: Annotated[UUID, Field(strict=False)]
    attempt: AttemptNumber


class CompleteIn(In):
    run_id: Annotated[UUID, Field(strict=False)]
    attempt: AttemptNumber
    outcome: one_of(EffectStatus.DONE, EffectStatus.FAILED)
    result: JsonObject | None = None
    error: Annotated[Text, Field(max_length=4000)] | None = None


class ReconcileIn(In):
    run_id: Annotated[UUID, Field(strict=False)]
    attempt: AttemptNumber
    outcome: Literal["done", "not_done"]
    evidence: Annotated[Text, Field(min_length=1, max_length=2000)]
    result: JsonObject | None = None


# --- Answers ---------------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any]


class ErrorOut(BaseModel):
    error: ErrorDetail


class BlockingOut(BaseModel):
    reason: Literal["unkeyed_effect", "recorded_call", "manual_policy"]
    effect_id: str | None
    call_id: str | None
    tool: str | None
    message: str


class NoteOut(BaseModel):
    reason: Literal[
        "done",
        "awaiting_approval",
        "approved",
        "pending",
        "in_flight",
        "unknown_outcome",
        "rejected",
        "expired",
        "failed",
    ]
    effect_id: str
    tool: str
    message: str


class OverrideOut(BaseModel):
    by: str | None
    at: str
    note: str


class VerdictOut(BaseModel):
    safe: bool
    policy: RestartPolicyName
    blocking: list[BlockingOut]
    notes: list[NoteOut]
    override: OverrideOut | None


class RunOut(BaseModel):
    id: str
    run_key: str
    title: str
    input: dict[str, Any]
    status: RunStatusName
    restart_policy: RestartPolicyName
    heartbeat_timeout: int
    heartbeat_at: str
    current_attempt: int
    restart_ready: bool
    restart_url: str | None
    created_at: str
    updated_at: str


class AttemptOut(BaseModel):
    number: int
    status: AttemptStatusName
    started_at: str
    ended_at: str | None
    started_by: str = Field(description="agent, auto, or operator:<username>")
    reason: str
    agent_version: str | None
    verdict_at_start: VerdictOut | None
    error: str | None


class ApprovalOut(BaseModel):
    by: str
    at: str
    note: str
    args_hash: str


class DecisionOut(BaseModel):
    verb: Literal["approved", "rejected", "marked_done", "released", "expired", "reconciled"]
    by: str = Field(
        description="The operator's username, agent:<name>, system, or policy:<rule id> "
        "for a tool policy's automatic approval or block"
    )
    at: str
    note: str
    args_hash: str
    final: bool


class HoldOut(BaseModel):
    """Why the server made an effect wait, or refused it, although its call asked for less."""

    reason: Literal["key_drift", "tool_unconfirmed", "policy_rule"]
    message: str
    effect_id: str | None = Field(description="The earlier effect, for key_drift")


class ClaimedByOut(BaseModel):
    run_id: str
    attempt: int


class EffectOut(BaseModel):
    id: str
    run_id: str
    tool: str
    key: str | None
    key_source: KeySourceName | None
    needs_approval: bool
    approvals_required: int
    approvals: list[ApprovalOut]
    timeout: int | None
    status: EffectStatusName
    args: dict[str, Any]
    args_hash: str
    args_versions: int
    preview: str | None
    result: dict[str, Any] | None
    error: str | None
    claimed_by: ClaimedByOut | None
    approval_expires_at: str | None
    decision: DecisionOut | None
    hold: HoldOut | None
    revision: int
    created_at: str
    updated_at: str


class CallOut(BaseModel):
    id: str
    attempt: int
    seq: int
    tool: str
    kind: CallKindName
    args_hash: str
    action: ActionName
    effect_id: str | None
    at: str


class StartOut(BaseModel):
    run: RunOut
    attempt: AttemptOut
    verdict: VerdictOut
    journal: list[CallOut]
    effects: list[EffectOut]


class RunDetailOut(BaseModel):
    run: RunOut
    attempts: list[AttemptOut]
    verdict: VerdictOut
    journal: list[CallOut]
    effects: list[EffectOut]


class RunOnlyOut(BaseModel):
    run: RunOut


class RecordOut(BaseModel):
    call: CallOut
    action: ActionName
    effect: EffectOut | None


class EffectActionOut(BaseModel):
    effect: EffectOut
    action: ActionName


class EffectOnlyOut(BaseModel):
    effect: EffectOut


class ToolPolicyOut(BaseModel):
    kind: CallKindName | None
    needs_approval: bool
    approvals_required: int
    approval_ttl: int | None
    on_expiry: Literal["expire", "reject"]
    rules: list[dict[str, Any]] = Field(
        description='Argument rules, the first match wins: {"id", "pointer", "op", "value", '
        '"action": "require|block|approve", "approvals"}'
    )
    updated_at: str


class EffectiveOut(BaseModel):
    kind: CallKindName
    needs_approval: bool
    approvals_required: int
    approval_ttl: int
    on_expiry: Literal["expire", "reject"]


class ToolOut(BaseModel):
    """A registered tool: its latest declaration, its state, its policy and the rule in
    force (``effective``; argument rules apply per call on top of it)."""

    name: str
    kind: CallKindName
    key_source: KeySourceName | None
    needs_approval: bool
    approvals_required: int
    schema_: dict[str, Any] | None = Field(alias="schema")
    annotations: dict[str, Any] | None
    fingerprint: str
    state: Literal["registered", "confirmed", "changed"]
    policy: ToolPolicyOut | None
    effective: EffectiveOut
    created_at: str
    updated_at: str


class ToolsOut(BaseModel):
    tools: list[ToolOut]


class RunPage(BaseModel):
    items: list[RunOut]
    next_cursor: str | None


class EffectPage(BaseModel):
    items: list[EffectOut]
    next_cursor: str | None


class ToolPage(BaseModel):
    items: list[ToolOut]
    next_cursor: str | None
