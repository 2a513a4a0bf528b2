"""Real processes for the end-to-end tests: a Celery worker (with beat) on Redis
against the test database, and a runner (`python -m providers.runner`) talking
HTTP to pytest-django's live server on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import ROOT, require_or_skip
from tests.support.processes import child_env
from tests.support.waiting import wait_until


@pytest.fixture(scope="package")
def celery_worker_process(django_db_setup, tmp_path_factory):
    """A real Celery worker with beat, consuming from the Redis broker; stopped when
    tests/e2e ends, so it never takes tasks meant for a later package's own worker
    (tests/webhooks' worker, whose settings differ)."""
    if not settings.CELERY_BROKER_URL.startswith("redis"):
        require_or_skip("the end-to-end Celery test needs REDIS_URL (make test sets it)")
    logdir = tmp_path_factory.mktemp("celery")
    env = child_env(GPUMARKET_VAR_DIR=str(logdir))
    subprocess.run([sys.executable, "-m", "celery", "-A", "marketplace", "purge", "-f"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    log = open(logdir / "worker.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--beat", "--pool",
         "solo", "--loglevel", "INFO", "-s", str(logdir / "beat-schedule")],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    wait_until("the Celery worker to be ready",
               lambda: "ready" in (logdir / "worker.log").read_text(), timeout=60)
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


class Runner:
    def __init__(self, url: str, token: str, dump: Path, state: Path) -> None:
        self.url, self.token, self.dump, self.state = url, token, dump, state
        self.proc: subprocess.Popen | None = None
        self.log = state / "runner.log"

    def register(self) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "providers.runner", "register", "--url", self.url,
             "--token", self.token, "--simulate", str(self.dump), "--state-dir",
             str(self.state)],
            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60,
        )

    def start(self, runtime: str = "docker", *, network: str = "none",
              extra: tuple[str, ...] = ()) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(self.state),
             "--poll-interval", "0.3", "--runtime", runtime, "--network", network, *extra],
            cwd=ROOT, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def runner_factory(tmp_path, docker_client):
    made: list[Runner] = []

    def make(url: str, token: str, dump: Path) -> Runner:
        runner = Runner(url, token, dump, tmp_path / f"runner-{len(made)}")
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.stop()
    for runner in made:  # only what this test's runners made: their node's label
        config = runner.state / "config.json"
        uid = json.loads(config.read_text()).get("node", {}).get("uid") \
            if config.exists() else None
        if uid:
            for container in docker_client.containers.list(
                    all=True, filters={"label": f"gpumarket.node={uid}"}):
                container.remove(force=True)
