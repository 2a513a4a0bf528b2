"""/ws/summary/ (the home page's and /auctions/' feed): a snapshot of the markets with
orders and of the open auctions, then a market_summary after each change of a book and an
auction_summary after each change of an auction — never a sealed bid's content. On Redis
and on the embedded default's SQLite layer (core/sqlite_layer.py)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from marketplace import auctions, book
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import call, connect, drain, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
MARKET = "h100-sxm-80gb"


@pytest.fixture(params=["redis", "sqlite-file"])
def layer(request, settings, tmp_path):
    from channels.layers import channel_layers

    if request.param == "sqlite-file":
        settings.REDIS_URL = ""
        settings.CHANNEL_LAYERS = {"default": {
            "BACKEND": "core.sqlite_layer.SQLiteChannelLayer",
            "CONFIG": {"path": str(tmp_path / "channels.sqlite3")}}}
        channel_layers.backends.clear()
    yield request.param
    channel_layers.backends.clear()


def test_summary_follows_books_and_auctions(layer):
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_000_000, gpus=3, available_until=in_a_day())

    async def scenario():
        comm, connected, _ = await connect("/ws/summary/")
        assert connected
        snap = await recv(comm)
        await call(book.place_bid, buyer_id=buyer.pk, market_slug=MARKET, price=1_500_000,
                   gpus=1, duration_seconds=3600)
        bid = await recv(comm)
        lot = await call(auctions.open_auction, provider_id=provider.pk, node_id=node.pk,
                         gpus=4, reserve_price=1_000_000, duration_seconds=3600,
                         closes_at=timezone.now() + timedelta(hours=1))
        frames = await drain(comm)
        await call(auctions.place_sealed_bid, bidder_id=buyer.pk, auction_id=lot.pk,
                   price=3_141_593)
        frames += await drain(comm)
        await comm.disconnect()
        return snap, bid, lot, [json.loads(f) for f in frames]

    snap, bid, lot, later = async_to_sync(scenario)()
    assert snap["type"] == "snapshot" and snap["feed"] == "summary"
    assert snap["markets"] == [{"market": MARKET, "best_bid": None, "best_ask": "2.000000",
                                "gpus_offered": 3}]
    assert snap["auctions"] == []
    assert bid["type"] == "market_summary" and bid["seq"] == snap["seq"] + 1
    assert (bid["market"], bid["best_bid"], bid["best_ask"], bid["gpus_offered"]) == \
        (MARKET, "1.500000", "2.000000", 3)
    mine = [m for m in later if m["type"] == "auction_summary"]
    assert [m["bids"] for m in mine][-1] == 1
    assert {m["auction"] for m in mine} == {lot.pk} and mine[-1]["status"] == "open"
    assert [m["seq"] for m in later] == list(range(bid["seq"] + 1, bid["seq"] + 1 + len(later)))
    assert not any("3.141593" in json.dumps(m) or "3141593" in json.dumps(m) for m in later)
