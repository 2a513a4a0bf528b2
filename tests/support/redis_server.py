"""A private `redis-server` on a free 127.0.0.1 port, without persistence, that a test
can kill (SIGKILL: nothing saved) and start again empty on the same port."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import redis

from tests.conftest import require_or_skip
from tests.support.net import free_port


class PrivateRedis:
    """`url` (database 0); `start()` waits until it answers PING; `kill()` waits until
    the process is gone; `restart()` is both: a server that has lost all its data."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if shutil.which("/usr/bin/redis-server") else None)
        if binary is None:
            require_or_skip("redis-server is not installed: cannot start a private Redis")
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the server)
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None:
                self._log.seek(0)
                out = self._log.read().decode(errors="replace")
                pytest.fail(f"redis-server exited with {self.proc.returncode}:\n{out[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"redis-server did not answer within {timeout} s")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)
