from __future__ import annotations

from django.core.management.base import BaseCommand

from runs.sweep import sweep


class Command(BaseCommand):
    help = "Run one sweep now: interrupt stale runs, time out effects, expire approvals."

    def handle(self, *args, **options):
        report = sweep()
        self.stdout.write(f"Sweep done: {report.summary()}.")
