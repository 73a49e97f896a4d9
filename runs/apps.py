from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Journal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from startsafe import checks  # noqa: F401  (registers the project's system checks)
