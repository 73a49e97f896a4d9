from __future__ import annotations

from django.core.management.base import BaseCommand

from runs.models import Run
from runs.verdict import blocked_runs_filter


class Command(BaseCommand):
    help = (
        "Mark every run whose journal has a blocking reason (runs/verdict.py) in the "
        "column the console's verdict filter reads (Run.verdict_blocked). The rules keep "
        "it as reasons appear, and migration 0009 filled it once; run this after a "
        "rolling deploy of that migration, since a web process of the old release "
        "records calls without keeping the column. Safe to run at any time."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="count the runs to mark, change nothing"
        )

    def handle(self, *args, **options):
        unmarked = Run.objects.filter(blocked_runs_filter(), verdict_blocked=False)
        # Marked without a reason: the column is never cleared, so this is a bug to
        # report, not to hide by changing the row.
        unexplained = Run.objects.filter(verdict_blocked=True).exclude(blocked_runs_filter())
        if options["dry_run"]:
            count = unmarked.count()
            self.stdout.write(f"{count} run(s) to mark as blocked (dry run: nothing changed).")
        else:
            count = unmarked.update(verdict_blocked=True)
            self.stdout.write(f"Marked {count} run(s) as blocked.")
        wrong = unexplained.count()
        if wrong:
            self.stderr.write(
                f"{wrong} run(s) are marked blocked although their journal has no blocking "
                "reason; left as they are. Please report this."
            )
