"""Server side of GPU health: findings stored, an unhealthy GPU leaves the asks and gets
no lease, comes back when healthy; a failed lease pays only its healthy seconds."""

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from marketplace import book
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running
from marketplace.models import LeaseGpu, Order
from settlement.checks import first_violation
from settlement.money import lease_cost
from tests.factories import funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db


def _heartbeat(token, findings):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    r = api.post("/api/v1/runner/heartbeat/", {"runtime": "docker", "gpus": [],
                                               "findings": findings}, format="json")
    assert r.status_code == 200, r.content


def test_unhealthy_gpu_leaves_the_ask_and_returns(django_capture_on_commit_callbacks):
    provider, node, token = registered_node()
    sick = node.gpus.order_by("pci_bus_id").first()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_000_000, gpus=8, available_until=in_a_day()).order
    fatal = [{"uuid": sick.uuid, "rule": "xid", "severity": "fatal",
              "evidence": "XID 119 GSP_RPC_TIMEOUT, NVIDIA immediate action RESET_GPU"}]
    with django_capture_on_commit_callbacks(execute=True):
        _heartbeat(token, fatal)
    sick.refresh_from_db()
    ask.refresh_from_db()
    assert not sick.healthy and sick.findings[0]["rule"] == "xid"
    assert ask.remaining_gpus == 7

    buyer = funded_buyer(1000)
    whole = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                           gpus=8, duration_seconds=3600)
    assert whole.leases == [] and whole.order.status == "open"  # 8 on one node: not now
    part = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                          gpus=7, duration_seconds=3600)
    [lease] = part.leases
    assert sick.uuid not in {lg.gpu.uuid for lg in LeaseGpu.objects.filter(lease=lease)}

    with django_capture_on_commit_callbacks(execute=True):
        _heartbeat(token, [])  # healthy again: the GPU goes back to the ask
    sick.refresh_from_db()
    ask.refresh_from_db()
    assert sick.healthy
    assert ask.remaining_gpus == 1
    assert Order.objects.get(pk=whole.order.pk).status == "open"  # still needs 8 at once
    assert first_violation() is None


def test_failed_lease_pays_only_the_seconds_the_runner_saw_healthy():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=2, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                             gpus=2, duration_seconds=3600).leases
    lease = mark_running(lease=lease, container_id="h" * 64)
    ended = end_lease(lease_id=lease.pk, status="failed", cause="GPU x: xid: XID 79",
                      now=lease.started_at + timedelta(seconds=900),
                      detail={"runner_usage_seconds": 600})
    assert ended.cost == lease_cost(2_000_000, 2, 600)
    assert first_violation() is None


def test_an_ask_never_offers_an_unhealthy_gpu():
    provider, node, _ = registered_node()
    sick = node.gpus.order_by("pci_bus_id").first()
    sick.healthy = False
    sick.save(update_fields=["healthy"])
    from marketplace.errors import InvalidInput

    with pytest.raises(InvalidInput, match="only 7 GPUs"):
        book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                       price=2_000_000, gpus=8, available_until=in_a_day())
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_000_000, gpus=7, available_until=in_a_day()).order
    assert ask.remaining_gpus == 7


def test_a_known_gpu_reported_as_another_model_is_refused_and_its_ask_stays():
    """A GPU UUID names one board: an inventory that re-declares it as another class is a
    409 naming the GPU, and nothing changes (found by a user trial: the a10 ask then
    stood for a GPU that had 'become' an H100, and every crossing a10 bid got a 409)."""
    provider, node, token = registered_node()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_490_000, gpus=2, available_until=in_a_day()).order
    gpu = node.gpus.order_by("pci_bus_id").first()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    r = api.post("/api/v1/runner/inventory/", {
        "hostname": "node-1", "driver_version": "535", "cuda_version": "12.2",
        "runner_version": "t", "source": "test",
        "gpus": [{"uuid": gpu.uuid, "product_name": "NVIDIA A10", "gpu_class": "a10",
                  "memory_mib": 23028, "pci_bus_id": gpu.pci_bus_id}]}, format="json")
    assert r.status_code == 409, r.content
    assert "is registered as h100-sxm-80gb, not a10" in r.json()["detail"]
    gpu.refresh_from_db()
    assert gpu.gpu_class.slug == "h100-sxm-80gb"
    ask.refresh_from_db()
    assert ask.remaining_gpus == 2


def test_an_ask_in_a_market_where_the_node_has_no_gpus_left_is_withdrawn():
    """rebalance_asks covers every market the node has asks in, not only its GPUs' current
    classes: an ask whose GPUs are gone from its class offers nothing, and a crossing bid
    rests instead of failing."""
    from marketplace.health import rebalance_asks
    from marketplace.models import GpuClass

    provider, node, _ = registered_node()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_490_000, gpus=2, available_until=in_a_day()).order
    node.gpus.update(gpu_class=GpuClass.objects.get(slug="a10"))  # (an operator's edit)
    rebalance_asks(node=node)
    ask.refresh_from_db()
    assert ask.remaining_gpus == 0
    bid = book.place_bid(buyer_id=funded_buyer(100).pk, market_slug="h100-sxm-80gb",
                         price=2_600_000, gpus=1, duration_seconds=3600)
    assert bid.order.status == "open" and bid.leases == []
    assert first_violation() is None
