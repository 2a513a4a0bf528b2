"""Reliability records of nodes and providers (issue 15, docs/FAULTS.md "Reliability").

Over a window (7 or 30 days, by `ended_at`): `completed` = leases that ended completed,
`failed` = leases that ended failed by a provider-side cause (Lease.fault "provider");
reliability = completed / (completed + failed) as a Decimal with 3 places, None when the
window holds neither (a new node: it meets any `min_reliability`). `recover_seconds`: the
median seconds from a provider-caused failure to its continuation running (None: none).
Preempted, cancelled and buyer-caused or unknown failures count for nobody.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, Decimal
from statistics import median

from django.db.models import Count, F, Q
from django.utils import timezone

from core.bulk import update_all
from marketplace.models import GpuClass, Lease
from providers.models import Node

WINDOWS_DAYS = (7, 30)
#: the window `min_reliability` is compared with
MATCH_WINDOW_DAYS = 30


@dataclass(frozen=True)
class Record:
    days: int
    completed: int
    failed: int
    reliability: Decimal | None
    recover_seconds: int | None

    def as_dict(self) -> dict:
        return {"days": self.days, "completed": self.completed, "failed": self.failed,
                "reliability": None if self.reliability is None else str(self.reliability),
                "recover_seconds": self.recover_seconds}


def ratio(completed: int, failed: int) -> Decimal | None:
    """completed / (completed + failed), floored to 3 places; None when both are 0."""
    if completed + failed == 0:
        return None
    return (Decimal(completed) / Decimal(completed + failed)).quantize(
        Decimal("0.001"), rounding=ROUND_FLOOR)


def _scope(node_id: int | None, provider_id: int | None) -> Q:
    return Q(node_id=node_id) if node_id is not None else Q(provider_id=provider_id)


def record(*, days: int, node_id: int | None = None, provider_id: int | None = None,
           now: datetime | None = None) -> Record:
    """The record of one node (or, with provider_id, of all of a provider's nodes)."""
    now = now or timezone.now()
    leases = Lease.objects.filter(_scope(node_id, provider_id),
                                  ended_at__gte=now - timedelta(days=days))
    counts = leases.aggregate(
        completed=Count("pk", filter=Q(status="completed")),
        failed=Count("pk", filter=Q(status="failed", fault="provider")))
    waits = [int((started - ended).total_seconds()) for ended, started in
             leases.filter(status="failed", fault="provider",
                           continuation__started_at__isnull=False)
             .values_list("ended_at", "continuation__started_at")]
    return Record(days=days, completed=counts["completed"], failed=counts["failed"],
                  reliability=ratio(counts["completed"], counts["failed"]),
                  recover_seconds=int(median(waits)) if waits else None)


def records(*, node_id: int | None = None, provider_id: int | None = None,
            now: datetime | None = None) -> list[dict]:
    """Both windows, as the API shows them: [{days, completed, failed, reliability,
    recover_seconds}]."""
    return [record(days=d, node_id=node_id, provider_id=provider_id, now=now).as_dict()
            for d in WINDOWS_DAYS]


def node_reliability(node_id: int, now: datetime | None = None) -> Decimal | None:
    return record(days=MATCH_WINDOW_DAYS, node_id=node_id, now=now).reliability


def by_node(node_ids, now: datetime | None = None) -> dict[int, Decimal | None]:
    """{node id: 30-day reliability (None: no record)} in one query."""
    now = now or timezone.now()
    rows = (Lease.objects.filter(node_id__in=list(node_ids),
                                 ended_at__gte=now - timedelta(days=MATCH_WINDOW_DAYS))
            .values("node_id")
            .annotate(completed=Count("pk", filter=Q(status="completed")),
                      failed=Count("pk", filter=Q(status="failed", fault="provider"))))
    out: dict[int, Decimal | None] = dict.fromkeys(node_ids)
    for row in rows:
        out[row["node_id"]] = ratio(row["completed"], row["failed"])
    return out


def meets(node_id: int, minimum: Decimal | None, now: datetime | None = None) -> bool:
    """Whether the node qualifies for a bid's `min_reliability` (no minimum, or no
    record yet: yes)."""
    if minimum is None:
        return True
    have = node_reliability(node_id, now)
    return have is None or have >= minimum


def refresh_node(node_id: int, market_id: int, now: datetime | None = None) -> None:
    """Store the node's 30-day reliability on it (Node.reliability: what the book and the
    offers table read). The caller holds market `market_id`'s lock: when the figure
    changed, that market's cached books are marked stale (its asks of the node carry it;
    docs/MATCHING.md "The book cache"); another market's books see it at their next
    rebuild."""
    new = node_reliability(node_id, now)
    if Node.objects.filter(pk=node_id).exclude(reliability=new).update(reliability=new):
        GpuClass.objects.filter(pk=market_id).update(book_rebuild_version=F("book_version") + 1)


def refresh_nodes(node_ids: list[int], market_id: int, now: datetime | None = None) -> None:
    """refresh_node for several nodes of one market (a batch of lease ends): one read of
    their records (by_node) and of their stored figures, one UPDATE of the nodes whose
    figure changed, and the market's books marked stale once if any did."""
    fresh = by_node(node_ids, now)
    stored = dict(Node.objects.filter(pk__in=node_ids).values_list("pk", "reliability"))
    changed = [pk for pk in node_ids if pk in stored and stored[pk] != fresh[pk]]
    # one UPDATE for all (core.bulk): the instances carry only the key and the figure
    update_all([Node(pk=pk, reliability=fresh[pk]) for pk in changed], ["reliability"])
    if changed:
        GpuClass.objects.filter(pk=market_id).update(book_rebuild_version=F("book_version") + 1)
