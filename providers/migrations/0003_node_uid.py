import uuid

from django.db import migrations, models


def fill(apps, schema_editor):
    Node = apps.get_model("providers", "Node")
    for node in Node.objects.filter(uid__isnull=True):
        node.uid = uuid.uuid4()
        node.save(update_fields=["uid"])


class Migration(migrations.Migration):
    dependencies = [("providers", "0002_gpu_health")]
    operations = [
        migrations.AddField("node", "uid", models.UUIDField(null=True, editable=False)),
        migrations.RunPython(fill, migrations.RunPython.noop),
        migrations.AlterField("node", "uid", models.UUIDField(
            default=uuid.uuid4, unique=True, editable=False,
            help_text="labels the node's containers (unique across databases)")),
    ]
