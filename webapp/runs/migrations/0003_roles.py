"""The roles as groups: operators may create, run, break and heal runs; any signed-in
user may look; admins are superusers."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

OPERATOR_PERMISSIONS = ["add_run", "change_run", "delete_run", "operate_run", "inject_fault"]


def create_groups(apps, schema_editor):
    # Permissions are normally made after all migrations; the groups need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    Group.objects.get_or_create(name="viewers")
    operators, _ = Group.objects.get_or_create(name="operators")
    operators.permissions.add(*Permission.objects.filter(
        content_type__app_label="runs", codename__in=OPERATOR_PERMISSIONS))


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["viewers", "operators"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0002_control_room"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(create_groups, remove_groups)]
