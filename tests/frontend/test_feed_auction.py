"""/ws/auctions/<id>/: only the count of bids and the clock before close (DESIGN
invariant 4: never a sealed bid's price or quantity), the result at close."""

import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from marketplace import auctions
from tests.factories import funded_buyer, registered_node
from tests.frontend.conftest import call, connect, drain, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]

SECRET_PRICES = (3_141_593, 2_718_282)
SECRET_STRINGS = ("3.141593", "3141593", "2.718282", "2718282")


def _open_auction(provider, node):
    return auctions.open_auction(
        provider_id=provider.pk, node_id=node.pk, gpus=8, reserve_price=2_000_000,
        duration_seconds=3600, closes_at=timezone.now() + timedelta(hours=1))


def test_sealed_bids_show_only_their_count_and_close_shows_the_result():
    provider, node, _ = registered_node()
    auction = _open_auction(provider, node)
    alice, bob = funded_buyer(100), funded_buyer(100)
    path = f"/ws/auctions/{auction.pk}/"

    async def scenario():
        comm, connected, _ = await connect(path)
        assert connected
        frames = [await comm.receive_from(5)]
        for buyer, price in zip((alice, bob), SECRET_PRICES, strict=True):
            await call(auctions.place_sealed_bid, bidder_id=buyer.pk, auction_id=auction.pk,
                       price=price)
            frames.append(await comm.receive_from(5))
        # a bidder replacing its bid: still just a count
        await call(auctions.place_sealed_bid, bidder_id=alice.pk, auction_id=auction.pk,
                   price=SECRET_PRICES[0] + 1)
        frames += await drain(comm)
        before_close = list(frames)
        await call(auctions.close_auction, auction_id=auction.pk,
                   now=auction.closes_at + timedelta(seconds=1))
        result = await recv(comm)
        await comm.disconnect()
        return before_close, result

    before_close, result = async_to_sync(scenario)()
    for frame in before_close:
        for secret in (*SECRET_STRINGS, "3.141594", "3141594"):
            assert secret not in frame, f"sealed content {secret} in {frame}"
    messages = [json.loads(f) for f in before_close]
    snap, first, second, *rest = messages
    assert snap["type"] == "snapshot" and snap["bids"] == 0 and snap["status"] == "open"
    assert snap["seconds_left"] > 3500 and snap["closes_at"] and snap["server_time"]
    assert (first["type"], first["bids"], first["seq"]) == ("auction", 1, snap["seq"] + 1)
    assert (second["bids"], second["seq"]) == (2, snap["seq"] + 2)
    assert [m["bids"] for m in rest] == [2] and rest[0]["seq"] == snap["seq"] + 3
    allowed = {"type", "auction", "market", "status", "rule", "gpus", "reserve_price",
               "duration_seconds", "closes_at", "seconds_left", "server_time", "bids",
               "seq", "ts"}
    for m in messages[1:]:
        assert set(m) == allowed
    # second price: the winner (alice, 3.141594) pays bob's 2.718282 for all 8 GPUs
    assert result["type"] == "auction_result" and result["status"] == "closed"
    assert result["seq"] == snap["seq"] + 4
    assert result["clearing_price"] == "2.718282"
    assert result["awards"] == [{"gpus": 8, "price": "2.718282"}]
    assert result["bids"] == 2
    assert all(set(award) == {"gpus", "price"} for award in result["awards"])  # anonymous


def test_unknown_auction_is_refused():
    async def scenario():
        _, connected, code = await connect("/ws/auctions/999999/")
        return connected, code

    assert async_to_sync(scenario)() == (False, 4404)
