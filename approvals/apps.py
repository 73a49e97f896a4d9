from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


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
        # A flush (as transactional tests do) empties auth_group; bring the roles back.
        post_migrate.connect(
            _ensure_roles_after_migrate, sender=self, dispatch_uid="startsafe_ensure_roles"
        )
