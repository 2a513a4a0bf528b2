"""Webhook tests' real parts: receivers on 127.0.0.1 (tests/support/webhooks.py) and a
real Celery worker with beat on the Redis broker (a thread pool, so a hanging receiver
holds one thread only)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from django.conf import settings

from tests.conftest import ROOT, require_or_skip
from tests.support.processes import child_env
from tests.support.waiting import wait_until
from tests.support.webhooks import receiver_factory  # noqa: F401 (a fixture)


@pytest.fixture
def allow_private(settings):
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = True  # the receivers are on 127.0.0.1


def _other_workers(env: dict, own: str) -> list[str]:
    """Names of the Celery workers on this broker other than `own` (remote-control ping)."""
    answer = subprocess.run([sys.executable, "-m", "celery", "-A", "marketplace", "inspect",
                             "ping", "--json", "-t", "1"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    try:
        replies = json.loads(answer.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return []  # no node replied
    return sorted(name for name in replies if name != own)


@pytest.fixture(scope="package")
def webhook_worker(django_db_setup, tmp_path_factory):
    """A real Celery worker with beat on Redis, allowed to reach 127.0.0.1, retrying
    after 0.5 s (doubling), sweeping and evaluating alert rules every 0.5 s. It must be
    the broker's only worker: another (with default settings) would take its tasks,
    refuse 127.0.0.1 and push the retries out past every wait here."""
    if not settings.CELERY_BROKER_URL.startswith("redis"):
        require_or_skip("the webhook worker tests need REDIS_URL (make test sets it)")
    logdir = tmp_path_factory.mktemp("webhook-worker")
    env = child_env(GPUMARKET_VAR_DIR=str(logdir), GPUMARKET_WEBHOOK_ALLOW_PRIVATE="1",
                    GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS="0.5",
                    GPUMARKET_WEBHOOK_RETRY_MAX_SECONDS="2",
                    GPUMARKET_WEBHOOK_SWEEP_SECONDS="0.5",
                    GPUMARKET_ALERT_EVALUATE_SECONDS="0.5",
                    GPUMARKET_WEBHOOK_READ_TIMEOUT_SECONDS="30")
    subprocess.run([sys.executable, "-m", "celery", "-A", "marketplace", "purge", "-f"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    log = open(logdir / "worker.log", "w")  # noqa: SIM115
    own = f"webhook-tests-{os.getpid()}@{socket.gethostname()}"
    others = _other_workers(env, own)
    if others:
        pytest.fail(f"other Celery workers consume from this broker: {', '.join(others)}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--beat", "--pool",
         "threads", "--concurrency", "4", "--loglevel", "INFO", "-n", own,
         "-s", str(logdir / "beat-schedule")],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    wait_until("the Celery worker to be ready",
               lambda: "ready" in (logdir / "worker.log").read_text(), timeout=60)
    others = _other_workers(env, own)
    if others:
        proc.terminate()
        pytest.fail(f"other Celery workers consume from this broker: {', '.join(others)}")
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
