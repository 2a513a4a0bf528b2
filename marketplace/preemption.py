"""The preemption policy: which interruptible leases a resting bid outbids, scheduled
under the market lock (`schedule_preemption`, `reconsider_preemptions`), and called off
when their bid is gone (`call_off_preemptions`). The caller holds the market lock.

The rule, stated once: docs/MATCHING.md, "Preemption".
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, Q

from marketplace import lease_notice
from marketplace.env_templates import cuda_ok
from marketplace.locking import sells_until
from marketplace.models import GpuClass, Lease, Order
from marketplace.runtimes import can_run
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.market")


def candidates_exist(market: GpuClass) -> bool:
    """Whether any lease of `market` could be preempted at all (one cheap query, so that a
    group of bids skips schedule_preemption's per-bid search when none can)."""
    return Lease.objects.filter(market=market, interruptible=True, status__in=Lease.ACTIVE,
                                preempt_at__isnull=True, ask__isnull=False).exists()



def call_off_preemptions(bid: Order, now: datetime) -> None:
    """The leases scheduled to be preempted for `bid` (no longer active) run on; they may
    be another resting bid's now (reconsider_preemptions). Caller holds the market lock."""
    victims = list(Lease.objects.select_for_update()
                   .filter(preempted_for=bid, preempt_at__isnull=False,
                           status__in=Lease.ACTIVE))
    for lease in victims:
        lease.preempt_at = None
        cleared = lease_notice.cleared_fields(lease, lease_notice.PREEMPTION)
        lease.note(cause=f"preemption called off: the bid it was for is {bid.status}", at=now,
                   update_fields=("preempt_at", *cleared))
    if victims:
        log.info("bid %s %s: preemption of leases %s called off", bid.pk, bid.status,
                 [lease.pk for lease in victims])
        reconsider_preemptions(bid.market_id, now)



def schedule_preemption(market: GpuClass, bid: Order, now: datetime) -> list[Lease]:
    """Schedule the preemption of the interruptible leases that `bid` (resting, GPUs
    still wanted) outbids, as few as cover its remaining gangs (docs/MATCHING.md,
    "Preemption"). The caller holds the market lock. Returns the leases scheduled. An
    NVLink bid preempts nothing (the victims' GPUs need not make connected gangs)."""
    gang = bid.gang_size or bid.remaining_gpus
    if bid.remaining_gpus // gang <= 0 or bid.interconnect == "nvlink":
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
    asks = {a.pk: a for a in Order.objects.select_related("node")
            .filter(pk__in={c.ask_id for c in candidates})}
    chosen = _choose_victims(bid, candidates, asks, _offers(asks), [], deadline)
    _mark_preempted(bid, chosen, now, deadline)
    return chosen


def reconsider_preemptions(market_id: int, now: datetime, *,
                           through_bid: int | None = None) -> list[Lease]:
    """Offer the market's preemptible leases (docs/MATCHING.md, "Preemption") to the
    resting bids again, after the set may have grown: a new interruptible lease from a
    fill, a preemption called off, GPUs back on an ask. The caller holds the market lock.

    Resting GTC bids that strictly outbid some candidate go highest price first, then
    oldest, each through the rule of schedule_preemption, counting first the leases
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
        price__gt=candidates[0].bid_price).exclude(interconnect="nvlink")
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
    asks = {a.pk: a for a in Order.objects.select_related("node").filter(pk__in=ask_ids)}
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
    """The rule of docs/MATCHING.md ("Preemption") for one bid: the leases to
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
                and ask.owner_id != bid.owner_id
                and sells_until(ask.available_until, ask.node.maintenance_from) >= at + hours
                and cuda_ok(ask.node.cuda_version, bid.min_cuda)
                and can_run(ask.node.runtime, bid.command)
                and bid.node_id in (None, ask.node_id))

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
        # the workload's notice (docs/LEASE_CONTRACT.md), unless it has an earlier one
        told = lease_notice.set_fields(lease, reason=lease_notice.PREEMPTION,
                                       deadline=deadline, now=now)
        lease.note(cause=cause, at=now, update_fields=("preempt_at", "preempted_for", *told),
                   detail={"preempt_at": deadline.isoformat(), "notice_seconds": notice})
        webhooks.emit(lease.buyer_id, "lease.preemption_notice", {
            "lease": lease.pk, "preempt_at": deadline.isoformat(), "notice_seconds": notice,
            "cause": cause})
    log.info("bid %s at %s: preemption of leases %s scheduled at %s", bid.pk, bid.price,
             [lease.pk for lease in chosen], deadline.isoformat())

