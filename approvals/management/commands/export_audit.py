from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from approvals.audit_export import (
    EXPORT_FORMATS,
    AuditFilterForm,
    audit_events,
    audit_filters,
    audit_rows,
)


class Command(BaseCommand):
    help = (
        "Write the audit log as CSV or NDJSON (the columns of /history/export.csv, "
        "README 'Exporting the audit log'), newest first, with the history page's "
        "filters; to standard output unless --output is given. Streamed: constant "
        "memory however many rows."
    )

    def add_arguments(self, parser):
        parser.add_argument("--format", choices=sorted(EXPORT_FORMATS), required=True)
        parser.add_argument("--agent", help="the agent's name")
        parser.add_argument("--verb", help="one verb, e.g. approved")
        parser.add_argument("--since", metavar="ISO", help="from this date or time (included)")
        parser.add_argument(
            "--until",
            metavar="ISO",
            help="before this time; a date alone includes that whole day",
        )
        parser.add_argument("--run", metavar="RUN_ID", help="one run's id")
        parser.add_argument("--output", metavar="FILE", help="write here, not to stdout")

    def handle(self, *args, **options):
        # The page's form reads the filters, so both accept and mean the same values;
        # here a value it rejects is an error rather than ignored.
        given = {name: options[name] for name in AuditFilterForm.base_fields if options[name]}
        form = AuditFilterForm(given)
        if not form.is_valid():
            problems = "; ".join(f"--{name}: {' '.join(e)}" for name, e in form.errors.items())
            raise CommandError(problems)
        encode, _ = EXPORT_FORMATS[options["format"]]
        count = 0

        def counted(rows):
            nonlocal count
            for row in rows:
                count += 1
                yield row

        lines = encode(counted(audit_rows(audit_events(audit_filters(given)))))
        if options["output"]:
            # newline="": the CSV's \r\n is written as it is.
            with open(options["output"], "w", encoding="utf-8", newline="") as out:
                out.writelines(lines)
        else:
            for chunk in lines:
                self.stdout.write(chunk, ending="")
        self.stderr.write(f"{count} rows written.", style_func=lambda text: text)
