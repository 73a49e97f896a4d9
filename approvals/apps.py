from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate, post_save


def _ensure_roles_after_migrate(sender, using="default", apps=None, **kwargs) -> None:
    from django.apps import apps as global_apps

    from approvals.roles import ensure_roles

    apps = apps or global_apps  # flush sends no migration state
    try:
        apps.get_model("approvals", "Approval")
        apps.get_model("runs", "Run")
    except LookupError:
        return  # migrating backwards past our tables
    ensure_roles(apps=apps, using=using)


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals import signals, slack
        from runs.models import AuditEvent
        from runs.signals import runs_need_person

        # Structured logs of every state change: the audit row is the one place all
        # of them pass through (runs/audit.py), so one receiver logs them all.
        post_save.connect(
            signals.log_audit_event, sender=AuditEvent, dispatch_uid="startsafe_log_audit_event"
        )
        # Slack messages follow every change they show, whoever made it (console,
        # Slack, e-mail link, expiry): the audit row is where all of them pass.
        post_save.connect(
            slack.sync_after_commit, sender=AuditEvent, dispatch_uid="startsafe_slack_sync"
        )
        runs_need_person.connect(
            signals.tell_operators_runs_need_person,
            dispatch_uid="startsafe_tell_operators_runs_need_person",
        )
        # A flush (as transactional tests do) empties auth_group; bring the roles back.
        post_migrate.connect(
            _ensure_roles_after_migrate, sender=self, dispatch_uid="startsafe_ensure_roles"
        )
