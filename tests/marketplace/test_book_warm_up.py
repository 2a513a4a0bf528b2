"""The book cache warmed before the process serves (locking.warm_up, the ASGI lifespan's
startup: marketplace/lifespan.py): the first writer after it finds a hit (or catches up
with what other processes wrote since) instead of rebuilding, and its book equals a
rebuild."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import book, lifespan, locking
from marketplace.models import GpuClass
from tests.factories import funded_buyer, registered_node
from tests.marketplace.test_book_cache import snapshot

pytestmark = pytest.mark.django_db(transaction=True)

MARKET = "h100-sxm-80gb"


@pytest.fixture
def market_with_orders(monkeypatch):
    """An ask and resting bids, written through another process's cache (not ours)."""
    monkeypatch.setattr(locking, "book_cache", locking.BookCache())
    provider, node, _ = registered_node()
    buyer = funded_buyer(1000)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_500_000, gpus=8, available_until=timezone.now() + timedelta(days=1))
    for price in (2_000_000, 2_100_000, 2_100_000, 1_900_000):
        book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=price, gpus=1,
                       duration_seconds=3600)
    ours = locking.BookCache()
    monkeypatch.setattr(locking, "book_cache", ours)
    return ours, buyer, GpuClass.objects.get(slug=MARKET)


def test_the_first_writer_after_a_warm_up_does_not_rebuild(market_with_orders):
    cache, buyer, market = market_with_orders
    assert locking.warm_up() == {market.pk: 5}
    assert cache.peek(market.pk).version == market.book_version
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_200_000, gpus=2,
                   duration_seconds=3600)
    assert cache.stats == {"hit": 1, "caught_up": 0, "rebuilt": 0, "warmed": 1}
    market.refresh_from_db()
    assert snapshot(cache.peek(market.pk).book) == snapshot(locking.build_book(market))


def test_a_warmed_book_catches_up_with_other_processes_writes(market_with_orders, monkeypatch):
    cache, buyer, market = market_with_orders
    locking.warm_up([market.pk])
    monkeypatch.setattr(locking, "book_cache", locking.BookCache())  # another process
    other = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_300_000, gpus=1,
                           duration_seconds=3600).order
    book.cancel_order(user_id=buyer.pk, order_id=other.pk)
    monkeypatch.setattr(locking, "book_cache", cache)  # back in this process
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_400_000, gpus=3,
                   duration_seconds=3600)
    assert (cache.stats["caught_up"], cache.stats["rebuilt"]) == (1, 0)
    market.refresh_from_db()
    assert snapshot(cache.peek(market.pk).book) == snapshot(locking.build_book(market))


def test_the_lifespan_startup_warms_the_cache_before_it_completes(market_with_orders):
    cache, _, market = market_with_orders
    sent = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive():
        return next(messages)

    async def send(message):
        sent.append((message["type"], cache.peek(market.pk) is not None))

    asyncio.run(lifespan.lifespan({"type": "lifespan"}, receive, send))
    assert sent == [("lifespan.startup.complete", True), ("lifespan.shutdown.complete", True)]


def test_no_warm_up_when_switched_off(market_with_orders, settings):
    cache, _, market = market_with_orders
    settings.GPUMARKET_BOOK_WARM_UP = False
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive():
        return next(messages)

    async def send(message):
        pass

    asyncio.run(lifespan.lifespan({"type": "lifespan"}, receive, send))
    assert cache.peek(market.pk) is None
