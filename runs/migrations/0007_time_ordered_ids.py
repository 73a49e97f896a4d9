# The ids of new runs, effects and calls are time-ordered (runs.models.time_ordered_id).
# Only Django's state changes: the default is Python's, the columns stay as they are
# (AlterField would rebuild the three tables on SQLite for nothing).

from django.db import migrations, models

import runs.models


def _id_field():
    return models.UUIDField(
        default=runs.models.time_ordered_id,
        editable=False,
        primary_key=True,
        serialize=False,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0006_drop_covered_fk_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name=model, name="id", field=_id_field())
                for model in ("call", "effect", "run")
            ],
            database_operations=[],
        ),
    ]
