"""Reliability records (marketplace/reliability.py): completed vs failed by the provider's
fault over 7 and 30 days, time to recover; on Node.reliability, the offers, the node API;
a bid's min_reliability honoured by matching (engine min_rel)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import book, failover, reliability
from marketplace.engine import Ask, Bid, OrderBook
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running
from marketplace.models import Lease
from providers.models import Node
from tests.factories import H100, funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db

PRICE = 2_000_000


def _lease_on(node, provider, buyer, **terms):
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=PRICE,
                   gpus=1, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                             duration_seconds=3600, **terms).leases
    return lease


def test_record_counts_completed_and_provider_caused_failures_only():
    provider, node, _ = registered_node(name="n1", own_uuids=True)
    buyer = funded_buyer(100)
    outcomes = [("completed", "lease time is over"), ("completed", "lease time is over"),
                ("completed", "lease time is over"),
                ("failed", "the lease's container is gone (removed outside the runner)"),
                ("failed", "container exited with status 3"),  # the buyer's: not counted
                ("cancelled", "stopped by the buyer")]
    for status, cause in outcomes:
        lease = mark_running(lease=_lease_on(node, provider, buyer, failover=False),
                             container_id="c" * 64)
        end_lease(lease_id=lease.pk, status=status, cause=cause)
    [week, month] = reliability.records(node_id=node.pk)
    assert (week["days"], week["completed"], week["failed"], week["reliability"]) == (
        7, 3, 1, "0.750")
    assert month["reliability"] == "0.750" and month["recover_seconds"] is None
    node.refresh_from_db()
    assert node.reliability == Decimal("0.750")  # refreshed at each end
    # a window: ends older than 7 days count for 30 only
    Lease.objects.filter(node=node, status="completed").update(
        ended_at=timezone.now() - timedelta(days=10))
    assert reliability.record(days=7, node_id=node.pk).reliability == Decimal("0.000")
    assert reliability.record(days=30, node_id=node.pk).reliability == Decimal("0.750")
    assert reliability.ratio(0, 0) is None and reliability.ratio(2, 1) == Decimal("0.666")


def test_time_to_recover_is_failure_to_continuation_running():
    prov_a, node_a, _ = registered_node(name="a", own_uuids=True)
    prov_b, node_b, _ = registered_node(name="b", own_uuids=True)
    buyer = funded_buyer(100)
    lease = _lease_on(node_a, prov_a, buyer)
    book.place_ask(provider_id=prov_b.pk, node_id=node_b.pk, market_slug=None, price=PRICE,
                   gpus=1, available_until=in_a_day())
    failed = end_lease(lease_id=lease.pk, status="failed",
                       cause="the lease's container is gone (removed outside the runner)")
    failover.continue_lease(lease_id=failed.pk)
    made = Lease.objects.get(continues=failed)
    mark_running(lease=made, container_id="d" * 64, now=failed.ended_at + timedelta(seconds=7))
    assert reliability.record(days=30, node_id=node_a.pk).recover_seconds == 7
    assert reliability.record(days=30, provider_id=prov_a.pk).failed == 1


def test_a_bid_with_min_reliability_skips_a_less_reliable_node_and_the_offers_show_it():
    prov_a, node_a, _ = registered_node(name="a", own_uuids=True)
    prov_b, node_b, _ = registered_node(name="b", own_uuids=True)
    Node.objects.filter(pk=node_a.pk).update(reliability=Decimal("0.800"))
    Node.objects.filter(pk=node_b.pk).update(reliability=Decimal("0.990"))
    book.place_ask(provider_id=prov_a.pk, node_id=node_a.pk, market_slug=None,
                   price=1_000_000, gpus=8, available_until=in_a_day())  # cheaper
    book.place_ask(provider_id=prov_b.pk, node_id=node_b.pk, market_slug=None,
                   price=PRICE, gpus=8, available_until=in_a_day())
    buyer = funded_buyer(100)
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                             duration_seconds=3600, min_reliability=Decimal("0.95")).leases
    assert lease.node_id == node_b.pk and lease.min_reliability == Decimal("0.950")
    [plain] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                             duration_seconds=3600).leases
    assert plain.node_id == node_a.pk
    # a resting bid with a floor: an ask of an unreliable node does not fill it
    rest = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=500_000, gpus=1,
                          duration_seconds=3600, min_reliability=Decimal("0.9"))
    prov_c, node_c, _ = registered_node(name="c", own_uuids=True)
    Node.objects.filter(pk=node_c.pk).update(reliability=Decimal("0.5"))
    made = book.place_ask(provider_id=prov_c.pk, node_id=node_c.pk, market_slug=None,
                          price=500_000, gpus=8, available_until=in_a_day()).leases
    assert made == [] and not Lease.objects.filter(fill__bid=rest.order).exists()

    client = APIClient()
    client.force_authenticate(buyer)
    offers = client.get(f"/api/v1/gpu-classes/{H100}/").json()["offers"]
    assert {o["reliability"] for o in offers} == {"0.800", "0.990", "0.500"}
    client.force_authenticate(prov_b)
    body = client.get(f"/api/v1/nodes/{node_b.pk}/reliability/").json()
    assert body["node"] == node_b.pk and [r["days"] for r in body["records"]] == [7, 30]
    assert client.get(f"/api/v1/nodes/{node_a.pk}/reliability/").status_code == 404


def test_the_engine_honours_min_rel_and_avoid_node():
    ob = OrderBook()
    ob.rest_ask(Ask(id=1, owner=10, price=100, gpus=1, node=7, available_until=10**9, seq=1,
                    rel=800))
    ob.rest_ask(Ask(id=2, owner=11, price=200, gpus=1, node=8, available_until=10**9, seq=2))
    r = ob.submit_bid(Bid(id=3, owner=1, price=300, gpus=1, gang=1, duration_s=60, seq=3,
                          tif="IOC", min_rel=900), 0)
    assert [(f.ask_id, f.node) for f in r.fills] == [(2, 8)]
    ob.rest_ask(Ask(id=4, owner=12, price=50, gpus=1, node=9, available_until=10**9, seq=4))
    r = ob.submit_bid(Bid(id=5, owner=1, price=300, gpus=1, gang=1, duration_s=60, seq=5,
                          tif="IOC", avoid_node=9), 0)
    assert [f.ask_id for f in r.fills] == [1]


def test_a_sealed_bid_below_its_min_reliability_is_refused_naming_it():
    from marketplace import auctions
    from marketplace.errors import Conflict

    provider, node, _ = registered_node(name="s1", own_uuids=True)
    Node.objects.filter(pk=node.pk).update(reliability=Decimal("0.700"))
    auction = auctions.open_auction(
        provider_id=provider.pk, node_id=node.pk, gpus=1, reserve_price=1_000_000,
        duration_seconds=3600, closes_at=timezone.now() + timedelta(hours=1))
    buyer = funded_buyer(100)
    with pytest.raises(Conflict) as refused:
        auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk,
                                  price=2_000_000, min_reliability=Decimal("0.9"))
    assert refused.value.field == "min_reliability"
    bid = auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk,
                                    price=2_000_000, min_reliability=Decimal("0.5"))
    assert bid.min_reliability == Decimal("0.5") and bid.failover is True


def test_the_sweep_finds_failovers_a_lost_task_left_pending():
    prov_a, node_a, _ = registered_node(name="a", own_uuids=True)
    buyer = funded_buyer(100)
    lease = _lease_on(node_a, prov_a, buyer)
    failed = end_lease(lease_id=lease.pk, status="failed",
                       cause="the lease's container is gone (removed outside the runner)")
    assert failed.failover_state == "pending"
    assert failover.pending_ids(failed.ended_at) == []  # not yet 10 s old
    later = failed.ended_at + timedelta(seconds=11)
    assert failover.pending_ids(later) == [failed.pk]
    assert failover.continue_lease(lease_id=failed.pk) == "rested"  # (no other node; GTC)
    assert failover.pending_ids(later) == []


@pytest.mark.django_db(transaction=True)  # commits: the book cache is filled on commit
def test_a_cached_book_learns_a_node_s_new_reliability():
    """Node A's two asks are in the process's book cache; a provider-caused failure of a
    lease from one of them drops A's reliability: the other ask must not fill a bid whose
    floor A no longer meets (the failure's transaction marks the cached book stale)."""
    prov_a, node_a, _ = registered_node(name="a", own_uuids=True)
    buyer = funded_buyer(100)
    book.place_ask(provider_id=prov_a.pk, node_id=node_a.pk, market_slug=None, price=PRICE,
                   gpus=1, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                             duration_seconds=3600, failover=False).leases
    book.place_ask(provider_id=prov_a.pk, node_id=node_a.pk, market_slug=None, price=PRICE,
                   gpus=7, available_until=in_a_day())
    end_lease(lease_id=lease.pk, status="failed",
              cause="the lease's container is gone (removed outside the runner)")
    assert Node.objects.get(pk=node_a.pk).reliability == Decimal("0.000")
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                            duration_seconds=3600, min_reliability=Decimal("0.5"))
    assert placed.leases == [] and placed.order.status == "open"
