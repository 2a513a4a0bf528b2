"""Continuous auction services: place and cancel bids and asks, matched by the
engine (marketplace/engine) under one matching writer per order book.

The writer lock is the GPU class row, taken with SELECT … FOR UPDATE at the
start of every transaction that reads or changes that book (PostgreSQL row
lock; SQLite serialises writers anyway). Lock order everywhere: market row,
then leases, then ledger accounts. Nothing outside the database is called while
the lock is held; broadcasts and runner pushes go out on commit.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from marketplace import engine
from marketplace.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from marketplace.models import Fill, GpuClass, Lease, Order
from providers.models import Node
from settlement import services as ledger
from settlement.money import MAX_USD_MICROS, lease_cost

log = logging.getLogger("gpumarket.market")

MAX_GPUS = 4096
MAX_DURATION_SECONDS = 366 * 24 * 3600
CLIENT_ORDER_ID = re.compile(r"\A[A-Za-z0-9._:-]{1,64}\Z")
CLIENT_ID_CONSTRAINT = "order_client_id_unique_per_owner"


def lock_market(market_id: int) -> GpuClass:
    """Take the order book's single-writer lock for the rest of the transaction."""
    return GpuClass.objects.select_for_update().get(pk=market_id)


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


def _load_book(market: GpuClass, *, exclude: int | None = None,
               now: datetime | None = None) -> engine.OrderBook:
    """The market's resting orders as an engine book (caller holds the market lock, or
    only reads it). With `now`, orders past their expiry are left out even if the
    expiry sweep has not closed them yet."""
    book = engine.OrderBook()
    resting = _resting(market, now=now).exclude(pk=exclude).order_by("pk")
    # plain tuples, not model instances: this runs on every order (bench/README.md)
    rows = resting.values_list("pk", "side", "owner_id", "price", "remaining_gpus",
                               "gang_size", "duration_seconds", "time_in_force", "node_id",
                               "available_until")
    rest_bid, rest_ask, Bid, Ask = book.rest_bid, book.rest_ask, engine.Bid, engine.Ask
    for pk, side, owner, price, gpus, gang, duration, tif, node, until in rows:
        if side == Order.Side.BID:
            rest_bid(Bid(id=pk, owner=owner, price=price, gpus=gpus, gang=gang,
                         duration_s=duration, seq=pk, tif=tif))
        elif gpus > 0:
            rest_ask(Ask(id=pk, owner=owner, price=price, gpus=gpus, node=node,
                         available_until=_epoch(until), seq=pk))
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


def _replay(owner_id: int, client_order_id: str | None) -> Placed | None:
    """The first order of `owner_id` with `client_order_id`, as a Placed, or None."""
    if client_order_id is None:
        return None
    order = Order.objects.filter(owner_id=owner_id, client_order_id=client_order_id).first()
    if order is None:
        return None
    leases = list(Lease.objects.filter(Q(fill__bid=order) | Q(fill__ask=order)).order_by("pk"))
    return Placed(order=order, leases=leases, created=False)


def _is_client_id_clash(exc: IntegrityError) -> bool:
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == CLIENT_ID_CONSTRAINT
    return "client_order_id" in str(exc)  # SQLite names the columns instead


def _expire_due(market: GpuClass, now: datetime) -> list[int]:
    """Expire the market's active orders past their time: bids past `expires_at` (hold
    released), asks past `available_until`. The caller holds the market lock."""
    due = (Order.objects.filter(market=market, status__in=Order.ACTIVE)
           .filter(Q(expires_at__lte=now) | Q(available_until__lte=now)).order_by("pk"))
    expired = []
    for order in due:
        if order.side == Order.Side.BID:
            cause = f"expires_at {order.expires_at.isoformat()} passed"
        else:
            cause = f"available_until {order.available_until.isoformat()} passed"
        _close_order(order, "expired", cause, now)
        expired.append(order.pk)
    return expired


def expire_orders(*, now: datetime | None = None) -> list[int]:
    """Expire every active order past its expires_at (bids) or available_until (asks),
    one market at a time under its lock; returns the ids expired. Safe to run
    concurrently and again: an order already expired is no longer active."""
    now = now or timezone.now()
    market_ids = sorted(set(
        Order.objects.filter(status__in=Order.ACTIVE)
        .filter(Q(expires_at__lte=now) | Q(available_until__lte=now))
        .values_list("market_id", flat=True)))
    expired: list[int] = []
    for market_id in market_ids:
        with transaction.atomic():
            expired += _expire_due(lock_market(market_id), now)
    if expired:
        log.info("expired orders %s", expired)
    return expired


def free_gpu_count(node: Node, market: GpuClass) -> int:
    """GPUs of `market`'s class on `node` that no active lease, standing ask or open
    auction already covers."""
    total = node.gpus.filter(gpu_class=market).count()
    leased = Lease.objects.filter(node=node, status__in=Lease.ACTIVE, market=market)
    leased_gpus = sum(leased.values_list("gpu_count", flat=True))
    offered = sum(Order.objects.filter(node=node, market=market, side=Order.Side.ASK,
                                       status__in=Order.ACTIVE)
                  .values_list("remaining_gpus", flat=True))
    auctioned = sum(node.auctions.filter(status="open", market=market)
                    .values_list("gpus", flat=True))
    return total - leased_gpus - offered - auctioned


def _check_common(*, price: int, gpus: int) -> None:
    if price <= 0:
        raise InvalidInput("must be greater than zero", field="price")
    if not 0 < gpus <= MAX_GPUS:
        raise InvalidInput(f"must be between 1 and {MAX_GPUS}", field="gpus")


def place_bid(*, buyer_id: int, market_slug: str, price: int, gpus: int,
              duration_seconds: int, gang_size: int | None = None,
              time_in_force: str = "GTC", image: str = "", command: list[str] | None = None,
              expires_at: datetime | None = None, client_order_id: str | None = None,
              now: datetime | None = None) -> Placed:
    """Place a bid: hold its cost, match it, rest what is left (GTC) until cancelled,
    filled or `expires_at`.

    price: micro-USD per GPU-hour; gpus: GPUs wanted; duration_seconds: lease length;
    gang_size: GPUs per node (default all on one node); client_order_id: the buyer's own
    id, unique per buyer — placing it again returns the first order (created=False) and
    writes nothing. Raises InvalidInput naming the field, and
    settlement.InsufficientFunds when the hold cannot be placed; in every refusal nothing
    is written.
    """
    now = now or timezone.now()
    _check_client_order_id(client_order_id)
    replayed = _replay(buyer_id, client_order_id)
    if replayed is not None:
        return replayed
    market = get_market(market_slug)
    gang_size = gpus if gang_size is None else gang_size
    _check_common(price=price, gpus=gpus)
    if not 0 < duration_seconds <= MAX_DURATION_SECONDS:
        raise InvalidInput("must be between 1 second and 366 days", field="hours")
    if gang_size <= 0 or gpus % gang_size:
        raise InvalidInput(f"must divide gpus ({gpus})", field="gang_size")
    if time_in_force not in Order.TimeInForce.values:
        raise InvalidInput("must be GTC, IOC or FOK", field="time_in_force")
    if expires_at is not None and expires_at <= now:
        raise InvalidInput("must be in the future", field="expires_at")
    hold_amount = checked_hold_amount(price=price, gpus=gpus, duration_seconds=duration_seconds)
    try:
        with transaction.atomic():
            market = lock_market(market.pk)
            _expire_due(market, now)
            order = Order.objects.create(
                market=market, owner_id=buyer_id, side=Order.Side.BID, price=price, gpus=gpus,
                remaining_gpus=gpus, duration_seconds=duration_seconds, gang_size=gang_size,
                time_in_force=time_in_force, image=image, command=command,
                expires_at=expires_at, client_order_id=client_order_id or "",
            )
            hold = ledger.hold_place(buyer_id=buyer_id, amount=hold_amount,
                                     reference=f"order:{order.pk}")
            order.hold_id = hold.pk
            order.save(update_fields=["hold_id"])
            order.events.create(from_status="", to_status="open", at=now, cause="bid placed")
            book = _load_book(market, exclude=order.pk)
            result = book.submit_bid(_engine_bid(order), _epoch(now))
            leases = _apply(market, order, result, now)
    except IntegrityError as exc:
        # the same client_order_id raced in from another request (possibly another
        # market): that one committed first and stands
        replayed = _replay(buyer_id, client_order_id) if _is_client_id_clash(exc) else None
        if replayed is None:
            raise
        return replayed
    return Placed(order=order, leases=leases)


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
    replayed = _replay(provider_id, client_order_id)
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
        with transaction.atomic():
            market = lock_market(market.pk)
            _expire_due(market, now)
            free = free_gpu_count(node, market)
            if gpus > free:
                raise InvalidInput(f"only {free} GPUs of node {node.name} are free to offer",
                                   field="gpus")
            order = Order.objects.create(
                market=market, owner_id=provider_id, side=Order.Side.ASK, price=price,
                gpus=gpus, remaining_gpus=gpus, node=node, available_until=available_until,
                client_order_id=client_order_id or "",
            )
            order.events.create(from_status="", to_status="open", at=now, cause="ask placed")
            book = _load_book(market, exclude=order.pk)
            result = book.submit_ask(_engine_ask(order), _epoch(now))
            leases = _apply(market, order, result, now)
    except IntegrityError as exc:
        replayed = _replay(provider_id, client_order_id) if _is_client_id_clash(exc) else None
        if replayed is None:
            raise
        return replayed
    return Placed(order=order, leases=leases)


def cancel_order(*, user_id: int, order_id: int, cause: str = "cancelled by its owner") -> Order:
    """Cancel an open or partially filled order of `user_id`, releasing a bid's hold.
    Raises NotFound (also for another user's order) or Conflict when already closed."""
    order = Order.objects.filter(pk=order_id, owner_id=user_id).first()
    if order is None:
        raise NotFound(f"no order {order_id} of yours", field="order")
    with transaction.atomic():
        lock_market(order.market_id)
        order = Order.objects.get(pk=order_id)
        if order.status not in Order.ACTIVE:
            raise Conflict(f"order {order_id} is already {order.status}")
        _close_order(order, "cancelled", cause, timezone.now())
    return order


def _close_order(order: Order, status: str, cause: str, now: datetime) -> None:
    order.set_status(status, cause=cause, at=now)
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
            order.set_status(status, cause=f"fill {fill.pk}: {f.gpus} GPUs at {f.price}",
                             at=now, update_fields=("remaining_gpus",))
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
    holds the market lock."""
    ask = Order.objects.get(pk=ask_id)
    if ask.status not in (*Order.ACTIVE, "filled") or ask.available_until <= now:
        return []
    market = ask.market
    _expire_due(market, now)  # an expired resting bid must not take the returned GPUs
    ask.remaining_gpus += gpus
    ask.set_status("partially_filled", cause=f"{gpus} GPUs returned from an ended lease",
                   at=now, update_fields=("remaining_gpus",))
    book = _load_book(market, exclude=ask.pk)
    result = book.submit_ask(_engine_ask(ask), _epoch(now))
    return _apply(market, ask, result, now)


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


__all__ = ["Placed", "cancel_order", "depth", "expire_orders", "place_ask", "place_bid",
           "return_gpus_to_ask"]
