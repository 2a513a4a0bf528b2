"""The live feed's metrics (core/metrics.py): a websocket client counts in
gpumarket_feed_clients while connected, and an event published to its market counts in
gpumarket_feed_messages_total — the real ASGI application and publisher thread."""

import pytest
from asgiref.sync import async_to_sync

from core import metrics
from frontend import feed
from marketplace import book
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import call, connect, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
H100 = "h100-sxm-80gb"


def clients() -> float:
    return metrics.FEED_CLIENTS.labels("market")._value.get()


def messages() -> float:
    return metrics.FEED_MESSAGES.labels("market")._value.get()


def test_feed_clients_and_messages_are_counted():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    before_clients, seen = clients(), {}

    async def scenario():
        comm, connected, _ = await connect(f"/ws/markets/{H100}/")
        assert connected
        await recv(comm)  # the snapshot
        seen["connected"], seen["messages"] = clients(), messages()
        await call(book.place_ask, provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=8, available_until=in_a_day())
        await call(book.place_bid, buyer_id=buyer.pk, market_slug=H100, price=2_600_000,
                   gpus=2, duration_seconds=3600)
        await recv(comm)  # something of the trade or the book reached the client
        await call(feed.flush)
        seen["published"] = messages()
        await comm.disconnect()

    async_to_sync(scenario)()
    assert seen["connected"] == before_clients + 1
    assert seen["published"] > seen["messages"]
    assert clients() == before_clients
