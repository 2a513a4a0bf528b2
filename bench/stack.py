"""The running stack the runner benches share: a fresh migrated database, uvicorn serving
the marketplace, and the real runner registered with `--simulate` and running with the
Docker runtime (`--network none`) — started in order, stopped in reverse, the node's
containers removed at the end.

    env = migrated_database(pg, db, redis)      # os.environ updated; then set_up()
    with Stack(port, token, env, run_args=("--grace", "1")) as stack:
        stack.wait_heartbeat(node_id); stack.wait_push()
        ... stack.base, stack.runner (Popen), stack.log ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.api_orders import fresh_database, server_env
from bench.handoff import DUMP, _up, wait

ROOT = Path(__file__).resolve().parent.parent


def migrated_database(pg: str, db: str, redis: str) -> dict[str, str]:
    """Drop, create and migrate `db`; the servers' environment (also set in os.environ)."""
    env = {**server_env(fresh_database(pg, db)), "REDIS_URL": redis}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    return env


class Stack:
    """uvicorn on 127.0.0.1:`port` and a runner for the node of `token` (state in a temp
    directory, its log at `log`); `run_args` go to `providers.runner run`."""

    def __init__(self, port: int, token: str, env: dict[str, str], *,
                 run_args: tuple[str, ...] = (), dump: Path = DUMP, prefix: str = "bench") -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.port, self.token, self.env, self.dump = port, token, env, dump
        self.run_args = run_args
        self.state = Path(tempfile.mkdtemp(prefix=f"{prefix}-runner-"))
        self.log = self.state / "runner.log"
        self.procs: list[subprocess.Popen] = []
        self.runner: subprocess.Popen | None = None
        self.node_uid: str | None = None

    def __enter__(self) -> Stack:
        from django.db import connections

        connections.close_all()  # the servers are other processes: no connection to share
        try:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host",
                 "127.0.0.1", "--port", str(self.port), "--workers", "1", "--no-access-log",
                 "--log-level", "warning"], cwd=ROOT, env=self.env))
            wait(lambda: _up(self.base), 30, "uvicorn", step=0.1)
            runner = [sys.executable, "-m", "providers.runner"]
            subprocess.run([*runner, "register", "--url", self.base, "--token", self.token,
                            "--simulate", str(self.dump), "--state-dir", str(self.state)],
                           cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            out = open(self.log, "w")
            self.runner = subprocess.Popen(
                [*runner, "run", "--state-dir", str(self.state), "--runtime", "docker",
                 "--network", "none", *self.run_args],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
            self.procs.append(self.runner)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def wait_heartbeat(self, node_id: int) -> None:
        from providers.models import Node

        wait(lambda: Node.objects.filter(pk=node_id, last_heartbeat_at__isnull=False)
             .exists(), 30, "the runner's first heartbeat", step=0.05)
        self.node_uid = str(Node.objects.get(pk=node_id).uid)

    def wait_push(self) -> None:
        wait(lambda: "connected;" in self.log.read_text(), 30, "the runner's push websocket",
             step=0.05)

    def __exit__(self, *exc) -> None:
        import docker
        from django.db import connections

        for proc in reversed(self.procs):
            proc.terminate()
            proc.wait(timeout=30)
        self.procs.clear()
        connections.close_all()
        if self.node_uid is None:
            return
        client = docker.from_env(timeout=30)
        for container in client.containers.list(all=True, filters={"label": "gpumarket.lease"}):
            if container.labels.get("gpumarket.node") == self.node_uid:
                container.remove(force=True)
