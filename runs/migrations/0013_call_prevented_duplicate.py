"""Calls say whether their key prevented a duplicate (``Call.prevented_duplicate``,
set by runs/calls.py when a call is recorded), so the insights page counts a period's
duplicates from a partial index of them alone, instead of joining the period's
skip/wait calls to their effects (half a second at the bench scale).

The calls recorded before this migration get the flag from the rule it replaces:
answered skip or wait on a keyed effect created before the call."""

from django.db import migrations, models
from django.db.models import F


def mark_past_duplicates(apps, schema_editor):
    Call = apps.get_model("runs", "Call")
    Call.objects.filter(
        action__in=("skip", "wait"),
        effect__key__isnull=False,
        at__gt=F("effect__created_at"),
    ).update(prevented_duplicate=True)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0012_insights_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="call",
            name="prevented_duplicate",
            field=models.BooleanField(db_default=False, default=False),
        ),
        # Backfilled while call_replay_at_idx still finds the skip/wait calls.
        migrations.RunPython(mark_past_duplicates, migrations.RunPython.noop, elidable=True),
        migrations.RemoveIndex(
            model_name="call",
            name="call_replay_at_idx",
        ),
        migrations.AddIndex(
            model_name="call",
            index=models.Index(
                condition=models.Q(("prevented_duplicate", True)),
                fields=["at", "tool"],
                name="call_duplicate_at_idx",
            ),
        ),
    ]
