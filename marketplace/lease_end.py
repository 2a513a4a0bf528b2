"""Ending leases under the market lock: `end_lease` settles a lease once and returns its
GPUs to the ask, which re-matches; `preempt_lease` ends a due preemption (or calls it
off); `end_overdue_leases` and `preempt_due_leases` are the worker's sweeps.
Billing and preemption: docs/MATCHING.md and marketplace/leases.py.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from core import metrics
from marketplace import (
    faults,
    fills_many,
    lease_end_many,
    lease_notice,
    locking,
    matching,
    preemption,
    reliability,
)
from marketplace.errors import Conflict
from marketplace.leases import hold_ids as lease_hold_ids
from marketplace.leases import move
from marketplace.models import Lease, Order
from settlement import credits
from settlement import services as ledger
from settlement.models import Hold
from settlement.money import format_usd, lease_cost

log = logging.getLogger("gpumarket.leases")


def end_lease(*, lease_id: int, status: str, cause: str, now: datetime | None = None,
              detail: dict | None = None) -> Lease:
    """End a lease (completed, failed, preempted or cancelled) and settle it, once.

    Charged seconds: from started_at to `now` (or to a notice or preemption deadline
    already past: the stop after the deadline is the provider's, docs/LEASE_CONTRACT.md),
    at most the leased duration (0 if it never ran). One journal entry pays provider and
    platform by the take-rate split and releases the rest of the hold. The GPUs become
    free and return to the ask they were sold from. Raises Conflict if the lease has already ended.
    """
    now = now or timezone.now()
    market_id = Lease.objects.values_list("market_id", flat=True).get(pk=lease_id)
    with locking.tracked(market_id), transaction.atomic():
        locking.lock_market(market_id)
        lease = Lease.objects.select_for_update().get(pk=lease_id)
        if lease.status in Lease.ENDED:
            raise Conflict(f"lease {lease_id} has already ended ({lease.status})")
        lease, seconds, released = _end_locked(lease, status=status, cause=cause, now=now,
                                               detail=detail)
    _log_end(lease, seconds, released)
    return lease


def _end_locked(lease: Lease, *, status: str, cause: str, now: datetime,
                detail: dict | None) -> tuple[Lease, int, int]:
    """end_lease's work on `lease` (unended, row locked), the market lock held: returns
    (lease, seconds charged, micro-USD released to the buyer)."""
    seconds = lease_end_many.charged_seconds(lease, status=status, now=now, detail=detail)
    # never below what periodic settlement already paid out of the holds (the lease's own
    # and one per extension)
    holds = lease_hold_ids(lease)
    captured = Hold.objects.filter(pk__in=holds).aggregate(t=Sum("captured"))["t"] or 0
    cost = max(lease_cost(lease.price, lease.gpu_count, seconds), captured)
    fault = faults.classify(cause) if status == "failed" else None
    # a provider's fault on a bid that allows failover: the unused hold is carried to the
    # continuation (marketplace/failover.py) instead of released
    wants = bool(fault and fault.side == faults.PROVIDER and lease.failover
                 and seconds < lease.duration_seconds)
    over = wants and failover_spent(lease)  # the chain's bound reached: no more
    carry = f"carry:lease:{lease.pk}" if wants and not over else ""
    settled = ledger.hold_settle_many(hold_ids=holds, cost=cost,
                                      provider_id=lease.provider_id,
                                      reference=f"lease:{lease.pk}", carry_reference=carry)
    lease.ended_at = now
    lease.cause = cause[:300]
    lease.cost = cost
    lease.platform_fee = settled.fee_total  # periodic captures included
    lease.provider_amount = cost - settled.fee_total
    lease.settled_at = now
    extra: dict = {}
    if fault is not None:
        lease.fault, lease.failure_code = fault.side, fault.code
        extra = {"fault": fault.side, "failure_code": fault.code}
        if settled.carried_hold_id:
            lease.failover_state, lease.carry_hold_id = "pending", settled.carried_hold_id
    move(lease, status, cause=cause, at=now,
         detail={**(detail or {}), "seconds": seconds, **extra},
         update_fields=("ended_at", "cause", "cost", "provider_amount", "platform_fee",
                        "settled_at", "fault", "failure_code", "failover_state",
                        "carry_hold_id"))
    metrics.lease_ended(status, cause)
    if fault is not None and fault.credit:
        _fault_credit(lease, fault, seconds, now)
    if over:
        limit = settings.GPUMARKET_FAILOVER_MAX_CONTINUATIONS
        lease.failover_state = "released"
        lease.note(cause=f"not continued: the chain has failed over {limit} times, the "
                   f"most GPUMARKET_FAILOVER_MAX_CONTINUATIONS allows; the unused hold "
                   f"({format_usd(settled.released)} USD) was released",
                   at=now, detail={"failover": "released", "bound": limit},
                   update_fields=("failover_state",))
    if lease.failover_state == "pending":
        lease_id = lease.pk
        transaction.on_commit(lambda: queue_failover(lease_id))
    lease.lease_gpus.update(active=False)
    reliability.refresh_node(lease.node_id, lease.market_id)  # before the ask re-matches
    if lease.ask_id:
        matching.return_gpus_to_ask(ask_id=lease.ask_id, gpus=lease.gpu_count, now=now)
    return lease, seconds, settled.released


FAILOVER_TASK = "marketplace.tasks.failover_lease"


def failover_spent(lease: Lease) -> bool:
    """Whether `lease`'s chain already holds GPUMARKET_FAILOVER_MAX_CONTINUATIONS
    continuations (docs/FAULTS.md, "Failover": the bound), so a failure of it ends the
    chain whatever its cause."""
    limit = settings.GPUMARKET_FAILOVER_MAX_CONTINUATIONS
    made = Lease.objects.filter(chain_id=lease.chain).exclude(pk=lease.chain).count()
    return made >= limit


def queue_failover(lease_id: int) -> None:
    """Queue the failover task by name (after the end's commit); broker down: the beat
    sweep resume_failovers queues it."""
    try:
        current_app.signature(FAILOVER_TASK, args=(lease_id,)).apply_async()
    except Exception:
        log.warning("could not queue the failover of lease %s; the sweep will", lease_id)


def _fault_credit(lease: Lease, fault: faults.Fault, seconds: int, now: datetime) -> None:
    """The provider pays the buyer for its fault (docs/FAULTS.md): the cost of the last
    GPUMARKET_FAULT_CREDIT_MINUTES healthy minutes (at most the seconds charged), bounded
    by what the lease earned the provider; the finding is the entry's evidence."""
    minutes = settings.GPUMARKET_FAULT_CREDIT_MINUTES
    amount = lease_cost(lease.price, lease.gpu_count, min(minutes * 60, seconds))
    credit = credits.fault_credit(
        provider_id=lease.provider_id, buyer_id=lease.buyer_id, amount=amount,
        bound=lease.provider_amount or 0, reference=f"lease:{lease.pk}",
        evidence=f"lease {lease.pk} on node {lease.node_id}: {fault.code}: {fault.evidence}")
    if credit:
        lease.fault_credit = credit
        lease.note(cause=f"the provider's fault ({fault.code}): the provider credits "
                         f"{format_usd(credit)} USD to the buyer", at=now,
                   detail={"fault_credit": credit, "failure_code": fault.code},
                   update_fields=("fault_credit",))


def _log_end(lease: Lease, seconds: int, released: int) -> None:
    log.info("lease %s: %s after %s s; cost %s = provider %s + platform %s; released %s",
             lease.pk, lease.status, seconds, lease.cost, lease.provider_amount,
             lease.platform_fee, released)


LEASE_END_CHUNK = 50  # leases per market-lock transaction within a batch (bench/README.md)


def end_overdue_leases(*, now: datetime | None = None,
                       batch: int | None = None) -> list[int]:
    """End running leases whose ends_at passed more than GPUMARKET_LEASE_GRACE_SECONDS ago
    without the runner reporting the end. Charged up to ends_at only.

    Batched: per market, up to `batch` leases (GPUMARKET_LEASE_END_BATCH by default;
    oldest ends_at first) through end_leases_batch: settled as end_lease settles each,
    LEASE_END_CHUNK to a transaction, then the returned GPUs re-matched once for the
    batch. A lease the runner ended meanwhile is skipped. Returns the ids ended."""
    now = now or timezone.now()
    batch = batch or settings.GPUMARKET_LEASE_END_BATCH
    cutoff = now - timedelta(seconds=settings.GPUMARKET_LEASE_GRACE_SECONDS)
    due: dict[int, list[int]] = {}
    for lease_id, market_id in (Lease.objects
                                .filter(status=Lease.Status.RUNNING, ends_at__lt=cutoff)
                                .order_by("ends_at", "pk")
                                .values_list("pk", "market_id")):
        due.setdefault(market_id, []).append(lease_id)
    ended: list[int] = []
    for market_id, ids in due.items():
        for start in range(0, len(ids), batch):
            ended += end_leases_batch(market_id=market_id, lease_ids=ids[start:start + batch],
                                      status="completed", now=now,
                                      cause="lease time is over; the runner did not "
                                            "report the end")
    return ended


def end_leases_batch(*, market_id: int, lease_ids: list[int], status: str, cause: str,
                     now: datetime | None = None) -> list[int]:
    """End the unended leases of `lease_ids` (all of market `market_id`), in the given
    order, each as end_lease would: LEASE_END_CHUNK of them to a transaction that takes
    the market lock once (set-based: lease_end_many, but for `failed`, which ends and
    re-matches one at a time); then the asks that took GPUs back re-match the resting
    bids once for the whole batch (fills_many.rematch_returned: bounded passes, each its
    own transaction). Returns the ids ended (an already ended lease is skipped). Inside a
    caller's transaction everything is that transaction's."""
    now = now or timezone.now()
    ended: list[int] = []
    asks: dict[int, None] = {}  # the asks that took GPUs back, in order
    for start in range(0, len(lease_ids), LEASE_END_CHUNK):
        chunk = lease_ids[start:start + LEASE_END_CHUNK]
        with locking.tracked(market_id), transaction.atomic():
            locking.lock_market(market_id)
            rows = {lease.pk: lease for lease in Lease.objects.select_for_update()
                    .filter(pk__in=chunk, market_id=market_id).order_by("pk")}
            # (ended by the runner meanwhile: skipped)
            due = [rows[pk] for pk in chunk if pk in rows and rows[pk].status not in Lease.ENDED]
            if status == "failed":  # faults, carried holds, credits: one at a time
                done = [_end_locked(lease, status=status, cause=cause, now=now, detail=None)
                        for lease in due]
            else:
                done, standing = lease_end_many.end_many_locked(due, status=status,
                                                                cause=cause, now=now)
                fills_many.note_rematch_due(market_id, standing, now)  # repair: a crash
                asks.update(dict.fromkeys(standing))
        for lease, seconds, released in done:
            _log_end(lease, seconds, released)
        ended += [lease.pk for lease, _, _ in done]
    if ended and status != "failed":
        fills_many.rematch_returned(market_id=market_id, ask_ids=list(asks), now=now)
    return ended


def preempt_lease(*, lease_id: int, now: datetime | None = None) -> Lease | None:
    """End lease `lease_id` `preempted` if its preemption is due at `now`, under the market
    lock; returns it, or None when there is nothing to do (already ended, not scheduled,
    not yet due) or the preemption was called off because the bid it was for is no
    longer active. Safe to run twice or concurrently: the second run finds it ended."""
    now = now or timezone.now()
    market_id = Lease.objects.values_list("market_id", flat=True).get(pk=lease_id)
    with locking.tracked(market_id), transaction.atomic():
        locking.lock_market(market_id)
        lease = Lease.objects.select_for_update().get(pk=lease_id)
        if lease.status in Lease.ENDED or lease.preempt_at is None or lease.preempt_at > now:
            return None
        bid = Order.objects.get(pk=lease.preempted_for_id)
        if bid.status not in Order.ACTIVE or (bid.expires_at and bid.expires_at <= now):
            gone = bid.status if bid.status not in Order.ACTIVE else "expired"
            lease.preempt_at = None
            cleared = lease_notice.cleared_fields(lease, lease_notice.PREEMPTION)
            lease.note(cause=f"preemption called off: the bid it was for is {gone}", at=now,
                       update_fields=("preempt_at", *cleared))
            log.info("lease %s: preemption called off (bid %s %s)", lease.pk, bid.pk, gone)
            preemption.reconsider_preemptions(market_id, now)  # it may be another resting bid's now
            return None
        lease, seconds, released = _end_locked(
            lease, status="preempted", now=now,
            cause=f"preempted at {now.isoformat()} for a higher bid (notice deadline "
                  f"{lease.preempt_at.isoformat()})",
            detail={"preempt_at": lease.preempt_at.isoformat()})
    _log_end(lease, seconds, released)
    return lease


def preempt_due_leases(*, now: datetime | None = None) -> list[int]:
    """End every unended lease whose `preempt_at` has come (one transaction each);
    returns the ids preempted by this run. Running it again changes nothing."""
    now = now or timezone.now()
    due = (Lease.objects.filter(status__in=Lease.ACTIVE, preempt_at__lte=now)
           .order_by("preempt_at", "pk").values_list("pk", flat=True))
    return [lease_id for lease_id in list(due) if preempt_lease(lease_id=lease_id, now=now)]
