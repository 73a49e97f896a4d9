"""Django admin: agents (create, deactivate, rotate a token shown once, their tool
mode), tools (confirm) and their policies (edit), the journal read-only."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db import models
from django.utils import timezone

from runs.audit import Actor, new_event
from runs.models import (
    Agent,
    Attempt,
    AuditEvent,
    Call,
    Effect,
    EffectVersion,
    Run,
    Tool,
    ToolDeclaration,
    ToolPolicy,
)
from runs.registry import POLICY_FIELDS, confirm_tool, save_policy


class ReadOnlyAdmin(admin.ModelAdmin):
    """The journal is changed only by its rules, never by hand in the admin."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "is_active",
        "tool_mode",
        "token_hint",
        "created_at",
        "token_rotated_at",
    ]
    list_filter = ["is_active", "tool_mode"]
    search_fields = ["name"]
    fields = ["name", "is_active", "tool_mode", "token_hint", "created_at", "token_rotated_at"]
    readonly_fields = ["token_hint", "created_at", "token_rotated_at"]
    actions = ["rotate_tokens", "deactivate"]

    def has_delete_permission(self, request, obj=None):
        return False  # an agent's runs and keys outlive it; deactivate instead

    def save_model(self, request, obj, form, change):
        if not change:
            token = obj.set_new_token()
            super().save_model(request, obj, form, change)
            messages.warning(
                request,
                f"The token of {obj.name} is {token} — copy it now, it is not shown again.",
            )
        else:
            super().save_model(request, obj, form, change)
        if change and "tool_mode" in form.changed_data:
            # Which tools an agent may call is a policy: its changes are audited.
            event = new_event(
                Actor.for_user(request.user),
                "tool_mode_changed",
                at=timezone.now(),
                data={"from": form.initial.get("tool_mode"), "to": obj.tool_mode},
            )
            event.agent = obj
            event.save(force_insert=True)

    @admin.action(
        description="Rotate the token (the new one is shown once)", permissions=["change"]
    )
    def rotate_tokens(self, request, queryset):
        for agent in queryset:
            token = agent.rotate_token()
            messages.warning(
                request, f"New token of {agent.name}: {token} — copy it now, it is not shown again."
            )

    @admin.action(
        description="Deactivate (its token stops working at once)", permissions=["change"]
    )
    def deactivate(self, request, queryset):
        count = queryset.update(is_active=False)
        messages.info(request, f"{count} agent(s) deactivated.")


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ["number", "status", "started_at", "ended_at", "started_by", "reason", "error"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["run_key", "agent", "status", "restart_policy", "current_attempt", "updated_at"]
    list_filter = ["status", "restart_policy", "agent"]
    search_fields = ["run_key", "title"]
    inlines = [AttemptInline]
    # Read-only, but Django still builds the form: say the scheme its URL field
    # assumes (http is a deprecated default in Django 6.0, and restart URLs have one).
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["run", "number", "status", "started_by", "started_at", "ended_at"]
    list_filter = ["status"]


@admin.register(Call)
class CallAdmin(ReadOnlyAdmin):
    list_display = ["run", "attempt_number", "seq", "tool", "kind", "action", "at"]
    list_filter = ["kind", "action"]


@admin.register(Effect)
class EffectAdmin(ReadOnlyAdmin):
    list_display = ["tool", "key", "status", "needs_approval", "agent", "updated_at"]
    list_filter = ["status", "needs_approval", "key_source"]
    search_fields = ["key", "tool"]


@admin.register(EffectVersion)
class EffectVersionAdmin(ReadOnlyAdmin):
    list_display = ["effect", "number", "author", "adopted", "at"]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "actor", "verb", "run", "effect", "old_status", "new_status"]
    list_filter = ["verb", "actor_kind"]
    search_fields = ["actor", "note"]


# --- The tool registry -------------------------------------------------------------


class ToolDeclarationInline(admin.TabularInline):
    model = ToolDeclaration
    extra = 0
    can_delete = False
    fields = ["first_seen_at", "source", "fingerprint", "declaration"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    """Tools register themselves (runs/registry.py); an admin confirms them here.

    Every field is read-only: the declaration is the agent's, the one in force
    changes only by a confirmation (the action), which is audited."""

    list_display = ["name", "agent", "state", "short_fingerprint", "updated_at"]
    list_filter = ["state", "agent"]
    search_fields = ["name"]
    fields = [
        "agent",
        "name",
        "state",
        "fingerprint",
        "declaration",
        "adopted_fingerprint",
        "adopted",
        "confirmed_by",
        "confirmed_at",
        "created_at",
        "updated_at",
    ]
    readonly_fields = fields
    inlines = [ToolDeclarationInline]
    actions = ["confirm"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="fingerprint")
    def short_fingerprint(self, tool: Tool) -> str:
        return tool.fingerprint[:12]

    @admin.action(
        description="Confirm the latest declaration (held effects go on)", permissions=["change"]
    )
    def confirm(self, request, queryset):
        for tool in queryset:
            confirm_tool(request.user, tool.pk)
        messages.info(request, f"{queryset.count()} tool(s) confirmed.")


@admin.register(ToolPolicy)
class ToolPolicyAdmin(admin.ModelAdmin):
    """An admin's rules for a tool (runs/policies.py applies them); each save is audited."""

    list_display = ["tool", "kind", "needs_approval", "approvals_required", "on_expiry"]
    list_filter = ["on_expiry", "needs_approval"]
    search_fields = ["tool__name"]
    raw_id_fields = ["tool"]
    fields = ["tool", *POLICY_FIELDS, "updated_by", "updated_at"]
    readonly_fields = ["updated_by", "updated_at"]

    def has_delete_permission(self, request, obj=None):
        return False  # a tool's rules are loosened by editing them, which is audited

    def save_model(self, request, obj, form, change):
        save_policy(request.user, obj)
