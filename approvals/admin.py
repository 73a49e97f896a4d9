from __future__ import annotations

from django.contrib import admin

from approvals.models import Approval, SlackMessage, SlackUserMapping
from runs.admin import ReadOnlyAdmin


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ["effect", "user", "args_hash", "at"]


@admin.register(SlackUserMapping)
class SlackUserMappingAdmin(admin.ModelAdmin):
    """Admins say which Slack member is which console user (approvals/slack.py)."""

    list_display = ["slack_user_id", "user"]
    search_fields = ["slack_user_id", "user__username", "user__email"]
    raw_id_fields = ["user"]


@admin.register(SlackMessage)
class SlackMessageAdmin(ReadOnlyAdmin):
    list_display = ["effect", "purpose", "status", "channel", "ts", "tries", "last_error"]
    list_filter = ["purpose", "status"]
