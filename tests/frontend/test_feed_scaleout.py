"""The live feed with several publishing processes on one Redis: depth coalesced across
processes (one depth per interval per market, the last one always the latest book, no
change left uncovered), and events numbered in another Redis database (another
deployment or test run on the same server: pub/sub channels are server-wide) ignored."""

import json
import time

import pytest
from asgiref.sync import async_to_sync

from frontend import feed
from marketplace import book
from marketplace.models import GpuClass
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import call, connect, drain, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
H100 = "h100-sxm-80gb"
PATH = f"/ws/markets/{H100}/"
GROUP = feed.market_group(H100)


def _bid(buyer, price):
    return book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=price, gpus=1,
                          duration_seconds=3600)


def test_depth_is_coalesced_across_publishing_processes(settings):
    settings.FEED_DEPTH_INTERVAL = 0.5
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=8, available_until=in_a_day())
    buyer = funded_buyer(100)
    market = GpuClass.objects.get(slug=H100)
    other = feed.Publisher()  # a second web process that committed a change of this book

    def changes():
        _bid(buyer, 1_000_000)  # published at once: this process takes the depth slot
        feed.flush()
        _bid(buyer, 1_100_000)  # within the interval: waits for this process's next turn
        noted = feed.Batch(markets={market.pk})
        noted.committed_at = time.time()
        other.submit(noted)  # the other process's depth: the slot is taken, it waits
        assert other.flush(5) and feed.flush(5)

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        await call(changes)
        frames = await drain(comm, timeout=1.0)
        await comm.disconnect()
        return snap, [json.loads(f) for f in frames]

    snap, frames = async_to_sync(scenario)()
    depths = [m for m in frames if m["type"] == "depth"]
    # three depth publications were due (two here, one there); two went out
    assert len(depths) == 2
    assert feed.publisher().depth_covered + other.depth_covered == 1
    assert [m["seq"] for m in frames] == list(range(snap["seq"] + 1,
                                                    snap["seq"] + 1 + len(frames)))
    assert depths[0]["bids"] == [["1.000000", 1]]
    assert depths[-1]["bids"] == [["1.100000", 1], ["1.000000", 1]]  # the latest book


def test_events_numbered_in_another_redis_database_are_ignored():
    registered_node()

    def event(seq, ns, marker):
        text = json.dumps({"type": "depth", "market": H100, "marker": marker, "seq": seq,
                           "ts": 0.0})
        return {"type": feed.EVENT_TYPE, "group": GROUP, "seq": seq, "user": None,
                "ns": ns, "text": text}

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        hub = feed.hub()
        base = hub.seq(GROUP)
        hub.deliver(event(base + 500, "elsewhere", "foreign"))  # far ahead: no gap here
        hub.deliver(event(base + 1, hub.ns, "ours"))
        frames = await drain(comm)
        await comm.disconnect()
        return snap, hub.ns, [json.loads(f) for f in frames]

    snap, ns, frames = async_to_sync(scenario)()
    assert ns == feed.namespace() != "elsewhere"
    assert [(m["seq"], m["marker"]) for m in frames] == [(snap["seq"] + 1, "ours")]
