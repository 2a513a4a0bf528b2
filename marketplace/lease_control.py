"""The buyer's control of a lease: `stop_lease` (end it now, pay the seconds used) and
`extend_lease` (the same GPUs for longer at the lease's price, on a new hold). Both for
continuous-auction and sealed-bid leases; the rules: docs/MATCHING.md, "Stop and extend".

Errors: NotFound (not a lease of this buyer: the same answer as for a missing one),
Conflict (409, naming why an extension cannot be had), InvalidInput (400, naming the field).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from marketplace import failover, health, locking
from marketplace.errors import Conflict, InvalidInput, NotFound
from marketplace.lease_end import end_lease
from marketplace.models import Auction, Lease, LeaseExtension, Order
from providers.models import Gpu
from settlement import services as ledger
from settlement.money import format_usd, lease_cost

log = logging.getLogger("gpumarket.leases")

#: the longest a lease may last, extensions included (as a bid's hours: 366 days)
MAX_LEASE_SECONDS = 366 * 24 * 3600
STOP_CAUSE = "stopped by the buyer"


def _own(buyer_id: int, lease_id: int) -> Lease:
    lease = Lease.objects.filter(pk=lease_id, buyer_id=buyer_id).first()
    if lease is None:
        raise NotFound(f"no lease {lease_id} of yours")
    return lease


def stop_lease(*, buyer_id: int, lease_id: int, now: datetime | None = None) -> Lease:
    """End the buyer's pending, starting or running lease now, `cancelled` with the cause
    "stopped by the buyer" (lease_end.end_lease: charged the seconds it ran, 0 if it never
    ran; the rest of its holds released; its GPUs back to the ask, which re-matches). A
    failed lease of a chain stops the chain (failover.stop_chain: its pending failover,
    resting bid or running continuation). Another ended lease is returned unchanged (a
    second stop is a no-op). NotFound for a lease
    that is not the buyer's."""
    lease = _own(buyer_id, lease_id)
    if lease.status == "failed" and lease.failover_state:  # a chain: stop what goes on
        going = failover.stop_chain(lease=lease, now=now)
        if going is not None:
            stop_lease(buyer_id=buyer_id, lease_id=going.pk, now=now)
        return Lease.objects.get(pk=lease.pk)
    if lease.status in Lease.ENDED:
        return lease
    try:
        return end_lease(lease_id=lease.pk, status="cancelled", cause=STOP_CAUSE, now=now,
                         detail={"by": "buyer"})
    except Conflict:  # ended meanwhile (the runner, the worker): unchanged, as above
        return Lease.objects.get(pk=lease.pk)


def extension_cost(lease: Lease, seconds: int) -> int:
    """Micro-USD `seconds` more cost: the whole lease's cost after minus before, so the
    lease's holds always add up to exactly lease_cost(price, gpus, duration)."""
    return (lease_cost(lease.price, lease.gpu_count, lease.duration_seconds + seconds)
            - lease_cost(lease.price, lease.gpu_count, lease.duration_seconds))


def extend_lease(*, buyer_id: int, lease_id: int, seconds: int, field: str = "seconds",
                 request_id: str = "", now: datetime | None = None) -> Lease:
    """Extend the buyer's unended lease by `seconds` at its price: a new hold of
    extension_cost, a LeaseExtension row, `duration_seconds` and `ends_at` grown, an event;
    the runner is told after commit (runner_push watches `ends_at`). Under the market lock,
    all or nothing. Conflict naming why when the lease has ended or its time is over, is
    scheduled for preemption, its node is silent, a GPU is unhealthy, the window does not
    reach the new end, or the wallet lacks the extra cost; InvalidInput (`field`) for a
    lease that would last longer than MAX_LEASE_SECONDS or an extension that costs
    nothing. `request_id` (the client's Idempotency-Key): an extension of this lease made
    with it already is answered with the lease as it is, nothing written; the same key
    with other `seconds` is a Conflict naming `request_id`."""
    now = now or timezone.now()
    market_id = _own(buyer_id, lease_id).market_id
    with locking.tracked(market_id), transaction.atomic():
        locking.lock_market(market_id)
        lease = Lease.objects.select_for_update().get(pk=lease_id)
        if request_id and (done := _replay(lease, request_id, seconds)) is not None:
            return done
        _check_extensible(lease, seconds, field, now)
        new_end = (lease.ends_at or now + timedelta(seconds=lease.duration_seconds)) \
            + timedelta(seconds=seconds)
        _check_window(lease, new_end, now)
        cost = extension_cost(lease, seconds)
        if cost <= 0:
            raise InvalidInput(f"{seconds} s at this price cost less than one micro-USD; "
                               "extend by more", field=field)
        try:
            hold = ledger.hold_place(buyer_id=lease.buyer_id, amount=cost,
                                     reference=f"lease-extension:{lease.pk}")
        except ledger.InsufficientFunds as exc:
            raise Conflict(f"insufficient funds: the extension needs {format_usd(exc.needed)}"
                           f" USD, your wallet has {format_usd(exc.available)} USD "
                           "available") from None
        LeaseExtension.objects.create(lease=lease, seconds=seconds, cost=cost, hold_id=hold.pk,
                                      request_id=request_id)
        lease.duration_seconds += seconds
        fields = ["duration_seconds"]
        if lease.ends_at is not None:
            lease.ends_at += timedelta(seconds=seconds)
            fields.append("ends_at")
        lease.note(cause=f"extended by the buyer by {seconds} s, {format_usd(cost)} USD "
                         f"more held", at=now,
                   detail={"seconds": seconds, "cost": cost, "hold": hold.pk,
                           "ends_at": lease.ends_at.isoformat() if lease.ends_at else None},
                   update_fields=tuple(fields))
    log.info("lease %s: extended by %s s (now %s s), %s held on hold %s", lease.pk, seconds,
             lease.duration_seconds, cost, hold.pk)
    return lease


def _replay(lease: Lease, request_id: str, seconds: int) -> Lease | None:
    """The lease when `request_id` already extended it by `seconds` (a retry); None when
    the key is new; Conflict when it was used for another number of seconds."""
    first = LeaseExtension.objects.filter(lease=lease, request_id=request_id).first()
    if first is None:
        return None
    if first.seconds != seconds:
        raise Conflict(f"request_id {request_id} already extended lease {lease.pk} by "
                       f"{first.seconds} s; use a new one for another extension",
                       field="request_id")
    log.info("lease %s: extension %s replayed (request_id already used)", lease.pk, first.pk)
    return lease


def _check_extensible(lease: Lease, seconds: int, field: str, now: datetime) -> None:
    if lease.status in Lease.ENDED:
        raise Conflict(f"lease {lease.pk} has ended ({lease.status}): there is nothing to "
                       "extend")
    if lease.preempt_at is not None:
        raise Conflict(f"lease {lease.pk} is scheduled for preemption at "
                       f"{lease.preempt_at.isoformat()}: it cannot be extended")
    if lease.ends_at is not None and lease.ends_at <= now:
        raise Conflict(f"lease {lease.pk}'s time is over (at {lease.ends_at.isoformat()}): "
                       "it can no longer be extended")
    if lease.duration_seconds + seconds > MAX_LEASE_SECONDS:
        raise InvalidInput(f"a lease lasts at most {MAX_LEASE_SECONDS} s "
                           f"(366 days); this one has {lease.duration_seconds} s",
                           field=field)
    node = lease.node
    seen = node.last_heartbeat_at or node.registered_at
    if seen is None or seen < health.silent_cutoff(now):
        raise Conflict(f"node {node.name} is not active: no heartbeat since "
                       f"{seen.isoformat() if seen else 'ever'}")
    sick = (Gpu.objects.filter(lease_gpus__lease=lease, healthy=False)
            .order_by("pci_bus_id").values_list("uuid", flat=True).first())
    if sick:
        raise Conflict(f"GPU {sick} of the lease is unhealthy: it cannot be extended")


def _check_window(lease: Lease, new_end: datetime, now: datetime) -> None:
    """The provider must offer these GPUs until `new_end`: through the lease's own ask (a
    continuous-auction lease) or, for a sealed-bid lease, a standing ask of the provider
    for this node and GPU class, and then no open auction of the node may close before
    `new_end` (its lot may need these GPUs)."""
    alive = (*Order.ACTIVE, Order.Status.FILLED)
    if lease.ask_id is not None:
        ask = Order.objects.get(pk=lease.ask_id)
        where = f"ask {ask.pk}"
        if ask.status not in alive or ask.available_until <= now:
            state = ask.status if ask.status not in alive else "past its window"
            raise Conflict(f"the window is closed: the provider's {where} is {state}")
    else:
        ask = (Order.objects.filter(node_id=lease.node_id, market_id=lease.market_id,
                                    owner_id=lease.provider_id, side=Order.Side.ASK,
                                    status__in=alive, available_until__gt=now)
               .order_by("-available_until", "pk").first())
        if ask is None:
            raise Conflict(f"the window is closed: the provider offers node "
                           f"{lease.node.name} in no standing ask beyond the auction's lot")
        where = f"the provider's ask {ask.pk} on node {lease.node.name}"
    until = locking.sells_until(ask.available_until, ask.node.maintenance_from)
    if until < new_end:
        why = "" if until == ask.available_until else ", where the node's maintenance starts"
        raise Conflict(f"the window ends at {until.isoformat()} ({where}{why}): the "
                       f"lease can run until then at most, {new_end.isoformat()} was asked")
    if lease.ask_id is not None:
        return
    auction = (Auction.objects.filter(node_id=lease.node_id, market_id=lease.market_id,
                                      status=Auction.Status.OPEN, closes_at__lt=new_end)
               .order_by("closes_at").first())
    if auction is not None:
        raise Conflict(f"auction {auction.pk} of node {lease.node.name} closes at "
                       f"{auction.closes_at.isoformat()} and may need these GPUs: the lease "
                       "can be extended until then at most")
