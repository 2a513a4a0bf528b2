"""Price history (marketplace/price_history.py): OHLC buckets from fills made at chosen
times — bucket boundaries, empty buckets, open/high/low/close, exact volume."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from marketplace import price_history
from marketplace.errors import InvalidInput
from marketplace.models import Fill, GpuClass
from tests.factories import H100, ask, bid, funded_buyer, registered_node

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 12, 1, 12, 7, 30, tzinfo=UTC)  # in the 12:00 bucket of 15 minutes


@pytest.fixture
def trade():
    """trade(price, gpus, at, seconds=3600): one real fill (an ask and a bid through the
    book) whose created_at is then set to `at`."""
    provider, node, _ = registered_node()
    buyer = funded_buyer(usd=100_000)

    def make(price: int, gpus: int, at: datetime, seconds: int = 3600) -> Fill:
        ask(provider, node, price=price, gpus=gpus)
        placed = bid(buyer, price=price, gpus=gpus, duration_seconds=seconds)
        fill = Fill.objects.get(bid=placed.order)
        Fill.objects.filter(pk=fill.pk).update(created_at=at)
        return fill
    return make


def _bucket(h, start: datetime) -> dict:
    return next(b for b in h["buckets"] if b["start"] == start)


def test_buckets_aligned_in_utc_with_the_last_holding_now():
    h = price_history.history(GpuClass.objects.get(slug=H100), price_history.RANGES["24h"],
                              now=NOW)
    assert len(h["buckets"]) == 96 and h["bucket_seconds"] == 900
    assert h["buckets"][-1]["start"] == datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert h["end"] == datetime(2026, 12, 1, 12, 15, tzinfo=UTC)
    assert h["start"] == h["end"] - timedelta(hours=24)
    assert all(b["open"] is None and b["trades"] == 0 and b["gpu_seconds"] == 0
               for b in h["buckets"])  # no trade: every bucket empty, none left out
    for name, size, count in (("1h", 60, 60), ("7d", 7200, 84)):
        h = price_history.history(GpuClass.objects.get(slug=H100),
                                  price_history.RANGES[name], now=NOW)
        assert (h["bucket_seconds"], len(h["buckets"])) == (size, count)
        assert int(h["end"].timestamp()) % size == 0


def test_ohlc_and_volume_per_bucket_from_fills_at_chosen_times(trade):
    b12 = datetime(2026, 12, 1, 11, 45, tzinfo=UTC)  # the bucket [11:45, 12:00)
    trade(2_000_000, 1, b12)                                    # open (first at its start)
    trade(2_600_000, 2, b12 + timedelta(minutes=3))             # high
    trade(1_900_000, 1, b12 + timedelta(minutes=7), seconds=1800)  # low
    trade(2_100_000, 1, b12 + timedelta(seconds=899.999999))    # close, its last instant
    trade(3_000_000, 1, b12 + timedelta(minutes=15))            # the next bucket's first
    trade(9_000_000, 1, b12 - timedelta(days=2))                # before the range: left out
    h = price_history.history(GpuClass.objects.get(slug=H100), price_history.RANGES["24h"],
                              now=NOW)
    b = _bucket(h, b12)
    assert (b["open"], b["high"], b["low"], b["close"]) == (2_000_000, 2_600_000, 1_900_000,
                                                            2_100_000)
    assert (b["trades"], b["gpus"], b["gpu_seconds"]) == (4, 5, 4 * 3600 + 1800)
    nxt = _bucket(h, b12 + timedelta(minutes=15))
    assert (nxt["open"], nxt["close"], nxt["trades"]) == (3_000_000, 3_000_000, 1)
    before = _bucket(h, b12 - timedelta(minutes=15))
    assert before["open"] is None and before["trades"] == 0  # an empty bucket stays
    assert sum(x["trades"] for x in h["buckets"]) == 5


def test_ranges_parse_and_bad_ones_name_the_parameter():
    assert price_history.parse_range({}).name == "24h"
    assert price_history.parse_range({"range": "7d"}).bucket_seconds == 7200
    for query, field in (({"range": "2h"}, "range"), ({"range": ""}, "range"),
                         ({"from": "x"}, "from")):
        with pytest.raises(InvalidInput) as exc:
            price_history.parse_range(query)
        assert exc.value.field == field


def test_gpu_hours_are_exact_to_six_places_rounded_down():
    assert price_history.gpu_hours(5400) == "1.5"
    assert price_history.gpu_hours(7200) == "2"
    assert price_history.gpu_hours(1) == "0.000277"
    assert price_history.gpu_hours(0) == "0"
