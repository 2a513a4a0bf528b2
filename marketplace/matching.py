"""Writing what the engine decided, under the market lock: fills become leases, orders
change state, holds move (`apply_result`); orders past their time expire
(`expire_due`); GPUs of an ended lease go back to their ask and re-match
(`return_gpus_to_ask`). Shared by book.py's writers, lease_end.py and health.py; the
set-wise forms for a batch of lease ends: marketplace/fills_many.py.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core import metrics
from marketplace import engine, locking, preemption
from marketplace.leases import lease_from_fill
from marketplace.models import Fill, GpuClass, Lease, Order
from settlement import services as ledger
from settlement.models import Hold
from settlement.money import format_usd, lease_cost
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.market")


def bid_hold_amount(*, price: int, gpus: int, duration_seconds: int) -> int:
    """What a bid holds: its whole cost at its limit price (micro-USD)."""
    return lease_cost(price, gpus, duration_seconds)



def past_due(now: datetime) -> Q:
    """Active orders past their time: a bid's expires_at, an ask's available_until (as
    written, the partial indexes order_active_expiry / order_active_window serve it)."""
    return Q(expires_at__lte=now) | Q(side=Order.Side.ASK, available_until__lte=now)


def expire_due(market: GpuClass, now: datetime) -> list[int]:
    """Expire the market's active orders past their time: bids past `expires_at` (hold
    released), asks past `available_until`. The caller holds the market lock."""
    due = (Order.objects.filter(market=market, status__in=Order.ACTIVE)
           .filter(past_due(now)).order_by("pk"))
    expired = []
    for order in due:
        if order.side == Order.Side.BID:
            cause = f"expires_at {order.expires_at.isoformat()} passed"
        else:
            cause = f"available_until {order.available_until.isoformat()} passed"
        close_order(order, "expired", cause, now)
        if order.side == Order.Side.BID:
            preemption.call_off_preemptions(order, now)
        expired.append(order.pk)
    return expired



def close_order(order: Order, status: str, cause: str, now: datetime) -> None:
    order.set_status(status, cause=cause, at=now, update_fields=locking.touch(order))
    if order.side == Order.Side.BID and order.hold_id:
        ledger.hold_release(hold_id=order.hold_id, cause=f"order {order.pk} {status}")


@metrics.timed_match
def apply_result(market: GpuClass, incoming: Order, result: engine.MatchResult,
           now: datetime) -> list[Lease]:
    """Write the engine's result: fills → leases, order states, holds."""
    if result.killed:
        close_order(incoming, "cancelled", "FOK: could not fill whole", now)
        return []
    for order_id in result.self_trade_cancels:
        resting = Order.objects.get(pk=order_id)
        close_order(resting, "cancelled", f"self-trade prevention against order {incoming.pk}",
                     now)
    leases = []
    touched: dict[int, Order] = {incoming.pk: incoming}
    for f in result.fills:
        bid = touched.get(f.bid_id) or Order.objects.get(pk=f.bid_id)
        ask = touched.get(f.ask_id) or Order.objects.get(pk=f.ask_id)
        touched[bid.pk], touched[ask.pk] = bid, ask
        fill = Fill.objects.create(market=market, bid=bid, ask=ask, gpus=f.gpus, price=f.price)
        metrics.fill(market.slug, "continuous", f.gpus, bid.duration_seconds)
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
                             at=now, update_fields=("remaining_gpus", *locking.touch(order)))
            webhooks.emit(order.owner_id, "order.filled", {
                "order": order.pk, "side": order.side, "status": status, "fill": fill.pk,
                "lease": leases[-1].pk, "gpus": f.gpus, "price_usd_micros": f.price,
                "remaining_gpus": order.remaining_gpus})
        if bid.remaining_gpus == 0:
            ledger.hold_release(hold_id=bid.hold_id, cause=f"order {bid.pk} filled")
        log.info("fill %s: bid %s × ask %s, %s GPUs at %s", fill.pk, bid.pk, ask.pk,
                 f.gpus, f.price)
    if incoming.status in Order.ACTIVE and not result.rested:
        close_order(incoming, "cancelled", f"{incoming.time_in_force}: remainder not rested",
                     now)
    if incoming.side == Order.Side.ASK and result.fills and incoming.remaining_gpus == 0:
        tell_outbid(market, incoming, {f.bid_id for f in result.fills})
    return leases


OUTBID_MAX = 100  # the most resting bids told per ask taken


def tell_outbid(market: GpuClass, ask: Order, winners: set[int]) -> None:
    """`order.outbid` to the resting bids that could pay `ask` but whose GPUs a better bid
    took (the ask is used up): {order, ask, price_usd_micros (the ask's), remaining_gpus};
    one read of the bids, one of their owners' endpoints (webhooks.emit_many)."""
    waiting = (Order.objects.filter(market=market, side=Order.Side.BID,
                                    status__in=Order.ACTIVE, price__gte=ask.price)
               .exclude(pk__in=winners).exclude(owner_id=ask.owner_id)
               .order_by("-price", "pk")[:OUTBID_MAX])
    webhooks.emit_many([(bid.owner_id, "order.outbid", {
        "order": bid.pk, "ask": ask.pk, "price_usd_micros": ask.price,
        "remaining_gpus": bid.remaining_gpus}) for bid in waiting])


def _hold_amount(hold_id: int) -> int:
    return Hold.objects.get(pk=hold_id).amount


def on_node_runtime_changed(sender, *, node, old: str, new: str, **kwargs) -> None:
    """A node's heartbeat announces another runtime (providers.signals.node_runtime_changed,
    after commit): as for a new CUDA version, every cached book is rebuilt and its asks
    match again (a node that now runs images may fill bids without a command)."""
    on_node_cuda_changed(sender, node=node, old=old, new=new, what="runtime")


def on_node_cuda_changed(sender, *, node, old: str, new: str, what: str = "CUDA",
                         **kwargs) -> None:
    """A node now reports another CUDA version (providers.signals.node_cuda_changed, after
    its inventory committed): in each market where it has an active ask, under the lock
    (as a foreign holder, so every process's cached book, whose asks carry the node's old
    version, is rebuilt), its asks match the resting bids again: a higher version may
    now run bids that rest for want of it. Prices as in return_gpus_to_ask: the earlier
    of the two orders sets it."""
    now = timezone.now()
    market_ids = sorted(set(Order.objects.filter(node=node, side=Order.Side.ASK,
                                                 status__in=Order.ACTIVE)
                            .values_list("market_id", flat=True)))
    for market_id in market_ids:
        with transaction.atomic():
            market = locking.lock_market(market_id)
            expire_due(market, now)
            asks = list(Order.objects.select_related("node").filter(
                market=market, node=node, side=Order.Side.ASK, status__in=Order.ACTIVE,
                remaining_gpus__gt=0).order_by("pk"))
            if not asks:
                continue
            book = locking.load_book(market)
            made = []
            for ask in asks:
                result = book.rematch_ask(ask.pk, locking.epoch(now))
                result.fills[:] = [f if f.bid_id < ask.pk else replace(f, price=ask.price)
                                   for f in result.fills]
                made += apply_result(market, ask, result, now)
            if made:
                log.info("node %s: %s %r → %r, leases %s", node.pk, what, old, new,
                         [lease.pk for lease in made])
                preemption.reconsider_preemptions(market.pk, now)


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
    ask = Order.objects.select_related("node").get(pk=ask_id)
    if ask.status not in (*Order.ACTIVE, "filled") or ask.available_until <= now:
        preemption.reconsider_preemptions(ask.market_id, now)
        return []
    market = ask.market
    expire_due(market, now)  # an expired resting bid must not take the returned GPUs
    ask.remaining_gpus += gpus
    # every GPU back: the ask stands as it was placed ("open"), else partly sold
    back = "open" if ask.remaining_gpus >= ask.gpus else "partially_filled"
    ask.set_status(back, cause=f"{gpus} GPUs returned from an ended lease",
                   at=now, update_fields=("remaining_gpus", *locking.touch(ask)))
    book = locking.load_book(market, exclude=ask.pk)
    result = book.submit_ask(locking.engine_ask(ask), locking.epoch(now))
    result.fills[:] = [f if f.bid_id < ask.pk else replace(f, price=ask.price)
                       for f in result.fills]
    leases = apply_result(market, ask, result, now)
    preemption.reconsider_preemptions(market.pk, now)
    return leases
