"""RestartHandoff and TaskState now belong to runs (runs 0010); their tables stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_background_work"),
        ("runs", "0010_handoff_and_task_state_move_here"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="TaskState"),
                migrations.DeleteModel(name="RestartHandoff"),
            ],
            database_operations=[],
        ),
    ]
