"""order_checks.market_facts (the bid path's one read of a market before the lock) agrees
with the three reads it folds, and place_bids runs a fixed number of statements per
group, whatever its size (bench/README.md, "the book at depth")."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from marketplace import book, order_checks, runtimes
from marketplace.errors import InvalidInput
from marketplace.models import GpuClass
from tests.factories import H100, funded_buyer, registered_node

pytestmark = pytest.mark.django_db


def _three_reads(slug: str) -> tuple[int, int, bool]:
    market = order_checks.get_market(slug)
    return market.pk, order_checks.largest_node(market), runtimes.market_runs_images(market.pk)


def _facts(slug: str) -> tuple[int, int, bool]:
    f = order_checks.market_facts(slug)
    return f.market.pk, f.largest, f.runs_images


def test_market_facts_agree_with_get_market_largest_node_and_runs_images():
    _, node, _ = registered_node()
    _, other, _ = registered_node(name="node-2", own_uuids=True)
    assert _facts(H100) == _three_reads(H100)
    assert _facts(H100)[1:] == (8, True)
    node.runtime = runtimes.PROCESS
    node.save(update_fields=["runtime"])
    assert _facts(H100) == _three_reads(H100)  # the other node still runs images
    other.runtime = runtimes.PROCESS
    other.save(update_fields=["runtime"])
    assert _facts(H100) == _three_reads(H100)
    assert _facts(H100)[2] is False  # every node process-only
    other.retired_at = timezone.now()
    other.save(update_fields=["retired_at"])
    assert _facts(H100) == _three_reads(H100)
    node.retired_at = timezone.now()
    node.save(update_fields=["retired_at"])
    assert _facts(H100) == _three_reads(H100)
    assert _facts(H100)[2] is True  # no node in service: a bid may rest
    empty = GpuClass.objects.exclude(slug=H100).exclude(gpus__isnull=False).first()
    assert _facts(empty.slug) == _three_reads(empty.slug)
    assert _facts(empty.slug)[1:] == (0, True)
    market = order_checks.market_facts(H100).market
    assert market == GpuClass.objects.get(slug=H100)
    assert market.book_version == GpuClass.objects.get(slug=H100).book_version
    with pytest.raises(InvalidInput, match="unknown GPU class"):
        order_checks.market_facts("no-such-class")


def _statements(monkeypatch, call) -> int:
    """Statements sent to PostgreSQL (every psycopg cursor: the ORM's and core.bulk's)."""
    count = 0
    real = psycopg.Cursor.execute

    def counted(self, *args, **kwargs):
        nonlocal count
        count += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    call()
    monkeypatch.setattr(psycopg.Cursor, "execute", real)
    return count


def test_a_group_of_bids_runs_the_same_statements_as_one_bid(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("counts PostgreSQL statements")
    registered_node()
    buyers = [funded_buyer(1000) for _ in range(8)]

    def bids(n: int, price: int) -> list[book.BidRequest]:
        return [book.BidRequest(buyer_id=buyers[i].pk, market_slug=H100, price=price,
                                gpus=1, duration_seconds=3600) for i in range(n)]

    book.place_bids(bids(8, 1_000_000))  # accounts and book cache warm: steady state
    one = _statements(monkeypatch, lambda: book.place_bids(bids(1, 1_100_000)))
    eight = _statements(monkeypatch, lambda: book.place_bids(bids(8, 1_200_000)))
    assert one == eight
    # market facts, lock (with its lock_timeout), due/victims flags, orders, account
    # rows locked, holds, entries, postings, balances, hold ids, events: 11 (was 15,
    # 16 with a fence); here also the SAVEPOINT and RELEASE of the test's transaction
    # and the book's read under the lock
    assert one <= 14
