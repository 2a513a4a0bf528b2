"""The environment of a process a test starts (a runner, uvicorn, Celery, a management
command): the test's own environment, the real settings and the test database."""

from __future__ import annotations

import os

from django.conf import settings


def child_env(**extra: str) -> dict[str, str]:
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "marketplace.settings",
           "PYTHONUNBUFFERED": "1", **extra}
    if db["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = (f"postgres://{db['USER'] or 'postgres'}@{db['HOST']}:"
                               f"{db['PORT'] or 5432}/{db['NAME']}")
    return env
