from __future__ import annotations

from django.db import models


class Effect(models.Model):
    """The three columns of the project's effect table that the baseline answers."""

    id = models.UUIDField(primary_key=True)
    status = models.CharField(max_length=32)
    revision = models.IntegerField()

    class Meta:
        managed = False
        db_table = "runs_effect"

    def __str__(self) -> str:
        return str(self.id)
