"""Unauthenticated concurrency must not exhaust PostgreSQL (issue 10, item 5): the real
ASGI app under uvicorn (DEBUG=0) against a private PostgreSQL with max_connections=30,
started once for this module. The app connects as the role `app`; another tenant of the
same server (`tenant`) must still get a connection while the app is under attack; no
connection to be had is a 503 with Retry-After, never a 500."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import httpx
import psycopg
import pytest
from cryptography.fernet import Fernet

from tests.conftest import ROOT
from tests.support.net import free_port
from tests.support.postgres import PrivatePostgres
from tests.support.waiting import wait_until

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def pg():
    server = PrivatePostgres(max_connections=30,
                             superuser_reserved_connections=3).start()
    try:
        server.execute("CREATE ROLE app LOGIN", "CREATE ROLE tenant LOGIN",
                       "CREATE DATABASE market OWNER app")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def app(pg, tmp_path_factory):
    """(environment of the app's processes, API token of `alice`) on the migrated private
    database: DEBUG off, as in production."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    env.update(DATABASE_URL=pg.dsn("app", "market"), DEBUG="0", SECRET_KEY="x" * 50,
               GPUMARKET_SECRETS_KEY=Fernet.generate_key().decode(),
               ALLOWED_HOSTS="127.0.0.1", GPUMARKET_SSL_REDIRECT="0",
               GPUMARKET_VAR_DIR=str(tmp_path_factory.mktemp("var")),
               DJANGO_SETTINGS_MODULE="marketplace.settings", PYTHONUNBUFFERED="1")
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=600)
    made = subprocess.run(
        [*manage, "shell", "-c",
         "from django.contrib.auth.models import User;"
         "from marketplace import api_tokens;"
         f"u = User.objects.create_user('alice', password={PASSWORD!r});"
         "print(api_tokens.issue(user=u, name='test').key)"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=120)
    return env, made.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def serve(env: dict[str, str], **settings: str):
    """uvicorn marketplace.asgi:application on a free port with `settings` → base URL."""
    port = free_port()
    log = open(os.path.join(env["GPUMARKET_VAR_DIR"], f"uvicorn-{port}.log"), "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host",
         "127.0.0.1", "--port", str(port), "--no-access-log"],
        cwd=ROOT, env={**env, **settings}, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            with open(log.name) as out:
                raise AssertionError(f"uvicorn ended: {out.read()[-3000:]}")
        try:
            return httpx.get(f"{base}/api/v1/gpu-classes/", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until("uvicorn to answer", up, timeout=120)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def app_connections(watch: psycopg.Connection, *, waiting_on_lock: bool = False) -> int:
    sql = "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'"
    if waiting_on_lock:
        sql += " AND wait_event_type = 'Lock'"
    return watch.execute(sql).fetchone()[0]


def assert_503(response: httpx.Response, *, api: bool) -> None:
    assert response.status_code == 503, (response.status_code, response.text[:500])
    assert int(response.headers["retry-after"]) >= 1
    if api:
        assert "no database connection" in response.json()["detail"]
    else:
        assert response.headers["content-type"].startswith("text/html")
        assert "try again" in response.text


def test_sixty_concurrent_wrong_logins_get_no_500_and_other_tenants_still_connect(pg, app):
    """Before: every login held a connection while hashing its password; 60 at once took
    all 27 of the server's ordinary slots, the rest were 500s ("sorry, too many clients
    already") and the other tenant could not connect. Now the process holds at most its
    pool's connections (10), and none while it hashes."""
    env, _ = app
    # limits out of the way: this is about connections (the limits have their own tests)
    with serve(env, GPUMARKET_DB_POOL_MAX="10", GPUMARKET_LOGIN_RATE="1000/min",
               GPUMARKET_LOGIN_LOCKOUT_FAILURES="1000") as base:
        start = threading.Barrier(61)

        def wrong_login(i: int) -> httpx.Response:
            start.wait(timeout=60)
            return httpx.post(f"{base}/api/v1/auth/token/", timeout=600, json={
                "username": "alice" if i % 2 else f"nobody{i}", "password": f"wrong {i}"})

        tenant_errors: list[str] = []
        tenant_connections = most_app_connections = 0
        with ThreadPoolExecutor(60) as pool, psycopg.connect(pg.dsn(), autocommit=True) as watch:
            pending = {pool.submit(wrong_login, i) for i in range(60)}
            futures = set(pending)
            start.wait(timeout=60)
            while pending:  # while the logins run, the other tenant connects again and again
                try:
                    with psycopg.connect(pg.dsn("tenant"), connect_timeout=10) as other:
                        other.execute("SELECT 1")
                    tenant_connections += 1
                except psycopg.OperationalError as exc:
                    tenant_errors.append(str(exc).strip())
                most_app_connections = max(most_app_connections, app_connections(watch))
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        responses = [f.result() for f in futures]
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {400, 401, 429, 503}, statuses
    for r in responses:
        if r.status_code in (429, 503):
            assert int(r.headers["retry-after"]) >= 1
        else:
            assert r.json()["detail"] == "unable to log in with these credentials"
    assert tenant_connections >= 1 and not tenant_errors, tenant_errors[:3]
    assert most_app_connections <= 10, most_app_connections
    print(f"60 wrong logins: {statuses.count(400)} × 400, {statuses.count(503)} × 503; "
          f"at most {most_app_connections} app connections; other tenant connected "
          f"{tenant_connections} times")


def test_pool_exhausted_is_a_503_with_retry_after(pg, app):
    """One connection in the pool, held by a request waiting on a lock: the next request
    waits GPUMARKET_DB_POOL_TIMEOUT for it, then is a 503 (JSON under /api/, a page
    elsewhere), and the first one still completes once the lock goes."""
    env, token = app
    auth = {"Authorization": f"Token {token}"}
    with serve(env, GPUMARKET_DB_POOL_MIN="1", GPUMARKET_DB_POOL_MAX="1",
               GPUMARKET_DB_POOL_TIMEOUT="1") as base, \
            psycopg.connect(pg.dsn(), autocommit=True) as watch, \
            psycopg.connect(pg.dsn(db="market")) as locker, ThreadPoolExecutor(1) as pool:
        locker.execute("LOCK TABLE marketplace_apitoken IN ACCESS EXCLUSIVE MODE")
        blocked = pool.submit(httpx.get, f"{base}/api/v1/me/", headers=auth, timeout=120)
        wait_until("a request to hold the pool's only connection, waiting on the lock",
                   lambda: app_connections(watch, waiting_on_lock=True) == 1, timeout=60)
        api = httpx.get(f"{base}/api/v1/me/", headers=auth, timeout=60)
        page = httpx.get(f"{base}/", timeout=60)
        locker.rollback()
        first = blocked.result(timeout=120)
    assert_503(api, api=True)
    assert_503(page, api=False)
    assert first.status_code == 200 and first.json()["username"] == "alice"


def test_postgres_refusing_connections_is_a_503_with_retry_after(pg, app):
    """Without the pool (GPUMARKET_DB_POOL=0, e.g. behind PgBouncer), PostgreSQL's "too
    many clients" is a 503 too, and the app answers again once slots are free."""
    env, token = app
    auth = {"Authorization": f"Token {token}"}
    with serve(env, GPUMARKET_DB_POOL="0") as base:
        hogs: list[psycopg.Connection] = []
        try:
            refused = ""
            while not refused:  # take every ordinary slot of the server
                try:
                    hogs.append(psycopg.connect(pg.dsn("tenant"), autocommit=True))
                except psycopg.OperationalError as exc:
                    refused = str(exc)
                assert len(hogs) <= 30, "the server never refused"
            assert "too many clients" in refused or "reserved" in refused, refused
            api = httpx.get(f"{base}/api/v1/me/", headers=auth, timeout=60)
            login = httpx.post(f"{base}/api/v1/auth/token/", timeout=60,
                               json={"username": "alice", "password": PASSWORD})
            page = httpx.get(f"{base}/", timeout=60)
        finally:
            for conn in hogs:
                conn.close()
        after = httpx.get(f"{base}/api/v1/me/", headers=auth, timeout=60)
    assert_503(api, api=True)
    assert_503(login, api=True)
    assert_503(page, api=False)
    assert after.status_code == 200, after.text
