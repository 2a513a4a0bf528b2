"""The buyer CLI against a live marketplace: the real ASGI application under uvicorn on
127.0.0.1 (tests/support/servers.AsgiServer), the test database, Redis for the feed; the
CLI as its own process (`python -m buyer_cli`), with its config file in tmp_path. The
runner's side of a lease (starting, running, logs, end) is sent over HTTP with the node's
runner token, as a runner would. Nothing is mocked."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.factories import api_token, ask, funded_buyer, registered_node
from tests.support.servers import AsgiServer

PASSWORD = "correct-horse-battery"  # UserFactory's


@pytest.fixture
def server(transactional_db):
    """The live marketplace's base URL."""
    with AsgiServer() as live:
        yield live.url


@dataclass
class Gm:
    """Runs `gpumarket ARGS…` against `url` with its config file at `config`."""

    url: str
    config: Path
    started: list = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
        return {**clean, "GPUMARKET_CONFIG": str(self.config), "PYTHONUNBUFFERED": "1",
                **extra}

    def __call__(self, *args: str, stdin: str = "", timeout: float = 60, **env
                 ) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "buyer_cli", *args], cwd=ROOT,
                              input=stdin, capture_output=True, text=True, timeout=timeout,
                              env=self.env(**env))

    def popen(self, *args: str, **env) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-m", "buyer_cli", *args], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=self.env(**env))
        self.started.append(process)
        return process

    def login(self, user) -> str:
        """Log `user` in with a new API token (`login --token -`); returns the token."""
        token = api_token(user, "cli-test")
        done = self("login", "--url", self.url, "--token", "-", stdin=token + "\n")
        assert done.returncode == 0, done.stderr
        return token


@pytest.fixture
def gm(server, tmp_path):
    """`gm(*args)`: the CLI logged in nowhere yet; what it started is killed afterwards."""
    runs = Gm(server, tmp_path / "gm" / "config.json")
    yield runs
    for process in runs.started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        process.stdout.close()


@dataclass
class Market:
    """A provider's node with an ask of 8 H100 GPUs at $1.50 and a funded buyer."""

    provider: object
    node: object
    runner_token: str
    buyer: object
    url: str

    def runner(self, lease_id: int, path: str, body: dict) -> dict:
        """POST /api/v1/runner/leases/<id>/<path>/ as the node's runner does."""
        answer = httpx.post(f"{self.url}/api/v1/runner/leases/{lease_id}/{path}/", json=body,
                            headers={"Authorization": f"Bearer {self.runner_token}"},
                            timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def run(self, lease_id: int, **running) -> None:
        """The lease to running, as a runner reports it."""
        self.runner(lease_id, "events", {"status": "starting"})
        self.runner(lease_id, "events", {"status": "running", "container_id": "c0ffee",
                                         **running})


@pytest.fixture
def market(server) -> Market:
    provider, node, token = registered_node(name="cli-node")
    ask(provider, node, price=1_500_000, gpus=8)
    return Market(provider, node, token, funded_buyer(100), server)
