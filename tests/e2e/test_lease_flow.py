"""The main job end to end, with real parts: PostgreSQL, Redis, a Celery worker, the
runner as its own process over HTTP, and a real Docker container.

runner registers from the recorded H100 dump → ask → bid → fill → lease → container
running with the lease label (seen through the Docker API) → lease ends → container
gone → provider 85 %, platform 15 %, buyer's unused hold released, ledger balanced.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions, book
from marketplace.models import Auction, Lease
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Account
from settlement.split import split
from tests.conftest import DATA
from tests.factories import H100_DUMP, RTX4090_DUMP, funded_buyer, in_a_day, registered_node
from tests.support.containers import inspected
from tests.support.trading import empty_node, trade_and_settle
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]


def _containers(docker_client, lease_id: int):
    return inspected(docker_client, label=f"gpumarket.lease={lease_id}")


LEASE_S = 10  # the continuous-market lease's duration, seconds


def _lease(lease_id: int, *statuses: str):
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.status in statuses else None


def test_ask_bid_fill_lease_container_settlement(live_server, docker_client, test_image,
                                                 runner_factory):
    provider, node, token = registered_node(H100_DUMP, name="h100-e2e")
    node.gpus.all().delete()  # the runner registers them itself below
    runner = runner_factory(live_server.url, token, H100_DUMP)
    reg = runner.register()
    assert reg.returncode == 0, reg.stderr
    assert "8 × NVIDIA H100 80GB HBM3 (h100-sxm-80gb)" in reg.stdout
    assert node.gpus.count() == 8
    runner.start()

    buyer = funded_buyer(100)
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_490_000, gpus=4, available_until=in_a_day()).order
    # long enough to inspect the running container on a loaded machine
    placed = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_600_000,
                            gpus=2, duration_seconds=LEASE_S, image=test_image,
                            command=["sleep", "3600"])
    [lease] = placed.leases
    hold_at_trade = 2_490_000 * 2 * LEASE_S // 3600

    running = wait_until("the lease to run", lambda: _lease(lease.pk, "running", "completed"),
                         timeout=30)
    [container] = _containers(docker_client, lease.pk)
    assert container.id == running.container_id
    assert container.status in ("running", "created")
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    leased = sorted(lg.gpu.uuid for lg in lease.lease_gpus.all())
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == leased
    assert container.attrs["HostConfig"]["NetworkMode"] == "none"

    ended = wait_until("the lease to end", lambda: _lease(lease.pk, "completed", "failed"),
                       timeout=30)
    assert ended.status == "completed", ended.cause
    wait_until("the container to be removed", lambda: not _containers(docker_client, lease.pk),
               timeout=30)

    seconds = int((ended.ended_at - ended.started_at).total_seconds())
    assert LEASE_S - 1 <= seconds <= LEASE_S or ended.cost == hold_at_trade
    parts = split(ended.cost, 1500)
    assert ended.cost == 2_490_000 * 2 * min(seconds, LEASE_S) // 3600
    assert (ended.provider_amount, ended.platform_fee) == (parts.provider, parts.platform_fee)
    assert ledger.wallet(user_id=provider.pk).earned == parts.provider
    assert Account.objects.get(kind="platform_revenue").balance == parts.platform_fee
    buyer_wallet = ledger.wallet(user_id=buyer.pk)
    assert buyer_wallet.held == 0
    assert buyer_wallet.available == 100_000_000 - ended.cost
    ask.refresh_from_db()
    assert ask.remaining_gpus == 4  # the GPUs went back to the standing ask
    assert first_violation() is None
    assert "lease" in runner.output()


H200_DUMP = DATA / "nvidia-smi" / "h200-x1.thamada-gls.q.txt"


def test_recorded_h200_registers_as_its_class_trades_runs_and_settles(
        live_server, docker_client, test_image, runner_factory):
    provider, node, token = empty_node("h200-e2e")
    runner = runner_factory(live_server.url, token, H200_DUMP)
    reg = runner.register()
    assert reg.returncode == 0, reg.stderr
    assert "1 × NVIDIA H200 (h200-sxm-141gb)" in reg.stdout
    [gpu] = node.gpus.all()
    assert (gpu.uuid, gpu.product_name, gpu.gpu_class.slug, gpu.memory_mib) == (
        "GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732", "NVIDIA H200", "h200-sxm-141gb", 143771)
    runner.start()
    leased = trade_and_settle(provider=provider, node=node, runner=runner,
                              docker_client=docker_client, test_image=test_image,
                              market="h200-sxm-141gb", gpus=1, price=3_500_000)
    assert leased == [gpu.uuid]


def test_sealed_auction_closed_by_the_celery_worker(live_server, docker_client, test_image,
                                                    runner_factory, celery_worker_process):
    provider, node, token = registered_node(RTX4090_DUMP, name="rtx-e2e")
    runner = runner_factory(live_server.url, token, RTX4090_DUMP)
    assert runner.register().returncode == 0
    runner.start()
    # open long enough to take the bids on a loaded machine, then due at once: the
    # worker's 1 s sweep closes it (its eta task, at the original time, finds it closed)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_100_000, duration_seconds=3,
                                    closes_at=timezone.now() + timedelta(seconds=60))
    bidders = {}
    for price in (1_300_000, 1_450_000, 1_200_000):
        buyer = funded_buyer(100)
        auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk, price=price,
                                  image=test_image, command=["sleep", "3600"])
        bidders[price] = buyer
    Auction.objects.filter(pk=auction.pk).update(closes_at=timezone.now())

    closed = wait_until("the worker to close the auction",
                        lambda: Auction.objects.filter(pk=auction.pk, status="closed").first(),
                        timeout=30)
    assert closed.clearing_price == 1_300_000
    assert closed.events.filter(to_status="closed").count() == 1
    lease = Lease.objects.get(sealed_bid__auction=auction)
    assert lease.buyer == bidders[1_450_000] and lease.price == 1_300_000
    for loser in (bidders[1_300_000], bidders[1_200_000]):
        assert ledger.wallet(user_id=loser.pk).available == 100_000_000
    ended = wait_until("the won lease to run and end",
                       lambda: _lease(lease.pk, "completed", "failed"), timeout=40)
    assert ended.status == "completed", ended.cause
    assert ended.cost == 1_300_000 * 8 * 3 // 3600
    assert ledger.wallet(user_id=provider.pk).earned == split(ended.cost, 1500).provider
    assert first_violation() is None
