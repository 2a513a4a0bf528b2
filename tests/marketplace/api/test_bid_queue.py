"""The per-market bid queue on Redis (marketplace/api/bid_queue.py): bids from several
web processes (here: several BidQueue instances, each with its own process id, reply
list and consumers) are placed by one consumer, in queue order — price-time priority
across processes — each exactly once; a dead consumer's lease lapses and its queue,
and the group it left in flight, are taken over (only what it did not commit is
placed); a fenced-off consumer writes nothing. Real Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace

import pytest
import redis
from django.conf import settings
from django.db import connection

from marketplace import book, locking
from marketplace.api import bid_queue
from marketplace.api_tokens import hash_key
from marketplace.models import GpuClass, Order
from settlement.checks import first_violation
from tests.factories import api_token, ask, ensure_catalog, funded_buyer, registered_node

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "h100-sxm-80gb"


@pytest.fixture
def queues():
    """Make BidQueue instances (fast lease, short timeouts) on clean keys; stop them after."""
    if not settings.REDIS_URL:
        pytest.skip("the bid queue needs Redis (REDIS_URL)")
    ensure_catalog()
    made: list[bid_queue.BidQueue] = []

    def make() -> bid_queue.BidQueue:
        q = bid_queue.BidQueue(64, lease_ms=300, answer_timeout=10)
        made.append(q)
        return q

    r = redis.Redis.from_url(settings.REDIS_URL)
    prefix = f"gpumarket:bidq:{settings.DATABASES['default']['NAME']}:"
    for key in r.scan_iter(f"{prefix}*"):
        r.delete(key)
    yield make
    for q in made:
        q.stop()


def bid(price: str, gpus: int = 1) -> book.BidRequest:
    return book.BidRequest(buyer_id=0, market_slug=H100, price=int(float(price) * 1e6),
                           gpus=gpus, duration_seconds=3600)


def held_by_a_dead_consumer(q: bid_queue.BidQueue, ms: int) -> None:
    """A lease of a consumer that is gone: it lapses after `ms` and nobody renews it."""
    q.redis.set(q.key("owner", H100), "dead-process:" + H100, px=ms)


async def place_all(pairs):
    return await asyncio.gather(*(q.place(token, b) for q, token, b in pairs))


def test_bids_of_two_processes_are_placed_by_one_consumer_in_queue_order(queues):
    """12 bids through two processes wait behind a dead consumer's lease; when it lapses,
    one process takes the queue over and places them all, in the order they were queued:
    ids ascending, and the ask fills the best prices first."""
    provider, node, _ = registered_node()
    ask(provider, node, price=2_200_000, gpus=2)
    buyers = [funded_buyer(100) for _ in range(4)]
    tokens = [api_token(b) for b in buyers]
    a, b = queues(), queues()
    held_by_a_dead_consumer(a, 600)
    prices = ["2.00", "2.05", "2.30", "2.10", "2.15", "2.25"] * 2
    pairs = [((a, b)[i % 2], tokens[i % 4], bid(p)) for i, p in enumerate(prices)]
    answers = asyncio.run(place_all(pairs))
    assert [status for status, _ in answers] == [201] * 12
    ids = [body["id"] for _, body in answers]
    assert ids == sorted(ids)  # queue order = arrival order, across both processes
    # one consumer placed every bid (the other process placed none)
    assert sorted([a.stats["bids"], b.stats["bids"]]) == [0, 12]
    assert a.stats["took_over"] + b.stats["took_over"] == 0  # nothing was in flight
    filled = [body["price"] for _, body in answers if body["leases"]]
    assert filled == ["2.300000", "2.250000"]  # price priority, then time
    assert Order.objects.filter(side="bid").count() == 12
    assert first_violation() is None


def test_a_group_left_in_flight_is_placed_once_after_a_take_over(queues):
    """A consumer took 5 bids (they are in proc:), committed the first 3 under its fence,
    and died. The next consumer raises the fence, places only the last 2, and answers
    them; the 3 committed stay as they are (exactly once)."""
    buyer = funded_buyer(100)
    token = api_token(buyer)
    q = queues()
    market = GpuClass.objects.get(slug=H100)
    group = uuid.uuid4().hex
    items, requests = [], []
    for i in range(5):
        r = bid(f"1.{10 + i}")
        requests.append(replace(r, buyer_id=buyer.pk))
        items.append(json.dumps({"id": f"req-{i}", "r": q.reply_key, "h": hash_key(token),
                                 "b": bid_queue.encode_bid(r), "d": 4e9}))
    # the dead consumer (token 1): took the group, committed positions 0-2, then died
    q.redis.set(q.key("fence", H100), 1)
    placed = book.place_bids(requests[:3], fence=locking.Fence(1, group, [0, 1, 2]))
    assert all(isinstance(p, book.Placed) for p in placed)
    q.redis.set(q.key("proc", H100), json.dumps({"group": group, "items": items}))
    held_by_a_dead_consumer(q, 200)
    market.refresh_from_db()
    assert (market.bid_queue_group, market.bid_queue_done) == (group, 2)

    async def wait_for_the_rest():
        loop = asyncio.get_running_loop()
        futures = {}
        for i in (3, 4):
            futures[i] = loop.create_future()
            q._waiting[f"req-{i}"] = (loop, futures[i], H100)
        q._ensure_replies()  # its watchdog adopts the lapsed lease
        return await asyncio.wait_for(asyncio.gather(*futures.values()), 20)

    answers = asyncio.run(wait_for_the_rest())
    assert [(kind, status) for kind, status, _ in answers] == [("answer", 201)] * 2
    prices = sorted(Order.objects.filter(side="bid").values_list("price", flat=True))
    assert prices == [1_100_000, 1_110_000, 1_120_000, 1_130_000, 1_140_000]  # once each
    assert q.stats["took_over"] == 1
    assert q.redis.get(q.key("proc", H100)) is None
    market.refresh_from_db()
    assert market.bid_queue_fence == 2 and market.bid_queue_done == 4
    assert first_violation() is None


def test_a_fenced_off_consumer_writes_nothing(queues):
    """Once a later consumer raised the fence (take_over), the earlier one's transaction
    is refused whole: no order, no hold."""
    buyer = funded_buyer(100)
    market = GpuClass.objects.get(slug=H100)
    assert locking.take_over(market.pk, 5) == ("", -1)
    r = book.BidRequest(buyer_id=buyer.pk, market_slug=H100, price=1_500_000, gpus=1,
                        duration_seconds=3600)
    with pytest.raises(locking.Fenced):
        book.place_bids([r, r], fence=locking.Fence(4, "old", [0, 1]))
    assert not Order.objects.exists()
    with pytest.raises(locking.Fenced):
        locking.take_over(market.pk, 3)
    placed = book.place_bids([r], fence=locking.Fence(5, "new", [0]))
    assert isinstance(placed[0], book.Placed)
    connection.close()
    assert first_violation() is None


def test_a_bid_past_its_deadline_in_the_queue_is_not_placed(queues):
    buyer = funded_buyer(100)
    q = queues()
    q.answer_timeout = 0.5
    held_by_a_dead_consumer(q, 1500)  # the lease lapses after the bid's deadline
    with pytest.raises(bid_queue.NotPlaced, match="past its deadline"):
        asyncio.run(q.place(api_token(buyer), bid("1.50")))
    assert not Order.objects.exists()


def test_the_codec_keeps_every_term_and_seals_the_secrets():
    from datetime import UTC, datetime
    from decimal import Decimal

    r = book.BidRequest(buyer_id=3, market_slug=H100, price=1, gpus=4, duration_seconds=60,
                        gang_size=2, time_in_force="IOC", image="img", command=["a", "b"],
                        expires_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
                        client_order_id="c-1", interruptible=True, ports=[22, 8888],
                        port_roles={"8888": "jupyter"}, ssh=True, env={"A": "1"},
                        secrets={"TOKEN": "s3cr3t-value"}, interconnect="nvlink",
                        failover=False, min_reliability=Decimal("0.950"), avoid_node_id=7,
                        node=9, notice_signal="SIGUSR1", stop_grace_seconds=30)
    data = bid_queue.encode_bid(r)
    assert "s3cr3t-value" not in json.dumps(data)
    assert bid_queue.decode_bid(json.loads(json.dumps(data))) == r
