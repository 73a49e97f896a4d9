"""Indexes for the insights page (approvals/insights.py): the period's approval events,
drift holds and replayed calls, each a range scan of a small partial index instead
of reading every audit event, effect or call of the period."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0011_tool_registry"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(
                    ("new_status", "awaiting_approval"),
                    ("old_status", "awaiting_approval"),
                    _connector="OR",
                ),
                fields=["at"],
                name="audit_awaiting_at_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="effect",
            index=models.Index(
                condition=models.Q(("hold__isnull", False)),
                fields=["created_at"],
                name="effect_held_created_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="call",
            index=models.Index(
                condition=models.Q(("action__in", ["skip", "wait"])),
                fields=["at"],
                name="call_replay_at_idx",
            ),
        ),
    ]
