from __future__ import annotations

from django.contrib import admin

from approvals.models import Approval
from runs.admin import ReadOnlyAdmin


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ["effect", "user", "args_hash", "at"]
