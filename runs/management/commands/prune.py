from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from runs.prune import prune_finished_runs


class Command(BaseCommand):
    help = (
        "Delete finished runs (completed or abandoned) unchanged for DAYS days, with "
        "their attempts, calls and effects; each key they recorded keeps a tombstone "
        "with its outcome, so a key redelivered later is still deduplicated."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            type=float,
            required=True,
            metavar="DAYS",
            help="prune finished runs whose last change is older than this many days",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="say what would be pruned, change nothing"
        )

    def handle(self, *args, **options):
        days = options["older_than"]
        # A negative or absurd age would prune runs that just finished (or overflow).
        if not 0 <= days <= 100_000:
            raise CommandError("--older-than must be a number of days from 0 to 100000.")
        report = prune_finished_runs(timedelta(days=days), dry_run=options["dry_run"])
        for line in report.lines():
            self.stdout.write(line)
