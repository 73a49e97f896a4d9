"""The console's addresses, fixed by product.md ("Console addresses and forms")."""

from __future__ import annotations

from django.urls import path

from approvals import views, views_actions

app_name = "console"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("runs/", views.runs, name="runs"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run"),
    path("runs/<uuid:run_id>/allow-restart", views_actions.allow_restart, name="allow-restart"),
    path("runs/<uuid:run_id>/abandon", views_actions.abandon, name="abandon"),
    path("effects/bulk", views_actions.bulk, name="bulk"),
    path("effects/<uuid:effect_id>/", views.effect_detail, name="effect"),
    path("effects/<uuid:effect_id>/edit", views_actions.edit, name="edit"),
    path("effects/<uuid:effect_id>/approve", views_actions.approve, name="approve"),
    path("effects/<uuid:effect_id>/reject", views_actions.reject, name="reject"),
    path("effects/<uuid:effect_id>/mark-done", views_actions.mark_done, name="mark-done"),
    path("effects/<uuid:effect_id>/release", views_actions.release, name="release"),
    path("history/", views.history, name="history"),
]
