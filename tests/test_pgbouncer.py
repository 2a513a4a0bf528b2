"""PgBouncer in transaction mode (Debian's 1.18, which cannot track prepared statements):
why GPUMARKET_DB_PGBOUNCER=1 turns psycopg's prepared statements off, that the setting
does, and the bid path and the market lock through a real PgBouncer. The e2e lease flow
and the concurrency tests run whole through one in CI (`make test-pgbouncer`)."""

from __future__ import annotations

import subprocess
import sys
import threading

import psycopg
import pytest
from django.db import connection, connections, transaction

from marketplace import book, locking
from marketplace.errors import MarketBusy
from marketplace.models import GpuClass, Lease
from tests.conftest import ROOT
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.support.pgbouncer import PgBouncer, route_through
from tests.support.processes import child_env


@pytest.fixture(scope="module")
def bouncer():
    """One server connection only: every client's transactions share it, as two web
    processes' do in production when their transactions interleave."""
    server = PgBouncer(pool_size=1).start()
    yield server
    server.stop()


def _twice_on_two_clients(dsn: str, prepare_threshold: int | None) -> None:
    a = psycopg.connect(dsn, autocommit=True, prepare_threshold=prepare_threshold)
    b = psycopg.connect(dsn, autocommit=True, prepare_threshold=prepare_threshold)
    try:
        for _ in range(2):
            for conn in (a, b):
                conn.execute("SELECT %s::int + 1", [1]).fetchone()
    finally:
        a.close()
        b.close()


def test_prepared_statements_break_in_transaction_mode_and_none_avoids_them(bouncer):
    with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
        _twice_on_two_clients(bouncer.dsn(), prepare_threshold=0)  # prepare at once
    _twice_on_two_clients(bouncer.dsn(), prepare_threshold=None)  # what the setting does


def test_the_setting_switches_off_what_transaction_mode_cannot_carry():
    code = ("import django; django.setup(); from django.conf import settings as s; "
            "d = s.DATABASES['default']; print(d.get('DISABLE_SERVER_SIDE_CURSORS', False), "
            "repr(d['OPTIONS'].get('prepare_threshold', 'unset')), 'pool' in d['OPTIONS'])")
    env = child_env(GPUMARKET_DB_PGBOUNCER="1")
    env.pop("GPUMARKET_DB_POOL", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == ["True", "None", "False"]
    env["GPUMARKET_DB_PGBOUNCER"] = "0"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == ["False", "'unset'", "True"]


@pytest.mark.django_db(transaction=True)
def test_bids_match_and_the_market_lock_holds_through_pgbouncer(bouncer, settings):
    settings.GPUMARKET_MARKET_LOCK_TIMEOUT_MS = 300
    provider, node, _ = registered_node(name="behind-bouncer")
    buyer = funded_buyer(100)
    own = PgBouncer(pool_size=3).start()
    try:
        with route_through(own):
            connection.ensure_connection()
            assert connection.connection.info.port == own.port  # really through it
            book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                           price=2_000_000, gpus=4, available_until=in_a_day())
            for _ in range(3):  # more statements than psycopg's default threshold (5)
                placed = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                                        price=2_100_000, gpus=1, duration_seconds=3600)
                assert placed.order.status == "filled"
            assert Lease.objects.filter(buyer=buyer).count() == 3

            held, release = threading.Event(), threading.Event()
            market = GpuClass.objects.get(slug="h100-sxm-80gb")

            def holder() -> None:
                try:
                    with transaction.atomic():
                        locking.lock_market(market.pk)
                        held.set()
                        release.wait(30)
                finally:
                    connections.close_all()

            thread = threading.Thread(target=holder)
            thread.start()
            assert held.wait(30)
            try:
                with pytest.raises(MarketBusy):
                    book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                                   price=2_100_000, gpus=1, duration_seconds=3600)
            finally:
                release.set()
                thread.join(30)
            placed = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                                    price=2_100_000, gpus=1, duration_seconds=3600)
            assert placed.order.status == "filled"  # the lock ended with its transaction
    finally:
        own.stop()


@pytest.mark.django_db(transaction=True)
def test_heartbeat_groups_bound_on_the_server_pass_pgbouncer(bouncer):
    """core/pg.py's server-bound statements (the heartbeat group's SELECTs and writes),
    more times than a prepared statement could survive, from two threads' connections
    sharing PgBouncer's one server connection: no prepared statement is named there."""
    from marketplace.api import heartbeat_batch
    from marketplace.api.heartbeat_path import lean_heartbeat
    from providers.models import Gpu

    _p, node, token = registered_node(name="beats-behind-bouncer")
    uuid = Gpu.objects.filter(node=node).values_list("uuid", flat=True).first()
    failures: list[BaseException] = []

    def beats(power: float) -> None:
        try:
            batcher = heartbeat_batch.HeartbeatBatcher(256)
            for i in range(4):
                beat = lean_heartbeat({"runtime": "docker", "gpus": [
                    {"uuid": uuid, "power_w": power + i}]})
                [outcome] = batcher._outcomes([heartbeat_batch._Pending(
                    token, beat, "req", None, None)])
                assert outcome[0] == 200, outcome
        except BaseException as exc:  # the test thread reports it
            failures.append(exc)
        finally:
            connections.close_all()

    with route_through(bouncer):
        threads = [threading.Thread(target=beats, args=(p,)) for p in (100.0, 200.0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert failures == []
    assert Gpu.objects.get(uuid=uuid).last_health["power_w"] in (103.0, 203.0)


@pytest.mark.django_db
def test_server_bound_statements_are_bound_there_and_never_prepared():
    from core import pg

    with pg.cursor() as cursor:
        for _ in range(8):  # past psycopg's default threshold (5)
            cursor.execute("SELECT %s::int + 1", [1])
            assert cursor.fetchone() == (2,)
        assert type(cursor.cursor) is psycopg.Cursor  # not Django's ClientCursor
    assert len(connection.connection._prepared._names) == 0
