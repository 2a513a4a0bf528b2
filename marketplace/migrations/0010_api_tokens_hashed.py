"""API tokens stored hashed, expiring (marketplace/api_tokens.py), and websocket tickets.

Existing DRF tokens (rest_framework.authtoken, no longer installed: its table
`authtoken_token` kept each token in clear) are carried over hashed, so their users keep
working; they expire GPUMARKET_API_TOKEN_TTL_DAYS after this migration. The clear rows are
then deleted. Reversing it cannot bring the clear tokens back (only hashes remain)."""

import hashlib
from datetime import timedelta

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def carry_over_drf_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    from django.utils import timezone

    ApiToken = apps.get_model("marketplace", "ApiToken")
    expires_at = timezone.now() + timedelta(days=settings.GPUMARKET_API_TOKEN_TTL_DAYS)
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id, created FROM authtoken_token")
        rows = cursor.fetchall()
    ApiToken.objects.bulk_create(
        ApiToken(user_id=user_id, name="carried over", prefix=key[:6],
                 key_hash=hashlib.sha256(key.encode()).hexdigest(), expires_at=expires_at)
        for key, user_id, _created in rows)
    for (key, _user_id, created) in rows:  # auto_now_add: the original date set after
        ApiToken.objects.filter(key_hash=hashlib.sha256(key.encode()).hexdigest()).update(
            created_at=created)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):

    dependencies = [
        ('marketplace', '0009_sealed_bid_audit'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(blank=True, max_length=100)),
                ('prefix', models.CharField(editable=False, max_length=12)),
                ('key_hash', models.CharField(editable=False, max_length=64, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('expires_at', models.DateTimeField()),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-created_at', '-id'],
            },
        ),
        migrations.CreateModel(
            name='WsTicket',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key_hash', models.CharField(editable=False, max_length=64, unique=True)),
                ('expires_at', models.DateTimeField(db_index=True)),
                ('api_token', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='marketplace.apitoken')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
        ),
        migrations.RunPython(carry_over_drf_tokens, migrations.RunPython.noop),
    ]
