"""Ending many leases of one market at once, set-based (the hour boundary, issue 17):
`end_many_locked` does for a batch what lease_end._end_locked does for each lease, in a
fixed number of statements for the batch; its asks re-match afterwards, for the whole
batch (lease_end.end_leases_batch → fills_many.rematch_returned). Why and what it
costs: bench/README.md, "The hour boundary"; the rules: docs/MATCHING.md.

Same results as the leases ended one after another (tests/marketplace/
test_lease_end_many.py): the same charges, journal entries, holds, lease states and
events, webhooks and metrics; then, all leases of the batch having ended at the same
`now`, the node's reliability is refreshed once per node and each ask gets all its
GPUs back at once before it re-matches (one after another: one return had one ask's
GPUs back before the next lease of the batch ended, which only made a difference to
a resting bid wanting more GPUs of one node than one lease returned — it now sees
them together, as the market would have an instant later). The re-match follows the
batch's commits: in between, the returned GPUs stand on their asks as offers that a
new bid takes as usual.
"""

from __future__ import annotations

from datetime import datetime

from core import metrics
from marketplace import fills_many, reliability
from marketplace.leases import LEASE_WEBHOOKS, lease_event
from marketplace.models import Lease, LeaseExtension, LeaseGpu
from settlement import bulk as ledger_bulk
from settlement.models import Hold
from settlement.money import lease_cost
from webhooks import events as webhooks

_ENDED_FIELDS = ("ended_at", "cause", "cost", "provider_amount", "platform_fee",
                 "settled_at")


def charged_seconds(lease: Lease, *, status: str, now: datetime,
                    detail: dict | None) -> int:
    """The seconds a lease ending at `now` pays: from started_at to now (or to a notice
    or preemption deadline already past), at most its duration, 0 if it never ran; a
    failure with the runner's `runner_usage_seconds` pays only those."""
    if lease.started_at is None:
        return 0
    end = min([now, *(at for at in (lease.notice_deadline, lease.preempt_at)
                      if at is not None)])
    seconds = int(min((end - lease.started_at).total_seconds(), lease.duration_seconds))
    seconds = max(seconds, 0)
    reported = (detail or {}).get("runner_usage_seconds")
    if status == "failed" and isinstance(reported, int) and 0 <= reported < seconds:
        seconds = reported  # a failure: the buyer pays only the healthy seconds the runner saw
    return seconds


def end_many_locked(leases: list[Lease], *, status: str, cause: str,
                    now: datetime) -> tuple[list[tuple[Lease, int, int]], list[int]]:
    """End `leases` (unended, rows locked, all of one market whose lock the caller
    holds) with `status` — completed, cancelled or preempted, never failed (its faults
    and carried holds are lease_end._end_locked's) — and settle them; returns (lease,
    seconds charged, micro-USD released) for each, in order.

    Statements for the batch: one read of the extensions' holds, one of what they
    captured, settlement.bulk.holds_settle_batch (a fixed few), one UPDATE of the
    leases and one INSERT of their events, one read of webhook endpoints, one UPDATE of
    their GPUs, one reliability read for all their nodes; then the asks' GPUs and states
    (fills_many.return_gpus_to_asks: one read, one UPDATE and one INSERT per state)."""
    if not leases:
        return [], []
    if status == "failed":
        raise ValueError("failed leases end one at a time (lease_end._end_locked)")
    holds_of = {lease.pk: [lease.hold_id] for lease in leases}
    for lease_id, hold_id in (LeaseExtension.objects.filter(lease_id__in=list(holds_of))
                              .order_by("pk").values_list("lease_id", "hold_id")):
        holds_of[lease_id].append(hold_id)
    captured = dict(Hold.objects.filter(pk__in=[pk for ids in holds_of.values() for pk in ids])
                    .values_list("pk", "captured"))
    seconds = [charged_seconds(lease, status=status, now=now, detail=None) for lease in leases]
    # never below what periodic settlement already paid out of the lease's holds
    costs = [max(lease_cost(lease.price, lease.gpu_count, s),
                 sum(captured[pk] for pk in holds_of[lease.pk]))
             for lease, s in zip(leases, seconds, strict=True)]
    settled = ledger_bulk.holds_settle_batch([
        ledger_bulk.Charge(hold_ids=holds_of[lease.pk], cost=cost,
                           provider_id=lease.provider_id, reference=f"lease:{lease.pk}")
        for lease, cost in zip(leases, costs, strict=True)])
    for lease, cost, paid in zip(leases, costs, settled, strict=True):
        lease.ended_at = now
        lease.cause = cause[:300]
        lease.cost = cost
        lease.platform_fee = paid.fee_total  # periodic captures included
        lease.provider_amount = cost - paid.fee_total
        lease.settled_at = now
    Lease.set_status_many(leases, status, causes=[cause] * len(leases),
                          details=[{"seconds": s} for s in seconds], at=now,
                          update_fields=_ENDED_FIELDS)
    if status in LEASE_WEBHOOKS:
        webhooks.emit_many([(lease.buyer_id, LEASE_WEBHOOKS[status], lease_event(lease, cause))
                            for lease in leases])
    for _ in leases:
        metrics.lease_ended(status, cause)
    LeaseGpu.objects.filter(lease_id__in=[lease.pk for lease in leases]).update(active=False)
    # before the asks re-match
    reliability.refresh_nodes(list(dict.fromkeys(lease.node_id for lease in leases)),
                              leases[0].market_id, now)
    back: dict[int, int] = {}
    for lease in leases:
        if lease.ask_id:
            back[lease.ask_id] = back.get(lease.ask_id, 0) + lease.gpu_count
    standing = fills_many.return_gpus_to_asks(returns=list(back.items()), now=now)
    return [(lease, s, paid.released) for lease, s, paid in zip(leases, seconds, settled,
                                                                strict=True)], standing
