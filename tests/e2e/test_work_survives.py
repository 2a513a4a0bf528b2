"""Issue 15's "Done when", one chain end to end: real PostgreSQL, Redis, the Celery worker
with beat, Docker, moto's S3 server (credentials enforced) and two runners (processes,
Docker runtime, GPUs simulated from a recorded H200 `nvidia-smi -q` report: no GPU here).

A lease on node A (checkpoint store, notice_signal SIGUSR1) is warned: its provider
announces a maintenance window, the beat's maintenance sweep gives the notice, runner A
writes the notice file and sends SIGUSR1; the workload's handler writes
/workspace/checkpoint/state.txt and runner A uploads it. Then a replayed XID 79 fails the
lease; the worker places the continuation on node B, runner B restores the checkpoint
before the workload starts and the workload prints it. The provider of A pays the credit,
the ledger balances, and the buyer's spend is the charged costs less the credit.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from marketplace import book, checkpoints, maintenance
from marketplace.lease_end import end_lease
from marketplace.models import Lease
from providers.models import LeaseLog
from settlement.checks import first_violation
from settlement.models import JournalEntry
from settlement.services import wallet
from tests.e2e.test_checkpoint_chain import _reports
from tests.e2e.test_failover import DUMP, MARKET, XID_79, _heard, _lease
from tests.factories import funded_buyer, in_a_day
from tests.support.trading import empty_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]

# warned (SIGUSR1): write the checkpoint; a continuation prints the one it was given
WORKLOAD = (
    "if [ -f /workspace/checkpoint/state.txt ]; then"
    " echo \"resumed from $(cat /workspace/checkpoint/state.txt)\"; fi;"
    " trap 'mkdir -p /workspace/checkpoint && echo step-42 > /workspace/checkpoint/state.txt"
    " && echo checkpointed' USR1;"
    " while true; do sleep 1 & wait $!; done")


def test_a_warned_lease_checkpoints_fails_on_a_and_continues_on_b_from_its_checkpoint(
        live_server, docker_client, test_image, runner_factory, celery_worker_process,
        s3_server, tmp_path):
    bucket = s3_server.bucket("work-survives")
    prov_a, node_a, token_a = empty_node("survives-a")
    prov_b, node_b, token_b = empty_node("survives-b")
    runner_a = runner_factory(live_server.url, token_a, DUMP)
    runner_b = runner_factory(live_server.url, token_b, DUMP)
    for runner in (runner_a, runner_b):
        reg = runner.register()
        assert reg.returncode == 0, reg.stderr
        runner.start()
    wait_until("both runners' first heartbeat", lambda: _heard(node_a) and _heard(node_b))
    book.place_ask(provider_id=prov_a.pk, node_id=node_a.pk, market_slug=MARKET,
                   price=3_000_000, gpus=1, available_until=in_a_day())
    store = checkpoints.clean({"url": f"s3://{bucket}", "endpoint_url": s3_server.endpoint_url,
                               "access_key_id": s3_server.access_key_id,
                               "secret_access_key": s3_server.secret_access_key})
    buyer = funded_buyer(100)
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=3_000_000, gpus=1,
                             duration_seconds=600, image=test_image,
                             command=["sh", "-c", WORKLOAD], checkpoint=store,
                             notice_signal="SIGUSR1").leases
    assert lease.node_id == node_a.pk and lease.failover
    wait_until("the lease to run on node A", lambda: _lease(lease.pk, "running"), timeout=60)

    # warned: a maintenance window from just past the notice period; the beat's sweep
    # gives the notice within a second or two, runner A delivers it (file and SIGUSR1)
    starts = timezone.now() + timedelta(seconds=settings.GPUMARKET_PREEMPTION_NOTICE_SECONDS
                                        + 2)
    maintenance.announce(user_id=prov_a.pk, node_id=node_a.pk, starts_at=starts,
                         ends_at=starts + timedelta(hours=1), reason="firmware")
    noticed = wait_until("the maintenance notice", lambda: Lease.objects.filter(
        pk=lease.pk, notice_reason="maintenance").first(), timeout=30)
    assert noticed.notice_deadline == starts
    [uploaded] = wait_until("A's notice upload", lambda: _reports(lease.pk), timeout=60)
    assert (uploaded["status"], uploaded["reason"], uploaded["files"]) == (
        "uploaded", "notice", 1)
    assert s3_server.read(bucket, uploaded["key"].replace(
        "manifest.json", "files/state.txt")) == b"step-42\n"
    book.place_ask(provider_id=prov_b.pk, node_id=node_b.pk, market_slug=MARKET,
                   price=2_900_000, gpus=1, available_until=in_a_day())

    # node A's GPU falls off the bus before the window: the runner reads a replayed XID 79
    log = tmp_path / "xid79.log"
    log.write_text(XID_79)
    runner_a.stop()
    runner_a.start(extra=("--replay-xid", str(log)))
    failed = wait_until("the lease to fail", lambda: _lease(lease.pk, "failed"), timeout=60)
    assert (failed.fault, failed.failure_code) == ("provider", "gpu_xid"), failed.cause
    made = wait_until("the continuation to run on node B", lambda: Lease.objects.filter(
        continues=failed, status="running").first(), timeout=90)
    assert (made.node_id, made.chain_id, made.price) == (node_b.pk, failed.pk, 2_900_000)
    tail = wait_until("B's workload to print the checkpoint", lambda: (row := LeaseLog.objects
                      .filter(lease_id=made.pk).first()) and "resumed" in row.tail and row.tail,
                      timeout=60)
    assert "resumed from step-42" in tail
    restored = _reports(made.pk)[0]  # the notice's upload, or A's last one after it
    assert restored["status"] == "restored"
    assert restored["key"] in {r["key"] for r in _reports(lease.pk) if r["status"] == "uploaded"}

    # the provider of A pays the credit, with the finding as its evidence
    failed.refresh_from_db()
    assert failed.failover_state == "continued"
    assert 0 < failed.fault_credit <= failed.provider_amount
    credit = JournalEntry.objects.get(kind="fault_credit", reference=f"lease:{failed.pk}")
    assert "XID 79" in credit.evidence

    # every cent: once the continuation ends, the buyer paid the charged costs less the credit
    end_lease(lease_id=made.pk, status="completed", cause="work survives: done",
              now=timezone.now())
    made.refresh_from_db()
    spent = 100_000_000 - wallet(user_id=buyer.pk).available
    assert wallet(user_id=buyer.pk).held == 0
    assert spent == failed.cost + made.cost - failed.fault_credit
    assert s3_server.secret_access_key not in runner_a.output() + runner_b.output()
    assert json.loads(s3_server.read(bucket, uploaded["key"]))["lease"] == failed.pk
    assert first_violation() is None
