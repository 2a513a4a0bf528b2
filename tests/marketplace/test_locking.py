"""The market lock waits at most GPUMARKET_MARKET_LOCK_TIMEOUT_MS (marketplace/locking.py):
a writer that cannot get it is refused with MarketBusy (the API's 503 with Retry-After)
and writes nothing. The lock is held by a real second connection (another thread)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from marketplace import book
from marketplace.errors import MarketBusy
from marketplace.locking import lock_market
from marketplace.models import GpuClass
from tests.factories import ensure_catalog, funded_buyer
from tests.support.api import client_for, snapshot

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "h100-sxm-80gb"


@pytest.fixture
def market_held(settings):
    """The H100 market's lock held by another connection until the test is done (or
    30 s: so that, without a lock timeout, the waiting writer gets it and the test
    fails instead of hanging)."""
    settings.GPUMARKET_MARKET_LOCK_TIMEOUT_MS = 100
    ensure_catalog()
    market_id = GpuClass.objects.get(slug=H100).pk
    held, done = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                lock_market(market_id)
                held.set()
                done.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(30)
    yield market_id
    done.set()
    thread.join()


def test_a_writer_that_cannot_get_the_lock_is_refused_and_writes_nothing(market_held):
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    with pytest.raises(MarketBusy, match="the market is busy"):
        book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=2_000_000, gpus=1,
                       duration_seconds=3600)
    assert snapshot(buyer) == before


def test_the_api_answers_503_with_retry_after(market_held):
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    response = client_for(buyer).post("/api/v1/orders/", {
        "side": "bid", "gpu_class": H100, "price": "2.00", "gpus": 1, "hours": 1},
        format="json")
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "1"
    assert "the market is busy" in response.json()["detail"]
    assert snapshot(buyer) == before


def test_a_group_of_bids_is_refused_whole_not_retried_one_by_one(market_held):
    buyers = [funded_buyer(100) for _ in range(3)]
    results = book.place_bids([
        book.BidRequest(buyer_id=b.pk, market_slug=H100, price=2_000_000, gpus=1,
                        duration_seconds=3600) for b in buyers])
    assert [type(r) for r in results] == [MarketBusy] * 3
