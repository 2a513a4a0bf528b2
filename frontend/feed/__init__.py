"""The live feed: market, auction and own-rows websockets fed after commit.

`note` collects what a transaction changed (batch.py); the publisher thread numbers and
sends it after commit (publisher.py, counters.py); each process's hub fans it out to its
websockets (hub.py); payloads.py reads the messages and snapshots. The messages, the
sequence and resync rules, epochs and depth coalescing: docs/FEED_PROTOCOL.md.
"""

from core.after_commit import namespace
from frontend.feed.batch import Batch, batch, current_batch, note, note_many
from frontend.feed.counters import counter, current, current_seq
from frontend.feed.hub import Hub, Subscriber, hub
from frontend.feed.local import _hubs
from frontend.feed.payloads import (
    auction_payload,
    auction_snapshot,
    auction_summary_payload,
    depth_payload,
    lease_payload,
    market_snapshot,
    market_summary_payload,
    me_snapshot,
    order_payload,
    sealed_bid_payload,
    summary_snapshot,
    trade_payload,
    wallet_payload,
    wallet_payloads,
)
from frontend.feed.protocol import (
    DEPTH_LEVELS,
    EVENT_TYPE,
    LAST_TRADES,
    SNAPSHOT_CACHE_S,
    SUMMARY_GROUP,
    auction_group,
    market_group,
    user_group,
)
from frontend.feed.publisher import Publisher, flush, publisher, send_events

__all__ = [
    "DEPTH_LEVELS", "EVENT_TYPE", "LAST_TRADES", "SNAPSHOT_CACHE_S", "SUMMARY_GROUP", "Batch",
    "Hub", "Publisher", "Subscriber", "_hubs", "auction_group", "auction_payload",
    "auction_snapshot", "auction_summary_payload", "batch", "counter", "current",
    "current_batch", "current_seq", "depth_payload", "flush", "hub", "lease_payload",
    "market_group", "market_snapshot", "market_summary_payload", "me_snapshot", "namespace",
    "note", "note_many", "order_payload", "publisher", "sealed_bid_payload", "send_events",
    "summary_snapshot", "trade_payload", "user_group", "wallet_payload", "wallet_payloads",
]
