"""Declarations beside the tools: ``read()`` and ``effect(...)`` specs, what they refuse,
the decorator as a thin layer over them, and the key rule's "never from nothing".

What a call does with a spec is tested through both clients in ``test_client_flow.py``
(``run.call`` and the adapters' ``run.call_spec``).
"""

from __future__ import annotations

import pytest

import startsafe_client as ss


def campaign_key(args: dict) -> ss.Key:
    return ss.intent_key("campaign", campaign_id=args.get("campaign_id"))


def test_a_spec_is_a_declaration_the_decorator_pairs_with_a_function():
    client = ss.Client("http://startsafe.test", "tok")
    spec = ss.effect(key=campaign_key, needs_approval=True, approvals_required=2)

    @client.tool(spec)
    def send_campaign(campaign_id: str) -> dict: ...

    @client.tool(spec, name="send_campaign_v2")
    def send_again(campaign_id: str) -> dict: ...

    assert send_campaign.spec is spec and send_campaign.name == "send_campaign"
    assert send_again.name == "send_campaign_v2"
    assert send_campaign.kind == "effect"


def test_the_decorators_keywords_make_the_same_spec_as_effect():
    client = ss.Client("http://startsafe.test", "tok")

    @client.tool(kind="effect", key=campaign_key, needs_approval=True, preview="Send it")
    def send_campaign(campaign_id: str) -> dict: ...

    @client.tool(kind="read")
    def lookup(email: str) -> dict: ...

    @client.tool
    def charge_card(amount: int) -> dict: ...  # an unkeyed effect

    assert send_campaign.spec == ss.effect(key=campaign_key, needs_approval=True, preview="Send it")
    assert lookup.spec == ss.read()
    assert charge_card.spec == ss.effect()


def test_a_spec_and_keywords_together_are_refused():
    client = ss.Client("http://startsafe.test", "tok")

    with pytest.raises(ValueError, match="once"):
        client.tool(ss.effect(key=campaign_key), needs_approval=True)


@pytest.mark.parametrize(
    "declare",
    [
        lambda: ss.ToolSpec(kind="read", key=campaign_key),
        lambda: ss.ToolSpec(kind="read", needs_approval=True),
        lambda: ss.ToolSpec(kind="read", not_performed=(OSError,)),
        lambda: ss.ToolSpec(kind="write"),
        lambda: ss.effect(approvals_required=4, needs_approval=True),
        lambda: ss.effect(approvals_required=2),  # without needs_approval
    ],
)
def test_a_spec_that_cannot_be_honoured_is_refused(declare):
    with pytest.raises(ValueError):
        declare()


def test_not_performed_takes_exception_types_only():
    with pytest.raises(TypeError):
        ss.effect(not_performed=("ConnectionRefusedError",))

    spec = ss.effect(not_performed=[ConnectionRefusedError])
    assert spec.not_performed == (ConnectionRefusedError,)
    assert spec.performed_nothing(ConnectionRefusedError()) is True
    assert spec.performed_nothing(ss.NotPerformed("refused")) is True
    # A timeout may come after the provider took the request: not proof of nothing.
    assert spec.performed_nothing(TimeoutError()) is False


@pytest.mark.parametrize(
    "args", [{}, {"campaign_id": None}, {"campaign_id": ""}, {"campaign_id": "  "}]
)
def test_a_key_is_never_built_from_nothing(args):
    with pytest.raises(ss.KeyRefused) as refused:
        ss.effect(key=campaign_key).key_for("send_campaign", args)

    assert refused.value.tool == "send_campaign"
    assert isinstance(refused.value, ValueError)


def test_a_file_that_cannot_be_read_gives_no_content_key(tmp_path):
    spec = ss.effect(key=lambda a: ss.content_key_of_file(a["path"]))

    with pytest.raises(ss.KeyRefused, match="FileNotFoundError"):
        spec.key_for("import_dataset", {"path": str(tmp_path / "missing.csv")})


def test_a_key_rule_that_returns_none_refuses_and_one_that_returns_text_is_a_bug():
    with pytest.raises(ss.KeyRefused):
        ss.effect(key=lambda a: None).key_for("t", {"x": 1})
    with pytest.raises(TypeError, match="must return a Key"):
        ss.effect(key=lambda a: "campaign:x").key_for("t", {"x": 1})


def test_a_read_and_an_unkeyed_effect_have_no_key():
    assert ss.read().key_for("lookup", {"email": "a@x"}) is None
    assert ss.effect().key_for("charge_card", {"amount": 5}) is None


def test_results_go_to_the_journal_as_objects_and_come_back_as_values():
    assert ss.as_result(None) == {}
    assert ss.as_result({"id": 1}) == {"id": 1}
    assert ss.as_result("sent") == {"value": "sent"}
    assert ss.from_result({"value": "sent"}) == "sent"
    assert ss.from_result({"id": 1}) == {"id": 1}


@pytest.mark.parametrize(
    ("effect", "text"),
    [
        (
            {"status": "rejected", "decision": {"note": "Not the EU list", "final": False}},
            "rejected by an operator: Not the EU list",
        ),
        (
            {"status": "rejected", "decision": {"note": "Never", "final": True}},
            "rejected by an operator (final: do not propose it again): Never",
        ),
        ({"status": "expired", "decision": {}}, "not performed: nobody approved it in time"),
    ],
)
def test_a_blocked_effect_speaks_to_the_model(effect, text):
    assert ss.EffectBlocked("blocked", effect={"id": "e", **effect}).for_model == text
