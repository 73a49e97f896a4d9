"""RestartHandoff and TaskState move from the approvals app to runs, rows and all.

The sweep owns them, and ``runs/`` never imports ``approvals/``. Only Django's idea
of which app holds them changes: the tables keep their names (``db_table``), so no
row is copied and no statement touches them (SeparateDatabaseAndState). Their
content types follow them, so permissions granted on them stay granted.
"""

import django.db.models.deletion
from django.db import migrations, models

MOVED = ["restarthandoff", "taskstate"]


def content_types_to(app_label: str, from_label: str):
    def move(apps, schema_editor):
        ContentType = apps.get_model("contenttypes", "ContentType")
        ContentType.objects.using(schema_editor.connection.alias).filter(
            app_label=from_label, model__in=MOVED
        ).update(app_label=app_label)

    return move


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_run_verdict_blocked"),
        ("approvals", "0003_background_work"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="TaskState",
                    fields=[
                        ("name", models.CharField(max_length=50, primary_key=True, serialize=False)),
                        ("last_started_at", models.DateTimeField(blank=True, null=True)),
                        ("last_duration", models.FloatField(default=0.0)),
                        ("last_error", models.TextField(blank=True, default="")),
                        ("runs_total", models.PositiveBigIntegerField(default=0)),
                        ("errors_total", models.PositiveBigIntegerField(default=0)),
                        ("counters", models.JSONField(blank=True, default=dict)),
                    ],
                    options={"db_table": "approvals_taskstate"},
                ),
                migrations.CreateModel(
                    name="RestartHandoff",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("attempt", models.PositiveIntegerField()),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("pending", "Pending"),
                                    ("sending", "Sending"),
                                    ("sent", "Sent"),
                                    ("obsolete", "Obsolete"),
                                    ("given_up", "Given Up"),
                                ],
                                default="pending",
                                max_length=10,
                            ),
                        ),
                        ("due_at", models.DateTimeField()),
                        ("tries", models.PositiveIntegerField(default=0)),
                        ("failures", models.PositiveIntegerField(default=0)),
                        ("last_answer", models.JSONField(blank=True, default=dict)),
                        ("created_at", models.DateTimeField()),
                        ("updated_at", models.DateTimeField()),
                        (
                            "run",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="handoffs",
                                to="runs.run",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "approvals_restarthandoff",
                        "indexes": [
                            models.Index(
                                condition=models.Q(("status__in", ["pending", "sending"])),
                                fields=["due_at"],
                                name="handoff_due_idx",
                            )
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("run", "attempt"), name="handoff_unique_per_attempt"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(
            content_types_to("runs", from_label="approvals"),
            content_types_to("approvals", from_label="runs"),
        ),
    ]
