"""startsafe's own system checks (registered by runs.apps.RunsConfig.ready)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def check_development_env_file(app_configs, **kwargs) -> list[Warning]:
    """A deployment served from a folder where ``make run`` ran reads its var/dev.env:
    DEBUG=1 and the development SECRET_KEY for every variable the environment left unset.
    """
    path = settings.DEV_ENV_FILE
    if path is None:
        return []
    return [
        Warning(
            f"Settings read {path}, the development values that `make run` writes "
            "(DEBUG=1 and its own SECRET_KEY), for every variable the environment does "
            "not set.",
            hint=f"Delete {path} (or set STARTSAFE_VAR_DIR to another folder) before "
            "deploying from this folder.",
            id="startsafe.W001",
        )
    ]
