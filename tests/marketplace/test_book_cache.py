"""The in-process order book cache (marketplace/book.py, "Book cache") never differs from
the book rebuilt from the database.

A seeded random walk of service calls — bids (GTC/IOC/FOK, gangs, expiries, some beyond
the buyer's balance), asks, cancels, the expiry sweep, leases ending (GPUs return to the
ask, which re-matches), GPU health changes (health.py rebalancing asks), and
transactions that roll back after the book was loaded — runs on real transactions
(on_commit fires), alternating between two caches as two processes would. Every time
a writer gets its book (cache hit, catch-up from the orders other "processes"
changed, or rebuild), it is compared with a fresh rebuild inside the same
transaction; after every step the cached book of the current version is compared
again. All three paths must have been taken.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.signals import post_save
from django.utils import timezone

from marketplace import book, health, locking, matching
from marketplace.errors import Conflict
from marketplace.lease_end import end_lease
from marketplace.models import GpuClass, Lease, Order
from providers.models import Gpu
from settlement import services as ledger
from settlement.checks import first_violation
from tests.factories import UserFactory, funded_buyer, registered_node

pytestmark = pytest.mark.django_db(transaction=True)

MARKET = "h100-sxm-80gb"


def snapshot(b) -> tuple[list, list]:
    return ([(x.id, x.owner, x.price, x.gpus, x.gang, x.duration_s, x.seq, x.tif, x.nvlink)
             for x in b.bids()],
            [(a.id, a.owner, a.price, a.gpus, a.node, a.available_until, a.seq)
             for a in b.asks()])


class Boom(Exception):
    pass


@pytest.fixture
def checked_loads(monkeypatch):
    """Wrap _load_book: every book a writer gets must equal a rebuild, there and then."""
    real_load = locking.load_book
    seen = {"loads": 0}

    def load(market, **kw):
        got = real_load(market, **kw)
        fresh = locking.build_book(market, exclude=kw.get("exclude"), now=kw.get("now"))
        assert snapshot(got) == snapshot(fresh)
        seen["loads"] += 1
        return got

    monkeypatch.setattr(locking, "load_book", load)
    return seen


def test_cached_book_equals_a_rebuild_after_random_service_calls(monkeypatch, checked_loads):
    rng = random.Random(20261129)
    caches = [locking.BookCache(), locking.BookCache()]  # two "processes"
    base = timezone.now()
    nodes = [registered_node()]  # (the recorded dumps' GPU UUIDs are unique to one node)
    buyers = []
    for i in range(5):
        user = UserFactory(username=f"buyer{i}")
        ledger.dev_credit(user_id=user.pk, amount=(50 if i == 4 else 10_000) * 1_000_000)
        buyers.append(user)
    # a provider can also bid (self-trade prevention)
    buyers.append(nodes[0][0])
    ledger.dev_credit(user_id=nodes[0][0].pk, amount=10_000 * 1_000_000)
    market = GpuClass.objects.get(slug=MARKET)
    refusals = []

    def refused(call, **kwargs) -> None:
        try:
            call(**kwargs)
        except (ledger.InsufficientFunds, Conflict) as exc:
            # Conflict: a GPU that turns unhealthy while an ask still offers it (before the
            # health rebalance shrinks the ask) leaves a lease too few GPUs, and the whole
            # transaction rolls back — after the engine changed the book it loaded
            refusals.append(exc)

    def check_current(cache: locking.BookCache) -> None:
        entry = cache.peek(market.pk)
        version = GpuClass.objects.values_list("book_version", flat=True).get(pk=market.pk)
        if entry is not None and entry.version == version:
            assert snapshot(entry.book) == snapshot(locking.build_book(market))

    for step in range(220):
        cache = rng.choice(caches)
        monkeypatch.setattr(locking, "book_cache", cache)
        now = base + timedelta(minutes=step)
        action = rng.choices(
            ["bid", "ask", "cancel", "expire", "end_lease", "health", "rollback"],
            weights=[50, 10, 12, 5, 8, 4, 5])[0]
        if action == "bid" or action == "rollback":
            gpus = rng.choice((1, 2, 2, 4, 8))
            gang = rng.choice([g for g in (1, 2, 4, 8) if gpus % g == 0])
            kwargs = {
                "buyer_id": rng.choice(buyers).pk, "market_slug": MARKET, "gpus": gpus,
                "gang_size": gang, "price": rng.randrange(1_800_000, 2_800_000, 50_000),
                "duration_seconds": rng.choice((600, 3600, 7200)),
                "time_in_force": rng.choice(("GTC", "GTC", "GTC", "IOC", "FOK")),
                "expires_at": (now + timedelta(minutes=rng.randrange(1, 30))
                               if rng.random() < 0.3 else None),
                "interconnect": "nvlink" if gang > 1 and rng.random() < 0.2 else "any",
                "now": now}
            if action == "rollback":
                # a failure inside the transaction after the engine changed the cached
                # book: a post_save receiver of the new order raising
                def failing_receiver(sender, instance, **kw):
                    raise Boom("after the engine changed the book")
                post_save.connect(failing_receiver, sender=Order, dispatch_uid="boom")
                try:
                    with pytest.raises((Boom, Conflict, ledger.InsufficientFunds)):
                        book.place_bid(**kwargs)
                finally:
                    post_save.disconnect(sender=Order, dispatch_uid="boom")
            else:
                refused(book.place_bid, **kwargs)
        elif action == "ask":
            provider, node, _ = rng.choice(nodes)
            free = book.free_gpu_count(node, market)
            if free:
                refused(book.place_ask,provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                               price=rng.randrange(1_800_000, 2_800_000, 50_000),
                               gpus=rng.randint(1, free),
                               available_until=now + timedelta(hours=rng.choice((1, 3, 48))),
                               now=now)
        elif action == "cancel":
            active = list(Order.objects.filter(status__in=Order.ACTIVE)
                          .values_list("pk", "owner_id"))
            if active:
                pk, owner = rng.choice(active)
                book.cancel_order(user_id=owner, order_id=pk)
        elif action == "expire":
            book.expire_orders(now=now)
        elif action == "end_lease":
            leases = list(Lease.objects.filter(status__in=Lease.ACTIVE).values_list("pk",
                                                                                   flat=True))
            if leases:
                refused(end_lease, lease_id=rng.choice(leases), status="cancelled", cause="test",
                          now=now)
        elif action == "health":
            _, node, _ = rng.choice(nodes)
            gpu = rng.choice(list(Gpu.objects.filter(node=node).order_by("pk")))
            with transaction.atomic():
                Gpu.objects.filter(pk=gpu.pk).update(healthy=not gpu.healthy)
            refused(health.rebalance_asks, node=node)
        for c in caches:
            check_current(c)

    stats = {k: sum(c.stats[k] for c in caches) for k in ("hit", "caught_up", "rebuilt")}
    assert all(stats.values()), stats  # every path was taken
    assert checked_loads["loads"] > 100
    assert first_violation() is None


def _cached_market_with_an_ask(monkeypatch):
    """A fresh book cache for this test, a funded buyer, and a node's 8 GPUs asked at 2.00."""
    provider, node, _ = registered_node()
    cache = locking.BookCache()
    monkeypatch.setattr(locking, "book_cache", cache)
    buyer = UserFactory()
    ledger.dev_credit(user_id=buyer.pk, amount=10_000 * 1_000_000)
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                         price=2_000_000, gpus=8,
                         available_until=timezone.now() + timedelta(days=1)).order
    return cache, buyer, ask


def test_a_rolled_back_writer_leaves_no_book_behind(monkeypatch):
    cache, buyer, ask = _cached_market_with_an_ask(monkeypatch)
    market_id = ask.market_id
    assert cache.peek(market_id) is not None  # published on commit

    def failing_apply(*a, **kw):
        raise Boom("rolled back")

    monkeypatch.setattr(matching, "apply_result", failing_apply)
    with pytest.raises(Boom):
        book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_100_000, gpus=8,
                       duration_seconds=3600)
    # the engine already matched the bid against the cached book: that book is gone
    assert cache.peek(market_id) is None


def test_a_writer_nested_in_a_callers_transaction_does_not_publish(monkeypatch):
    provider, node, _ = registered_node()
    cache = locking.BookCache()
    monkeypatch.setattr(locking, "book_cache", cache)
    with transaction.atomic():
        ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                             price=2_000_000, gpus=8,
                             available_until=timezone.now() + timedelta(days=1)).order
        # the caller may change orders itself before it commits
        Order.objects.filter(pk=ask.pk).update(remaining_gpus=5)
    assert cache.peek(ask.market_id) is None
    market = GpuClass.objects.get(pk=ask.market_id)
    assert market.book_rebuild_version == market.book_version  # the next writer rebuilds


def test_ending_a_lease_keeps_the_cached_book_warm(monkeypatch):
    cache, buyer, ask = _cached_market_with_an_ask(monkeypatch)
    market = GpuClass.objects.get(pk=ask.market_id)
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_500_000, gpus=2,
                   duration_seconds=3600)  # rests below the ask
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_100_000, gpus=4,
                             duration_seconds=3600).leases
    # the ask rests in the cached book with 4 GPUs; ending the lease gives it 8 again
    end_lease(lease_id=lease.pk, status="cancelled", cause="test")
    entry = cache.peek(market.pk)  # the book of the version the lease end committed
    market.refresh_from_db()
    assert (entry.version, market.book_rebuild_version < market.book_version) == (
        market.book_version, True)
    assert snapshot(entry.book) == snapshot(locking.build_book(market))
    rebuilt = cache.stats["rebuilt"]
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_100_000, gpus=8,
                            duration_seconds=3600)
    assert cache.stats["rebuilt"] == rebuilt  # the next order does not rebuild
    assert sum(x.gpu_count for x in placed.leases) == 8
    assert snapshot(cache.peek(market.pk).book) == snapshot(locking.build_book(market))
    assert first_violation() is None


def test_a_sealed_auction_opening_and_closing_keeps_the_cached_book(monkeypatch):
    """Auctions take the market lock but change no order (lock_market(orders_unchanged)):
    the next bid catches up (nothing to read) instead of rebuilding the book."""
    from marketplace import auctions

    provider, node, _ = registered_node()
    cache = locking.BookCache()
    monkeypatch.setattr(locking, "book_cache", cache)
    buyer = funded_buyer(1000)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_000_000, gpus=4, available_until=timezone.now() + timedelta(days=1))
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_500_000, gpus=1,
                   duration_seconds=3600)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=4,
                                    reserve_price=1_000_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk, price=1_200_000)
    assert auctions.close_auction(auction_id=auction.pk, now=auction.closes_at) is not None
    rebuilt = cache.stats["rebuilt"]
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_600_000, gpus=1,
                   duration_seconds=3600)
    assert cache.stats["rebuilt"] == rebuilt
    market = GpuClass.objects.get(slug=MARKET)
    assert snapshot(cache.peek(market.pk).book) == snapshot(locking.build_book(market))
    assert first_violation() is None
