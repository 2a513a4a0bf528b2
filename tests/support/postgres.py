"""A private PostgreSQL server for one test module: initdb into a temporary directory, on a
free port of 127.0.0.1, with the settings a test asks for (e.g. max_connections=30).
PostgreSQL refuses to run as root: as root the server runs as the `postgres` user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import require_or_skip
from tests.support.net import free_port

BIN = Path("/usr/local/bin")


def _tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if path is None:
        require_or_skip(f"{name} is not installed (PostgreSQL server binaries)")
    return str(path)


class PrivatePostgres:
    """`start()` → a running server; `dsn(user, db)`; `stop()` (removes its files).
    Superuser: `postgres`. Its directory is under the system's temporary directory: the
    `postgres` user cannot reach into pytest's (root-only) tmp_path."""

    def __init__(self, **config: str | int) -> None:
        root = Path(tempfile.mkdtemp(prefix="gpumarket-pg-"))
        self.root, self.config = root, config
        self.data, self.log = root / "data", root / "server.log"
        self.port = free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(root, user.pw_uid, user.pw_gid)
            self._as = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                        "--init-groups", "--"]

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self._as, *args], capture_output=True, text=True,
                              timeout=120, cwd=self.root)
        log = self.log.read_text()[-2000:] if self.log.exists() else ""
        assert done.returncode == 0, f"{args[0]} failed: {done.stdout}{done.stderr}{log}"

    def start(self) -> PrivatePostgres:
        self._run(_tool("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync")
        options = " ".join(f"-c {k}={v}" for k, v in {
            "listen_addresses": "127.0.0.1", "unix_socket_directories": str(self.root),
            "fsync": "off", **self.config}.items())
        self._run(_tool("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-o", f"-p {self.port} {options}", "start")
        return self

    def stop(self) -> None:
        subprocess.run([*self._as, _tool("pg_ctl"), "-D", str(self.data), "-m", "immediate",
                        "-w", "stop"], capture_output=True, timeout=60, cwd=self.root)
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, user: str = "postgres", db: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{db}"

    def execute(self, *statements: str, db: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.dsn(db=db), autocommit=True) as conn:
            for sql in statements:
                conn.execute(sql)
