"""The feed hub (frontend.feed.Hub): one subscription per group per process, fanned out
in memory; events handed out in seq order; a slow client is dropped from the stream and
told to resync without stalling the others; depth is coalesced but always the latest."""

import asyncio
import json

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings

from frontend import feed
from marketplace import book
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import call, connect, drain, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
H100 = "h100-sxm-80gb"
PATH = f"/ws/markets/{H100}/"
GROUP = feed.market_group(H100)


def _ask(provider, node):
    return book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                          price=2_490_000, gpus=8, available_until=in_a_day())


def _bid(buyer, price, gpus=1):
    return book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=price, gpus=gpus,
                          duration_seconds=3600)


def _event(seq: int, marker: str) -> dict:
    text = json.dumps({"type": "depth", "market": H100, "marker": marker, "seq": seq,
                       "ts": 0.0})
    return {"type": feed.EVENT_TYPE, "group": GROUP, "seq": seq, "user": None, "text": text}


def _numsub(group: str) -> int:
    """Redis subscribers of the group's pub/sub channel (channels_redis' naming)."""
    r = redis.Redis.from_url(settings.REDIS_URL)
    [(_, count)] = r.pubsub_numsub(f"asgi__group__{group}")
    return count


def test_several_local_clients_share_one_subscription_and_all_get_each_event():
    registered_node()
    buyer = funded_buyer(100)

    async def scenario():
        comms = []
        for _ in range(3):
            comm, connected, _ = await connect(PATH)
            assert connected
            comms.append((comm, await recv(comm)))
        subscriptions = await call(_numsub, GROUP)
        members = len(feed.hub().groups[GROUP].members)
        await call(_bid, buyer, 2_000_000, 3)
        got = [await recv(comm) for comm, _ in comms]
        for comm, _ in comms:
            await comm.disconnect()
        after = await call(_numsub, GROUP)
        return comms, subscriptions, members, got, after

    comms, subscriptions, members, got, after = async_to_sync(scenario)()
    assert subscriptions == 1 and members == 3
    assert after == 0  # the last one to leave unsubscribes
    [seq] = {snap["seq"] for _, snap in comms}
    for message in got:
        assert message["type"] == "depth" and message["seq"] == seq + 1
        assert message["bids"] == [["2.000000", 3]]
    assert len({json.dumps(m, sort_keys=True) for m in got}) == 1  # the very same frame


def test_events_from_several_publishers_are_handed_out_in_seq_order():
    registered_node()

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        hub = feed.hub()
        base = hub.seq(GROUP)
        # seq base+2 overtakes base+1 (two publishing processes): held, then both in order
        hub.deliver(_event(base + 2, "second"))
        hub.deliver(_event(base + 1, "first"))
        frames = await drain(comm)
        await comm.disconnect()
        return snap, base, [json.loads(f) for f in frames]

    snap, base, frames = async_to_sync(scenario)()
    assert snap["seq"] == base
    assert [(m["seq"], m["marker"]) for m in frames] == [(base + 1, "first"),
                                                         (base + 2, "second")]


def test_a_missing_seq_is_waited_for_briefly_then_clients_are_told_to_resync():
    registered_node()

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        base = feed.hub().seq(GROUP)
        feed.hub().deliver(_event(base + 2, "after a lost one"))
        warning, event = await recv(comm), await recv(comm)
        await comm.disconnect()
        return snap, warning, event

    snap, warning, event = async_to_sync(scenario)()
    assert warning["type"] == "resync_required" and warning["expected"] == snap["seq"] + 1
    assert event["seq"] == snap["seq"] + 2


def test_a_slow_client_is_dropped_and_told_to_resync_without_stalling_the_others(settings):
    settings.FEED_CLIENT_QUEUE = 4
    registered_node()

    async def scenario():
        fast, ok1, _ = await connect(PATH)
        assert ok1
        await recv(fast)
        hub = feed.hub()
        [fast_consumer] = hub.groups[GROUP].members
        slow, ok2, _ = await connect(PATH)
        assert ok2
        slow_snap = await recv(slow)
        [stuck] = hub.groups[GROUP].members - {fast_consumer}
        # the slow client's socket stops draining: its sender blocks on send()
        gate = asyncio.Event()
        real_send = stuck.send

        async def blocked_send(*args, **kwargs):
            await gate.wait()
            return await real_send(*args, **kwargs)

        stuck.send = blocked_send
        base = hub.seq(GROUP)
        for i in range(1, 21):  # one at a time, as they come from Redis
            hub.deliver(_event(base + i, f"e{i}"))
            await asyncio.sleep(0.005)
        fast_frames = [json.loads(f) for f in await drain(fast)]
        gate.set()
        slow_frames = [json.loads(f) for f in await drain(slow)]
        lagging = stuck.lagging
        # more events while it has not resynced: none is queued for it
        hub.deliver(_event(base + 21, "e21"))
        quiet = await drain(slow)
        await slow.send_to(text_data=json.dumps({"type": "resync"}))
        fresh = await recv(slow)
        hub.deliver(_event(base + 22, "e22"))
        resumed = await recv(slow)
        await fast.disconnect()
        await slow.disconnect()
        return (base, slow_snap, fast_frames, slow_frames, lagging, quiet, fresh, resumed)

    base, slow_snap, fast, slow, lagging, quiet, fresh, resumed = async_to_sync(scenario)()
    # the fast client got all 20, in order, while the slow one was stuck
    assert [m["seq"] for m in fast] == list(range(base + 1, base + 21))
    # the slow one: what was already on its way, then resync_required, then nothing more
    kinds = [m["type"] for m in slow]
    assert "resync_required" in kinds and kinds[-1] == "resync_required"
    assert len(slow) <= 1 + 4 + 1  # at most the one in flight and a full queue
    warning = slow[-1]
    assert warning["expected"] <= base + 6 and warning["seq"] > base
    assert lagging and quiet == []
    assert fresh["type"] == "snapshot" and fresh["seq"] == base + 21
    assert resumed["seq"] == base + 22
    assert slow_snap["seq"] == base


def test_depth_is_coalesced_and_the_last_one_is_the_latest_book(settings):
    settings.FEED_DEPTH_INTERVAL = 0.4
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _ask(provider, node)

    def five_bids():
        for i in range(5):
            _bid(buyer, 1_000_000 + i * 10_000)

    async def scenario():
        comm, connected, _ = await connect(PATH)
        assert connected
        snap = await recv(comm)
        await call(five_bids)
        frames = await drain(comm, timeout=1.0)
        await comm.disconnect()
        return snap, [json.loads(f) for f in frames]

    snap, frames = async_to_sync(scenario)()
    depths = [m for m in frames if m["type"] == "depth"]
    assert 1 <= len(depths) < 5  # coalesced: fewer messages than changes
    assert [m["seq"] for m in frames] == list(range(snap["seq"] + 1,
                                                    snap["seq"] + 1 + len(frames)))
    assert depths[-1]["bids"] == [[f"1.0{i}0000", 1] for i in (4, 3, 2, 1, 0)]
    assert depths[-1]["best_bid"] == "1.040000"
