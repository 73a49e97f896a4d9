"""The operators and admins groups, each carrying its whole role (product.md, "Roles").

Created by the migration ``0002_roles`` and made sure of after every ``migrate`` and
``flush`` (post_migrate), so a database emptied by tests or by hand gets them back.
"""

from __future__ import annotations

from django.apps import apps as global_apps

OPERATOR_PERMISSIONS = [
    ("approvals", "decide"),
    ("approvals", "view_approval"),
    ("runs", "view_run"),
    ("runs", "view_attempt"),
    ("runs", "view_call"),
    ("runs", "view_effect"),
    ("runs", "view_effectversion"),
    # The tool registry: everyone with a role reads tools and their policies.
    ("runs", "view_tool"),
    ("runs", "view_tooldeclaration"),
    ("runs", "view_toolpolicy"),
]

ADMIN_PERMISSIONS = OPERATOR_PERMISSIONS + [
    ("approvals", "view_history"),
    ("runs", "view_auditevent"),
    ("runs", "view_agent"),
    ("runs", "add_agent"),
    ("runs", "change_agent"),
    # Admins confirm tools (change_tool) and edit their policies.
    ("runs", "change_tool"),
    ("runs", "add_toolpolicy"),
    ("runs", "change_toolpolicy"),
    # Admins say which Slack member is which console user (approvals/slack.py).
    ("approvals", "view_slackusermapping"),
    ("approvals", "add_slackusermapping"),
    ("approvals", "change_slackusermapping"),
    ("approvals", "delete_slackusermapping"),
]

ROLES = {"operators": OPERATOR_PERMISSIONS, "admins": ADMIN_PERMISSIONS}


def ensure_roles(apps=global_apps, using: str = "default", **kwargs) -> None:
    """Create the groups and give each its permissions; safe to run any number of times."""
    from django.contrib.auth.management import create_permissions

    for label in ("runs", "approvals"):
        # The global app config (its models are loaded); ``apps`` may be migration state.
        create_permissions(global_apps.get_app_config(label), verbosity=0, using=using, apps=apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, wanted in ROLES.items():
        group, _ = Group.objects.using(using).get_or_create(name=name)
        for app_label, codename in wanted:
            permission = Permission.objects.using(using).get(
                content_type__app_label=app_label, codename=codename
            )
            group.permissions.add(permission)
