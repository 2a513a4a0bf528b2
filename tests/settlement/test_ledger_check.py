"""`manage.py ledger_check` (settlement/management/commands/ledger_check.py) run as the
operator runs it, against a database it cannot check: one clear line and a non-zero
exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT
from tests.support.net import free_port


def _ledger_check(database_url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.run([sys.executable, "manage.py", "ledger_check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _server() -> dict:
    cfg = connection.settings_dict
    return {"user": cfg["USER"] or "postgres", "host": cfg["HOST"] or "127.0.0.1",
            "port": int(cfg["PORT"] or 5432), "password": cfg["PASSWORD"] or None}


@pytest.fixture
def empty_database():
    """A fresh PostgreSQL database with no tables, dropped afterwards; its URL."""
    server = _server()
    name = f"gpumarket_unmigrated_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    auth = server["user"] + (f":{server['password']}" if server["password"] else "")
    yield f"postgres://{auth}@{server['host']}:{server['port']}/{name}"
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_ledger_check_on_an_unmigrated_database_says_to_run_migrate(empty_database):
    done = _ledger_check(empty_database)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "manage.py migrate" in lines[0]


def test_ledger_check_without_a_database_server_says_so_in_one_line():
    port = free_port()  # a port nothing listens on
    done = _ledger_check(f"postgres://postgres@127.0.0.1:{port}/gpumarket")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect to the database" in lines[0], done.stderr
