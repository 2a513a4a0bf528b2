"""The continuous auction through the services, on PostgreSQL."""

import pytest

from marketplace import book
from marketplace.errors import InvalidInput
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running
from marketplace.models import Fill, Lease, LeaseGpu, Order
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold, JournalEntry
from tests.factories import funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db


def test_bid_crossing_an_ask_fills_at_the_ask_price_and_becomes_a_lease():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_490_000, gpus=4, available_until=in_a_day()).order
    placed = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_600_000,
                            gpus=2, duration_seconds=3600)

    assert placed.order.status == "filled"
    [lease] = placed.leases
    assert lease.price == 2_490_000  # the resting ask's price
    assert lease.gpu_count == 2 and lease.node == node and lease.status == "pending"
    ask.refresh_from_db()
    assert ask.remaining_gpus == 2 and ask.status == "partially_filled"
    # the lease holds exactly its cost at the trade price; the bid's hold is closed
    assert Hold.objects.get(pk=lease.hold_id).amount == 2_490_000 * 2
    assert Hold.objects.get(pk=placed.order.hold_id).status == "released"
    assert ledger.wallet(user_id=buyer.pk).held == 4_980_000
    assert first_violation() is None


def test_price_time_priority_and_resting_bid():
    provider, node, _ = registered_node()
    early, late = funded_buyer(100), funded_buyer(100)
    b1 = book.place_bid(buyer_id=early.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                        gpus=2, duration_seconds=3600).order
    b2 = book.place_bid(buyer_id=late.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                        gpus=2, duration_seconds=3600).order
    b3 = book.place_bid(buyer_id=late.pk, market_slug="h100-sxm-80gb", price=1_900_000,
                        gpus=2, duration_seconds=3600).order
    assert b1.status == b2.status == b3.status == "open"
    placed = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                            price=1_800_000, gpus=2, available_until=in_a_day())
    [lease] = placed.leases
    assert lease.buyer == early and lease.price == 2_000_000  # resting bid's price, earliest
    b2.refresh_from_db()
    assert b2.status == "open"


def test_no_gpu_in_two_active_leases_and_gpus_return_to_the_ask():
    provider, node, _ = registered_node()
    buyer = funded_buyer(1000)
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_000_000, gpus=8, available_until=in_a_day()).order
    leases = []
    for _ in range(4):
        leases += book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                                 price=2_000_000, gpus=2, duration_seconds=3600).leases
    uuids = [lg.gpu.uuid for lg in LeaseGpu.objects.filter(active=True)]
    assert len(uuids) == 8 == len(set(uuids))
    more = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                          gpus=2, duration_seconds=3600)
    assert more.leases == [] and more.order.status == "open"  # nothing left to sell

    running = mark_running(lease=leases[0], container_id="c" * 64)
    end_lease(lease_id=running.pk, status="completed", cause="test")
    # the two GPUs return to the ask, which then fills the resting bid
    more.order.refresh_from_db()
    assert more.order.status == "filled"
    ask.refresh_from_db()
    assert ask.remaining_gpus == 0
    assert Lease.objects.filter(status="pending").count() == 4
    assert first_violation() is None


def test_an_ask_whose_every_gpu_came_back_is_open_again():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_000_000, gpus=4, available_until=in_a_day()).order
    [first] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                             price=2_000_000, gpus=2, duration_seconds=3600).leases
    [second] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                              price=2_000_000, gpus=2, duration_seconds=3600).leases
    ask.refresh_from_db()
    assert ask.status == "filled"
    end_lease(lease_id=mark_running(lease=first, container_id="a" * 64).pk,
              status="completed", cause="test")
    ask.refresh_from_db()
    assert (ask.status, ask.remaining_gpus) == ("partially_filled", 2)
    end_lease(lease_id=mark_running(lease=second, container_id="b" * 64).pk,
              status="completed", cause="test")
    ask.refresh_from_db()
    assert (ask.status, ask.remaining_gpus) == ("open", 4)
    assert first_violation() is None


def test_bid_beyond_balance_writes_nothing():
    buyer = funded_buyer(1)
    counts = (Order.objects.count(), Hold.objects.count(), JournalEntry.objects.count())
    with pytest.raises(ledger.InsufficientFunds):
        book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                       gpus=8, duration_seconds=3600)
    assert (Order.objects.count(), Hold.objects.count(),
            JournalEntry.objects.count()) == counts


def test_bad_inputs_name_the_field():
    provider, node, _ = registered_node()
    buyer = funded_buyer(10)
    with pytest.raises(InvalidInput) as e:
        book.place_bid(buyer_id=buyer.pk, market_slug="nope", price=1, gpus=1,
                       duration_seconds=60)
    assert e.value.field == "gpu_class"
    with pytest.raises(InvalidInput) as e:
        book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=1, gpus=3,
                       gang_size=2, duration_seconds=60)
    assert e.value.field == "gang_size"
    with pytest.raises(InvalidInput) as e:
        book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                       price=1_000_000, gpus=9, available_until=in_a_day())
    assert e.value.field == "gpus" and "only 8" in e.value.message
    assert Order.objects.count() == 0 and Fill.objects.count() == 0


def test_settled_lease_pays_exactly_85_15():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=2_490_000,
                   gpus=2, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_490_000,
                             gpus=2, duration_seconds=3600).leases
    from datetime import timedelta

    lease = mark_running(lease=lease, container_id="x" * 64)
    ended = end_lease(lease_id=lease.pk, status="completed", cause="test",
                      now=lease.started_at + timedelta(seconds=1234))
    cost = 2_490_000 * 2 * 1234 // 3600
    assert ended.cost == cost
    assert ended.platform_fee == cost * 1500 // 10_000
    assert ended.provider_amount == cost - ended.platform_fee
    assert ledger.wallet(user_id=provider.pk).earned == ended.provider_amount
    assert ledger.wallet(user_id=buyer.pk).available == 100_000_000 - cost
    assert ledger.wallet(user_id=buyer.pk).held == 0
    assert first_violation() is None
