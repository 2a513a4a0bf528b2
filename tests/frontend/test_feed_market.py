"""/ws/markets/<gpu_class>/: snapshot on connect, trades and depth after commit with
consecutive sequence numbers, nothing from a rolled-back transaction, gap → resync."""

import json

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction

from frontend import feed
from marketplace import book
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import WebsocketCommunicator, application, call, connect, drain, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
H100 = "h100-sxm-80gb"
PATH = f"/ws/markets/{H100}/"


def _ask(provider, node, price=2_490_000, gpus=8):
    return book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                          price=price, gpus=gpus, available_until=in_a_day())


def _bid(buyer, price=2_600_000, gpus=2):
    return book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=price, gpus=gpus,
                          duration_seconds=3600)


def test_snapshot_on_connect_has_depth_best_prices_and_anonymous_trades():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _ask(provider, node)
    _bid(buyer, price=2_600_000, gpus=2)            # trades 2 GPUs at the ask's price
    _bid(buyer, price=2_000_000, gpus=4)            # rests

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        await comm.disconnect()
        return snap

    snap = async_to_sync(scenario)()
    assert snap["type"] == "snapshot" and snap["feed"] == "market" and snap["market"] == H100
    assert isinstance(snap["seq"], int)
    assert snap["asks"] == [["2.490000", 6]] and snap["bids"] == [["2.000000", 4]]
    assert snap["best_ask"] == "2.490000" and snap["best_bid"] == "2.000000"
    [trade] = snap["trades"]
    assert set(trade) == {"id", "price", "gpus", "at"}
    assert trade["price"] == "2.490000" and trade["gpus"] == 2


@pytest.mark.parametrize("path", ["/ws/market/h100-sxm-80gb/", "/ws/", "/ws/markets/"])
def test_a_path_that_is_no_feed_is_closed_4404_naming_the_feeds(path):
    """Channels' router raised for a path of no route: the handshake was an HTTP 500."""
    async def scenario():
        comm, connected, _ = await connect(path)
        assert connected
        message = await recv(comm)
        assert message["type"] == "error" and f"no feed at {path}" in message["detail"]
        assert "/ws/markets/<gpu class>/" in message["detail"]
        assert (await comm.receive_output(5))["code"] == 4404

    async_to_sync(scenario)()


def test_unknown_market_is_refused_and_foreign_origin_too():
    async def scenario():
        _, connected, code = await connect("/ws/markets/no-such-gpu/")
        assert not connected and code == 4404
        comm = WebsocketCommunicator(application(), PATH,
                                     headers=[(b"origin", b"http://evil.example")])
        connected, _ = await comm.connect()
        assert not connected

    registered_node()
    async_to_sync(scenario)()


def test_a_fill_reaches_the_market_group_after_commit_with_the_next_seq():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _ask(provider, node)

    def bid_in_open_transaction(comm):
        with transaction.atomic():
            _bid(buyer)
            # still inside the transaction: nothing may have been sent yet
            quiet = async_to_sync(comm.receive_nothing)(0.5)
        return quiet

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        quiet = await call(bid_in_open_transaction, comm)
        trade, depth = await recv(comm), await recv(comm)
        rest = await drain(comm)
        await comm.disconnect()
        return snap, quiet, trade, depth, rest

    snap, quiet, trade, depth, rest = async_to_sync(scenario)()
    assert quiet, "a message went out before commit"
    assert trade["type"] == "trade" and trade["seq"] == snap["seq"] + 1
    assert set(trade) == {"type", "market", "id", "price", "gpus", "at", "seq", "ts"}
    assert trade["price"] == "2.490000" and trade["gpus"] == 2
    assert depth["type"] == "depth" and depth["seq"] == snap["seq"] + 2
    assert depth["asks"] == [["2.490000", 6]] and depth["best_ask"] == "2.490000"
    assert rest == []  # one depth message per transaction, however many rows it saved


def test_a_rolled_back_transaction_sends_nothing_and_uses_no_seq():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _ask(provider, node)

    class Boom(Exception):
        pass

    def bid_then_roll_back():
        try:
            with transaction.atomic():
                _bid(buyer)
                raise Boom
        except Boom:
            pass

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        await call(bid_then_roll_back)
        nothing = await drain(comm, timeout=1.0)
        await call(_bid, buyer, 2_000_000, 1)  # a committed change afterwards
        after = await recv(comm)
        await comm.disconnect()
        return snap, nothing, after

    snap, nothing, after = async_to_sync(scenario)()
    assert nothing == []
    assert after["type"] == "depth" and after["seq"] == snap["seq"] + 1
    assert after["bids"] == [["2.000000", 1]]


def test_dropped_messages_are_detected_by_the_server_and_a_resync_gives_a_snapshot():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _ask(provider, node)

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        # a message of this group lost on its way (as when a slow connection's buffer
        # overflows in the channel layer): its seq was taken but it never arrives
        await call(feed.counter().incr, feed.market_group(H100))
        await call(_bid, buyer, 2_000_000, 1)
        warning, depth = await recv(comm), await recv(comm)
        await comm.send_to(text_data=json.dumps({"type": "resync"}))
        fresh = await recv(comm)
        await comm.disconnect()
        return snap, warning, depth, fresh

    snap, warning, depth, fresh = async_to_sync(scenario)()
    assert warning["type"] == "resync_required"
    assert warning["expected"] == snap["seq"] + 1 and warning["seq"] == snap["seq"] + 2
    assert depth["seq"] == snap["seq"] + 2
    assert fresh["type"] == "snapshot" and fresh["seq"] == depth["seq"]
    assert fresh["bids"] == [["2.000000", 1]]
