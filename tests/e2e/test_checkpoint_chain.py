"""Checkpoints that follow a lease chain, end to end with real parts: PostgreSQL, the
marketplace over HTTP (live server), the runner as its own process with the Docker
runtime, a real container, and moto's S3 server on 127.0.0.1 (credentials enforced).

Lease A's workload writes /workspace/checkpoint/state.txt; at A's deadline the runner
uploads it to `<bucket>/<A>/` and reports it (the lease's events and API show it). Lease B,
put in A's chain by hand (chain_id, as failover does), gets it restored
before its workload starts: the workload prints it. The upload after A's deadline is not
billed: A is charged its leased seconds, no more.
"""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from marketplace import book, checkpoints
from marketplace.models import Lease
from providers.models import LeaseLog
from tests.factories import H100_DUMP, funded_buyer, in_a_day, registered_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]

WRITE = ("mkdir -p /workspace/checkpoint && echo step-42 > /workspace/checkpoint/state.txt"
         " && echo written && sleep 3600")
LEASE_S = 6


def _ended(lease_id: int):
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.status in Lease.ENDED else None


def _reports(lease_id: int) -> list[dict]:
    return [e.detail["checkpoint"] for e in Lease.objects.get(pk=lease_id).events.all()
            if "checkpoint" in e.detail]


def test_a_checkpoint_uploaded_at_the_deadline_is_restored_in_the_chains_next_lease(
        live_server, runner_factory, test_image, s3_server):
    bucket = s3_server.bucket("ckpt-e2e")
    provider, node, token = registered_node(H100_DUMP, name="h100-ckpt")
    node.gpus.all().delete()  # the runner registers them itself
    runner = runner_factory(live_server.url, token, H100_DUMP)
    assert runner.register().returncode == 0
    runner.start()
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=4, available_until=in_a_day())
    store = checkpoints.clean({"url": f"s3://{bucket}", "endpoint_url": s3_server.endpoint_url,
                               "access_key_id": s3_server.access_key_id,
                               "secret_access_key": s3_server.secret_access_key})

    [a] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                         gpus=1, duration_seconds=LEASE_S, image=test_image,
                         command=["sh", "-c", WRITE], checkpoint=store).leases
    ended = wait_until("lease A to end", lambda: _ended(a.pk), timeout=60)
    assert ended.status == "completed", ended.cause
    assert ended.cost == 2_000_000 * LEASE_S // 3600  # its seconds; the upload is not billed
    [uploaded] = wait_until("A's upload report", lambda: _reports(a.pk), timeout=60)
    assert (uploaded["status"], uploaded["reason"], uploaded["files"]) == (
        "uploaded", "deadline", 1)
    manifest = json.loads(s3_server.read(bucket, uploaded["key"]))
    assert uploaded["key"].startswith(f"{a.pk}/") and manifest["bytes"] == 8
    assert s3_server.read(bucket, uploaded["key"].replace(
        "manifest.json", "files/state.txt")) == b"step-42\n"

    with transaction.atomic():  # the runner hears of B only once it is A's continuation
        [b] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                             price=2_000_000, gpus=1, duration_seconds=60, image=test_image,
                             command=["cat", "/workspace/checkpoint/state.txt"],
                             checkpoint=store).leases
        # in A's chain (a failover continuation also sets `continues`, for a lease failed
        # by its provider on another node: marketplace/checks.py; A completed, here)
        Lease.objects.filter(pk=b.pk).update(chain_id=a.pk)
    ended = wait_until("lease B to end", lambda: _ended(b.pk), timeout=60)
    assert ended.status == "completed", ended.cause
    tail = wait_until("B's log tail", lambda: (row := LeaseLog.objects.filter(
        lease_id=b.pk).first()) and "step-42" in row.tail and row.tail, timeout=30)
    assert tail == "step-42\n"
    reports = wait_until("B's two reports", lambda: len(_reports(b.pk)) >= 2 and _reports(b.pk),
                         timeout=60)
    assert (reports[0]["status"], reports[0]["key"]) == ("restored", uploaded["key"])
    assert reports[1]["status"] == "uploaded" and reports[1]["key"].startswith(f"{a.pk}/")
    assert s3_server.secret_access_key not in runner.output()
