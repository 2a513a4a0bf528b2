"""Celery tasks: thin wrappers that take ids and call one service each.

Each is safe to run twice or concurrently: the services lock the row and leave a
closed auction or an ended lease alone.
"""

from __future__ import annotations

import logging

from celery import shared_task

from marketplace import (
    auctions,
    book,
    failover,
    fills_many,
    health,
    lease_end,
    leases,
    maintenance,
    telemetry,
)

log = logging.getLogger("gpumarket.tasks")


@shared_task(name="marketplace.tasks.close_auction", acks_late=True)
def close_auction_task(auction_id: int) -> str:
    """Close auction `auction_id` if it is due; a no-op when it is closed already or
    gone. A task that runs before closes_at (clock skew) leaves it to the sweep."""
    auction = auctions.close_auction(auction_id=auction_id)
    return "closed" if auction else "nothing to do"


@shared_task(name="marketplace.tasks.close_due_auctions")
def close_due_auctions() -> list[int]:
    """Beat sweep (every second): close every open auction past closes_at."""
    closed = []
    for auction_id in auctions.due_auction_ids():
        if auctions.close_auction(auction_id=auction_id):
            closed.append(auction_id)
    return closed


@shared_task(name="marketplace.tasks.end_overdue_leases")
def end_overdue_leases() -> list[int]:
    """Beat sweep: end running leases the runner did not end in time."""
    return lease_end.end_overdue_leases()


@shared_task(name="marketplace.tasks.repair_rematches")
def repair_rematches() -> list[int]:
    """Beat sweep (every 30 s): re-match the asks whose re-match after a batch of lease
    ends is older than GPUMARKET_REMATCH_REPAIR_SECONDS (a worker died between the
    batch's commit and its re-match); returns the leases made."""
    return [lease.pk for lease in fills_many.repair_rematches()]


@shared_task(name="marketplace.tasks.preempt_due_leases")
def preempt_due_leases() -> list[int]:
    """Beat sweep (every second): end `preempted` each interruptible lease whose notice
    deadline (preempt_at) has come; its GPUs go back to the ask and fill the waiting bid.
    Idempotent: an ended lease is left alone."""
    return lease_end.preempt_due_leases()


@shared_task(name="marketplace.tasks.maintenance_sweep")
def maintenance_sweep() -> dict[str, list[int]]:
    """Beat sweep (every second): maintenance notices due, leases at a maintenance
    deadline ended, asks of nodes whose window is over selling again (maintenance.py)."""
    return maintenance.sweep()


@shared_task(name="marketplace.tasks.expire_orders")
def expire_orders() -> list[int]:
    """Beat sweep: expire bids past expires_at (releasing their holds) and asks past
    available_until; each with its cause recorded."""
    return book.expire_orders()


@shared_task(name="marketplace.tasks.meter_running_leases")
def meter_running_leases() -> list[int]:
    """Beat: charge running leases for each whole metering period they ran. Safe to
    retry or to run on several workers: each period is captured once."""
    return leases.meter_running_leases()


@shared_task(name="marketplace.tasks.fail_silent_nodes")
def fail_silent_nodes_task() -> list[int]:
    """Beat sweep (every 15 s): fail the leases of nodes that missed their heartbeats."""
    return health.fail_silent_nodes()


@shared_task(name="marketplace.tasks.failover_lease", acks_late=True)
def failover_lease(lease_id: int) -> str:
    """Place failed lease `lease_id`'s remaining time (failover.continue_lease), once:
    a repeat (a retry, a redelivery after a worker died) finds nothing pending."""
    return failover.continue_lease(lease_id=lease_id) or "nothing to do"


@shared_task(name="marketplace.tasks.resume_failovers")
def resume_failovers() -> list[int]:
    """Beat sweep (every 10 s): queue failover_lease for failed leases still pending after
    10 s (a task lost before it was queued); a duplicate does nothing."""
    from datetime import timedelta

    from django.utils import timezone

    ids = failover.pending_ids(timezone.now() - timedelta(seconds=10))
    for lease_id in ids:
        failover_lease.delay(lease_id)
    return ids


@shared_task(name="marketplace.tasks.drop_ended_telemetry")
def drop_ended_telemetry() -> int:
    """Beat sweep (every 5 min): delete the GPU series of leases ended longer than
    GPUMARKET_TELEMETRY_KEEP_SECONDS ago (marketplace/telemetry.py)."""
    return telemetry.drop_ended()
