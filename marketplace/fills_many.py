"""Re-matching many returned GPUs at once (the hour boundary, issue 17): the GPUs of a
batch of ended leases go back to their asks (`return_gpus_to_asks`, in the batch's own
transactions), then the asks match the resting bids again for the whole batch together
(`rematch_returned`), bounded so the market lock stays short; the engine's results are
written set-wise (`apply_results_many`). Why and what it costs: bench/README.md, "The
hour boundary"; the rules: docs/MATCHING.md.

`apply_results_many` writes what matching.apply_result writes for each result in turn
(fills, leases with their holds and GPUs, order states and events, hold cuts and
releases, webhooks) in a fixed number of statements for all of them; a result it does
not handle set-wise (a kill, self-trade cancels, an NVLink gang, a failover
continuation) sends the whole list through apply_result, one result after another.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.db.models.signals import post_save
from django.utils import timezone

from core import metrics
from core.bulk import insert_all, update_all
from marketplace import engine, interconnect, locking, matching, preemption
from marketplace.errors import Conflict
from marketplace.leases import check_node, fill_terms, lease_row, next_lease_ids, units_gone
from marketplace.models import Fill, GpuClass, Lease, LeaseGpu, Order, RematchDue
from providers.models import Gpu
from settlement import bulk as ledger_bulk
from settlement import services as ledger
from settlement.money import format_usd, lease_cost
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.market")

# one re-match pass stops adding asks after this many fills or this long holding the
# lock; the asks left go to the next pass (another transaction: bids get the lock between)
REMATCH_MAX_FILLS = 20
REMATCH_MAX_SECONDS = 1.0


def return_gpus_to_asks(*, returns: list[tuple[int, int]], now: datetime) -> list[int]:
    """The GPUs of a batch's ended leases back on their asks: `returns` are (ask id, GPUs
    back). An ask that still stands (active or filled, its window open) gets them: its
    remaining GPUs and state written ("open" when every GPU is back, else
    "partially_filled", one event each: StateMachine.set_status_many). No re-match here:
    rematch_returned does it once for the batch. Returns the standing asks' ids, in the
    order of `returns`. The caller holds the market lock."""
    if not returns:
        return []
    asks = Order.objects.in_bulk([pk for pk, _ in returns])
    standing = [(asks[pk], gpus) for pk, gpus in returns
                if asks[pk].status in (*Order.ACTIVE, "filled")
                and asks[pk].available_until > now]
    moves: dict[str, list[tuple[Order, int]]] = {}
    for ask, gpus in standing:
        ask.remaining_gpus += gpus
        locking.touch(ask)
        # every GPU back: the ask stands as it was placed ("open"), else partly sold
        moves.setdefault("open" if ask.remaining_gpus >= ask.gpus else "partially_filled",
                         []).append((ask, gpus))
    for to, group in moves.items():
        Order.set_status_many([ask for ask, _ in group], to,
                              causes=[f"{gpus} GPUs returned from an ended lease"
                                      for _, gpus in group], at=now,
                              update_fields=("remaining_gpus", "book_version"))
    return [ask.pk for ask, _ in standing]


def note_rematch_due(market_id: int, ask_ids: list[int], now: datetime) -> None:
    """Record that the asks `ask_ids` of market `market_id` wait for their re-match (in the
    caller's transaction, the one that returned their GPUs): a RematchDue row each, kept
    as it is when one exists (its `since` stays the oldest)."""
    if ask_ids:
        RematchDue.objects.bulk_create(
            [RematchDue(ask_id=pk, market_id=market_id, since=now) for pk in ask_ids],
            ignore_conflicts=True)


def repair_rematches(now: datetime | None = None) -> list[Lease]:
    """The re-matches a worker's death skipped: each market's asks whose RematchDue is
    older than GPUMARKET_REMATCH_REPAIR_SECONDS, oldest first, through rematch_returned
    (which deletes the rows as it submits the asks). Returns the leases made; a second
    run finds nothing. Running beside a live re-match of the same asks is harmless: each
    pass submits under the market lock what is still standing then."""
    now = now or timezone.now()
    due = now - timedelta(seconds=settings.GPUMARKET_REMATCH_REPAIR_SECONDS)
    per_market: dict[int, list[int]] = {}
    for ask_id, market_id in (RematchDue.objects.filter(since__lte=due)
                              .order_by("since", "ask_id").values_list("ask_id", "market_id")):
        per_market.setdefault(market_id, []).append(ask_id)
    made: list[Lease] = []
    for market_id, ask_ids in sorted(per_market.items()):
        log.warning("market %s: re-matching %d asks whose re-match after a batch of lease "
                    "ends did not run (a worker stopped in between)", market_id, len(ask_ids))
        made += rematch_returned(market_id=market_id, ask_ids=ask_ids, now=now)
    return made


def rematch_returned(*, market_id: int, ask_ids: list[int], now: datetime) -> list[Lease]:
    """The asks `ask_ids` (GPUs just returned) match the resting bids again, in that
    order, as return_gpus_to_ask submits one (prices: the earlier of the two orders):
    passes of rematch_pass, each its own transaction under the market lock, until every
    ask was submitted. Returns the leases made. Not inside a caller's transaction (each
    pass commits)."""
    made: list[Lease] = []
    left = list(ask_ids)
    while True:
        with locking.tracked(market_id), transaction.atomic():
            market = locking.lock_market(market_id)
            leases, left = rematch_pass(market, left, now)
        made += leases
        if not left:
            return made


def rematch_pass(market: GpuClass, ask_ids: list[int], now: datetime
                 ) -> tuple[list[Lease], list[int]]:
    """One re-match pass under the market lock (the caller's): expire what is due, then
    submit the asks of `ask_ids` still standing with GPUs, in order, to the book, and
    write the results (apply_results_many); the preemptible leases are offered once at
    the end (reconsider_preemptions). When the resting bids want more GPUs than
    REMATCH_MAX_FILLS, the pass stops adding asks once it has REMATCH_MAX_FILLS fills or
    has run REMATCH_MAX_SECONDS (at least one ask each pass). Returns (leases made, ask
    ids left for the next pass)."""
    started = time.monotonic()
    matching.expire_due(market, now)  # an expired resting bid must not take the GPUs
    wanted = (Order.objects.filter(market=market, side=Order.Side.BID, status__in=Order.ACTIVE)
              .aggregate(n=Sum("remaining_gpus"))["n"] or 0)
    results: list[tuple[Order, engine.MatchResult]] = []
    left: list[int] = []
    if wanted and ask_ids:  # no resting bid: nothing can match, no book is loaded
        bounded = wanted > REMATCH_MAX_FILLS
        asks = Order.objects.select_related("node").in_bulk(ask_ids)
        book = locking.load_book(market)
        fills = 0
        for i, pk in enumerate(ask_ids):
            if bounded and results and (fills >= REMATCH_MAX_FILLS or
                                        time.monotonic() - started >= REMATCH_MAX_SECONDS):
                left = ask_ids[i:]
                break
            ask = asks.get(pk)
            if (ask is None or ask.status not in Order.ACTIVE or ask.remaining_gpus <= 0
                    or ask.available_until <= now):
                continue
            book.cancel(ask.pk)  # resubmitted: it matches as an incoming ask, then rests
            result = book.submit_ask(locking.engine_ask(ask), locking.epoch(now))
            result.fills[:] = [f if f.bid_id < ask.pk else replace(f, price=ask.price)
                               for f in result.fills]
            results.append((ask, result))
            fills += len(result.fills)
    leases = apply_results_many(market, results, now)
    preemption.reconsider_preemptions(market.pk, now)
    done = ask_ids[:len(ask_ids) - len(left)]
    if done:  # submitted (or no longer standing, or no bid wants GPUs): not due any more
        RematchDue.objects.filter(ask_id__in=done).delete()
    return leases, left


def _set_wise(results: list[tuple[Order, engine.MatchResult]],
              orders: dict[int, Order]) -> bool:
    """Whether apply_results_many writes `results` set-wise (else one by one)."""
    for _, result in results:
        if result.killed or result.self_trade_cancels:
            return False
        for f in result.fills:
            bid = orders[f.bid_id]
            if bid.interconnect == "nvlink" or bid.continues_lease_id:
                return False
    return True


def apply_results_many(market: GpuClass, results: list[tuple[Order, engine.MatchResult]],
                       now: datetime) -> list[Lease]:
    """matching.apply_result of each (incoming order, engine result) of `results`, in
    order, as if one after another — set-wise: one INSERT of the fills, one read of the
    nodes' free GPUs and one lock of those chosen, one draw of the lease ids,
    settlement.bulk.holds_reduce_many for the bids' hold cuts (one per fill, at the bid's
    limit), settlement.services.holds_place_many for the leases' holds (at the trade
    price), one INSERT each of the leases, their GPUs and their events, one UPDATE of the
    orders and one INSERT of their events (StateMachine.moved_event), holds_release_many
    for the bids filled, one webhooks.emit_many. Returns the leases made, in order.
    Conflict (the caller's transaction to roll back) as create_lease for a node that
    cannot give a fill its GPUs."""
    orders: dict[int, Order] = {o.pk: o for o, _ in results}
    need = {pk for _, r in results for f in r.fills for pk in (f.bid_id, f.ask_id)}
    orders.update(Order.objects.select_related("node").in_bulk(need - set(orders)))
    if not _set_wise(results, orders):
        return [lease for incoming, result in results
                for lease in matching.apply_result(market, incoming, result, now)]
    fills = [f for _, r in results for f in r.fills]
    leases: list[Lease] = []
    if fills:
        leases = _write_fills(market, fills, orders, now)
    for incoming, result in results:
        if incoming.status in Order.ACTIVE and not result.rested:
            matching.close_order(incoming, "cancelled",
                                 f"{incoming.time_in_force}: remainder not rested", now)
        if incoming.side == Order.Side.ASK and result.fills and incoming.remaining_gpus == 0:
            matching.tell_outbid(market, incoming, {f.bid_id for f in result.fills})
    return leases


def _write_fills(market: GpuClass, fills: list[engine.Fill], orders: dict[int, Order],
                 now: datetime) -> list[Lease]:
    """The writes of apply_results_many for its fills (see there)."""
    rows = insert_all([Fill(market=market, bid=orders[f.bid_id], ask=orders[f.ask_id],
                            gpus=f.gpus, price=f.price) for f in fills])
    for f in fills:
        metrics.fill(market.slug, "continuous", f.gpus, orders[f.bid_id].duration_seconds)
    # the filled part of each bid's hold, released at the bid's limit (one cut per fill)
    ledger_bulk.holds_reduce_many([
        (bid.hold_id, matching.bid_hold_amount(price=bid.price, gpus=f.gpus,
                                               duration_seconds=bid.duration_seconds),
         f"fill {row.pk}")
        for f, row in zip(fills, rows, strict=True) for bid in [orders[f.bid_id]]])
    terms = [fill_terms(fill=row, bid=orders[f.bid_id], ask=orders[f.ask_id])
             for f, row in zip(fills, rows, strict=True)]
    for t in terms:
        check_node(t["node"], min_cuda=t["min_cuda"], command=t["command"])
    chosen = _pick_gpus_many(market, [(t["node"], t["gpus"]) for t in terms])
    ids = next_lease_ids(len(terms))
    holds = ledger.holds_place_many([
        (t["buyer_id"], lease_cost(t["price"], t["gpus"], t["duration_seconds"]),
         f"lease:{pk}") for t, pk in zip(terms, ids, strict=True)])
    for hold in holds:
        if isinstance(hold, Exception):
            raise hold
    causes = [t.pop("cause") for t in terms]
    for t in terms:
        t.pop("nvlink_gang")
    leases = [lease_row(lease_id=pk, hold_id=hold.pk, **t)
              for t, pk, hold in zip(terms, ids, holds, strict=True)]
    Lease.objects.bulk_create(leases)
    insert_all([LeaseGpu(lease=lease, gpu=g)
                for lease, gpus in zip(leases, chosen, strict=True) for g in gpus])
    insert_all([lease.created_event(cause=cause, at=now, detail={"gpus": [g.uuid for g in gpus]})
                for lease, cause, gpus in zip(leases, causes, chosen, strict=True)])
    events, hooks, moved, releases = [], [], {}, []
    for f, row, lease in zip(fills, rows, leases, strict=True):
        bid, ask = orders[f.bid_id], orders[f.ask_id]
        for order in (bid, ask):
            order.remaining_gpus -= f.gpus
            status = "filled" if order.remaining_gpus == 0 else "partially_filled"
            events.append(order.moved_event(
                status, at=now, cause=f"fill {row.pk}: {f.gpus} GPUs at "
                f"{format_usd(f.price)} USD/GPU-hour"))
            locking.touch(order)
            moved[order.pk] = order
            hooks.append((order.owner_id, "order.filled", {
                "order": order.pk, "side": order.side, "status": status, "fill": row.pk,
                "lease": lease.pk, "gpus": f.gpus, "price_usd_micros": f.price,
                "remaining_gpus": order.remaining_gpus}))
        if bid.remaining_gpus == 0:
            releases.append((bid.hold_id, f"order {bid.pk} filled"))
        log.info("fill %s: bid %s × ask %s, %s GPUs at %s", row.pk, bid.pk, ask.pk,
                 f.gpus, f.price)
        log.info("lease %s: %s × %s on node %s for %s s at %s/GPU-h", lease.pk, f.gpus,
                 market.slug, lease.node.name, lease.duration_seconds, lease.price)
    fields = ("status", "remaining_gpus", "book_version")
    update_all(list(moved.values()), fields)
    insert_all(events)
    if releases:
        ledger_bulk.holds_release_many(releases)
    webhooks.emit_many(hooks)
    using = Order.objects.db
    for order in moved.values():  # as save() would: the live feed listens
        post_save.send(sender=Order, instance=order, created=False, raw=False, using=using,
                       update_fields=frozenset(fields))
    for model, made in ((Fill, rows), (Lease, leases)):  # the feed; the runners' push
        for obj in made:
            post_save.send(sender=model, instance=obj, created=True, raw=False,
                           using=using, update_fields=None)
    return leases


def _pick_gpus_many(market: GpuClass, wants: list[tuple[object, int]]) -> list[list[Gpu]]:
    """For each (node, count) of `wants`, in order, `count` healthy GPUs of the market on
    that node in no active lease and not picked by an earlier want, by bus id (as
    leases._pick_gpus without NVLink gangs): one read for all nodes, then one lock of
    all GPUs chosen (primary-key order, healthy still; as leases._locked). Conflict
    (nothing written) when a node has too few, or one changed meanwhile."""
    free: dict[int, list[Gpu]] = {}
    for gpu in (Gpu.objects.filter(node_id__in={node.pk for node, _ in wants},
                                   gpu_class=market, healthy=True)
                .exclude(lease_gpus__active=True)):
        free.setdefault(gpu.node_id, []).append(gpu)
    for gpus in free.values():
        gpus.sort(key=lambda g: interconnect.gpu_order(g.uuid, g.pci_bus_id))
    chosen = []
    for node, count in wants:
        have = free.get(node.pk, [])
        if len(have) < count:
            raise Conflict(f"node {node.name} has only {len(have)} free {market.slug} GPUs, "
                           f"{count} needed")
        chosen.append(have[:count])
        free[node.pk] = have[count:]
    gone = units_gone([g.pk for gpus in chosen for g in gpus])
    if gone:
        raise Conflict(f"the units of the market {market.slug} changed while these leases "
                       f"were being made (a new MIG layout or a health change): "
                       f"{gone} of the units picked left the market; "
                       "nothing was written: retry", field="gpus")
    return chosen
