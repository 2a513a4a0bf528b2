"""The market lock and the book cache: one matching writer per order book.

`lock_market` takes the GPU class row lock (an UPDATE that bumps its book_version) for
the rest of the transaction; `tracked` marks book.py's own writers, whose books come
from the per-process `book_cache` (`load_book`: hit, catch-up or rebuild). The rules
(lock order, versions, what a foreign lock holder must do): docs/MATCHING.md.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import Q
from django.db.transaction import TransactionManagementError

from core import metrics
from marketplace import engine, interconnect
from marketplace.env_templates import cuda_key
from marketplace.errors import MarketBusy, busy_message, is_lock_timeout
from marketplace.models import GpuClass, Order
from marketplace.runtimes import runs_images


@dataclass
class _Writer:
    """book.py's own write transaction on one market (thread-local, outermost only)."""

    market_id: int
    version: int | None = None          # the market's book_version in this transaction
    rebuild_version: int = 0
    epoch: UUID | None = None
    touched: dict[int, Order] = field(default_factory=dict)  # orders changed, by pk
    loaded: bool = False


_local = threading.local()


def _writer_for(market_id: int) -> _Writer | None:
    """This thread's tracked transaction on `market_id`, once it holds the lock."""
    w = getattr(_local, "writer", None)
    if w is not None and w.market_id == market_id and w.version is not None:
        return w
    return None


@contextmanager
def tracked(market_id: int):
    """Run the body (which opens the transaction and calls lock_market first) as one of
    book.py's own writers, which may use the book cache. Nested in a caller's
    transaction it is an ordinary lock holder instead: that caller may change orders
    afterwards, so the cache must not trust this transaction."""
    if transaction.get_connection().in_atomic_block or getattr(_local, "writer", None):
        yield None
        return
    _local.writer = _Writer(market_id)
    try:
        yield _local.writer
    finally:
        _local.writer = None


_LOCK_SQL = ('UPDATE "marketplace_gpuclass" SET "book_version" = "book_version" + 1{} '
             '{}WHERE "id" = %s RETURNING {}')
# the table's columns (with the lock-wait FROM on PostgreSQL); SQLite, the embedded
# default, takes no "TABLE.*" in RETURNING and has no FROM there: plain *
_RETURNING_TABLE, _RETURNING_ALL = '"marketplace_gpuclass".*', "*"
# the fence claimed in the same UPDATE, unless a later token wrote first
_FENCE_SQL = (', "bid_queue_fence" = CASE WHEN "bid_queue_fence" <= %s THEN %s '
              'ELSE "bid_queue_fence" END, '
              '"bid_queue_group" = CASE WHEN "bid_queue_fence" <= %s THEN %s '
              'ELSE "bid_queue_group" END, '
              '"bid_queue_done" = CASE WHEN "bid_queue_fence" <= %s THEN %s '
              'ELSE "bid_queue_done" END')
# SET LOCAL lock_timeout in the same statement: the FROM item is evaluated before the
# UPDATE waits for the row, and the wait reads the setting when it starts
_LOCK_WAIT_SQL = "FROM (SELECT set_config('lock_timeout', %s, true)) AS \"lock_wait\" "


@metrics.LOCK_WAIT.time()
def lock_market(market_id: int, *, orders_unchanged: bool = False,
                fence: Fence | None = None, through: int | None = None) -> GpuClass:
    """Take the order book's single-writer lock for the rest of the transaction (the row
    lock of an UPDATE of the GPU class row, which bumps its book_version).

    Called by anyone but book.py's own writers it also marks the in-process book
    caches stale (book_rebuild_version): such a caller may change orders directly —
    unless it says it changes no order row (`orders_unchanged`: the sealed auctions),
    when every process's cached book stays valid (a deep book is not rebuilt for it).
    Waits at most GPUMARKET_MARKET_LOCK_TIMEOUT_MS (PostgreSQL's lock_timeout, for the
    rest of the transaction, set by the same statement), then raises MarketBusy (the
    API's 503). With a `fence` (a bid queue consumer's), also record in the same statement
    that its group is committed `through` that position with this transaction, or
    raise Fenced when a later token wrote first."""
    if not transaction.get_connection().in_atomic_block:
        raise TransactionManagementError("lock_market needs a transaction (atomic block)")
    w = getattr(_local, "writer", None)
    tracked = w is not None and w.market_id == market_id and w.version is None
    sets = "" if tracked or orders_unchanged else ', "book_rebuild_version" = "book_version" + 1'
    params: list[Any] = []
    if fence is not None:
        sets += _FENCE_SQL
        params += [fence.token, fence.token, fence.token, fence.group, fence.token, through]
    wait = _lock_wait_ms()
    if wait:
        params.append(wait)
    sql = _LOCK_SQL.format(sets, _LOCK_WAIT_SQL if wait else "",
                           _RETURNING_TABLE if wait else _RETURNING_ALL)
    try:
        rows = list(GpuClass.objects.raw(sql, [*params, market_id]))
    except OperationalError as exc:
        if is_lock_timeout(exc):
            raise MarketBusy(busy_message()) from None
        raise
    if not rows:
        raise GpuClass.DoesNotExist(f"GpuClass {market_id} does not exist")
    market = rows[0]
    if fence is not None and (market.bid_queue_fence != fence.token
                              or market.bid_queue_group != fence.group):
        raise Fenced(f"market {market_id}: a later consumer holds the bid queue")
    if tracked:
        w.version, w.rebuild_version = market.book_version, market.book_rebuild_version
        w.epoch = market.book_epoch
    return market


@dataclass(frozen=True)
class Fence:
    """A bid queue consumer's claim on a market (marketplace/api/bid_queue.py): its
    fencing token, the id of the group it places, and each request's position in that
    group."""

    token: int
    group: str
    positions: list[int]


class Fenced(Exception):
    """A consumer with a later fencing token took the market's queue over: this one's
    transaction is rolled back, nothing of it written."""


def take_over(market_id: int, token: int) -> tuple[str, int]:
    """Raise the market's fence to `token` (waiting for a writer that holds the market
    lock: the same row) and return (group, last position committed) of the group written
    last. From then on an earlier token's transaction raises Fenced. Autocommit (its own
    statement); takes no market lock, so no book cache is invalidated."""
    with transaction.atomic():
        _bound_lock_wait()
        with transaction.get_connection().cursor() as cursor:
            cursor.execute('UPDATE "marketplace_gpuclass" SET "bid_queue_fence" = %s '
                           'WHERE "id" = %s AND "bid_queue_fence" <= %s '
                           'RETURNING "bid_queue_group", "bid_queue_done"',
                           [token, market_id, token])
            row = cursor.fetchone()
    if row is None:
        raise Fenced(f"market {market_id}: a later consumer holds the bid queue")
    return row[0], row[1]


def _lock_wait_ms() -> str | None:
    """The lock_timeout value for a market lock ("5000ms"), or None: not PostgreSQL, or
    0 in GPUMARKET_MARKET_LOCK_TIMEOUT_MS (no bound)."""
    ms = settings.GPUMARKET_MARKET_LOCK_TIMEOUT_MS
    if ms and transaction.get_connection().vendor == "postgresql":
        return f"{ms}ms"
    return None


def _bound_lock_wait() -> None:
    """SET LOCAL lock_timeout for this transaction (PostgreSQL; 0 in the setting: none)."""
    wait = _lock_wait_ms()
    if wait:
        with transaction.get_connection().cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [wait])


def touch(order: Order) -> tuple[str, ...]:
    """Stamp `order` (about to be saved) with this transaction's book version; returns the
    field to add to update_fields."""
    w = _writer_for(order.market_id)
    if w is not None:
        order.book_version = w.version
        if not w.loaded and order.pk is not None:  # (a new order is not in the book yet)
            w.touched[order.pk] = order
    return ("book_version",)



def epoch(dt: datetime) -> int:
    return int(dt.timestamp())


def rel_key(value) -> int:
    """A reliability (Decimal 0–1, None: none) as the engine counts it, per mille."""
    return 0 if value is None else int(value * 1000)


def engine_bid(order: Order) -> engine.Bid:
    return engine.Bid(id=order.pk, owner=order.owner_id, price=order.price,
                      gpus=order.remaining_gpus, gang=order.gang_size,
                      duration_s=order.duration_seconds, seq=order.pk,
                      tif=order.time_in_force, min_cuda=cuda_key(order.min_cuda),
                      nvlink=order.interconnect == "nvlink",
                      min_rel=rel_key(order.min_reliability),
                      avoid_node=order.avoid_node_id or 0, image_only=not order.command,
                      node=order.node_id or 0)


def sells_until(available_until: datetime, maintenance_from: datetime | None) -> datetime:
    """The end of the time an ask sells: its available_until, cut at the start of its
    node's next maintenance window (Node.maintenance_from; docs/LEASE_CONTRACT.md)."""
    if maintenance_from is not None and maintenance_from < available_until:
        return maintenance_from
    return available_until


def engine_ask(order: Order) -> engine.Ask:
    """The ask with its node's CUDA version, reliability, runtime and maintenance cut
    (reads the node unless it is loaded)."""
    return engine.Ask(id=order.pk, owner=order.owner_id, price=order.price,
                      gpus=order.remaining_gpus, node=order.node_id,
                      available_until=epoch(sells_until(order.available_until,
                                                        order.node.maintenance_from)),
                      seq=order.pk, cuda=cuda_key(order.node.cuda_version),
                      rel=_node_rel(order.node.reliability),
                      runs_images=runs_images(order.node.runtime))


def _node_rel(value) -> int:
    """A node's reliability per mille; 1000 without a record (it meets any floor)."""
    return 1000 if value is None else rel_key(value)


# a bid's min_cuda, an ask's node's cuda_version (docs/MATCHING.md, "CUDA compatibility");
# a bid's min_reliability and avoid_node_id, an ask's node's reliability (docs/FAULTS.md);
# a bid's command, an ask's node's runtime (docs/MATCHING.md, "Runtimes");
# node_id: an ask's node, or the one node a bid fills on (null: any)
ROW = ("pk", "side", "owner_id", "price", "remaining_gpus", "gang_size", "duration_seconds",
        "time_in_force", "node_id", "available_until", "min_cuda", "node__cuda_version",
        "interconnect", "min_reliability", "avoid_node_id", "node__reliability", "command",
        "node__runtime", "node__maintenance_from")


def build_book(market: GpuClass, *, exclude: int | None = None,
                now: datetime | None = None) -> engine.OrderBook:
    """The market's resting orders as an engine book, read from the database."""
    book = engine.OrderBook()
    book.links = interconnect.links_for(market.pk)
    resting = resting_orders(market, now=now).exclude(pk=exclude).order_by("pk")
    # plain tuples, not model instances: this runs on every rebuild (bench/README.md)
    rows = resting.values_list(*ROW)
    rest_buy, rest_sell = book.rest_buy, book.rest_sell  # plain ints: no Bid/Ask per row
    for (pk, side, owner, price, gpus, gang, duration, tif, node, until, need, cuda, link,
         mrel, avoid, rel, command, runtime, cut) in rows:
        if side == Order.Side.BID:
            rest_buy(pk, owner, price, gpus, gang, duration, pk, tif, cuda_key(need),
                     link == "nvlink", rel_key(mrel), avoid or 0, not command, node or 0)
        elif gpus > 0:
            rest_sell(pk, owner, price, gpus, node, epoch(sells_until(until, cut)), pk,
                      cuda_key(cuda or ""), _node_rel(rel), runtime != "process")
    return book


def _restate(book: engine.OrderBook, pk: int, status: str, side: str, owner: int, price: int,
             gpus: int, gang: int | None, duration: int | None, tif: str, node: int | None,
             until: datetime | None, need: str, cuda: str | None,
             link: str = "any", mrel=None, avoid: int | None = None,
             rel=None, command: list | None = None, runtime: str | None = None,
             cut: datetime | None = None) -> None:
    """Make `book` hold order `pk` as the database now has it (resting or not)."""
    book.cancel(pk)
    if status not in Order.ACTIVE or gpus <= 0:
        return
    if side == Order.Side.BID:
        book.rest_bid(engine.Bid(id=pk, owner=owner, price=price, gpus=gpus, gang=gang,
                                 duration_s=duration, seq=pk, tif=tif,
                                 min_cuda=cuda_key(need), nvlink=link == "nvlink",
                                 min_rel=rel_key(mrel), avoid_node=avoid or 0,
                                 image_only=not command, node=node or 0))
    else:
        book.rest_ask(engine.Ask(id=pk, owner=owner, price=price, gpus=gpus, node=node,
                                 available_until=epoch(sells_until(until, cut)), seq=pk,
                                 cuda=cuda_key(cuda or ""), rel=_node_rel(rel),
                                 runs_images=runs_images(runtime)))


@dataclass
class _Cached:
    epoch: UUID
    version: int
    book: engine.OrderBook


class BookCache:
    """Each market's engine book as of a committed book_version, one per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._books: dict[int, _Cached] = {}
        self.stats = {"hit": 0, "caught_up": 0, "rebuilt": 0, "warmed": 0}

    def count(self, how: str) -> None:
        self.stats[how] += 1
        metrics.BOOK_LOADS.labels(how).inc()

    def take(self, market_id: int) -> _Cached | None:
        with self._lock:
            return self._books.pop(market_id, None)

    def put(self, market_id: int, entry: _Cached) -> None:
        with self._lock:
            old = self._books.get(market_id)
            if old is None or old.epoch != entry.epoch or old.version < entry.version:
                self._books[market_id] = entry

    def peek(self, market_id: int) -> _Cached | None:
        with self._lock:
            return self._books.get(market_id)

    def clear(self) -> None:
        with self._lock:
            self._books.clear()


book_cache = BookCache()


def load_book(market: GpuClass, *, exclude: int | None = None,
               now: datetime | None = None) -> engine.OrderBook:
    """The market's resting orders as an engine book (caller holds the market lock, or
    only reads it). With `now`, orders past their expiry are left out even if the
    expiry sweep has not closed them yet.

    In one of book.py's own write transactions the book comes from the process cache
    (docs/MATCHING.md, "The book cache") and goes back to it when the transaction commits; the
    caller must apply the engine's result in the same transaction."""
    w = _writer_for(market.pk)
    if w is None or w.loaded or now is not None:
        return build_book(market, exclude=exclude, now=now)
    w.loaded = True
    cache = book_cache
    entry = cache.take(market.pk)
    base = w.version - 1
    if entry is not None and exclude is not None:
        entry.book.cancel(exclude)  # (an ask getting GPUs back rests there: resubmitted)
    if (entry is not None and entry.epoch == w.epoch and entry.version == base
            and w.rebuild_version <= entry.version):
        book = entry.book  # only this transaction's own changes are missing
        cache.count("hit")
        for pk, o in w.touched.items():
            if pk != exclude:
                _restate(book, pk, o.status, o.side, o.owner_id, o.price, o.remaining_gpus,
                         o.gang_size, o.duration_seconds, o.time_in_force, o.node_id,
                         o.available_until, o.min_cuda,
                         o.node.cuda_version if o.node_id else None, o.interconnect,
                         o.min_reliability, o.avoid_node_id,
                         o.node.reliability if o.node_id else None,
                         o.command, o.node.runtime if o.node_id else None,
                         o.node.maintenance_from if o.node_id else None)
    elif (entry is not None and entry.epoch == w.epoch
          and w.rebuild_version <= entry.version < base):
        book = entry.book  # other processes wrote since: read what they changed
        cache.count("caught_up")
        changed = (Order.objects.filter(market_id=market.pk, book_version__gt=entry.version)
                   .exclude(pk=exclude).values_list("status", *ROW))
        for status, pk, *rest in changed:
            _restate(book, pk, status, *rest)
    else:
        book = build_book(market, exclude=exclude)
        cache.count("rebuilt")
    book.links = interconnect.links_for(market.pk)  # reads the GPUs as they are now
    entry = _Cached(w.epoch, w.version, book)
    transaction.on_commit(lambda: cache.put(market.pk, entry))
    return book


def warm_up(market_ids: list[int] | None = None) -> dict[int, int]:
    """Fill this process's book cache before it serves (the ASGI lifespan's startup):
    each market with resting orders (or `market_ids`) read as of one committed
    book_version, in one snapshot (REPEATABLE READ on PostgreSQL), so the first writer
    finds a hit or catches up instead of rebuilding under the lock. Takes no lock and
    writes nothing. Returns {market id: resting orders loaded}."""
    if market_ids is None:
        market_ids = sorted(set(Order.objects.filter(status__in=Order.ACTIVE)
                                .values_list("market_id", flat=True)))
    loaded: dict[int, int] = {}
    for market_id in market_ids:
        with transaction.atomic():
            connection = transaction.get_connection()
            if connection.vendor == "postgresql":  # (the transaction's first statement)
                with connection.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            market = GpuClass.objects.filter(pk=market_id).first()
            if market is None:
                continue
            book = build_book(market)
        book_cache.put(market_id, _Cached(market.book_epoch, market.book_version, book))
        book_cache.count("warmed")
        loaded[market_id] = len(book)
    return loaded


def resting_orders(market: GpuClass, *, now: datetime | None = None):
    """The market's active orders; with `now`, without those past their expiry."""
    resting = Order.objects.filter(market=market, status__in=Order.ACTIVE)
    if now is not None:
        resting = resting.exclude(Q(expires_at__lte=now) | Q(available_until__lte=now))
    return resting


