"""The Celery app: broker from CELERY_BROKER_URL (Redis in tests and production, a
filesystem queue in the embedded demo); tasks in marketplace/tasks.py."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")

app = Celery("gpumarket")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
