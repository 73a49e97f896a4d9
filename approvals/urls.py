"""The console's addresses, fixed by product.md ("Console addresses and forms").

Each action's form class (``approvals/forms.py``) says which action ``decide`` takes.
"""

from __future__ import annotations

from django.urls import path

from approvals import views, views_export, views_insights, views_links, views_tools
from approvals.forms import (
    AbandonForm,
    AllowRestartForm,
    ApproveForm,
    MarkDoneForm,
    RejectForm,
    ReleaseForm,
)
from approvals.views_actions import bulk, decide, edit

app_name = "console"

RUN = "runs/<uuid:run_id>/"
EFFECT = "effects/<uuid:effect_id>/"
TOOL = "tools/<uuid:tool_id>/"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("runs/", views.runs, name="runs"),
    path(RUN, views.run_detail, name="run"),
    path(RUN + "allow-restart", decide, {"form_class": AllowRestartForm}, name="allow-restart"),
    path(RUN + "abandon", decide, {"form_class": AbandonForm}, name="abandon"),
    path("effects/bulk", bulk, name="bulk"),
    path(EFFECT, views.effect_detail, name="effect"),
    path(EFFECT + "edit", edit, name="edit"),
    path(EFFECT + "approve", decide, {"form_class": ApproveForm}, name="approve"),
    path(EFFECT + "reject", decide, {"form_class": RejectForm}, name="reject"),
    path(EFFECT + "mark-done", decide, {"form_class": MarkDoneForm}, name="mark-done"),
    path(EFFECT + "release", decide, {"form_class": ReleaseForm}, name="release"),
    path("history/", views.history, name="history"),
    path(
        "history/export.csv",
        views_export.history_export,
        {"fmt": "csv"},
        name="history-export-csv",
    ),
    path(
        "history/export.ndjson",
        views_export.history_export,
        {"fmt": "ndjson"},
        name="history-export-ndjson",
    ),
    path("insights/", views_insights.insights_page, name="insights"),
    # A signed e-mail link: GET confirms, POST decides (approvals/links.py).
    path("links/<str:token>/", views_links.link, name="link"),
    path("tools/", views_tools.tools, name="tools"),
    path(TOOL, views_tools.tool_detail, name="tool"),
    path(TOOL + "confirm", views_tools.tool_confirm, name="tool-confirm"),
    path(TOOL + "policy", views_tools.edit_policy, name="tool-policy"),
]
