"""Load the catalog of issue 13 (whole-GPU classes, MIG profile markets) and move each
registered whole GPU whose product name now maps to another class (the 16 GB V100s leave
`v100`, which stays the SXM2 32 GB). Re-runnable: `manage.py load_catalog` does the same
(docs/CATALOG.md)."""

from django.db import migrations


def load(apps, schema_editor):
    from marketplace.catalog import load_catalog, reclassify_gpus

    gpu_class = apps.get_model("marketplace", "GpuClass")
    load_catalog(gpu_class)
    reclassify_gpus(apps.get_model("providers", "Gpu"), apps.get_model("marketplace", "Order"),
                    apps.get_model("marketplace", "LeaseGpu"), gpu_class)


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0012_catalog_mig_classes"),
        ("providers", "0006_node_token_rotated_at"),
    ]
    operations = [migrations.RunPython(load, migrations.RunPython.noop)]
