"""The live feed across a Redis that restarts without its data (issue 10, item 4): the
sequence numbers never go back, every websocket connected before the restart is told to
resync at once and then gets the new events, one connected after it gets them too, and a
change committed while Redis was down is kept by the publisher and published once it is
back. Against a private redis-server (tests/support/redis_server.py) killed with SIGKILL
and started again empty, with real Channels websockets."""

import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers

from frontend import feed
from frontend.feed import counters as feed_seq
from marketplace import book
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import call, connect, recv
from tests.support.redis_server import PrivateRedis

pytestmark = pytest.mark.django_db(transaction=True)
H100 = "h100-sxm-80gb"
PATH = f"/ws/markets/{H100}/"


@pytest.fixture
def private_redis(settings):
    """REDIS_URL and the channel layer on a private Redis for this test."""
    server = PrivateRedis()
    server.start()
    feed.flush()
    settings.REDIS_URL = server.url
    settings.CHANNEL_LAYERS = {"default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [{"address": server.url, "socket_timeout": 30}]}}}
    feed_seq.reset()
    channel_layers.backends.clear()
    yield server
    feed.flush(30)
    feed_seq.reset()
    channel_layers.backends.clear()
    server.kill()


def _bid(buyer, price):
    return book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=price, gpus=1,
                          duration_seconds=3600)


def _bids(message) -> list[str]:
    return [price for price, _ in message.get("bids", [])]


def _wait_until_kept(timeout: float = 30) -> bool:
    """Whether the publisher holds the batch it could not publish (Redis is down)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if feed.publisher()._retained is not None:
            return True
        time.sleep(0.02)
    return False


async def _follow(comm, until, timeout: float = 30) -> list[dict]:
    """Messages as a client following the feed's rules reads them (it answers
    `resync_required` with `{"type": "resync"}`), up to the first one `until` accepts."""
    seen = []
    while True:
        message = await recv(comm, timeout)
        seen.append(message)
        if message["type"] == "resync_required":
            await comm.send_to(text_data=json.dumps({"type": "resync"}))
        if until(message):
            return seen


def _after_last_snapshot_in_order(seen: list[dict]) -> bool:
    """Every event after the client's last snapshot is the next one, without a gap."""
    last = max(i for i, m in enumerate(seen) if m["type"] == "snapshot")
    seqs = [m["seq"] for m in seen[last:]]
    return seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def test_after_redis_restarts_empty_every_client_resyncs_and_new_events_flow(private_redis):
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=8, available_until=in_a_day())
    buyer = funded_buyer(100)

    async def scenario():
        old, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(old)
        await call(_bid, buyer, 1_000_000)
        before = await recv(old)

        await call(private_redis.kill)
        await call(_bid, buyer, 1_100_000)  # committed while Redis is down
        kept = await call(_wait_until_kept)
        await call(private_redis.start)  # empty: every counter and key is gone

        resynced = await _follow(old, lambda m: m["type"] == "snapshot")
        published = await call(feed.flush, 30)  # the kept batch went out
        await call(_bid, buyer, 1_200_000)
        flowing = await _follow(old, lambda m: "1.200000" in _bids(m))

        new, connected, _ = await connect(PATH)  # a client connected after the restart
        assert connected
        fresh = await recv(new)
        await call(_bid, buyer, 1_300_000)
        got_new = await recv(new)
        got_old = await _follow(old, lambda m: "1.300000" in _bids(m))
        await old.disconnect()
        await new.disconnect()
        return (snap, before, kept, resynced, published, flowing, fresh, got_new, got_old)

    (snap, before, kept, resynced, published, flowing, fresh, got_new,
     got_old) = async_to_sync(scenario)()
    assert before["type"] == "depth" and before["seq"] == snap["seq"] + 1
    assert kept and published
    # told to resync at once, before anything numbered by the new Redis run
    assert resynced[0]["type"] == "resync_required"
    assert [m["type"] for m in resynced[1:-1]] == ["depth"] * (len(resynced) - 2)
    snapshot = resynced[-1]
    assert snapshot["seq"] > before["seq"]  # the numbers never went back
    assert _bids(snapshot) == ["1.100000", "1.000000"]  # with the change made meanwhile
    # then the new events flow, in order, without a restart of anything
    seen = resynced + flowing
    assert _after_last_snapshot_in_order(seen)
    assert flowing[-1]["type"] == "depth"
    assert _bids(flowing[-1]) == ["1.200000", "1.100000", "1.000000"]
    assert all(m["seq"] > before["seq"] for m in seen)
    # the client connected after the restart gets its snapshot and the next event
    assert fresh["type"] == "snapshot"
    assert _bids(fresh) == ["1.200000", "1.100000", "1.000000"]
    assert got_new["type"] == "depth" and got_new["seq"] == fresh["seq"] + 1
    assert _bids(got_new) == ["1.300000", "1.200000", "1.100000", "1.000000"]
    assert got_old == [got_new] and _after_last_snapshot_in_order(seen + got_old)
