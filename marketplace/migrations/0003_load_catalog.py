from django.db import migrations


def load(apps, schema_editor):
    from marketplace.catalog import load_catalog

    load_catalog(apps.get_model("marketplace", "GpuClass"))


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0002_initial")]
    operations = [migrations.RunPython(load, migrations.RunPython.noop)]
