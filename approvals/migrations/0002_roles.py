"""The operators and admins groups, each carrying its whole role.

Adding a user to a group is all it takes: the admin site lets members of either
group in (see ``startsafe/admin.py``), so nobody needs ``is_staff`` as well.
"""

from django.db import migrations

OPERATOR_PERMISSIONS = [
    ("approvals", "decide"),
    ("approvals", "view_approval"),
    ("runs", "view_run"),
    ("runs", "view_attempt"),
    ("runs", "view_call"),
    ("runs", "view_effect"),
    ("runs", "view_effectversion"),
]

ADMIN_PERMISSIONS = OPERATOR_PERMISSIONS + [
    ("approvals", "view_history"),
    ("runs", "view_auditevent"),
    ("runs", "view_agent"),
    ("runs", "add_agent"),
    ("runs", "change_agent"),
]


def create_roles(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after all migrations; the groups need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None

    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, wanted in (("operators", OPERATOR_PERMISSIONS), ("admins", ADMIN_PERMISSIONS)):
        group, _ = Group.objects.get_or_create(name=name)
        for app_label, codename in wanted:
            permission = Permission.objects.get(content_type__app_label=app_label, codename=codename)
            group.permissions.add(permission)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["operators", "admins"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0001_initial"),
        ("runs", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
