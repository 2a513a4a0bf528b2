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
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
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


def _load_book(market: GpuClass, *, exclude: int | None = None) -> engine.OrderBook:
    """The market's resting orders as an engine book (caller holds the market lock)."""
    book = engine.OrderBook()
    resting = (Order.objects.filter(market=market, status__in=Order.ACTIVE)
               .exclude(pk=exclude).order_by("pk"))
    for order in resting:
        if order.side == Order.Side.BID:
            book.rest_bid(_engine_bid(order))
        elif order.remaining_gpus > 0:
            book.rest_ask(_engine_ask(order))
    return book


@dataclass(frozen=True)
class Placed:
    order: Order
    leases: list[Lease]


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
              now: datetime | None = None) -> Placed:
    """Place a bid: hold its cost, match it, rest what is left (GTC).

    price: micro-USD per GPU-hour; gpus: GPUs wanted; duration_seconds: lease length;
    gang_size: GPUs per node (default all on one node). Raises InvalidInput naming the
    field, and settlement.InsufficientFunds when the hold cannot be placed; in every
    refusal nothing is written.
    """
    market = get_market(market_slug)
    gang_size = gpus if gang_size is None else gang_size
    _check_common(price=price, gpus=gpus)
    if not 0 < duration_seconds <= MAX_DURATION_SECONDS:
        raise InvalidInput("must be between 1 second and 366 days", field="hours")
    if gang_size <= 0 or gpus % gang_size:
        raise InvalidInput(f"must divide gpus ({gpus})", field="gang_size")
    if time_in_force not in Order.TimeInForce.values:
        raise InvalidInput("must be GTC, IOC or FOK", field="time_in_force")
    hold_amount = checked_hold_amount(price=price, gpus=gpus, duration_seconds=duration_seconds)
    now = now or timezone.now()
    with transaction.atomic():
        market = lock_market(market.pk)
        order = Order.objects.create(
            market=market, owner_id=buyer_id, side=Order.Side.BID, price=price, gpus=gpus,
            remaining_gpus=gpus, duration_seconds=duration_seconds, gang_size=gang_size,
            time_in_force=time_in_force, image=image, command=command,
        )
        hold = ledger.hold_place(buyer_id=buyer_id, amount=hold_amount,
                                 reference=f"order:{order.pk}")
        order.hold_id = hold.pk
        order.save(update_fields=["hold_id"])
        order.events.create(from_status="", to_status="open", at=now, cause="bid placed")
        book = _load_book(market, exclude=order.pk)
        result = book.submit_bid(_engine_bid(order), _epoch(now))
        leases = _apply(market, order, result, now)
    return Placed(order=order, leases=leases)


def place_ask(*, provider_id: int, node_id: int, market_slug: str | None, price: int,
              gpus: int, available_until: datetime, now: datetime | None = None) -> Placed:
    """Offer `gpus` GPUs of a node at `price` micro-USD per GPU-hour until
    `available_until`, matching resting bids at their prices.

    Raises NotFound/PermissionDenied for a node that is not the provider's, and
    InvalidInput naming the field for more GPUs than are free or a past window.
    """
    now = now or timezone.now()
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
    with transaction.atomic():
        market = lock_market(market.pk)
        free = free_gpu_count(node, market)
        if gpus > free:
            raise InvalidInput(f"only {free} GPUs of node {node.name} are free to offer",
                               field="gpus")
        order = Order.objects.create(
            market=market, owner_id=provider_id, side=Order.Side.ASK, price=price, gpus=gpus,
            remaining_gpus=gpus, node=node, available_until=available_until,
        )
        order.events.create(from_status="", to_status="open", at=now, cause="ask placed")
        book = _load_book(market, exclude=order.pk)
        result = book.submit_ask(_engine_ask(order), _epoch(now))
        leases = _apply(market, order, result, now)
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
    ask.remaining_gpus += gpus
    ask.set_status("partially_filled", cause=f"{gpus} GPUs returned from an ended lease",
                   at=now, update_fields=("remaining_gpus",))
    market = ask.market
    book = _load_book(market, exclude=ask.pk)
    result = book.submit_ask(_engine_ask(ask), _epoch(now))
    return _apply(market, ask, result, now)


def depth(market: GpuClass, levels: int = 20) -> tuple[list[tuple[int, int]],
                                                          list[tuple[int, int]]]:
    """Order book depth: (bids high→low, asks low→high) as (price, GPUs) per level."""
    book = _load_book(market)
    return book.depth(levels)


__all__ = ["Placed", "cancel_order", "depth", "place_ask", "place_bid", "return_gpus_to_ask"]
