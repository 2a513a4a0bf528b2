"""book.place_bids: a group of bids in one transaction behaves exactly as the same bids
placed one after the other, and a refused bid in a group changes nothing of its own
and does not disturb the others (PostgreSQL)."""

from __future__ import annotations

import random

import pytest
from django.db import transaction

from marketplace import book, locking
from marketplace.errors import InvalidInput
from marketplace.models import Fill, Lease, Order, OrderEvent
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold, JournalEntry
from tests.factories import funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db

MARKET = "h100-sxm-80gb"


def bid(buyer, price: int, gpus: int = 1, **kw) -> book.BidRequest:
    return book.BidRequest(buyer_id=buyer.pk, market_slug=MARKET, price=price, gpus=gpus,
                           duration_seconds=kw.pop("duration_seconds", 3600), **kw)


def test_a_mixed_group_answers_each_bid_on_its_own():
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_500_000, gpus=4, available_until=in_a_day())
    rich, poor = funded_buyer(100), funded_buyer(1)
    before = {"orders": Order.objects.count(), "holds": Hold.objects.count()}

    results = book.place_bids([
        bid(rich, 2_000_000),                              # rests
        bid(poor, 2_000_000, gpus=2),                      # 4 USD held: refused
        bid(rich, 2_000_000, gpus=3, gang_size=2),         # gang does not divide
        bid(rich, 2_600_000, gpus=2),                      # crosses the ask: a lease
        bid(rich, 2_600_000, gpus=8, time_in_force="FOK"),  # cannot fill whole: killed
        bid(rich, 2_100_000, time_in_force="IOC"),         # nothing to match: cancelled
        bid(poor, 900_000),                                # 0.90 of 1 USD: fits
    ])

    rests, broke, gang, crossed, fok, ioc, small = results
    assert isinstance(rests, book.Placed) and rests.order.status == "open"
    assert isinstance(broke, ledger.InsufficientFunds)
    assert isinstance(gang, InvalidInput) and gang.field == "gang_size"
    assert crossed.order.status == "filled" and len(crossed.leases) == 1
    assert crossed.leases[0].price == 2_500_000 and crossed.leases[0].gpu_count == 2
    assert fok.order.status == "cancelled" and fok.leases == []
    assert ioc.order.status == "cancelled"
    assert small.order.status == "open"
    # the refused bids wrote nothing: five orders, five holds
    assert Order.objects.count() == before["orders"] + 5
    assert Hold.objects.filter(reference__startswith="order:").count() == 5
    assert not Order.objects.filter(owner=poor, gpus=2).exists()
    # every placed order is in the database as answered, with its hold and first event
    for placed in (rests, crossed, fok, ioc, small):
        stored = Order.objects.get(pk=placed.order.pk)
        assert (stored.status, stored.remaining_gpus) == (placed.order.status,
                                                          placed.order.remaining_gpus)
        hold = Hold.objects.get(pk=stored.hold_id)
        assert hold.reference == f"order:{stored.pk}" and hold.buyer_id == stored.owner_id
        assert OrderEvent.objects.filter(order=stored, to_status="open",
                                         cause="bid placed").count() == 1
    assert ledger.wallet(user_id=rich.pk).held == (
        2_000_000 + 2_500_000 * 2)  # the resting bid, and the lease at the trade price
    assert ledger.wallet(user_id=poor.pk).held == 900_000
    assert first_violation() is None


def test_a_buyers_bids_in_one_group_draw_on_one_balance():
    buyer = funded_buyer(5)
    results = book.place_bids([bid(buyer, 2_000_000), bid(buyer, 2_000_000),
                               bid(buyer, 2_000_000)])
    assert [type(r).__name__ for r in results] == ["Placed", "Placed", "InsufficientFunds"]
    assert results[2].available == 1_000_000
    assert ledger.wallet(user_id=buyer.pk).available == 1_000_000
    assert first_violation() is None


def test_a_client_order_id_twice_in_a_group_places_one_order():
    buyer = funded_buyer(100)
    first, again, other = book.place_bids([
        bid(buyer, 2_000_000, client_order_id="job-7"),
        bid(buyer, 2_000_000, client_order_id="job-7"),
        bid(buyer, 2_100_000, client_order_id="job-7")])  # other terms: not a retry
    assert first.created and not again.created
    assert again.order.pk == first.order.pk and again.order.price == 2_000_000
    assert isinstance(other, book.Conflict) and other.field == "client_order_id"
    replay, = book.place_bids([bid(buyer, 2_000_000, client_order_id="job-7")])
    assert not replay.created and replay.order.pk == first.order.pk
    assert Order.objects.filter(owner=buyer).count() == 1


def test_an_error_inside_a_group_places_the_others_one_by_one(monkeypatch):
    """A failure while writing the group (here: the third bid's hold raising) rolls the
    group back, then each bid runs alone: only the failing bid gets the error."""
    buyers = [funded_buyer(100) for _ in range(4)]
    real = ledger.holds_place_many

    def failing(requests):
        if any(buyer == buyers[2].pk for buyer, _, _ in requests):
            raise RuntimeError("ledger unavailable for this buyer")
        return real(requests)

    monkeypatch.setattr(ledger, "holds_place_many", failing)
    results = book.place_bids([bid(b, 2_000_000) for b in buyers])
    assert [type(r).__name__ for r in results] == ["Placed", "Placed", "RuntimeError",
                                                   "Placed"]
    assert Order.objects.filter(owner=buyers[2]).count() == 0
    assert Order.objects.filter(owner__in=buyers).count() == 3
    assert first_violation() is None


def _outcome() -> dict:
    """What the book and the ledger look like, in terms that do not depend on ids."""
    orders = list(Order.objects.filter(side="bid").order_by("pk")
                  .values_list("pk", "status", "remaining_gpus"))
    rank = {pk: i for i, (pk, _, _) in enumerate(orders)}
    fills = sorted((rank[f.bid_id], f.ask_id, f.gpus, f.price) for f in Fill.objects.all())
    leases = sorted((rank[lease.fill.bid_id], lease.gpu_count, lease.price, lease.node_id)
                    for lease in Lease.objects.select_related("fill"))
    holds = sorted((h.buyer_id, h.status, h.amount) for h in Hold.objects.all())
    return {"orders": [(s, r) for _, s, r in orders], "fills": fills, "leases": leases,
            "holds": holds, "entries": JournalEntry.objects.count()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_group_ends_exactly_as_the_same_bids_one_by_one(seed):
    """Seeded random bids against two standing asks (some cross, some rest,
    some are IOC/FOK, some too big for a buyer's balance): placed as one group and,
    in a rolled-back transaction, one by one — the same orders, fills, leases, holds
    and journal entries."""
    rng = random.Random(seed)
    provider, node, _ = registered_node()
    for price in (2_400_000, 2_300_000):
        book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                       price=price, gpus=4, available_until=in_a_day())
    buyers = [funded_buyer(rng.choice((3, 30, 300))) for _ in range(6)]
    requests = []
    for _ in range(40):
        gpus = rng.choice((1, 2, 4))
        requests.append(bid(rng.choice(buyers), rng.randrange(2_000_000, 2_600_000, 50_000),
                            gpus=gpus, gang_size=rng.choice([g for g in (1, 2, 4)
                                                             if gpus % g == 0]),
                            time_in_force=rng.choice(("GTC", "GTC", "IOC", "FOK"))))

    with transaction.atomic():
        one_by_one = [book.place_bids([r])[0] for r in requests]
        expected = _outcome()
        transaction.set_rollback(True)
    locking.book_cache.clear()  # the rolled-back books never reached the cache anyway
    grouped = book.place_bids(requests)

    assert [type(r) for r in grouped] == [type(r) for r in one_by_one]
    assert _outcome() == expected
    assert sum(isinstance(r, book.Placed) and bool(r.leases) for r in grouped) > 0
    assert first_violation() is None
