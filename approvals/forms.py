"""The console's action forms (product.md, "Console addresses and forms").

A form that does not validate is a 400, whoever sends it and whatever the state:
the views check it before anything else and show its errors on the form. A
decision form's ``save`` takes the decision through its rule in
``approvals/decisions.py``, which checks the role (403) and the state (409). JSON
fields are held to the API's rules (``runs/validation.py``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from approvals import decisions
from runs.canonical import NotCanonicalizable, canonical_json
from runs.errors import Forbidden, JournalError
from runs.models import Effect, EffectStatus, Run, ToolPolicy
from runs.registry import POLICY_FIELDS
from runs.validation import check_json_object

# api.md's limit for notes and evidence; a hash longer than this is refused too.
MAX_NOTE = 2000


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


class JsonObjectField(forms.Field):
    """A JSON object typed into a textarea, held to the API's rules (runs/validation.py);
    blank is ``None``."""

    widget = forms.Textarea

    def to_python(self, value: Any) -> dict | None:
        if not value or not value.strip():
            return None
        try:
            parsed = json.loads(value, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise ValidationError(f"This is not valid JSON: {exc}", code="invalid") from None
        if not isinstance(parsed, dict):
            raise ValidationError("This must be a JSON object ({…}).", code="object")
        try:
            check_json_object(parsed)
            # It must read back canonically too: 1e17 is a float here but an integer
            # beyond ±(2^53−1) once stored, whose hash could never be recomputed.
            canonical_json(json.loads(canonical_json(parsed)))
        except (ValueError, NotCanonicalizable, RecursionError) as exc:
            raise ValidationError(f"This JSON {exc}.", code="unfit") from None
        return parsed


def note_field(*, required: bool = True) -> forms.CharField:
    # CharField refuses U+0000 itself (PostgreSQL cannot store it): a 400, not a 500.
    return forms.CharField(
        required=required,
        max_length=MAX_NOTE,
        error_messages={"required": "A note is required."},
    )


def args_hash_field() -> forms.CharField:
    # The version of the arguments the operator saw: a decision for an older one is
    # refused (409), never applied to the new one.
    return forms.CharField(
        max_length=MAX_NOTE, error_messages={"required": "args_hash is required."}
    )


class DecisionForm(forms.Form):
    """A decision on an effect or a run: ``save`` takes it through its rule in
    ``approvals/decisions.py``, which checks the role (403) and the state (409)."""

    kind = ""  # "effect" or "run": what it decides on (the page, the queue's row)
    action = ""  # its name in decisions.allowed_actions or allowed_run_actions
    rule = None  # the rule, called with the form's fields as its keyword arguments

    def save(self, user, obj_id: Any) -> Effect | Run:
        return self.rule(user, obj_id, **self.cleaned_data)

    def success_message(self, obj: Any) -> str:
        raise NotImplementedError


class EffectForm(DecisionForm):
    kind = "effect"
    args_hash = args_hash_field()


class ApproveForm(EffectForm):
    action = "approve"
    note = note_field(required=False)
    args = JsonObjectField(required=False)  # edited arguments, from the editor's confirm

    def save(self, user, effect_id: Any) -> Effect:
        data = self.cleaned_data
        return decisions.approve_effect(
            user, effect_id, args_hash=data["args_hash"], note=data["note"],
            edited_args=data["args"],
        )  # fmt: skip

    def success_message(self, effect: Effect) -> str:
        if effect.status == EffectStatus.APPROVED:
            return f"Approved {effect.tool}: the agent may claim it now."
        have, need = len(effect.current_approvals), effect.approvals_required
        return f"Your approval of {effect.tool} is recorded ({have} of {need})."


class RejectForm(EffectForm):
    action = "reject"
    rule = staticmethod(decisions.reject_effect)
    note = note_field()
    final = forms.BooleanField(required=False)  # a revision may not ask again

    def success_message(self, effect: Effect) -> str:
        return f"Rejected {effect.tool}" + (" for good." if effect.decision["final"] else ".")


class MarkDoneForm(EffectForm):
    action = "mark_done"
    rule = staticmethod(decisions.mark_effect_done)
    note = note_field()
    # An effect's result is a JSON object everywhere (api.md: complete and reconcile
    # take "result"? (object)), so the agent that skips it gets what a tool returns.
    result = JsonObjectField(required=False)

    def success_message(self, effect: Effect) -> str:
        return f"Marked {effect.tool} done."


class ReleaseForm(EffectForm):
    action = "release"
    rule = staticmethod(decisions.release_effect)
    note = note_field()

    def success_message(self, effect: Effect) -> str:
        return f"Released {effect.tool}: it is {effect.status} and may be claimed again."


class EditForm(forms.Form):
    """Approve with edits, the review step: the edited arguments and the version they
    were edited from. Nothing changes until the operator confirms (an approve)."""

    args_hash = args_hash_field()
    args = JsonObjectField(error_messages={"required": "The edited arguments are required."})
    note = note_field(required=False)


class RunForm(DecisionForm):
    kind = "run"
    note = note_field()
    message = ""

    def success_message(self, run: Run) -> str:
        return self.message


class AllowRestartForm(RunForm):
    action = "allow_restart"
    rule = staticmethod(decisions.allow_restart)
    message = "Restart allowed: the next start goes through."


class AbandonForm(RunForm):
    action = "abandon"
    rule = staticmethod(decisions.abandon_run)
    message = "Run abandoned."


class EffectIdsField(forms.Field):
    """The ids of the effects ticked in the queue (``effect``, repeated), as sent."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[str]:
        ids = list(dict.fromkeys(value or ()))
        try:
            for effect_id in ids:
                uuid.UUID(effect_id)
        except ValueError:
            raise ValidationError("An effect id is not valid.", code="invalid") from None
        return ids


class BulkForm(forms.Form):
    """Approve or reject several awaiting effects, each bound to its own version
    (``args_hash_<id>``, one field per ticked effect)."""

    decision = forms.ChoiceField(
        choices=[("approve", "Approve"), ("reject", "Reject")],
        error_messages={"required": "Choose approve or reject."},
    )
    effect = EffectIdsField(error_messages={"required": "Select at least one effect."})
    note = note_field(required=False)
    final = forms.BooleanField(required=False)

    def __init__(self, data=None, **kwargs):
        super().__init__(data, **kwargs)
        for effect_id in data.getlist("effect") if data is not None else ():
            self.fields[f"args_hash_{effect_id}"] = forms.CharField(
                max_length=MAX_NOTE,
                error_messages={"required": f"args_hash_{effect_id} is required."},
            )

    def clean(self):
        data = super().clean()
        if data.get("decision") == "reject" and not data.get("note"):
            self.add_error("note", "A note is required to reject.")
        return data

    def save(self, user) -> tuple[int, list[str]]:
        """Decide each effect on its own (its own lock, hash check and audit event),
        so one stale or decided effect is refused without undoing the others. A user
        who may not decide is refused at the first (``Forbidden``), before any change."""
        data = self.cleaned_data
        done, refused = 0, []
        for effect_id in data["effect"]:
            args_hash = data[f"args_hash_{effect_id}"]
            try:
                if data["decision"] == "approve":
                    decisions.approve_effect(
                        user, effect_id, args_hash=args_hash, note=data["note"]
                    )
                else:
                    decisions.reject_effect(
                        user, effect_id, args_hash=args_hash, note=data["note"], final=data["final"]
                    )
                done += 1
            except Forbidden:
                raise
            except JournalError as exc:
                refused.append(f"{effect_id}: {exc.message}")
        return done, refused


# --- The tools pages -----------------------------------------------------------------


class RulesField(forms.JSONField):
    """A policy's argument rules, as a JSON list typed into a textarea (pretty, so that
    an admin edits one rule per few lines); blank is no rules."""

    def prepare_value(self, value: Any) -> str:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value if value is not None else [], indent=2, ensure_ascii=False)

    def to_python(self, value: Any) -> Any:
        parsed = super().to_python(value)
        return [] if parsed is None else parsed


class PolicyForm(forms.ModelForm):
    """An admin's policy for one tool (runs/models.py ``ToolPolicy``). The rules are
    checked by the model's own ``clean`` (runs/policies.py ``rule_errors``)."""

    kind = forms.TypedChoiceField(
        choices=[("", "as declared"), ("effect", "effect")],
        required=False,
        empty_value=None,
        help_text="A tool declared read can be made an effect; never the other way.",
    )
    approvals_required = forms.TypedChoiceField(
        choices=[(1, "1"), (2, "2"), (3, "3")], coerce=int, initial=1
    )
    approval_ttl = forms.IntegerField(
        required=False,
        min_value=60,
        max_value=2_592_000,
        help_text="Seconds (60 to 30 days); blank: the effect's own, or the default.",
    )
    rules = RulesField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "class": "mono"}),
        help_text='A list of {"id", "pointer", "op", "value", "action", "approvals"?}; '
        "the first match wins.",
    )

    class Meta:
        model = ToolPolicy
        fields = POLICY_FIELDS


class LinkDecisionForm(forms.Form):
    """The confirm page of a signed e-mail link (approvals/links.py): the link names
    the effect, its version and the action; the form adds the note (required to
    reject or mark done, as in the console) and, for a rejection, ``final``."""

    note = note_field(required=False)
    final = forms.BooleanField(required=False)

    def __init__(self, *args, action: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.action = action
        self.fields["note"].required = action != "approve"
