"""The live feed: what is published, to whom, in which order, and the snapshots.

Three feeds, each one Channels group with its own sequence number:

| websocket path              | group              | who may connect                     |
|-----------------------------|--------------------|-------------------------------------|
| `/ws/markets/<gpu_class>/`  | `market.<slug>`    | anyone (anonymous data only)        |
| `/ws/auctions/<id>/`        | `auction.<id>`     | anyone (never a sealed bid's content)|
| `/ws/me/`                   | `user.<id>`        | that user: session cookie, or       |
|                             |                    | `?token=<DRF token>`; else 4401     |

Every websocket needs an `Origin` header whose host is in ALLOWED_HOSTS
(AllowedHostsOriginValidator); a non-browser client must send one.

Messages (JSON text frames). Money is a decimal USD string (6 places, as
`settlement.money.format_usd`), prices per GPU-hour, times ISO 8601 UTC. Every
message from the server carries `seq` (int) and `ts` (float, server epoch seconds
at publish, for latency measurement).

Server → client, all feeds:
- `{"type": "snapshot", "feed": "market"|"auction"|"me", "seq": N, "ts": …, …state}`:
  on connect and in answer to a client's `{"type": "resync"}`. N is the group's
  sequence number when the snapshot was read; the next event has a seq > N.
- `{"type": "resync_required", "seq": N, "expected": M, "ts": …}`: the server saw
  that this connection's buffer overflowed (the channel layer dropped messages
  M … N-1 for it); the client should send `{"type": "resync"}`.
  Sequence rule for clients: a message with seq == last + 1 is the next one; seq <=
  last is stale (ignore); seq > last + 1 is a gap → send `{"type": "resync"}`.

`/ws/markets/<slug>/`:
- snapshot: `{"type": "snapshot", "feed": "market", "market": slug, "seq", "ts",
  "bids": [["2.490000", 8], …] (high→low), "asks": [[price, gpus], …] (low→high),
  "best_bid": "2.49…"|null, "best_ask": …|null,
  "trades": [{"id", "price", "gpus", "at"}, …] (newest first, 20)}`
- `{"type": "trade", "market", "seq", "ts", "id", "price", "gpus", "at"}` — anonymous:
  no order, user, node or lease id. `id` is the fill id, to drop a trade seen twice
  (a snapshot read while a trade commits may contain it and be followed by it).
- `{"type": "depth", "market", "seq", "ts", "bids", "asks", "best_bid", "best_ask"}`:
  the whole depth (20 levels a side) after each committed change of the book — a new
  depth snapshot per change rather than a diff: simpler, and idempotent.

`/ws/auctions/<id>/`:
- snapshot / `{"type": "auction", "auction": id, "seq", "ts", "market", "status":
  "open"|"closed"|"cancelled", "rule", "gpus", "reserve_price", "bids": count of active
  bids, "closes_at", "seconds_left", "server_time"}` — never a bid's price, quantity or
  bidder. The countdown is computed by the client from closes_at/server_time; no
  ticks are pushed.
- at close: `{"type": "auction_result", "auction", "seq", "ts", "status": "closed",
  "clearing_price": "…"|null, "awards": [{"gpus", "price"}, …], "bids": count,
  "closed_at"}` — awards are anonymous (no bidder).

`/ws/me/` (only the connected user's own rows):
- snapshot: `{"type": "snapshot", "feed": "me", "seq", "ts", "user": id, "wallet":
  {"available", "held", "earned"}, "orders": [active orders], "sealed_bids": [active
  own bids, with price], "leases": [leases as buyer or provider, not ended]}`
- `{"type": "order", "seq", "ts", "order": {id, market, side, status, price, gpus,
  remaining_gpus, time_in_force, created_at}}`
- `{"type": "sealed_bid", "seq", "ts", "bid": {id, auction, status, price, gpus,
  min_gpus, awarded_gpus, paid_price, created_at}}` (to its bidder only)
- `{"type": "lease", "seq", "ts", "lease": {id, market, role: "buyer"|"provider",
  status, gpus, price, duration_seconds, node, started_at, ends_at, ended_at, cause,
  cost, provider_amount, platform_fee}}` (to buyer and provider, each with its role)
- `{"type": "balance", "seq", "ts", "entries": [{"id", "kind"}, …], "wallet":
  {"available", "held", "earned"}}`: after each committed transaction that moved money
  of the user (one message per user per transaction).

Client → server: `{"type": "resync"}` → a fresh snapshot.

Publishing: frontend/signals.py collects what changed in the current transaction
(post_save of Order, Fill, Auction, SealedBid, Lease, JournalEntry, Posting) into one
batch per outermost transaction, flushed by `transaction.on_commit` (so a rolled-back
transaction sends nothing). The flush reads the rows fresh after commit, takes the
next seq per group (Redis INCR on the channel layer's Redis when REDIS_URL is set, so
several processes agree; an in-process counter otherwise) and then group_sends. For a
market, the depth is read *after* its seq was taken, so the depth carried by seq k
includes every change whose seq is <= k.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

log = logging.getLogger("gpumarket.feed")

DEPTH_LEVELS = 20
LAST_TRADES = 20
EVENT_TYPE = "feed.event"  # the channel layer message type → consumer.feed_event


def market_group(slug: str) -> str:
    return f"market.{slug}"


def auction_group(auction_id: int) -> str:
    return f"auction.{auction_id}"


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


# ---------------------------------------------------------------- sequence numbers

class _LocalCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = defaultdict(int)

    def incr(self, group: str) -> int:
        with self._lock:
            self._values[group] += 1
            return self._values[group]

    def get(self, group: str) -> int:
        with self._lock:
            return self._values[group]


class _RedisCounter:
    PREFIX = "gpumarket:feed:seq:"

    def __init__(self, url: str) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)

    def incr(self, group: str) -> int:
        return int(self._redis.incr(self.PREFIX + group))

    def get(self, group: str) -> int:
        return int(self._redis.get(self.PREFIX + group) or 0)


_counter: _LocalCounter | _RedisCounter | None = None
_counter_lock = threading.Lock()


def counter() -> _LocalCounter | _RedisCounter:
    """The sequence counter: Redis (REDIS_URL, the channel layer's server) or in-process."""
    global _counter
    with _counter_lock:
        if _counter is None:
            url = getattr(settings, "REDIS_URL", "")
            _counter = _RedisCounter(url) if url else _LocalCounter()
        return _counter


def current_seq(group: str) -> int:
    return counter().get(group)


# ---------------------------------------------------------------- payloads

def _usd(micros: int | None) -> str | None:
    from settlement.money import format_usd

    return None if micros is None else format_usd(micros)


def _iso(dt) -> str | None:
    return None if dt is None else dt.isoformat()


def _levels(levels: Iterable[tuple[int, int]]) -> list[list[Any]]:
    return [[_usd(price), gpus] for price, gpus in levels]


def depth_payload(market) -> dict[str, Any]:
    from marketplace import book

    bids, asks = book.depth(market, levels=DEPTH_LEVELS)
    return {
        "market": market.slug, "bids": _levels(bids), "asks": _levels(asks),
        "best_bid": _usd(bids[0][0]) if bids else None,
        "best_ask": _usd(asks[0][0]) if asks else None,
    }


def trade_payload(fill) -> dict[str, Any]:
    """Anonymous: price, GPUs, time (and the fill id, for de-duplication). Never who."""
    return {"id": fill.pk, "price": _usd(fill.price), "gpus": fill.gpus,
            "at": _iso(fill.created_at)}


def market_snapshot(market) -> dict[str, Any]:
    from marketplace.models import Fill

    trades = [trade_payload(f) for f in Fill.objects.filter(market=market).order_by("-pk")
              [:LAST_TRADES]]
    return {"type": "snapshot", "feed": "market", **depth_payload(market), "trades": trades}


def auction_payload(auction) -> dict[str, Any]:
    """Public state of a sealed-bid auction: the count of active bids and the clock.
    After close: the clearing price and the anonymous awards. Never a bid's content
    before close (DESIGN invariant 4)."""
    from marketplace.models import SealedBid

    now = timezone.now()
    data: dict[str, Any] = {
        "auction": auction.pk, "market": auction.market.slug, "status": auction.status,
        "rule": auction.rule, "gpus": auction.gpus,
        "reserve_price": _usd(auction.reserve_price),
        "duration_seconds": auction.duration_seconds,
        "closes_at": _iso(auction.closes_at),
        "seconds_left": max(0, int((auction.closes_at - now).total_seconds())),
        "server_time": _iso(now),
    }
    if auction.status == "open":
        data["type"] = "auction"
        data["bids"] = auction.bids.filter(status=SealedBid.Status.ACTIVE).count()
    else:
        data["bids"] = auction.bids.filter(
            status__in=[SealedBid.Status.WON, SealedBid.Status.LOST]).count()
        data["type"] = "auction_result"
        data["clearing_price"] = _usd(auction.clearing_price)
        data["closed_at"] = _iso(auction.closed_at)
        data["awards"] = [
            {"gpus": gpus, "price": _usd(price)}
            for gpus, price in auction.bids.filter(status=SealedBid.Status.WON)
            .order_by("-paid_price", "pk").values_list("awarded_gpus", "paid_price")
        ]
    return data


def auction_snapshot(auction) -> dict[str, Any]:
    return {**auction_payload(auction), "type": "snapshot", "feed": "auction",
            "event": auction_payload(auction)["type"]}


def order_payload(order) -> dict[str, Any]:
    return {"id": order.pk, "market": order.market.slug, "side": order.side,
            "status": order.status, "price": _usd(order.price), "gpus": order.gpus,
            "remaining_gpus": order.remaining_gpus, "time_in_force": order.time_in_force,
            "created_at": _iso(order.created_at)}


def sealed_bid_payload(bid) -> dict[str, Any]:
    """A sealed bid as its own bidder sees it (only ever sent to user.<bidder>)."""
    return {"id": bid.pk, "auction": bid.auction_id, "status": bid.status,
            "price": _usd(bid.price), "gpus": bid.gpus, "min_gpus": bid.min_gpus,
            "awarded_gpus": bid.awarded_gpus, "paid_price": _usd(bid.paid_price),
            "created_at": _iso(bid.created_at)}


def lease_payload(lease, role: str) -> dict[str, Any]:
    return {"id": lease.pk, "market": lease.market.slug, "role": role,
            "status": lease.status, "gpus": lease.gpu_count, "price": _usd(lease.price),
            "duration_seconds": lease.duration_seconds, "node": lease.node.name,
            "started_at": _iso(lease.started_at), "ends_at": _iso(lease.ends_at),
            "ended_at": _iso(lease.ended_at), "cause": lease.cause, "cost": _usd(lease.cost),
            "provider_amount": _usd(lease.provider_amount),
            "platform_fee": _usd(lease.platform_fee)}


def wallet_payload(user_id: int) -> dict[str, Any]:
    from settlement import services as ledger

    w = ledger.wallet(user_id=user_id)
    return {"available": _usd(w.available), "held": _usd(w.held), "earned": _usd(w.earned)}


def me_snapshot(user_id: int) -> dict[str, Any]:
    from django.db.models import Q

    from marketplace.models import Lease, Order, SealedBid

    orders = Order.objects.filter(owner_id=user_id, status__in=Order.ACTIVE) \
        .select_related("market").order_by("pk")
    bids = SealedBid.objects.filter(bidder_id=user_id, status=SealedBid.Status.ACTIVE) \
        .order_by("pk")
    leases = Lease.objects.filter(Q(buyer_id=user_id) | Q(provider_id=user_id)) \
        .exclude(status__in=Lease.ENDED).select_related("market", "node").order_by("pk")
    return {
        "type": "snapshot", "feed": "me", "user": user_id, "wallet": wallet_payload(user_id),
        "orders": [order_payload(o) for o in orders],
        "sealed_bids": [sealed_bid_payload(b) for b in bids],
        "leases": [lease_payload(le, "buyer" if le.buyer_id == user_id else "provider")
                   for le in leases],
    }


# ---------------------------------------------------------------- publishing

@dataclass
class Batch:
    """What changed in one transaction; flushed once, after commit."""

    markets: set[int] = field(default_factory=set)
    fills: set[int] = field(default_factory=set)
    auctions: set[int] = field(default_factory=set)
    orders: set[int] = field(default_factory=set)
    sealed_bids: set[int] = field(default_factory=set)
    leases: set[int] = field(default_factory=set)
    entries: set[int] = field(default_factory=set)

    def __call__(self) -> None:  # the on_commit callback
        try:
            publish(self.messages())
        except Exception:  # the data is committed; a feed outage must not fail the caller
            log.exception("live feed: publishing after commit failed; clients resync")

    def messages(self) -> list[tuple[str, dict[str, Any], int | None]]:
        """(group, payload, user id for user groups) in publishing order, read after
        commit. Rows that no longer exist (rolled back in a savepoint) are skipped."""
        from marketplace.models import Auction, Fill, GpuClass, Lease, Order, SealedBid
        from settlement.models import Posting

        out: list[tuple[str, dict[str, Any], int | None]] = []
        fills = Fill.objects.filter(pk__in=self.fills).select_related("market").order_by("pk")
        for fill in fills:
            out.append((market_group(fill.market.slug),
                        {"type": "trade", "market": fill.market.slug, **trade_payload(fill)},
                        None))
        for market in GpuClass.objects.filter(pk__in=self.markets).order_by("pk"):
            out.append((market_group(market.slug), {"type": "depth", "_depth_of": market},
                        None))
        for auction in Auction.objects.filter(pk__in=self.auctions).select_related("market"):
            out.append((auction_group(auction.pk), auction_payload(auction), None))
        for order in Order.objects.filter(pk__in=self.orders).select_related("market") \
                .order_by("pk"):
            out.append((user_group(order.owner_id),
                        {"type": "order", "order": order_payload(order)}, order.owner_id))
        for bid in SealedBid.objects.filter(pk__in=self.sealed_bids).order_by("pk"):
            out.append((user_group(bid.bidder_id),
                        {"type": "sealed_bid", "bid": sealed_bid_payload(bid)}, bid.bidder_id))
        for lease in Lease.objects.filter(pk__in=self.leases) \
                .select_related("market", "node").order_by("pk"):
            for user_id, role in ((lease.buyer_id, "buyer"), (lease.provider_id, "provider")):
                out.append((user_group(user_id),
                            {"type": "lease", "lease": lease_payload(lease, role)}, user_id))
        if self.entries:
            per_user: dict[int, dict[int, str]] = defaultdict(dict)
            # accounts without an owner (platform, external) are not published
            rows = Posting.objects.filter(entry_id__in=self.entries,
                                          account__owner__isnull=False) \
                .values_list("account__owner_id", "entry_id", "entry__kind")
            for owner_id, entry_id, kind in rows:
                per_user[owner_id][entry_id] = kind
            for user_id in sorted(per_user):
                entries = [{"id": e, "kind": k} for e, k in sorted(per_user[user_id].items())]
                out.append((user_group(user_id), {"type": "balance", "entries": entries,
                                                   "wallet": wallet_payload(user_id)}, user_id))
        return out


def publish(messages: list[tuple[str, dict[str, Any], int | None]]) -> None:
    """Number each message in its group (next seq) and send it to the group."""
    if not messages:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    seqs = counter()
    prepared = []
    for group, payload, user_id in messages:
        seq = seqs.incr(group)
        depth_of = payload.pop("_depth_of", None)
        if depth_of is not None:  # read after the seq was taken: see the module docstring
            payload.update(depth_payload(depth_of))
        payload = {**payload, "seq": seq, "ts": time.time()}
        event = {"type": EVENT_TYPE, "group": group, "seq": seq, "user": user_id,
                 "text": json.dumps(payload, separators=(",", ":"))}
        prepared.append((group, event))

    async def send_all() -> None:
        for group, event in prepared:
            await layer.group_send(group, event)

    _run(layer, send_all)


_loop: asyncio.AbstractEventLoop | None = None


def _publisher_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process, in a daemon thread, for publishing to Redis: reuses
    the channel layer's connections instead of a new loop and pool per commit."""
    global _loop
    with _counter_lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="feed-publisher",
                             daemon=True).start()
        return _loop


def _run(layer, coroutine_function) -> None:
    from channels_redis.core import RedisChannelLayer

    if isinstance(layer, RedisChannelLayer):
        future = asyncio.run_coroutine_threadsafe(coroutine_function(), _publisher_loop())
        future.result(timeout=10)
    else:
        # the in-memory layer's queues belong to the server's loop: async_to_sync runs
        # on it when called from a sync_to_async thread (the demo's views and tasks)
        async_to_sync(coroutine_function)()


def current_batch() -> Batch | None:
    """The batch already registered with the current transaction's on_commit callbacks,
    if any. Looked up among the callbacks themselves, so a rolled-back savepoint that
    registered it takes it away with it (no stale state to clean up)."""
    from django.db import connection

    for entry in reversed(connection.run_on_commit):
        func = entry[1]
        if isinstance(func, Batch):
            return func
    return None


def batch() -> Batch:
    """The batch of the current transaction, registering it with on_commit on first use.
    Outside a transaction (autocommit) a fresh batch is flushed by the caller."""
    from django.db import connection, transaction

    if not connection.in_atomic_block:
        return Batch()
    found = current_batch()
    if found is not None:
        return found
    created = Batch()
    transaction.on_commit(created)
    return created


def note(**changes: int) -> None:
    """Record changed rows (markets=, fills=, auctions=, orders=, sealed_bids=, leases=,
    entries= ids) in the current transaction's batch; published after commit."""
    from django.db import connection

    b = batch()
    for name, pk in changes.items():
        getattr(b, name).add(pk)
    if not connection.in_atomic_block:
        b()
