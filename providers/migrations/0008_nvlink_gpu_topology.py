from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("providers", "0007_mig_gpu_slices"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpu",
            name="nvlink_links_active",
            field=models.PositiveSmallIntegerField(
                blank=True, help_text="active NVLinks; null: the GPU reported none", null=True),
        ),
        migrations.AddField(
            model_name="gpu",
            name="nvlink_peers",
            field=models.JSONField(
                blank=True, default=list,
                help_text="PCI bus ids of this node's GPUs it reaches over NVLink (sorted)"),
        ),
        migrations.AddField(
            model_name="gpu",
            name="pcie_generation",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="gpu",
            name="pcie_width",
            field=models.PositiveSmallIntegerField(
                blank=True, help_text="PCIe lanes (max link width)", null=True),
        ),
    ]
