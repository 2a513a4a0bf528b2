"""The environment of a process a test starts (a runner, uvicorn, Celery, a management
command): the test's own environment, the real settings and the test database."""

from __future__ import annotations

import os

from django.conf import settings


def child_env(**extra: str) -> dict[str, str]:
    """Also the test process's GPUMARKET_SECRETS_KEY (its development key unless one is
    set), so a child opens the secrets the test sealed, whatever its DEBUG."""
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "marketplace.settings",
           "PYTHONUNBUFFERED": "1",
           "GPUMARKET_SECRETS_KEY": ",".join(settings.GPUMARKET_SECRETS_KEYS), **extra}
    if db["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = (f"postgres://{db['USER'] or 'postgres'}@{db['HOST']}:"
                               f"{db['PORT'] or 5432}/{db['NAME']}")
    return env
