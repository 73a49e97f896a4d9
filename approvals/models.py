"""People's approvals of an effect's arguments.

An approval names the ``args_hash`` the operator was shown; only approvals of the
current version count, so a change of arguments silently stops older ones from
counting, and the unique constraint keeps one operator from approving one version
twice (the two-person rule counts distinct operators).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.models import Effect


class Approval(models.Model):
    effect = models.ForeignKey(Effect, on_delete=models.CASCADE, related_name="approvals")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    args_hash = models.CharField(max_length=64)
    note = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ["effect", "at"]
        permissions = [
            ("decide", "Can approve, reject, mark done, release, allow restart and abandon"),
            ("view_history", "Can see the restart history and the audit log"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["effect", "user", "args_hash"], name="one_approval_per_operator_per_version"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} approved {self.effect_id}"
