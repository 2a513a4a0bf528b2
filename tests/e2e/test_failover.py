"""Failover end to end (issue 15, docs/FAULTS.md): real PostgreSQL, Redis, Celery workers,
Docker and two runners (`python -m providers.runner run`, Docker runtime) on pytest-django's
live server.

- A lease on node A is failed by a replayed XID 79 (the runner restarted with
  `--replay-xid`, the GPUs simulated from a recorded H200 `nvidia-smi -q` report whose
  zeroed UUIDs each runner replaces by its own: no GPU here), the Celery worker places the
  continuation on node B, runner B runs it; the provider of A paid the credit; the ledger
  balances.
- A worker killed with SIGKILL in the middle of a failover (its transaction blocked after
  the continuation was written, before commit) leaves nothing; the task delivered again
  (twice) to a new worker places the continuation exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psycopg
import pytest
from django.conf import settings
from django.utils import timezone

from marketplace import book, lease_end
from marketplace.leases import mark_running
from marketplace.models import Lease
from settlement.checks import first_violation
from settlement.models import JournalEntry
from tests.conftest import DATA, ROOT, require_or_skip
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.support.containers import inspected
from tests.support.processes import child_env
from tests.support.trading import empty_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]

DUMP = DATA / "nvidia-smi" / "h200-x1.utku-exporter-590.48.01.q-idle.txt"  # zeroed UUIDs
MARKET = "h200-sxm-141gb"
XID_79 = "[Tue Dec  1 12:03:10 2026] NVRM: Xid (PCI:0000:83:00): 79, GPU has fallen off the bus.\n"


def _heard(node):
    return type(node).objects.get(pk=node.pk).last_heartbeat_at is not None


def _lease(pk, *statuses):
    lease = Lease.objects.filter(pk=pk, status__in=statuses).first()
    return lease


def test_xid_79_on_node_a_continues_on_node_b_and_the_provider_of_a_pays(
        live_server, docker_client, test_image, runner_factory, celery_worker_process,
        tmp_path):
    prov_a, node_a, token_a = empty_node("failover-a")
    prov_b, node_b, token_b = empty_node("failover-b")
    runner_a = runner_factory(live_server.url, token_a, DUMP)
    runner_b = runner_factory(live_server.url, token_b, DUMP)
    for runner in (runner_a, runner_b):
        reg = runner.register()
        assert reg.returncode == 0, reg.stderr
        runner.start()
    wait_until("both runners' first heartbeat", lambda: _heard(node_a) and _heard(node_b))
    book.place_ask(provider_id=prov_a.pk, node_id=node_a.pk, market_slug=MARKET,
                   price=3_000_000, gpus=1, available_until=in_a_day())
    buyer = funded_buyer(100)
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=3_000_000, gpus=1,
                             duration_seconds=600, image=test_image,
                             command=["sleep", "3600"]).leases
    assert lease.node_id == node_a.pk and lease.failover
    wait_until("the lease to run on node A", lambda: _lease(lease.pk, "running"), timeout=60)
    book.place_ask(provider_id=prov_b.pk, node_id=node_b.pk, market_slug=MARKET,
                   price=2_900_000, gpus=1, available_until=in_a_day())

    # the lease runs a few whole seconds first: a credit is the cost of healthy seconds, and
    # a fast restart can fail it within its first second (charged 0 s, credit 0)
    time.sleep(3)
    # node A's GPU falls off the bus: its runner (restarted) reads the replayed XID 79
    log = tmp_path / "xid79.log"
    log.write_text(XID_79)
    runner_a.stop()
    runner_a.start(extra=("--replay-xid", str(log)))

    failed = wait_until("the lease to fail", lambda: _lease(lease.pk, "failed"), timeout=60)
    assert (failed.fault, failed.failure_code) == ("provider", "gpu_xid"), failed.cause
    assert "XID 79" in failed.cause
    made = wait_until("the continuation to run on node B", lambda: Lease.objects.filter(
        continues=failed, status="running").first(), timeout=90)
    assert (made.node_id, made.chain_id, made.price) == (node_b.pk, failed.pk, 2_900_000)
    [container] = inspected(docker_client, label=[f"gpumarket.lease={made.pk}",
                                                  f"gpumarket.node={node_b.uid}"])
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["GPUMARKET_LEASE_ID"] == str(made.pk)
    failed.refresh_from_db()
    assert failed.failover_state == "continued"
    assert failed.fault_credit > 0 and failed.fault_credit <= failed.provider_amount
    credit = JournalEntry.objects.get(kind="fault_credit", reference=f"lease:{failed.pk}")
    assert "XID 79" in credit.evidence
    assert f"continued as lease {made.pk} on node failover-b" in " ".join(
        failed.events.values_list("cause", flat=True))
    assert first_violation() is None


def _worker(logdir, name, *, queue, lock_ms="5000"):
    log = open(logdir / f"{name}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--pool", "solo",
         "-Q", queue, "-n", f"{name}@%h", "--loglevel", "INFO"],
        cwd=ROOT, env=child_env(GPUMARKET_VAR_DIR=str(logdir),
                                GPUMARKET_MARKET_LOCK_TIMEOUT_MS=lock_ms),
        stdout=log, stderr=subprocess.STDOUT)
    wait_until(f"Celery worker {name} to be ready",
               lambda: "ready" in (logdir / f"{name}.log").read_text(), timeout=60)
    return proc


# the worker's backend, blocked at failover._continue_on's UPDATE of the ask (after the
# continuation's INSERT)
WAITING_ON_ASK = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE \"marketplace_order\"%'")


def _pg():
    db = settings.DATABASES["default"]
    return psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432,
                           user=db["USER"] or "postgres", dbname=db["NAME"], autocommit=False)


def test_a_worker_killed_mid_failover_leaves_one_continuation(monkeypatch, tmp_path):
    if not settings.CELERY_BROKER_URL.startswith("redis"):
        require_or_skip("the failover kill test needs REDIS_URL (make test sets it)")
    from marketplace.tasks import failover_lease

    queue = f"failover-kill-{tmp_path.name}"
    prov_a, node_a, _ = registered_node(name="kill-a", own_uuids=True)
    prov_b, node_b, _ = registered_node(name="kill-b", own_uuids=True)
    book.place_ask(provider_id=prov_a.pk, node_id=node_a.pk, market_slug=None,
                   price=2_000_000, gpus=8, available_until=in_a_day())
    buyer = funded_buyer(100)
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                             price=2_000_000, gpus=1, duration_seconds=3600).leases
    mark_running(lease=lease, container_id="c" * 64)
    ask_b = book.place_ask(provider_id=prov_b.pk, node_id=node_b.pk, market_slug=None,
                           price=2_000_000, gpus=8, available_until=in_a_day()).order
    # this test delivers the task itself, to its own workers' queue
    monkeypatch.setattr(lease_end, "queue_failover", lambda lease_id: None)
    failed = lease_end.end_lease(lease_id=lease.pk, status="failed",
                                 cause="the lease's container is gone (removed outside "
                                       "the runner)", now=timezone.now())
    assert failed.failover_state == "pending"

    blocker = _pg()  # holds ask B's row: the worker's transaction stops at its UPDATE
    blocker.execute('SELECT 1 FROM "marketplace_order" WHERE "id" = %s FOR UPDATE',
                    [ask_b.pk])
    first = _worker(tmp_path, "first", queue=queue, lock_ms="120000")
    try:
        failover_lease.apply_async(args=(failed.pk,), queue=queue)
        watch = _pg()
        watch.autocommit = True
        wait_until("the worker to block mid-failover (continuation written, not committed)",
                   lambda: watch.execute(WAITING_ON_ASK).fetchone()[0] == 1, timeout=60)
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
        blocker.rollback()
        blocker.close()
    # the dead worker's transaction never commits: nothing of it is left
    wait_until("the killed worker's backend to go", lambda: watch.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'").fetchone()[0] == 0, timeout=30)
    watch.close()
    failed.refresh_from_db()
    assert failed.failover_state == "pending"
    assert not Lease.objects.filter(continues=failed).exists()

    second = _worker(tmp_path, "second", queue=queue)
    try:
        for _ in range(2):  # redelivered, and once more: one continuation
            failover_lease.apply_async(args=(failed.pk,), queue=queue)
        wait_until("the continuation", lambda: Lease.objects.filter(continues=failed).exists(),
                   timeout=60)
        wait_until("both deliveries to be done", lambda: (tmp_path / "second.log").read_text()
                   .count("succeeded") >= 2, timeout=60)
    finally:
        second.terminate()
        second.wait(timeout=20)
    assert Lease.objects.filter(continues=failed).count() == 1
    assert Lease.objects.filter(chain_id=failed.pk).count() == 1
    failed.refresh_from_db()
    assert failed.failover_state == "continued"
    assert "nothing to do" in (tmp_path / "second.log").read_text()
    assert first_violation() is None
