"""Webhook tests' real parts: a receiver (http.server in a thread on 127.0.0.1 that
verifies each signature with the endpoint's secret) and a real Celery worker with beat
on the Redis broker (a thread pool, so a hanging receiver holds one thread only)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings

from tests.conftest import ROOT, require_or_skip
from tests.support.net import free_port
from tests.support.processes import child_env
from tests.support.waiting import wait_until
from webhooks import signing


class Receiver:
    """A webhook receiver on 127.0.0.1:`port`. `secret` set: each request's signature is
    checked. `answer` is the status it answers; `hang` (an Event) holds each request
    until it is set. `events` are the verified bodies, in arrival order."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.secret = ""
        self.answer = 200
        self.hang: threading.Event | None = None
        self.events: list[dict] = []
        self.bad_signatures = 0
        self.arrived = threading.Event()  # a request came in (even one still held)
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks?x=1"

    def ids(self) -> list[str]:
        return [e["id"] for e in self.events]

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.arrived.set()
                if receiver.hang is not None:
                    receiver.hang.wait(60)
                if signing.verify(receiver.secret, body,
                                  self.headers.get(signing.HEADER, "")):
                    receiver.events.append(json.loads(body))
                else:
                    receiver.bad_signatures += 1
                self.send_response(receiver.answer)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            if self.hang is not None:
                self.hang.set()
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def receiver_factory():
    made: list[Receiver] = []

    def make(port: int | None = None, *, start: bool = True) -> Receiver:
        receiver = Receiver(port)
        made.append(receiver)
        return receiver.start() if start else receiver

    yield make
    for receiver in made:
        receiver.stop()


@pytest.fixture
def allow_private(settings):
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = True  # the receivers are on 127.0.0.1


@pytest.fixture(scope="session")
def webhook_worker(django_db_setup, tmp_path_factory):
    """A real Celery worker with beat on Redis, allowed to reach 127.0.0.1, retrying
    after 0.5 s (doubling) and sweeping every 0.5 s."""
    if not settings.CELERY_BROKER_URL.startswith("redis"):
        require_or_skip("the webhook worker tests need REDIS_URL (make test sets it)")
    logdir = tmp_path_factory.mktemp("webhook-worker")
    env = child_env(GPUMARKET_VAR_DIR=str(logdir), GPUMARKET_WEBHOOK_ALLOW_PRIVATE="1",
                    GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS="0.5",
                    GPUMARKET_WEBHOOK_RETRY_MAX_SECONDS="2",
                    GPUMARKET_WEBHOOK_SWEEP_SECONDS="0.5",
                    GPUMARKET_WEBHOOK_READ_TIMEOUT_SECONDS="30")
    subprocess.run([sys.executable, "-m", "celery", "-A", "marketplace", "purge", "-f"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    log = open(logdir / "worker.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--beat", "--pool",
         "threads", "--concurrency", "4", "--loglevel", "INFO",
         "-s", str(logdir / "beat-schedule")],
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
