"""Continuous auction services: place and cancel bids and asks, matched by the
engine (marketplace/engine) under one matching writer per order book.

The writer lock is the GPU class row, taken with SELECT … FOR UPDATE at the
start of every transaction that reads or changes that book (PostgreSQL row
lock; SQLite serialises writers anyway). Lock order everywhere: market row,
then leases, then ledger accounts. Nothing outside the database is called while
the lock is held; broadcasts and runner pushes go out on commit.

Book cache: rebuilding the engine book from the database on every order costs
O(resting orders), so each process keeps the book of each market between orders,
valid for one version of the market. Taking the lock bumps `GpuClass.book_version`
(the UPDATE that takes the row lock also returns the versions). book.py's own
writers (place_bid, place_ask, cancel_order, expire_orders), when they run as the
outermost transaction, stamp every order they change with that version; every other
holder of the lock (leases, health, auctions, or a book.py call nested in a caller's
transaction) also sets `book_rebuild_version`. Under the lock a cached book of
version c is then (see `_load_book`):
  * used, after applying the orders this transaction changed, when c is the
    version before ours;
  * caught up from the orders stamped after c (one indexed query) when no foreign
    lock holder came after c, i.e. `book_rebuild_version <= c`;
  * rebuilt from the database otherwise (or when the row's epoch differs).
The book is taken out of the cache while a transaction uses it and put back only by
`transaction.on_commit`, so a rolled-back transaction leaves nothing behind: the
next writer rebuilds or catches up. Writers that change orders without taking the
market lock are not allowed (the single-writer rule); the Django admin's order form
is such a writer and must not be used on live books.

Preemption (interruptible bids, DESIGN.md "Interruptible leases"). A bid may be
`interruptible`; its leases copy the flag. When a GTC bid rests with GPUs still wanted
after matching, `_schedule_preemption` (same transaction, under the market lock) looks
for GPUs to free for it. The rule:
  * a victim is an unended (pending, starting or running) interruptible lease of the
    same GPU class, not yet scheduled for preemption, of another buyer, sold from a
    standing ask (a continuous-auction lease);
  * it is outbid when the new bid's limit price is STRICTLY above the limit price of
    the bid the victim was filled from (what its buyer offered, never less than what it
    pays). Whether the new bid is itself interruptible does not matter: an interruptible
    bid preempts interruptible leases bid strictly lower, like any other bid. An equal
    or lower bid preempts nothing, and a non-interruptible lease is never a victim;
  * its GPUs must be useful to the new bid: they go back to the victim's ask, so that
    ask must still stand (or be wholly filled) at a price the bid accepts, of another
    owner (self-trade prevention), with a window that fits the bid's hours counted
    from the deadline; and together with what the ask still offers they must make
    whole gangs of the bid on that node;
  * victims are taken lowest limit price first (then the newest lease first), only
    until the bid's remaining gangs are covered; a victim that does not help complete
    a gang is left alone. Leases already scheduled for the bid (unended, `preempt_at`
    set, `preempted_for` = the bid) cover its gangs first, with what their ask offers:
    a bid only ever gets what it still lacks;
  * a bid that expires by the deadline preempts nothing (it would be called off).
Each victim gets `preempt_at = now + GPUMARKET_PREEMPTION_NOTICE_SECONDS`,
`preempted_for` = the bid, and an event with cause and deadline at once (its buyer
sees it in the lease's events, in the API and on /ws/me/ through the Lease post_save
hook). At the deadline `leases.preempt_due_leases` (beat) ends it `preempted`
through leases.end_lease: the buyer pays the seconds it ran, the GPUs return to the
ask and the normal matching fills the waiting bid — by price-time priority, so a
better resting bid that fits takes them first. If the ask was withdrawn or expired
meanwhile, the freed GPUs simply stay free. If the waiting bid is no longer active at
the deadline (filled elsewhere, cancelled, expired), the preemption is called off
(event recorded; the lease runs on).

Reconsideration. A bid that rests when no lease can be preempted for it must not wait
forever once one can: whenever the market's preemptible leases may have grown,
`reconsider_preemptions` runs at once, in the same transaction under the market lock:
  * a fill made a new interruptible lease (place_bids, right after the bid that made it
    and over the bids placed so far, so a group still equals its bids one by one;
    place_ask);
  * a preemption was called off (leases.preempt_lease);
  * GPUs of an ended lease went back to an ask, or could not because it no longer
    stands (return_gpus_to_ask: the returned GPUs may complete a gang with a lease, the
    matching may have made interruptible leases, or a victim's bid did not get its GPUs
    — the freed GPUs went to a better bid by price-time priority, or stay free).
It takes the resting GTC bids that strictly outbid some candidate victim, highest
price first then oldest, each through the rule above (the leases already scheduled for
a bid counted first); what a bid counts on from an ask is not counted again for the
bids after it in the same pass. It stops when no candidate is left that a remaining bid
outbids. Nothing else can make a lease preemptible or useful to a bid (time only closes
windows and expires bids), so there is no beat sweep: a higher bid never waits for a
sweep interval. The hot path pays nothing for it: a bid whose fills make no
interruptible lease (the common case) never calls it; on the other paths it costs one
query when the market has no candidate, at most four reads when it has.
"""

from __future__ import annotations

import logging
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum
from django.db.models.signals import post_save
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from core.bulk import execute_arrays, insert_all
from marketplace import engine
from marketplace.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from marketplace.leases import clean_ports
from marketplace.models import Fill, GpuClass, Lease, Order
from providers.models import Node
from settlement import services as ledger
from settlement.money import MAX_USD_MICROS, format_usd, lease_cost

log = logging.getLogger("gpumarket.market")

MAX_GPUS = 4096
MAX_DURATION_SECONDS = 366 * 24 * 3600
CLIENT_ORDER_ID = re.compile(r"\A[A-Za-z0-9._:-]{1,64}\Z")
CLIENT_ID_CONSTRAINT = "order_client_id_unique_per_owner"


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
def _tracked(market_id: int):
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
             'WHERE "id" = %s RETURNING *')


def lock_market(market_id: int) -> GpuClass:
    """Take the order book's single-writer lock for the rest of the transaction (the row
    lock of an UPDATE of the GPU class row, which bumps its book_version).

    Called by anyone but book.py's own writers it also marks the in-process book
    caches stale (book_rebuild_version): such a caller may change orders directly."""
    if not transaction.get_connection().in_atomic_block:
        raise TransactionManagementError("lock_market needs a transaction (atomic block)")
    w = getattr(_local, "writer", None)
    tracked = w is not None and w.market_id == market_id and w.version is None
    sql = _LOCK_SQL.format("" if tracked else ', "book_rebuild_version" = "book_version" + 1')
    rows = list(GpuClass.objects.raw(sql, [market_id]))
    if not rows:
        raise GpuClass.DoesNotExist(f"GpuClass {market_id} does not exist")
    market = rows[0]
    if tracked:
        w.version, w.rebuild_version = market.book_version, market.book_rebuild_version
        w.epoch = market.book_epoch
    return market


def _touch(order: Order) -> tuple[str, ...]:
    """Stamp `order` (about to be saved) with this transaction's book version; returns the
    field to add to update_fields."""
    w = _writer_for(order.market_id)
    if w is not None:
        order.book_version = w.version
        if not w.loaded and order.pk is not None:  # (a new order is not in the book yet)
            w.touched[order.pk] = order
    return ("book_version",)


def get_market(slug: str) -> GpuClass:
    try:
        return GpuClass.objects.get(slug=slug)
    except GpuClass.DoesNotExist:
        raise InvalidInput(f"unknown GPU class '{slug}'", field="gpu_class") from None


def bid_hold_amount(*, price: int, gpus: int, duration_seconds: int) -> int:
    """What a bid holds: its whole cost at its limit price (micro-USD)."""
    return lease_cost(price, gpus, duration_seconds)


def checked_hold_amount(*, price: int, gpus: int, duration_seconds: int) -> int:
    """bid_hold_amount, refused (InvalidInput on `price`) when it floors to zero or
    exceeds the largest amount the ledger accepts."""
    amount = bid_hold_amount(price=price, gpus=gpus, duration_seconds=duration_seconds)
    if amount <= 0:
        raise InvalidInput("price × gpus × duration rounds down to 0 micro-USD: raise the "
                           "price or the duration", field="price")
    if amount > MAX_USD_MICROS:
        raise InvalidInput("price × gpus × duration is larger than the largest amount "
                           "accepted", field="price")
    return amount


def _epoch(dt: datetime) -> int:
    return int(dt.timestamp())


def _engine_bid(order: Order) -> engine.Bid:
    return engine.Bid(id=order.pk, owner=order.owner_id, price=order.price,
                      gpus=order.remaining_gpus, gang=order.gang_size,
                      duration_s=order.duration_seconds, seq=order.pk,
                      tif=order.time_in_force)


def _engine_ask(order: Order) -> engine.Ask:
    return engine.Ask(id=order.pk, owner=order.owner_id, price=order.price,
                      gpus=order.remaining_gpus, node=order.node_id,
                      available_until=_epoch(order.available_until), seq=order.pk)


_ROW = ("pk", "side", "owner_id", "price", "remaining_gpus", "gang_size", "duration_seconds",
        "time_in_force", "node_id", "available_until")


def _build_book(market: GpuClass, *, exclude: int | None = None,
                now: datetime | None = None) -> engine.OrderBook:
    """The market's resting orders as an engine book, read from the database."""
    book = engine.OrderBook()
    resting = _resting(market, now=now).exclude(pk=exclude).order_by("pk")
    # plain tuples, not model instances: this runs on every rebuild (bench/README.md)
    rows = resting.values_list(*_ROW)
    rest_bid, rest_ask, Bid, Ask = book.rest_bid, book.rest_ask, engine.Bid, engine.Ask
    for pk, side, owner, price, gpus, gang, duration, tif, node, until in rows:
        if side == Order.Side.BID:
            rest_bid(Bid(id=pk, owner=owner, price=price, gpus=gpus, gang=gang,
                         duration_s=duration, seq=pk, tif=tif))
        elif gpus > 0:
            rest_ask(Ask(id=pk, owner=owner, price=price, gpus=gpus, node=node,
                         available_until=_epoch(until), seq=pk))
    return book


def _restate(book: engine.OrderBook, pk: int, status: str, side: str, owner: int, price: int,
             gpus: int, gang: int | None, duration: int | None, tif: str, node: int | None,
             until: datetime | None) -> None:
    """Make `book` hold order `pk` as the database now has it (resting or not)."""
    book.cancel(pk)
    if status not in Order.ACTIVE or gpus <= 0:
        return
    if side == Order.Side.BID:
        book.rest_bid(engine.Bid(id=pk, owner=owner, price=price, gpus=gpus, gang=gang,
                                 duration_s=duration, seq=pk, tif=tif))
    else:
        book.rest_ask(engine.Ask(id=pk, owner=owner, price=price, gpus=gpus, node=node,
                                 available_until=_epoch(until), seq=pk))


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
        self.stats = {"hit": 0, "caught_up": 0, "rebuilt": 0}

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


def _load_book(market: GpuClass, *, exclude: int | None = None,
               now: datetime | None = None) -> engine.OrderBook:
    """The market's resting orders as an engine book (caller holds the market lock, or
    only reads it). With `now`, orders past their expiry are left out even if the
    expiry sweep has not closed them yet.

    In one of book.py's own write transactions the book comes from the process cache
    (see the module docstring) and goes back to it when the transaction commits; the
    caller must apply the engine's result in the same transaction."""
    w = _writer_for(market.pk)
    if w is None or w.loaded or now is not None:
        return _build_book(market, exclude=exclude, now=now)
    w.loaded = True
    cache = book_cache
    entry = cache.take(market.pk)
    base = w.version - 1
    if (entry is not None and entry.epoch == w.epoch and entry.version == base
            and w.rebuild_version <= entry.version):
        book = entry.book  # only this transaction's own changes are missing
        cache.stats["hit"] += 1
        for pk, o in w.touched.items():
            if pk != exclude:
                _restate(book, pk, o.status, o.side, o.owner_id, o.price, o.remaining_gpus,
                         o.gang_size, o.duration_seconds, o.time_in_force, o.node_id,
                         o.available_until)
    elif (entry is not None and entry.epoch == w.epoch
          and w.rebuild_version <= entry.version < base):
        book = entry.book  # other processes wrote since: read what they changed
        cache.stats["caught_up"] += 1
        changed = (Order.objects.filter(market_id=market.pk, book_version__gt=entry.version)
                   .exclude(pk=exclude).values_list("status", *_ROW))
        for status, pk, *rest in changed:
            _restate(book, pk, status, *rest)
    else:
        book = _build_book(market, exclude=exclude)
        cache.stats["rebuilt"] += 1
    entry = _Cached(w.epoch, w.version, book)
    transaction.on_commit(lambda: cache.put(market.pk, entry))
    return book


def _resting(market: GpuClass, *, now: datetime | None = None):
    """The market's active orders; with `now`, without those past their expiry."""
    resting = Order.objects.filter(market=market, status__in=Order.ACTIVE)
    if now is not None:
        resting = resting.exclude(Q(expires_at__lte=now) | Q(available_until__lte=now))
    return resting


@dataclass(frozen=True)
class Placed:
    """The order placed and the leases its matching made. `created` is False when a
    `client_order_id` was already used: `order` is then the first order with that id and
    `leases` every lease made from its fills so far."""

    order: Order
    leases: list[Lease]
    created: bool = True


def _check_client_order_id(client_order_id: str | None) -> None:
    if client_order_id is not None and not CLIENT_ORDER_ID.fullmatch(client_order_id):
        raise InvalidInput("must be 1 to 64 characters of A–Z, a–z, 0–9, '.', '_', ':' or '-'",
                           field="client_order_id")


def _replay(owner_id: int, client_order_id: str | None,
            terms: dict[str, Any]) -> Placed | None:
    """The first order of `owner_id` with `client_order_id`, as a Placed, or None.

    A replay must repeat the first order's `terms` (its field values, by Order attribute;
    `market` by slug): one that differs is a client reusing an id by mistake, refused with
    Conflict naming client_order_id and the first differing field (Stripe's rule for
    idempotency keys, "Idempotent requests": the same key with other parameters is an
    error), so it never believes a different order was placed."""
    if client_order_id is None:
        return None
    order = (Order.objects.select_related("market")
             .filter(owner_id=owner_id, client_order_id=client_order_id).first())
    if order is None:
        return None
    for name, wanted in terms.items():
        have = order.market.slug if name == "market" else getattr(order, name)
        if have != wanted:
            raise Conflict(f"'{client_order_id}' was used for order {order.pk} with another "
                           f"{name.removesuffix('_id')}: a replay must repeat its terms",
                           field="client_order_id")
    leases = list(Lease.objects.filter(Q(fill__bid=order) | Q(fill__ask=order)).order_by("pk"))
    return Placed(order=order, leases=leases, created=False)


def _is_client_id_clash(exc: IntegrityError) -> bool:
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == CLIENT_ID_CONSTRAINT
    return "client_order_id" in str(exc)  # SQLite names the columns instead


def _past_due(now: datetime) -> Q:
    """Active orders past their time: a bid's expires_at, an ask's available_until (as
    written, the partial indexes order_active_expiry / order_active_window serve it)."""
    return Q(expires_at__lte=now) | Q(side=Order.Side.ASK, available_until__lte=now)


def _expire_due(market: GpuClass, now: datetime) -> list[int]:
    """Expire the market's active orders past their time: bids past `expires_at` (hold
    released), asks past `available_until`. The caller holds the market lock."""
    due = (Order.objects.filter(market=market, status__in=Order.ACTIVE)
           .filter(_past_due(now)).order_by("pk"))
    expired = []
    for order in due:
        if order.side == Order.Side.BID:
            cause = f"expires_at {order.expires_at.isoformat()} passed"
        else:
            cause = f"available_until {order.available_until.isoformat()} passed"
        _close_order(order, "expired", cause, now)
        if order.side == Order.Side.BID:
            _call_off_preemptions(order, now)
        expired.append(order.pk)
    return expired


def expire_orders(*, now: datetime | None = None) -> list[int]:
    """Expire every active order past its expires_at (bids) or available_until (asks),
    one market at a time under its lock; returns the ids expired. Safe to run
    concurrently and again: an order already expired is no longer active."""
    now = now or timezone.now()
    market_ids = sorted(set(
        Order.objects.filter(status__in=Order.ACTIVE)
        .filter(_past_due(now))
        .values_list("market_id", flat=True)))
    expired: list[int] = []
    for market_id in market_ids:
        with _tracked(market_id), transaction.atomic():
            expired += _expire_due(lock_market(market_id), now)
    if expired:
        log.info("expired orders %s", expired)
    return expired


def free_gpu_count(node: Node, market: GpuClass) -> int:
    """Healthy GPUs of `market`'s class on `node` that no active lease, standing ask or
    open auction already covers (an unhealthy GPU is never offered)."""
    free = (node.gpus.filter(gpu_class=market, healthy=True)
            .exclude(lease_gpus__active=True).count())
    offered = sum(Order.objects.filter(node=node, market=market, side=Order.Side.ASK,
                                       status__in=Order.ACTIVE)
                  .values_list("remaining_gpus", flat=True))
    auctioned = sum(node.auctions.filter(status="open", market=market)
                    .values_list("gpus", flat=True))
    return max(free - offered - auctioned, 0)


def _check_common(*, price: int, gpus: int) -> None:
    if price <= 0:
        raise InvalidInput("must be greater than zero", field="price")
    if not 0 < gpus <= MAX_GPUS:
        raise InvalidInput(f"must be between 1 and {MAX_GPUS}", field="gpus")


@dataclass(frozen=True)
class BidRequest:
    """One bid for place_bids: the keyword arguments of place_bid (same units)."""

    buyer_id: int
    market_slug: str
    price: int
    gpus: int
    duration_seconds: int
    gang_size: int | None = None
    time_in_force: str = "GTC"
    image: str = ""
    command: list[str] | None = None
    expires_at: datetime | None = None
    client_order_id: str | None = None
    interruptible: bool = False
    ports: list[int] | None = None


def place_bid(*, buyer_id: int, market_slug: str, price: int, gpus: int,
              duration_seconds: int, gang_size: int | None = None,
              time_in_force: str = "GTC", image: str = "", command: list[str] | None = None,
              expires_at: datetime | None = None, client_order_id: str | None = None,
              interruptible: bool = False, ports: list[int] | None = None,
              now: datetime | None = None) -> Placed:
    """Place a bid: hold its cost, match it, rest what is left (GTC) until cancelled,
    filled or `expires_at`. A resting bid schedules the preemption of interruptible
    leases it outbids (module docstring, "Preemption").

    price: micro-USD per GPU-hour; gpus: GPUs wanted; duration_seconds: lease length;
    gang_size: GPUs per node (default all on one node); client_order_id: the buyer's own
    id, unique per buyer — placing it again returns the first order (created=False) and
    writes nothing; placing it again with other terms is a Conflict (see _replay).
    interruptible: the leases it makes may be preempted by a higher bid.
    ports: container ports (TCP) its leases expose to the buyer (leases.clean_ports).
    Raises InvalidInput naming the field, and
    settlement.InsufficientFunds when the hold cannot be placed; in every refusal nothing
    is written.
    """
    result = place_bids([BidRequest(
        buyer_id=buyer_id, market_slug=market_slug, price=price, gpus=gpus,
        duration_seconds=duration_seconds, gang_size=gang_size, time_in_force=time_in_force,
        image=image, command=command, expires_at=expires_at, client_order_id=client_order_id,
        interruptible=interruptible, ports=ports)], now=now)[0]
    if isinstance(result, Exception):
        raise result
    return result


def place_bids(requests: list[BidRequest], *,
               now: datetime | None = None) -> list[Placed | Exception]:
    """Place several bids, each exactly as place_bid would, as if one after the other in
    the order given — but with one transaction, one market lock and a fixed number of
    statements per market for all of them (group commit: the API's order endpoint gathers
    concurrent bids into one call, marketplace/api/bid_batcher.py).

    Returns, per request, its Placed or the exception refusing it (InvalidInput,
    InsufficientFunds, …): a refused bid writes nothing and does not affect the others.
    An unexpected error while writing a group of several bids makes each of them run
    again alone, so that error belongs to the bid that causes it only. A client_order_id
    that appears twice in one call (same buyer) is placed once; the second answers as a
    replay of the first.
    """
    now = now or timezone.now()
    results: list[Placed | Exception | None] = [None] * len(requests)
    markets: dict[str, GpuClass] = {}
    groups: dict[int, list[tuple[int, BidRequest, int]]] = {}
    seen_ids: set[tuple[int, str]] = set()
    again: list[int] = []  # a client_order_id repeated within this call
    for i, r in enumerate(requests):
        try:
            _check_client_order_id(r.client_order_id)
            replayed = _replay(r.buyer_id, r.client_order_id, _bid_terms(r))
            if replayed is not None:
                results[i] = replayed
                continue
            if r.client_order_id is not None:
                if (r.buyer_id, r.client_order_id) in seen_ids:
                    again.append(i)
                    continue
                seen_ids.add((r.buyer_id, r.client_order_id))
            market = markets.get(r.market_slug) or get_market(r.market_slug)
            markets[r.market_slug] = market
            hold_amount = _check_bid(r, now)
        except Exception as exc:  # each refusal is that bid's answer
            results[i] = exc
            continue
        groups.setdefault(market.pk, []).append((i, r, hold_amount))
    for market_id, items in groups.items():
        for (i, _, _), result in zip(items, _place_group(market_id, items, now), strict=True):
            results[i] = result
    if again:
        for i, result in zip(again, place_bids([requests[i] for i in again], now=now),
                             strict=True):
            results[i] = result
    return results  # type: ignore[return-value]  (every slot is filled)


def _bid_terms(r: BidRequest) -> dict[str, Any]:
    """What a replay of bid `r` must repeat (see _replay)."""
    return {"side": Order.Side.BID, "market": r.market_slug, "price": r.price,
            "gpus": r.gpus, "duration_seconds": r.duration_seconds,
            "gang_size": r.gpus if r.gang_size is None else r.gang_size,
            "time_in_force": r.time_in_force, "image": r.image, "command": r.command,
            "expires_at": r.expires_at, "interruptible": bool(r.interruptible),
            "ports": sorted(r.ports or [])}


def _check_bid(r: BidRequest, now: datetime) -> int:
    """The checks of place_bid that need no lock; returns the hold amount (micro-USD)."""
    gang_size = r.gpus if r.gang_size is None else r.gang_size
    _check_common(price=r.price, gpus=r.gpus)
    if not 0 < r.duration_seconds <= MAX_DURATION_SECONDS:
        raise InvalidInput("must be between 1 second and 366 days", field="hours")
    if gang_size <= 0 or r.gpus % gang_size:
        raise InvalidInput(f"must divide gpus ({r.gpus})", field="gang_size")
    if r.time_in_force not in Order.TimeInForce.values:
        raise InvalidInput("must be GTC, IOC or FOK", field="time_in_force")
    if r.expires_at is not None and r.expires_at <= now:
        raise InvalidInput("must be in the future", field="expires_at")
    clean_ports(r.ports)
    return checked_hold_amount(price=r.price, gpus=r.gpus, duration_seconds=r.duration_seconds)


def _place_group(market_id: int, items: list[tuple[int, BidRequest, int]],
                 now: datetime) -> list[Placed | Exception]:
    """One market's bids in one transaction; alone again when the group fails."""
    try:
        with _tracked(market_id), transaction.atomic():
            return _write_bids(market_id, [(r, amount) for _, r, amount in items], now)
    except _Regroup:
        return [_place_group(market_id, [item], now)[0] for item in items]
    except Exception as exc:
        if len(items) > 1:
            log.warning("a group of %d bids failed (%r); placing them one by one",
                        len(items), exc)
            return [_place_group(market_id, [item], now)[0] for item in items]
        r = items[0][1]
        # the same client_order_id raced in from another request (possibly another
        # market): that one committed first and stands
        if isinstance(exc, IntegrityError) and _is_client_id_clash(exc):
            try:
                replayed = _replay(r.buyer_id, r.client_order_id, _bid_terms(r))
            except Conflict as conflict:
                return [conflict]
            if replayed is not None:
                return [replayed]
        return [exc]


def _write_bids(market_id: int, items: list[tuple[BidRequest, int]],
                now: datetime) -> list[Placed | Exception]:
    """Under the market lock: insert the orders, hold their cost (one statement each for
    all of them), then match them one by one in the given order."""
    from settlement.models import Hold

    market = lock_market(market_id)
    anything_due, victims_possible = _group_flags(market.pk, now)
    if anything_due:
        _expire_due(market, now)
        victims_possible = _preemption_candidates_exist(market)
    book = _load_book(market)  # before the new orders exist: each is submitted below
    orders = []
    for r, _ in items:
        order = Order(
            market=market, owner_id=r.buyer_id, side=Order.Side.BID, price=r.price,
            gpus=r.gpus, remaining_gpus=r.gpus, duration_seconds=r.duration_seconds,
            gang_size=r.gpus if r.gang_size is None else r.gang_size,
            time_in_force=r.time_in_force, image=r.image, command=r.command,
            expires_at=r.expires_at, client_order_id=r.client_order_id or "",
            interruptible=bool(r.interruptible), ports=clean_ports(r.ports))
        _touch(order)
        orders.append(order)
    orders = insert_all(orders)
    holds = ledger.holds_place_many([(o.owner_id, amount, f"order:{o.pk}")
                                     for o, (_, amount) in zip(orders, items, strict=True)])
    refused = [o.pk for o, h in zip(orders, holds, strict=True) if not isinstance(h, Hold)]
    if refused:
        Order.objects.filter(pk__in=refused).delete()
    placed = [o for o, h in zip(orders, holds, strict=True) if isinstance(h, Hold)]
    for order, hold in zip(placed, [h for h in holds if isinstance(h, Hold)], strict=True):
        order.hold_id = hold.pk
    if placed:
        _set_hold_ids(placed)
        order_events = [order.events.model(order=o, from_status="", to_status="open", at=now,
                                           cause="bid placed") for o in placed]
        insert_all(order_events)
    leases_of: dict[int, list[Lease]] = {}
    for order in placed:
        result = book.submit_bid(_engine_bid(order), _epoch(now))
        leases: list[Lease] = []
        if result.fills or result.killed or result.self_trade_cancels or not result.rested:
            leases = _apply(market, order, result, now)
            victims_possible = victims_possible or any(x.interruptible for x in leases)
        if any(x.interruptible for x in leases):
            reconsider_preemptions(market.pk, now, through_bid=order.pk)  # `order` too
        elif victims_possible and order.status in Order.ACTIVE and order.remaining_gpus > 0:
            _schedule_preemption(market, order, now)
        leases_of[order.pk] = leases
    # A hold is refused before any bid is matched, but one by one, an earlier bid of the
    # same buyer that filled (its hold moved to the lease at the trade price, never more)
    # or was cancelled would have given money back first: then place them one by one.
    released = {o.owner_id for o in placed if o.status != "open"}
    if any(o.owner_id in released for o, h in zip(orders, holds, strict=True)
           if not isinstance(h, Hold)):
        raise _Regroup
    using = Order.objects.db
    for order in placed:
        post_save.send(sender=Order, instance=order, created=True, raw=False, using=using,
                       update_fields=None)
    return [Placed(order=o, leases=leases_of[o.pk]) if isinstance(h, Hold) else h
            for o, h in zip(orders, holds, strict=True)]


class _Regroup(Exception):
    """Roll the group back and place its bids one by one (see _write_bids)."""


def _set_hold_ids(orders: list[Order]) -> None:
    """Save each order's hold_id, in one UPDATE (arrays on PostgreSQL: Django's
    bulk_update builds an expression object per row, which dominated a group's cost)."""
    connection = transaction.get_connection()
    if connection.vendor != "postgresql":
        Order.objects.bulk_update(orders, ["hold_id"])
        return
    execute_arrays(connection,
                   'UPDATE "marketplace_order" SET "hold_id" = h.hold_id FROM '
                   'unnest(%s::bigint[], %s::bigint[]) AS h(id, hold_id) '
                   'WHERE "marketplace_order"."id" = h.id',
                   [[o.pk for o in orders], [o.hold_id for o in orders]])


def _group_flags(market_id: int, now: datetime) -> tuple[bool, bool]:
    """(any active order of the market past its time, any lease of it preemptible at all)
    in one round trip: the two questions every group of bids asks under the lock, almost
    always answered no (then _expire_due's and the preemption search's ORM queries are
    skipped). The same conditions as _past_due and _preemption_candidates_exist."""
    orders, leases = Order._meta.db_table, Lease._meta.db_table
    # the states and the side are written into the statement, not bound, so that the
    # planner sees the partial indexes' predicates (also in a generic plan)
    active = ", ".join(f"'{v}'" for v in Order.ACTIVE)
    unended = ", ".join(f"'{v}'" for v in Lease.ACTIVE)
    sql = (f'SELECT EXISTS (SELECT 1 FROM "{orders}" WHERE "market_id" = %s '  # noqa: S608
           f'AND "status" IN ({active}) AND ("expires_at" <= %s '
           f"OR (\"side\" = '{Order.Side.ASK}' AND \"available_until\" <= %s))), "
           f'EXISTS (SELECT 1 FROM "{leases}" WHERE "market_id" = %s AND "interruptible" '
           f'AND "status" IN ({unended}) AND "preempt_at" IS NULL AND "ask_id" IS NOT NULL)')
    params = [market_id, now, now, market_id]
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(sql, params)
        due, preemptible = cursor.fetchone()
    return bool(due), bool(preemptible)


def _preemption_candidates_exist(market: GpuClass) -> bool:
    """Whether any lease of `market` could be preempted at all (one cheap query, so that a
    group of bids skips _schedule_preemption's per-bid search when none can)."""
    return Lease.objects.filter(market=market, interruptible=True, status__in=Lease.ACTIVE,
                                preempt_at__isnull=True, ask__isnull=False).exists()


def place_ask(*, provider_id: int, node_id: int, market_slug: str | None, price: int,
              gpus: int, available_until: datetime, client_order_id: str | None = None,
              now: datetime | None = None) -> Placed:
    """Offer `gpus` GPUs of a node at `price` micro-USD per GPU-hour until
    `available_until` (then it expires), matching resting bids at their prices.

    client_order_id: as for place_bid. Raises NotFound/PermissionDenied for a node that
    is not the provider's, and InvalidInput naming the field for more GPUs than are free
    or a past window.
    """
    now = now or timezone.now()
    _check_client_order_id(client_order_id)
    terms = {"side": Order.Side.ASK, "node_id": node_id, "price": price, "gpus": gpus,
             "available_until": available_until}
    if market_slug is not None:  # (None: the node's only class)
        terms["market"] = market_slug
    replayed = _replay(provider_id, client_order_id, terms)
    if replayed is not None:
        return replayed
    try:
        node = Node.objects.select_related("provider").get(pk=node_id)
    except Node.DoesNotExist:
        raise NotFound(f"no node {node_id}", field="node") from None
    if node.provider.user_id != provider_id:
        raise PermissionDenied("that node is not yours", field="node")
    classes = list(node.gpus.order_by().values_list("gpu_class__slug", flat=True).distinct())
    if not classes:
        raise Conflict("this node has no registered GPUs yet: run gpumarket-runner register",
                       field="node")
    if market_slug is None:
        if len(classes) > 1:
            raise InvalidInput("this node has several GPU classes: name one", field="gpu_class")
        market_slug = classes[0]
    elif market_slug not in classes:
        raise InvalidInput(f"node {node.name} has no {market_slug} GPUs", field="gpu_class")
    market = get_market(market_slug)
    _check_common(price=price, gpus=gpus)
    if available_until <= now:
        raise InvalidInput("must be in the future", field="available_until")
    try:
        with _tracked(market.pk), transaction.atomic():
            market = lock_market(market.pk)
            _expire_due(market, now)
            free = free_gpu_count(node, market)
            if gpus > free:
                raise InvalidInput(f"only {free} GPUs of node {node.name} are free to offer",
                                   field="gpus")
            order = Order(
                market=market, owner_id=provider_id, side=Order.Side.ASK, price=price,
                gpus=gpus, remaining_gpus=gpus, node=node, available_until=available_until,
                client_order_id=client_order_id or "",
            )
            _touch(order)
            order.save(force_insert=True)
            order.events.create(from_status="", to_status="open", at=now, cause="ask placed")
            book = _load_book(market, exclude=order.pk)
            result = book.submit_ask(_engine_ask(order), _epoch(now))
            leases = _apply(market, order, result, now)
            if any(x.interruptible for x in leases):
                reconsider_preemptions(market.pk, now)
    except IntegrityError as exc:
        replayed = (_replay(provider_id, client_order_id, terms) if _is_client_id_clash(exc)
                    else None)
        if replayed is None:
            raise
        return replayed
    return Placed(order=order, leases=leases)


def cancel_order(*, user_id: int, order_id: int, cause: str = "cancelled by its owner",
                 now: datetime | None = None) -> Order:
    """Cancel an open or partially filled order of `user_id`, releasing a bid's hold and
    calling off at once the preemptions scheduled for it. An ask whose GPUs are all
    leased (`filled`, window still open) can be withdrawn too: its leases run on, and
    their GPUs no longer come back to the market when they end.
    Raises NotFound (also for another user's order) or Conflict when already closed."""
    order = Order.objects.filter(pk=order_id, owner_id=user_id).first()
    if order is None:
        raise NotFound(f"no order {order_id} of yours", field="order")
    now = now or timezone.now()
    with _tracked(order.market_id), transaction.atomic():
        lock_market(order.market_id)
        order = Order.objects.get(pk=order_id)
        standing_ask = (order.side == Order.Side.ASK and order.status == "filled"
                        and order.available_until > now)
        if order.status not in Order.ACTIVE and not standing_ask:
            raise Conflict(f"order {order_id} is already {order.status}")
        if standing_ask:
            cause = f"{cause}: its leased GPUs stay off the market when their leases end"
        _close_order(order, "cancelled", cause, now)
        if order.side == Order.Side.BID:
            _call_off_preemptions(order, now)
    return order


def _call_off_preemptions(bid: Order, now: datetime) -> None:
    """The leases scheduled to be preempted for `bid` (no longer active) run on; they may
    be another resting bid's now (reconsider_preemptions). Caller holds the market lock."""
    victims = list(Lease.objects.select_for_update()
                   .filter(preempted_for=bid, preempt_at__isnull=False,
                           status__in=Lease.ACTIVE))
    for lease in victims:
        lease.preempt_at = None
        lease.save(update_fields=["preempt_at"])
        lease.events.create(from_status=lease.status, to_status=lease.status, at=now,
                            cause=f"preemption called off: the bid it was for is {bid.status}")
    if victims:
        log.info("bid %s %s: preemption of leases %s called off", bid.pk, bid.status,
                 [lease.pk for lease in victims])
        reconsider_preemptions(bid.market_id, now)


def _close_order(order: Order, status: str, cause: str, now: datetime) -> None:
    order.set_status(status, cause=cause, at=now, update_fields=_touch(order))
    if order.side == Order.Side.BID and order.hold_id:
        ledger.hold_release(hold_id=order.hold_id, cause=f"order {order.pk} {status}")


def _apply(market: GpuClass, incoming: Order, result: engine.MatchResult,
           now: datetime) -> list[Lease]:
    """Write the engine's result: fills → leases, order states, holds."""
    from marketplace.leases import lease_from_fill

    if result.killed:
        _close_order(incoming, "cancelled", "FOK: could not fill whole", now)
        return []
    for order_id in result.self_trade_cancels:
        resting = Order.objects.get(pk=order_id)
        _close_order(resting, "cancelled", f"self-trade prevention against order {incoming.pk}",
                     now)
    leases = []
    touched: dict[int, Order] = {incoming.pk: incoming}
    for f in result.fills:
        bid = touched.get(f.bid_id) or Order.objects.get(pk=f.bid_id)
        ask = touched.get(f.ask_id) or Order.objects.get(pk=f.ask_id)
        touched[bid.pk], touched[ask.pk] = bid, ask
        fill = Fill.objects.create(market=market, bid=bid, ask=ask, gpus=f.gpus, price=f.price)
        # Move the filled part of the bid's hold onto the lease: release it at the bid's
        # limit, then hold the lease's cost at the trade price (never more).
        released = bid_hold_amount(price=bid.price, gpus=f.gpus,
                                   duration_seconds=bid.duration_seconds)
        ledger.hold_reduce(hold_id=bid.hold_id,
                           to_amount=_hold_amount(bid.hold_id) - released,
                           cause=f"fill {fill.pk}")
        leases.append(lease_from_fill(fill=fill, bid=bid, ask=ask, now=now))
        for order in (bid, ask):
            order.remaining_gpus -= f.gpus
            status = "filled" if order.remaining_gpus == 0 else "partially_filled"
            order.set_status(status, cause=f"fill {fill.pk}: {f.gpus} GPUs at "
                             f"{format_usd(f.price)} USD/GPU-hour",
                             at=now, update_fields=("remaining_gpus", *_touch(order)))
        if bid.remaining_gpus == 0:
            ledger.hold_release(hold_id=bid.hold_id, cause=f"order {bid.pk} filled")
        log.info("fill %s: bid %s × ask %s, %s GPUs at %s", fill.pk, bid.pk, ask.pk,
                 f.gpus, f.price)
    if incoming.status in Order.ACTIVE and not result.rested:
        _close_order(incoming, "cancelled", f"{incoming.time_in_force}: remainder not rested",
                     now)
    return leases


def _hold_amount(hold_id: int) -> int:
    from settlement.models import Hold

    return Hold.objects.get(pk=hold_id).amount


def return_gpus_to_ask(*, ask_id: int, gpus: int, now: datetime) -> list[Lease]:
    """GPUs of an ended lease go back to the ask they were sold from, if it still stands
    and its window is still open; the ask then matches resting bids again. The caller
    holds the market lock.

    Price: the ask has stood since it was placed, so the earlier of the two orders sets
    the price, as for any resting order: a bid placed after the ask (for instance the
    bid that preempted an interruptible lease) trades at the ask's price, a bid that was
    resting before the ask at its own.

    Either way the market's preemptible leases are then offered to the resting bids
    again (reconsider_preemptions): the GPUs back on the ask may complete a gang with
    them, the matching may have made new interruptible leases, or the ended lease was
    a victim whose bid did not get its GPUs."""
    ask = Order.objects.get(pk=ask_id)
    if ask.status not in (*Order.ACTIVE, "filled") or ask.available_until <= now:
        reconsider_preemptions(ask.market_id, now)
        return []
    market = ask.market
    _expire_due(market, now)  # an expired resting bid must not take the returned GPUs
    ask.remaining_gpus += gpus
    ask.set_status("partially_filled", cause=f"{gpus} GPUs returned from an ended lease",
                   at=now, update_fields=("remaining_gpus", *_touch(ask)))
    book = _load_book(market, exclude=ask.pk)
    result = book.submit_ask(_engine_ask(ask), _epoch(now))
    result.fills[:] = [f if f.bid_id < ask.pk else replace(f, price=ask.price)
                       for f in result.fills]
    leases = _apply(market, ask, result, now)
    reconsider_preemptions(market.pk, now)
    return leases


def _schedule_preemption(market: GpuClass, bid: Order, now: datetime) -> list[Lease]:
    """Schedule the preemption of the interruptible leases that `bid` (resting, GPUs
    still wanted) outbids, as few as cover its remaining gangs (module docstring,
    "Preemption"). The caller holds the market lock. Returns the leases scheduled."""
    gang = bid.gang_size or bid.remaining_gpus
    if bid.remaining_gpus // gang <= 0:
        return []
    deadline = now + timedelta(seconds=settings.GPUMARKET_PREEMPTION_NOTICE_SECONDS)
    if not _outlives(bid, deadline):
        return []
    candidates = list(
        _preemptible(market.pk).filter(fill__bid__price__lt=bid.price)
        .exclude(buyer_id=bid.owner_id)
        .order_by("fill__bid__price", "-pk"))
    if not candidates:
        return []
    asks = {a.pk: a for a in Order.objects.filter(pk__in={c.ask_id for c in candidates})}
    chosen = _choose_victims(bid, candidates, asks, _offers(asks), [], deadline)
    _mark_preempted(bid, chosen, now, deadline)
    return chosen


def reconsider_preemptions(market_id: int, now: datetime, *,
                           through_bid: int | None = None) -> list[Lease]:
    """Offer the market's preemptible leases (module docstring, "Preemption") to the
    resting bids again, after the set may have grown: a new interruptible lease from a
    fill, a preemption called off, GPUs back on an ask. The caller holds the market lock.

    Resting GTC bids that strictly outbid some candidate go highest price first, then
    oldest, each through the rule of _schedule_preemption, counting first the leases
    already scheduled for it (it gets only what it still lacks) and what the bids
    before it in this pass counted on from each ask. Stops when no candidate is left
    that a remaining bid outbids. Returns the leases scheduled. Running it again
    without a change in between schedules nothing.

    through_bid: only bids up to this id (place_bids: the group's later bids are
    written, with higher ids, but not placed yet)."""
    candidates = list(_preemptible(market_id).annotate(bid_price=F("fill__bid__price"))
                      .order_by("fill__bid__price", "-pk"))
    if not candidates:
        return []
    bids = list(Order.objects.filter(
        market_id=market_id, side=Order.Side.BID, status__in=Order.ACTIVE,
        time_in_force=Order.TimeInForce.GTC, remaining_gpus__gt=0,
        price__gt=candidates[0].bid_price)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .filter(Q() if through_bid is None else Q(pk__lte=through_bid))
        .order_by("-price", "pk"))
    if not bids:
        return []
    scheduled: dict[int, list[Lease]] = {}
    for lease in (Lease.objects.filter(market_id=market_id, status__in=Lease.ACTIVE,
                                       preempt_at__isnull=False,
                                       preempted_for__price__gt=candidates[0].bid_price)
                  .order_by("pk")):
        scheduled.setdefault(lease.preempted_for_id, []).append(lease)
    ask_ids = {c.ask_id for c in candidates}
    ask_ids.update(lease.ask_id for leases in scheduled.values() for lease in leases)
    asks = {a.pk: a for a in Order.objects.filter(pk__in=ask_ids)}
    offers = _offers(asks)
    deadline = now + timedelta(seconds=settings.GPUMARKET_PREEMPTION_NOTICE_SECONDS)
    done: list[Lease] = []
    for bid in bids:
        if not candidates or candidates[0].bid_price >= bid.price:
            break  # lowest first: no later (lower) bid outbids what is left
        outbid = [c for c in candidates if c.bid_price < bid.price and c.buyer_id != bid.owner_id]
        chosen = _choose_victims(bid, outbid, asks, offers, scheduled.get(bid.pk, []), deadline)
        if chosen:
            _mark_preempted(bid, chosen, now, deadline)
            taken = {lease.pk for lease in chosen}
            candidates = [c for c in candidates if c.pk not in taken]
            done += chosen
    return done


def _preemptible(market_id: int):
    """The market's candidate victims, locked: unended interruptible leases of a fill from
    a standing ask, not yet scheduled for preemption."""
    return (Lease.objects.select_for_update(of=("self",))
            .filter(market_id=market_id, interruptible=True, status__in=Lease.ACTIVE,
                    preempt_at__isnull=True, ask__isnull=False, fill__isnull=False))


def _outlives(bid: Order, deadline: datetime) -> bool:
    """Whether `bid` is still active at `deadline` unless filled or cancelled (a bid that
    expires by then would see its preemption called off: it preempts nothing)."""
    return bid.expires_at is None or bid.expires_at > deadline


def _offers(asks: dict[int, Order]) -> dict[int, int]:
    """What each ask offers now (free GPUs: its remaining ones while it stands)."""
    return {pk: (a.remaining_gpus if a.status in Order.ACTIVE else 0) for pk, a in asks.items()}


def _choose_victims(bid: Order, candidates: list[Lease], asks: dict[int, Order],
                    offers: dict[int, int], scheduled: list[Lease],
                    deadline: datetime) -> list[Lease]:
    """The rule of the module docstring ("Preemption") for one bid: the leases to
    preempt for it at `deadline`.

    candidates: unscheduled leases it outbids, of other buyers, lowest bid price first
    then newest; asks: by id, every ask of the candidates and of `scheduled`; offers: per
    ask, the GPUs it will offer besides this bid's victims (what it offers now, less what
    higher bids counted on) — updated to what is left for the bids after this one;
    scheduled: the unended leases already scheduled for this bid, whose GPUs (with what
    their ask offers) cover its gangs first."""
    gang = bid.gang_size or bid.remaining_gpus
    need = bid.remaining_gpus // gang
    hours = timedelta(seconds=bid.duration_seconds)

    def usable(ask: Order, at: datetime) -> bool:
        return (ask.status in (*Order.ACTIVE, "filled") and ask.price <= bid.price
                and ask.owner_id != bid.owner_id and ask.available_until >= at + hours)

    offered: dict[int, int] = {}
    mine: dict[int, list[Lease]] = {}
    for lease in scheduled:
        mine.setdefault(lease.ask_id, []).append(lease)
    for ask_id, leases in sorted(mine.items()):  # GPUs already on their way to this bid
        if not usable(asks[ask_id], max(lease.preempt_at for lease in leases)):
            continue  # they will not reach it
        offered[ask_id] = offers.get(ask_id, 0) + sum(lease.gpu_count for lease in leases)
        gangs = min(offered[ask_id] // gang, need)
        need -= gangs
        offered[ask_id] -= gangs * gang
    chosen: list[Lease] = []
    waiting: dict[int, list[Lease]] = {}  # per ask: victims not yet making a whole gang
    if need and _outlives(bid, deadline):
        for lease in candidates:
            if need == 0:
                break
            if not usable(asks[lease.ask_id], deadline):
                continue
            offered[lease.ask_id] = (offered.get(lease.ask_id, offers.get(lease.ask_id, 0))
                                     + lease.gpu_count)
            waiting.setdefault(lease.ask_id, []).append(lease)
            gangs = min(offered[lease.ask_id] // gang, need)
            if gangs:
                group = waiting.pop(lease.ask_id)
                for earlier in reversed(group[:-1]):  # spare a cheaper one that is not needed
                    if offered[lease.ask_id] - earlier.gpu_count >= gangs * gang:
                        offered[lease.ask_id] -= earlier.gpu_count
                        group.remove(earlier)
                need -= gangs
                offered[lease.ask_id] -= gangs * gang
                chosen += group
    for ask_id, left in waiting.items():  # not taken: their GPUs stay leased
        offered[ask_id] -= sum(lease.gpu_count for lease in left)
    offers.update(offered)
    return chosen


def _mark_preempted(bid: Order, chosen: list[Lease], now: datetime, deadline: datetime) -> None:
    """Schedule `chosen` to be preempted at `deadline` for `bid`, each buyer told at once."""
    if not chosen:
        return
    notice = settings.GPUMARKET_PREEMPTION_NOTICE_SECONDS
    cause = (f"preemption at {deadline.isoformat()} ({notice} s notice): a higher bid "
             "needs these GPUs")
    for lease in chosen:
        lease.preempt_at = deadline
        lease.preempted_for = bid
        lease.save(update_fields=["preempt_at", "preempted_for"])
        lease.events.create(from_status=lease.status, to_status=lease.status, at=now,
                            cause=cause, detail={"preempt_at": deadline.isoformat(),
                                                 "notice_seconds": notice})
    log.info("bid %s at %s: preemption of leases %s scheduled at %s", bid.pk, bid.price,
             [lease.pk for lease in chosen], deadline.isoformat())


def depth(market: GpuClass, levels: int = 20) -> tuple[list[tuple[int, int]],
                                                          list[tuple[int, int]]]:
    """Order book depth: (bids high→low, asks low→high) as (price, GPUs) per level —
    the engine's OrderBook.depth, aggregated by the database (no book is loaded)."""
    if levels <= 0:
        return [], []
    resting = _resting(market, now=timezone.now()).filter(remaining_gpus__gt=0)

    def side(name: str, order_by: str) -> list[tuple[int, int]]:
        rows = (resting.filter(side=name).order_by().values("price")
                .annotate(gpus=Sum("remaining_gpus")).order_by(order_by)[:levels])
        return [(r["price"], r["gpus"]) for r in rows]

    return side(Order.Side.BID, "-price"), side(Order.Side.ASK, "price")


__all__ = ["BidRequest", "Placed", "cancel_order", "depth", "expire_orders", "place_ask",
           "place_bid", "place_bids", "reconsider_preemptions", "return_gpus_to_ask"]
