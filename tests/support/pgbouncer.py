"""A private PgBouncer (Debian's `pgbouncer`) in transaction mode on a free port of
127.0.0.1, in front of a PostgreSQL server: every database name is passed through to
it, as user `postgres` (auth_type any). PgBouncer refuses to run as root: as root it
runs as the `postgres` user. `route_through(bouncer)` points the test process's
connections (and child_env's children) at it until the context ends."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import require_or_skip
from tests.support.net import free_port


class PgBouncer:
    """`start()` → a running pgbouncer; `stop()` (removes its files)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5432, *, pool_size: int = 20,
                 listen: str = "127.0.0.1") -> None:
        self.binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(self.binary).exists():
            require_or_skip("pgbouncer is not installed (apt-get install pgbouncer)")
        self.root = Path(tempfile.mkdtemp(prefix="gpumarket-pgbouncer-"))
        self.host, self.listen, self.port = host, listen, free_port()
        self.log = self.root / "pgbouncer.log"
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port} user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = {listen}\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 400\n"
            # Django's SET TIME ZONE is tracked and replayed per transaction by PgBouncer
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log}\npidfile = {self.root / 'pgbouncer.pid'}\n"
            "server_reset_query =\n")
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                        "--init-groups", "--"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> PgBouncer:
        self.proc = subprocess.Popen([*self._as, self.binary, str(self.root / "pgbouncer.ini")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.log.read_text()[-2000:] if self.log.exists() else ""
                    raise AssertionError(f"pgbouncer did not start: {log}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, db: str = "postgres") -> str:
        return f"postgres://postgres@{self.listen}:{self.port}/{db}"


@contextmanager
def route_through(bouncer: PgBouncer):
    """The default database's connections go through `bouncer` with the settings of
    GPUMARKET_DB_PGBOUNCER=1 (marketplace/settings.py); children get that setting too."""
    from django.conf import settings
    from django.db import connections

    db = connections["default"].settings_dict  # the very dict every thread's wrapper uses
    saved = {k: db.get(k) for k in ("HOST", "PORT", "DISABLE_SERVER_SIDE_CURSORS")}
    options = dict(db.get("OPTIONS", {}))
    was = (getattr(settings, "GPUMARKET_DB_PGBOUNCER", False),
           os.environ.get("GPUMARKET_DB_PGBOUNCER"))
    _close_everything()
    db.update(HOST=bouncer.listen, PORT=str(bouncer.port), DISABLE_SERVER_SIDE_CURSORS=True)
    # (the test process keeps its pool, now of connections to PgBouncer: threads that
    # outlive a switch give their connection back to the pool they took it from)
    db["OPTIONS"] = {**options, "prepare_threshold": None}
    settings.GPUMARKET_DB_PGBOUNCER = True
    os.environ["GPUMARKET_DB_PGBOUNCER"] = "1"
    try:
        yield bouncer
    finally:
        _close_everything()
        db.update(saved)
        db["OPTIONS"] = options
        settings.GPUMARKET_DB_PGBOUNCER = was[0]
        if was[1] is None:
            os.environ.pop("GPUMARKET_DB_PGBOUNCER", None)
        else:
            os.environ["GPUMARKET_DB_PGBOUNCER"] = was[1]


def _close_everything() -> None:
    from django.db import connections

    connection = connections["default"]
    connection.close()
    if hasattr(connection, "close_pool"):
        connection.close_pool()
