"""The Celery app: broker from CELERY_BROKER_URL (Redis in tests and production, a
filesystem queue in the embedded demo); tasks in marketplace/tasks.py.

Workers and beat take their database connections without the pool (GPUMARKET_DB_POOL):
Celery closes connections around every task, and under prefork it closes the process's
pool itself, under the feet of the live feed's publisher thread ("the pool is closed")."""

import os

from celery import Celery
from celery.signals import beat_init, celeryd_init

from core import metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")

app = Celery("gpumarket")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
metrics.connect_celery()  # celery-exporter's task counters (core/metrics.py)


def without_db_pool(**_kwargs) -> None:
    """Drop the connection pool from every database of this process, before its first
    connection (the pool is made on first use)."""
    from django.conf import settings

    for database in settings.DATABASES.values():
        database.get("OPTIONS", {}).pop("pool", None)


celeryd_init.connect(without_db_pool, weak=False)
beat_init.connect(without_db_pool, weak=False)
