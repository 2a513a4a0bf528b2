"""Celery workers and beat run without the database pool (marketplace/celery.py): under
prefork Celery closes the process's pool around every task, and the live feed's publisher
thread then found "the pool 'gpumarket' is closed"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = """
import django
django.setup()
from django.db import connection
before = bool(connection.settings_dict.get("OPTIONS", {}).get("pool"))
from celery.signals import SIGNAL
from marketplace.celery import app
SIGNAL.send(sender=None, instance=None, conf=app.conf, options={})
after = bool(connection.settings_dict.get("OPTIONS", {}).get("pool"))
print(before, after, connection.pool is None)  # the pool is made here, on first use
"""


@pytest.mark.parametrize("signal", ["celeryd_init", "beat_init"])
def test_a_worker_or_beat_takes_connections_without_the_pool(signal):
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.fail("needs DATABASE_URL on PostgreSQL (the pool is PostgreSQL's)")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "marketplace.settings",
           "GPUMARKET_DB_POOL": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT.replace("SIGNAL", signal)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "True"], done.stdout
