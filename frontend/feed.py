"""The live feed: what is published, to whom, in which order, and the snapshots.

Three feeds, each one Channels group with its own sequence number:

| websocket path              | group              | who may connect                     |
|-----------------------------|--------------------|-------------------------------------|
| `/ws/markets/<gpu_class>/`  | `market.<slug>`    | anyone (anonymous data only)        |
| `/ws/auctions/<id>/`        | `auction.<id>`     | anyone (never a sealed bid's content)|
| `/ws/me/`                   | `user.<id>`        | that user: session cookie, a        |
|                             |                    | `?ticket=` from POST /api/v1/       |
|                             |                    | ws-tickets/, or an `Authorization:  |
|                             |                    | Token <key>` header; else 4401      |

No credential in a URL: `?token=` (and the like) is refused on every websocket path with
an error frame and close code 4400 (frontend/ws_auth.py).

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
  that this connection missed messages M … N-1 (its queue overflowed because it read
  too slowly, or a message was lost on the way); the client should send
  `{"type": "resync"}`.
  Sequence rule for clients: a message with seq == last + 1 is the next one; seq <=
  last is stale (ignore); seq > last + 1 is a gap → send `{"type": "resync"}`.
  Numbers only grow, even across a Redis restart that lost them (frontend/feed_seq.py:
  a lost counter starts again from the clock in microseconds, ~1.7e15, exact in JS);
  after such a restart every connected client gets `resync_required` at once.

`/ws/markets/<slug>/`:
- snapshot: `{"type": "snapshot", "feed": "market", "market": slug, "seq", "ts",
  "bids": [["2.490000", 8], …] (high→low), "asks": [[price, gpus], …] (low→high),
  "best_bid": "2.49…"|null, "best_ask": …|null,
  "trades": [{"id", "price", "gpus", "at"}, …] (newest first, 20)}`
- `{"type": "trade", "market", "seq", "ts", "id", "price", "gpus", "at"}` — anonymous:
  no order, user, node or lease id. `id` is the fill id, to drop a trade seen twice
  (a snapshot read while a trade commits may contain it and be followed by it).
- `{"type": "depth", "market", "seq", "ts", "bids", "asks", "best_bid", "best_ask"}`:
  the whole depth (20 levels a side) after committed changes of the book — a new
  depth snapshot rather than a diff: simpler, and idempotent; coalesced to at most one
  per FEED_DEPTH_INTERVAL (see Publishing), always the latest.

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
  cost, provider_amount, platform_fee, interruptible, preempt_at, ports, endpoints:
  [{container_port, host, host_port, address: "host:port"}]}}` (to buyer and provider,
  each with its role)
- `{"type": "balance", "seq", "ts", "entries": [{"id", "kind"}, …], "wallet":
  {"available", "held", "earned"}}`: after committed transactions that moved money of
  the user (one message per user per published batch: usually one transaction).

Client → server: `{"type": "resync"}` → a fresh snapshot.

Publishing: frontend/signals.py collects what changed in the current transaction
(post_save of Order, Fill, Auction, SealedBid, Lease, JournalEntry, Posting) into one
batch per outermost transaction; `transaction.on_commit` hands it to this process's
publisher thread (`Publisher`), so a rolled-back transaction sends nothing and the
request thread does no feed reads. The publisher reads the rows fresh, takes the next
seq per group (Redis INCR, pipelined, on the channel layer's Redis when REDIS_URL is
set, so several processes agree; an in-process counter otherwise) and sends. Batches
that queued up meanwhile are read together (then a `balance` or `order` message covers
every transaction of the batch and carries the latest state). A market's depth is
coalesced: at most one per market every FEED_DEPTH_INTERVAL (0.1 s; the first one after
a quiet spell goes at once), always read after its seq was taken, so the depth carried
by seq k includes every change whose seq is <= k, and the last depth is the latest book.
Across processes (several web and worker processes commit changes of the same book)
the coalescing is shared through Redis (`_RedisCounter.depth_turn`): one process at a
time holds a market's depth slot for FEED_DEPTH_INTERVAL; a process whose changes were
already read by another process's published depth publishes none of its own. So a
market gets about one depth per interval whatever the number of processes, and still
every committed change is followed by a depth read after it.
Trades and the other messages are never coalesced away. Every event also carries `ns`,
the Redis database of its sequence numbers: pub/sub channels are server-wide, and a hub
ignores events numbered in another database (another deployment on the same server), and
`epoch`, the run id of the Redis server that numbered it.

Redis restarts (feed_seq.py): while Redis does not answer, the publisher keeps the batch
(and the due depths) and tries again, 0.05 s doubling to 1 s: nothing committed is
dropped; numbers taken for messages that were then not sent show as a gap. A hub that
gets an event of a new `epoch` tells every client of the group to resync at once. Its run
check (FEED_RUN_CHECK, 1 s: `INFO server` run_id) catches the restart even in a quiet
group: it subscribes every group again on fresh connections (the old pub/sub connection,
though reconnected by redis-py, was seen receiving nothing) and has every client resync.
Their snapshots are numbered in the new run and the next events flow, with no restart of
the web process. A client connecting after the restart gets its snapshot and events.

Delivery: each ASGI process has one `Hub` per event loop that subscribes once per group
to the channel layer (Redis pub/sub: `channels_redis.pubsub.RedisPubSubChannelLayer`;
in-memory in the embedded default, where the publisher hands events to the hub
directly) and fans each event out in memory to its websockets, each with a bounded
queue (frontend/consumers.py; under uvicorn, an event for a client with nothing queued
is written straight to its socket as one frame encoded once for the group: "Direct
writes" there). Ordering guarantee: per group, a client receives events
in increasing seq order. Events from several publishing processes may reach Redis out
of order; the hub holds an early one up to FEED_REORDER_WAIT (0.1 s) for the missing
seqs, then hands out what it has: the client sees the gap (`resync_required`, then it
resyncs). A client too slow to drain its queue (FEED_CLIENT_QUEUE, 128) loses its
backlog and gets `resync_required`; nothing more is sent to it until it resyncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connections
from django.utils import timezone

from core import after_commit
from core.after_commit import AfterCommitThread, PerProcess, group_send_all, namespace
from core.after_commit import is_local as _is_local
from frontend.feed_seq import DEPTH_COVERED, DEPTH_WAIT, counter, current
from frontend.feed_seq import current_seq as current_seq  # re-exported

log = logging.getLogger("gpumarket.feed")

DEPTH_LEVELS = 20
LAST_TRADES = 20
EVENT_TYPE = "feed.event"
SNAPSHOT_CACHE_S = 0.5  # the channel layer message type → consumer.feed_event


def market_group(slug: str) -> str:
    return f"market.{slug}"


def auction_group(auction_id: int) -> str:
    return f"auction.{auction_id}"


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


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
    from marketplace.leases import endpoint_text

    return {"id": lease.pk, "market": lease.market.slug, "role": role,
            "status": lease.status, "gpus": lease.gpu_count, "price": _usd(lease.price),
            "duration_seconds": lease.duration_seconds, "node": lease.node.name,
            "started_at": _iso(lease.started_at), "ends_at": _iso(lease.ends_at),
            "ended_at": _iso(lease.ended_at), "cause": lease.cause, "cost": _usd(lease.cost),
            "provider_amount": _usd(lease.provider_amount),
            "platform_fee": _usd(lease.platform_fee),
            "interruptible": lease.interruptible, "preempt_at": _iso(lease.preempt_at),
            "ports": list(lease.ports or []),
            "endpoints": [{**e, "address": endpoint_text(e)} for e in lease.endpoints or []]}


def wallet_payload(user_id: int) -> dict[str, Any]:
    return wallet_payloads([user_id])[user_id]


def wallet_payloads(user_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """wallet_payload of several users, read in one query."""
    from settlement import services as ledger

    return {u: {"available": _usd(w.available), "held": _usd(w.held), "earned": _usd(w.earned)}
            for u, w in ledger.wallets(user_ids=user_ids).items()}


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
    """What changed in one transaction; handed to the publisher thread after commit."""

    markets: set[int] = field(default_factory=set)
    fills: set[int] = field(default_factory=set)
    auctions: set[int] = field(default_factory=set)
    orders: set[int] = field(default_factory=set)
    sealed_bids: set[int] = field(default_factory=set)
    leases: set[int] = field(default_factory=set)
    entries: set[int] = field(default_factory=set)
    committed_at: float = 0.0

    FIELDS = ("markets", "fills", "auctions", "orders", "sealed_bids", "leases", "entries")

    def __call__(self) -> None:  # the on_commit callback: cheap, no reads, no I/O
        self.committed_at = time.time()
        try:
            publisher().submit(self)
        except Exception:  # the data is committed; a feed outage must not fail the caller
            log.exception("live feed: queueing after commit failed; clients resync")

    def merge(self, other: Batch) -> None:
        for name in self.FIELDS:
            getattr(self, name).update(getattr(other, name))
        self.committed_at = min(self.committed_at, other.committed_at)

    def messages(self, listening: set[int] | None = None
                 ) -> list[tuple[str, dict[str, Any], int | None]]:
        """(group, payload, user id for user groups) in publishing order, read after
        commit. Rows that no longer exist (rolled back in a savepoint) are skipped. A
        market's depth is a placeholder `{"type": "depth", "_depth_of": market}`, read
        when it is published (see Publisher). `listening`: the users whose order and
        balance messages are wanted (None: every user's)."""
        from marketplace.models import Auction, Fill, GpuClass, Lease, Order, SealedBid
        from settlement.models import Posting

        out: list[tuple[str, dict[str, Any], int | None]] = []
        if self.fills:
            fills = Fill.objects.filter(pk__in=self.fills).select_related("market") \
                .order_by("pk")
            for fill in fills:
                out.append((market_group(fill.market.slug),
                            {"type": "trade", "market": fill.market.slug,
                             **trade_payload(fill)}, None))
        if self.markets:
            for market in GpuClass.objects.filter(pk__in=self.markets).order_by("pk"):
                out.append((market_group(market.slug),
                            {"type": "depth", "_depth_of": market}, None))
        if self.auctions:
            for auction in Auction.objects.filter(pk__in=self.auctions) \
                    .select_related("market"):
                out.append((auction_group(auction.pk), auction_payload(auction), None))
        orders = Order.objects.filter(pk__in=self.orders)
        if listening is not None:  # nobody else would receive them: not even read
            orders = orders.filter(owner_id__in=listening)
        if self.orders and listening != set():
            for order in orders.select_related("market").order_by("pk"):
                out.append((user_group(order.owner_id),
                            {"type": "order", "order": order_payload(order)}, order.owner_id))
        if self.sealed_bids:
            for bid in SealedBid.objects.filter(pk__in=self.sealed_bids).order_by("pk"):
                out.append((user_group(bid.bidder_id),
                            {"type": "sealed_bid", "bid": sealed_bid_payload(bid)},
                            bid.bidder_id))
        if self.leases:
            for lease in Lease.objects.filter(pk__in=self.leases) \
                    .select_related("market", "node").order_by("pk"):
                for user_id, role in ((lease.buyer_id, "buyer"),
                                      (lease.provider_id, "provider")):
                    out.append((user_group(user_id),
                                {"type": "lease", "lease": lease_payload(lease, role)},
                                user_id))
        if self.entries and listening != set():
            per_user: dict[int, dict[int, str]] = defaultdict(dict)
            # accounts without an owner (platform, external) are not published
            postings = Posting.objects.filter(entry_id__in=self.entries,
                                              account__owner__isnull=False)
            if listening is not None:
                postings = postings.filter(account__owner_id__in=listening)
            rows = postings \
                .values_list("account__owner_id", "entry_id", "entry__kind")
            for owner_id, entry_id, kind in rows:
                per_user[owner_id][entry_id] = kind
            wallets = wallet_payloads(per_user)
            for user_id in sorted(per_user):
                entries = [{"id": e, "kind": k} for e, k in sorted(per_user[user_id].items())]
                out.append((user_group(user_id), {"type": "balance", "entries": entries,
                                                   "wallet": wallets[user_id]}, user_id))
        return out


def _redis_down_errors() -> tuple[type[BaseException], ...]:
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:
        return (ConnectionError,)
    return (RedisConnectionError, RedisTimeoutError, ConnectionError)


#: errors of an unreachable (restarting, loading) Redis: the publisher keeps the batch
_REDIS_DOWN = _redis_down_errors()


def _setting(name: str, default: float) -> float:
    return getattr(settings, name, default)


class Publisher(AfterCommitThread[Batch]):
    """One daemon thread per process that turns committed batches into feed messages.

    The request (or task) thread only appends the batch to a queue in `on_commit`; the
    reads, the sequence numbers and the sends happen here, in commit order. Batches
    that queued up while the thread was busy are merged (one read per table for all of
    them). A market's depth is coalesced: at most one depth message per market every
    FEED_DEPTH_INTERVAL seconds (default 0.1), sent at once when the previous one is
    older than that (no added delay at low rates), otherwise at the end of the interval,
    and always read at send time, so it is the latest depth. Trades, auction, order,
    bid, lease and balance messages are never coalesced away.
    """

    IDLE_CLOSE_S = 1.0  # close this thread's database connection after this idle time

    def __init__(self) -> None:
        super().__init__("feed-publisher")
        # market pk → (due, committed_at of the earliest change, its last change's number)
        self._dirty: dict[int, tuple[float, float, int]] = {}
        self.depth_covered = 0  # depths left to another process's publication
        self._last_depth: dict[int, float] = {}
        self._markets: dict[int, Any] = {}
        self.delays: dict[tuple[str, int], float] | None = None  # bench: (group, seq) → ts − commit
        self._retained: Batch | None = None  # a batch kept while Redis does not answer
        self._failures = 0  # rounds failed in a row on Redis

    def busy(self) -> bool:
        """`flush` waits for every submitted batch, coalesced depth included (while Redis
        does not answer, batches are kept: flush returns False after its timeout)."""
        return bool(self._unfinished or self._dirty or self._retained is not None)

    # -- the thread
    def run(self) -> None:
        idle_since: float | None = None
        while True:
            now = time.monotonic()
            wait = min((due for due, *_ in self._dirty.values()), default=None)
            timeout = self.IDLE_CLOSE_S if wait is None else max(0.0, wait - now)
            if self._retained is not None:
                timeout = min(timeout, self._retry_delay())
            taken = self.take(timeout)
            merged: Batch | None = self._retained
            for b in taken:
                if merged is None:
                    merged = b
                else:
                    merged.merge(b)
            retained: Batch | None = None
            dirty_before = dict(self._dirty)
            try:
                self._publish_round(merged)
                if self._failures:
                    log.warning("live feed: Redis answers again; publishing resumed")
                self._failures = 0
            except _REDIS_DOWN as exc:
                # Nothing of this round may be lost silently: keep the batch (its rows are
                # read again, fresh) and the depths that were due, and try again. Numbers
                # already taken for messages that were not sent show as a gap: resync.
                retained = merged
                for pk, entry in dirty_before.items():
                    self._dirty.setdefault(pk, entry)
                self._failures += 1
                if self._failures == 1:
                    log.warning("live feed: Redis unreachable (%s); the changes are kept and "
                                "published when it answers again", exc)
            except Exception:
                log.exception("live feed: publishing after commit failed; clients resync")
                self._dirty.clear()
            finally:
                with self._cond:  # (a reentrant lock: done() takes it too)
                    self._retained = retained
                    self.done(len(taken))
            if merged is None and not self._dirty:
                if idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self.IDLE_CLOSE_S:
                    connections.close_all()  # no idle connection held between bursts
                    idle_since = None
            else:
                idle_since = None

    def _retry_delay(self) -> float:
        """Seconds before the next try after `_failures` failed rounds: 0.05 doubling to 1."""
        return min(1.0, 0.05 * 2 ** min(self._failures, 5))

    def _publish_round(self, merged: Batch | None) -> None:
        now = time.monotonic()
        out: list[tuple[str, dict[str, Any], int | None, float]] = []
        interval = _setting("FEED_DEPTH_INTERVAL", 0.1)
        if merged is not None:
            noted: dict[int, float] = {}
            # Order and balance messages only for users someone listens to (/ws/me/):
            # asked after commit and before reading, and a subscriber reads its snapshot
            # after subscribing, so a change it was not sent is in its snapshot.
            listening = counter().listening_users() if (merged.orders or merged.entries) \
                else None
            for group, payload, user_id in merged.messages(listening):
                market = payload.pop("_depth_of", None)
                if market is None:
                    out.append((group, payload, user_id, merged.committed_at))
                    continue
                self._markets[market.pk] = market
                noted[market.pk] = max(now, self._last_depth.get(market.pk, 0.0) + interval)
            numbers = counter().depth_changes(sorted(noted)) if noted else {}
            for pk, due in noted.items():
                if pk in self._dirty:  # the earlier due and commit time, the later change
                    old_due, old_commit, old_need = self._dirty[pk]
                    self._dirty[pk] = (min(old_due, due), min(old_commit, merged.committed_at),
                                       max(old_need, numbers[pk]))
                else:
                    self._dirty[pk] = (due, merged.committed_at, numbers[pk])
        for pk, (due, committed_at, need) in sorted(self._dirty.items()):
            if due > now:
                continue
            turn, value = counter().depth_turn(pk, need, interval)
            if turn == DEPTH_WAIT:  # another process publishes this market's depth now
                self._dirty[pk] = (now + value, committed_at, need)
                continue
            del self._dirty[pk]
            if turn == DEPTH_COVERED:  # ... and it was read after this process's changes
                self.depth_covered += 1
                continue
            market = self._markets[pk]
            out.append((market_group(market.slug),
                        {"type": "depth", "_depth_of": market, "_covers": (pk, value)},
                        None, committed_at))
            self._last_depth[pk] = now
        if out:
            self._send(out)

    def _send(self, messages: list[tuple[str, dict[str, Any], int | None, float]]) -> None:
        epoch, seqs = counter().next_many([group for group, *_ in messages])
        events, covers, ns = [], [], namespace()
        for (group, payload, user_id, committed_at), seq in zip(messages, seqs, strict=True):
            depth_of = payload.pop("_depth_of", None)
            if depth_of is not None:  # read after its seq was taken: module docstring
                covers.append(payload.pop("_covers"))
                payload.update(depth_payload(depth_of))
            ts = time.time()
            payload = {**payload, "seq": seq, "ts": ts}
            if self.delays is not None:
                self.delays[(group, seq)] = ts - committed_at
            events.append({"type": EVENT_TYPE, "group": group, "seq": seq, "user": user_id,
                           "ns": ns, "epoch": epoch,
                           "text": json.dumps(payload, separators=(",", ":"))})
        send_events(events, self._loop)
        for pk, value in covers:  # only once sent: others may now skip their own depth
            counter().depth_done(pk, value)


# a short-lived process (a management command, a task run) publishes what it committed
# before it exits
_publisher: PerProcess[Publisher] = PerProcess(Publisher, flush_at_exit=True)


def publisher() -> Publisher:
    return _publisher.get()


def flush(timeout: float = 10.0) -> bool:
    """Block until everything committed so far in this process has been published."""
    return publisher().flush(timeout)


def send_events(events: list[dict[str, Any]], loop: asyncio.AbstractEventLoop) -> None:
    """Deliver numbered events: through the channel layer (Redis pub/sub: every process's
    hub that subscribed the group), or, with the in-memory layer, straight to this
    process's hubs (the embedded default runs web and publisher in one process)."""
    layer = get_channel_layer()
    if layer is None or _is_local(layer):
        for hub in list(_hubs.values()):
            if not hub.loop.is_closed():
                hub.loop.call_soon_threadsafe(hub.deliver_many, events)
        return

    loop.run_until_complete(group_send_all(layer, [(event["group"], event)
                                                   for event in events]))


def current_batch() -> Batch | None:
    """The batch already registered with the current transaction's on_commit callbacks,
    if any. Looked up among the callbacks themselves, so a rolled-back savepoint that
    registered it takes it away with it (no stale state to clean up)."""
    return after_commit.registered(Batch)


def batch() -> Batch:
    """The batch of the current transaction, registering it with on_commit on first use.
    Outside a transaction (autocommit) a fresh batch is flushed by the caller."""
    return after_commit.collector(Batch)


def note(**changes: int) -> None:
    """Record changed rows (markets=, fills=, auctions=, orders=, sealed_bids=, leases=,
    entries= ids) in the current transaction's batch; published after commit."""

    def add(b: Batch) -> None:
        for name, pk in changes.items():
            getattr(b, name).add(pk)

    after_commit.note(Batch, add)


# ---------------------------------------------------------------- the hub (delivery)

class Subscriber(Protocol):
    def offer(self, event: dict[str, Any]) -> None: ...

    # optional: the group's numbering restarted at `event` (Hub._renumbered); without
    # it the subscriber is offered the event (and sees a gap)
    # def renumbered(self, event: dict[str, Any]) -> None: ...


@dataclass
class _GroupState:
    members: set = field(default_factory=set)
    subscribed: bool = False
    expected: int = 1                      # the next seq to hand out, in order
    pending: dict[int, dict[str, Any]] = field(default_factory=dict)  # seq → early event
    timer: asyncio.TimerHandle | None = None
    epoch: str | None = None               # the Redis run that numbered `expected - 1`


class Hub:
    """Per event loop (one per ASGI process): subscribes to each group ONCE, whatever the
    number of local websockets on it, and fans every event out in memory to them.

    Order: events are handed to the local subscribers in seq order. Several publishing
    processes may deliver seq k+1 before k; the hub holds an early event up to
    FEED_REORDER_WAIT seconds (default 0.1) for the missing ones, then hands out what it
    has — the subscribers see the gap and tell their clients to resync. An event older
    than one already handed out is dropped (every subscriber is past it).

    `seq(group)` is the last seq handed out: a snapshot numbered with it and read
    afterwards contains every change up to it (each was committed before its seq was
    taken, and handed out after).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ns = namespace()
        self.groups: dict[str, _GroupState] = {}
        self._lock = asyncio.Lock()
        self._layer = None
        self._channel: str | None = None
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._own_layer = None  # a channel layer of this hub's own, once it resubscribed
        self._run: str | None = None  # the Redis run id last seen
        # group → (seq, monotonic time read, text) and the read in flight (seq, task)
        self.snapshots: dict[str, tuple[int, float, str]] = {}
        self._reading: dict[str, tuple[int, asyncio.Task]] = {}

    @property
    def local(self) -> bool:
        layer = get_channel_layer()
        return layer is None or _is_local(layer)

    def seq(self, group: str) -> int:
        return self.groups[group].expected - 1

    def any_member(self, group: str) -> Subscriber | None:
        """A local subscriber of `group`, if any (a new one may share what it looked up)."""
        state = self.groups.get(group)
        return next(iter(state.members), None) if state is not None else None

    async def snapshot(self, group: str, need_seq: int, read) -> tuple[int, str]:
        """(seq, JSON text) of a snapshot of `group` numbered seq >= need_seq.

        The seq is the last one handed out, taken before the rows are read (`read` runs
        in a thread): a change committed in between may show in the snapshot and arrive
        again as seq+1 (harmless), but none is missed. One read per group at a time:
        clients that (re)sync together share it, and a snapshot is reused for
        SNAPSHOT_CACHE_S while it is recent enough for the asker."""
        while True:
            cached = self.snapshots.get(group)
            if (cached and cached[0] >= need_seq
                    and time.monotonic() - cached[1] < SNAPSHOT_CACHE_S):
                return cached[0], cached[2]
            reading = self._reading.get(group)
            if reading is not None:
                with contextlib.suppress(Exception):
                    result = await asyncio.shield(reading[1])
                    if reading[0] >= need_seq:
                        return result
                if reading[0] >= need_seq:  # it failed: let the caller see it
                    return await reading[1]
                continue
            seq = self.seq(group) if group in self.groups else need_seq
            task = self.loop.create_task(self._read_snapshot(group, seq, read))
            self._reading[group] = (seq, task)

    async def _read_snapshot(self, group: str, seq: int, read) -> tuple[int, str]:
        from channels.db import database_sync_to_async

        try:
            data = await database_sync_to_async(read)()
            text = json.dumps({**data, "seq": seq, "ts": time.time()}, separators=(",", ":"))
            if group in self.groups:
                self.snapshots[group] = (seq, time.monotonic(), text)
            return seq, text
        finally:
            self._reading.pop(group, None)

    async def join(self, group: str, member: Subscriber) -> None:
        state = self.groups.setdefault(group, _GroupState())
        state.members.add(member)
        async with self._lock:  # a later joiner waits here until the group is subscribed
            if self.groups.get(group) is state and not state.subscribed:
                if not self.local:
                    await self._ensure_reader()
                    await self._layer.group_add(group, self._channel)
                # after subscribing: whatever seq was taken before now is either
                # in flight (and ≤ this value, so stale for everyone) or delivered
                epoch, last = await asyncio.to_thread(current, group)
                state.expected = max(state.expected, last + 1)
                state.epoch = epoch
                if self._run is None:
                    self._run = epoch
                state.subscribed = True

    async def leave(self, group: str, member: Subscriber) -> None:
        state = self.groups.get(group)
        if state is None:
            return
        state.members.discard(member)
        if state.members:
            return
        async with self._lock:
            if state.members or self.groups.get(group) is not state:
                return
            del self.groups[group]
            self.snapshots.pop(group, None)
            if state.timer is not None:
                state.timer.cancel()
            if state.subscribed and not self.local and self._channel is not None:
                await self._layer.group_discard(group, self._channel)
            if not self.groups and self._reader is not None:
                self._reader.cancel()
                self._reader, self._channel = None, None
            if not self.groups and self._watcher is not None:
                self._watcher.cancel()
                self._watcher = None

    async def _ensure_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            return
        self._layer = self._own_layer or get_channel_layer()
        self._channel = await self._layer.new_channel(prefix="feedhub.")
        self._reader = self.loop.create_task(self._read(self._layer, self._channel))
        if self._watcher is None or self._watcher.done():
            self._watcher = self.loop.create_task(self._watch())

    async def _watch(self) -> None:
        """Every FEED_RUN_CHECK seconds (default 1): did Redis restart under this hub's
        subscription (a new run id)? Events published while the subscription was down
        (redis-py subscribes again when it reconnects) are lost, and a quiet group would
        never show it: every group still numbered by the old run is renumbered from the
        new run's counter and its clients resync at once (`_renumbered`)."""
        while True:
            await asyncio.sleep(_setting("FEED_RUN_CHECK", 1.0))
            try:
                run = await asyncio.to_thread(counter().run_id)
                if self._run is None or run == self._run:
                    self._run = run
                    continue
                log.warning("live feed: Redis restarted (run %s, was %s): every client of "
                            "this process resyncs", run, self._run)
                self._run = run
                await self._resubscribe()
                for group, state in list(self.groups.items()):
                    if not state.subscribed or state.epoch == run:
                        continue
                    epoch, last = await asyncio.to_thread(current, group)
                    if self.groups.get(group) is state and state.epoch != epoch:
                        self._renumbered(group, state, {"group": group, "epoch": epoch,
                                                        "seq": max(last, state.expected - 1)})
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis still down: the next round asks again
                log.debug("feed hub: Redis run check failed: %s", exc)

    async def _resubscribe(self) -> None:
        """Subscribe every group again, on new connections (a channel layer of this hub's
        own), and drop the old ones: after a Redis restart, the old pub/sub connection,
        reconnected by redis-py, was seen subscribed on the server yet receiving nothing."""
        from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

        async with self._lock:
            old_layer, old_reader, old_channel = self._layer, self._reader, self._channel
            layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
            channel = await layer.new_channel(prefix="feedhub.")
            for group, state in self.groups.items():
                if state.subscribed:
                    await layer.group_add(group, channel)
            self._own_layer, self._layer, self._channel = layer, layer, channel
            self._reader = self.loop.create_task(self._read(layer, channel))
            if old_reader is not None:
                old_reader.cancel()
            if old_layer is not None and old_channel is not None:
                for group in self.groups:
                    with contextlib.suppress(Exception):
                        await old_layer.group_discard(group, old_channel)
            if old_layer is not None and old_layer is not get_channel_layer():
                with contextlib.suppress(Exception):
                    await old_layer.flush()

    async def _read(self, layer, channel: str) -> None:
        while True:
            event = await layer.receive(channel)
            try:
                self.deliver(event)
            except Exception:
                log.exception("feed hub: delivering %s failed", event.get("group"))

    # -- ordering and fan-out (synchronous: runs between two awaits of the loop)
    def deliver_many(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self.deliver(event)

    def deliver(self, event: dict[str, Any]) -> None:
        state = self.groups.get(event.get("group", ""))
        if state is None or not state.subscribed:
            return
        if event.get("ns", self.ns) != self.ns:  # numbered by another Redis database
            return
        seq = event["seq"]
        if seq < state.expected or seq in state.pending:
            return  # (also one numbered before a Redis reset and sent after it: stale)
        epoch = event.get("epoch")
        if epoch is not None and epoch != state.epoch:
            self._renumbered(event["group"], state, event)
            return
        if seq > state.expected:
            state.pending[seq] = event
            if len(state.pending) > 256:
                self._give_up(event["group"])
            elif state.timer is None:
                state.timer = self.loop.call_later(
                    _setting("FEED_REORDER_WAIT", 0.1), self._give_up, event["group"])
            return
        self._fan_out(state, event)
        self._release(state)

    def _release(self, state: _GroupState) -> None:
        while state.expected in state.pending:
            self._fan_out(state, state.pending.pop(state.expected))
        if not state.pending and state.timer is not None:
            state.timer.cancel()
            state.timer = None

    def _renumbered(self, group: str, state: _GroupState, event: dict[str, Any]) -> None:
        """The first event numbered by another Redis run (Redis restarted, lost or restored
        its counters, failed over): events published meanwhile may never have reached this
        hub. Hand out what was held, then tell every local subscriber at once to resync
        (`renumbered`: its backlog is dropped and it gets `resync_required`); the snapshot
        it asks for is numbered from this event on, and the next events flow."""
        log.info("live feed: %s is numbered by a new Redis run (%s, was %s): clients "
                 "resync", group, event.get("epoch"), state.epoch)
        for seq in sorted(state.pending):
            self._fan_out(state, state.pending.pop(seq))
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        state.epoch = event.get("epoch")
        state.expected = event["seq"] + 1
        self.snapshots.pop(group, None)
        for member in tuple(state.members):
            renumbered = getattr(member, "renumbered", None)
            if renumbered is None:
                if "text" in event:  # not the watcher's (Hub._watch) mark
                    member.offer(event)
            else:
                renumbered(event)

    def _give_up(self, group: str) -> None:
        """The missing seqs did not come in time: hand out the early events (with a gap)."""
        state = self.groups.get(group)
        if state is None:
            return
        state.timer = None
        if state.pending:
            state.expected = min(state.pending)
            self._release(state)
            if state.pending:  # a further gap among the early ones: wait for it in turn
                self._give_up(group)

    @staticmethod
    def _fan_out(state: _GroupState, event: dict[str, Any]) -> None:
        state.expected = event["seq"] + 1
        for member in tuple(state.members):
            member.offer(event)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """The hub of the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub(loop)
    return found
