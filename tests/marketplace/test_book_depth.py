"""book.depth (one statement per side on the partial index order_book_depth) equals the
naive computation over every order row: active, GPUs left, not past its time at `now`,
summed per price, the best `levels` of each side — on seeded random books of two
markets with every status, zero remainders, bids past expires_at and asks past
available_until, and also the engine's own depth of the book rebuilt at `now`."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from marketplace import book, locking
from marketplace.models import GpuClass, Order
from tests.factories import UserFactory, ensure_catalog, registered_node

# the rows are written directly (a read query's test, no holds behind the bids): only the
# ledger's own invariants are checked after each test
pytestmark = [pytest.mark.django_db, pytest.mark.ledger("ledger_only")]

STATUSES = ["open", "open", "open", "partially_filled", "filled", "cancelled", "expired"]


def naive(orders: list[Order], market: GpuClass, now, levels: int):
    sides: dict[str, dict[int, int]] = {"bid": defaultdict(int), "ask": defaultdict(int)}
    for o in orders:
        if (o.market_id != market.pk or o.status not in Order.ACTIVE
                or o.remaining_gpus <= 0
                or (o.expires_at is not None and o.expires_at <= now)
                or (o.available_until is not None and o.available_until <= now)):
            continue
        sides[o.side][o.price] += o.remaining_gpus
    bids = sorted(sides["bid"].items(), reverse=True)[:levels]
    asks = sorted(sides["ask"].items())[:levels]
    return bids, asks


def random_orders(rng: random.Random, markets, owners, node, now, n: int) -> list[Order]:
    orders = []
    for _ in range(n):
        side = rng.choice(["bid", "ask"])
        gpus = rng.randint(1, 8)
        remaining = rng.choice([0, gpus, rng.randint(0, gpus)])
        status = rng.choice(STATUSES)
        soon = now + timedelta(seconds=rng.randint(-120, 120))
        orders.append(Order(
            market=rng.choice(markets), owner=rng.choice(owners), side=side, status=status,
            price=rng.randint(180, 260) * 10_000, gpus=gpus, remaining_gpus=remaining,
            duration_seconds=3600 if side == "bid" else None,
            gang_size=1 if side == "bid" else None,
            expires_at=soon if side == "bid" and rng.random() < 0.3 else None,
            node=node if side == "ask" else None,
            available_until=(soon if rng.random() < 0.3 else now + timedelta(days=1))
            if side == "ask" else None))
    return Order.objects.bulk_create(orders)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_depth_equals_the_naive_computation(seed):
    ensure_catalog()
    _, node, _ = registered_node()
    rng = random.Random(seed)
    now = timezone.now()
    markets = [GpuClass.objects.get(slug=slug) for slug in ("h100-sxm-80gb", "a100-sxm-80gb")]
    owners = [UserFactory() for _ in range(3)]
    orders = random_orders(rng, markets, owners, node, now, 400)
    for market in markets:
        for levels in (0, 1, 5, 20, 200):
            for at in (now, now - timedelta(seconds=130), now + timedelta(seconds=60)):
                assert book.depth(market, levels, now=at) == naive(orders, market, at, levels)


def test_depth_is_the_engine_books_depth():
    """Where every active bid still wants GPUs (as the services keep it), the database's
    depth and the engine's depth of the book rebuilt at `now` agree."""
    _, node, _ = registered_node()
    rng = random.Random(7)
    now = timezone.now()
    market = GpuClass.objects.get(slug="h100-sxm-80gb")
    orders = random_orders(rng, [market], [UserFactory() for _ in range(3)], node, now, 300)
    Order.objects.filter(side="bid", remaining_gpus=0, status__in=Order.ACTIVE).update(
        status="filled")
    engine_book = locking.build_book(market, now=now)
    assert book.depth(market, 10, now=now) == engine_book.depth(10)
    assert orders  # (the random book was written)


def test_depth_reads_the_partial_index_on_postgresql():
    """The plan of each side's statement scans order_book_depth (index only), so the cost
    is the orders of the levels asked for, not of the whole book."""
    if connection.vendor != "postgresql":
        pytest.skip("the index plan is PostgreSQL's")
    _, node, _ = registered_node()
    market = GpuClass.objects.get(slug="h100-sxm-80gb")
    random_orders(random.Random(3), [market], [UserFactory()], node, timezone.now(), 2000)
    plans = []

    def capture(execute, sql, params, many, context):
        plans.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        book.depth(market, 20)
    assert len(plans) == 2
    with connection.cursor() as c:
        c.execute("ANALYZE marketplace_order")
        for sql, params in plans:
            c.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in c.fetchall())
            assert "order_book_depth" in plan, plan
