"""GPU health and the market: an unhealthy GPU is taken out of its node's asks, and put
back (re-matching resting bids) when the runner reports it healthy again.

A silent node (no heartbeat for GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS) is treated the same
way, whole: fail_silent_nodes (a beat task every 15 s) fails its pending/starting/running
leases, charging only up to the last heartbeat, and withdraws all its GPUs from its asks;
its next heartbeat puts them back (providers.services.heartbeat_record sends
gpu_health_changed when a silent node speaks again).

Runs on `providers.signals.gpu_health_changed`, after the heartbeat's commit, and on
`units_changed` after an inventory changed a MIG layout, under the market lock. A MIG
slice is one unit like a GPU; a fatal finding on its parent GPU makes it unhealthy too
(providers.services.heartbeat_record). The GPUs an ask offers never exceed the node's
healthy GPUs of that class that no active lease or open auction holds.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from marketplace.errors import Conflict
from marketplace.lease_end import end_lease
from marketplace.locking import lock_market
from marketplace.matching import return_gpus_to_ask
from marketplace.models import Auction, Lease, LeaseGpu, Order
from providers.models import Gpu, Node
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.health")


def silent_cutoff(now: datetime) -> datetime:
    """A node whose last heartbeat (or, never heartbeating, its registration) is older
    than this is silent."""
    return now - timedelta(seconds=settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS)


def _last_seen(node: Node) -> datetime | None:
    return node.last_heartbeat_at or node.registered_at


def rebalance_asks(*, node: Node) -> None:
    """Shrink or regrow the node's standing asks to its healthy, unleased capacity (none
    while the node is silent)."""
    now = timezone.now()
    node.refresh_from_db(fields=["last_heartbeat_at", "registered_at"])
    last_seen = _last_seen(node)
    silent = last_seen is not None and last_seen < silent_cutoff(now)
    # every market the node has GPUs or asks in (an ask never outlives its GPUs' class)
    market_ids = set(Gpu.objects.filter(node=node).values_list("gpu_class_id", flat=True))
    market_ids |= set(Order.objects.filter(node=node, side=Order.Side.ASK,
                                           status__in=(*Order.ACTIVE, "filled"))
                      .values_list("market_id", flat=True))
    for market_id in sorted(market_ids):
        with transaction.atomic():
            lock_market(market_id)
            asks = list(Order.objects.filter(node=node, market_id=market_id,
                                             side=Order.Side.ASK,
                                             status__in=(*Order.ACTIVE, "filled"))
                        .order_by("-pk"))
            if not asks:
                continue
            healthy_free = (Gpu.objects.filter(node=node, gpu_class_id=market_id, healthy=True)
                            .exclude(lease_gpus__active=True).count())
            in_auctions = sum(Auction.objects.filter(node=node, market_id=market_id,
                                                     status="open")
                              .values_list("gpus", flat=True))
            capacity = 0 if silent else max(healthy_free - in_auctions, 0)
            offered = sum(a.remaining_gpus for a in asks if a.status in Order.ACTIVE)
            excess = offered - capacity
            for ask in asks:  # newest first lose GPUs first
                if excess <= 0 or ask.status not in Order.ACTIVE or not ask.remaining_gpus:
                    continue
                cut = min(excess, ask.remaining_gpus)
                ask.remaining_gpus -= cut
                why = "node missed heartbeats" if silent else "unhealthy"
                ask.note(cause=f"{cut} GPUs withdrawn: {why}", at=now,
                         update_fields=("remaining_gpus",))
                excess -= cut
            room = capacity - max(offered, 0)
            for ask in reversed(asks):  # oldest first regain GPUs
                if room <= 0 or ask.available_until <= now:
                    continue
                leased = sum(Lease.objects.filter(ask=ask, status__in=Lease.ACTIVE)
                             .values_list("gpu_count", flat=True))
                missing = ask.gpus - leased - ask.remaining_gpus
                back = min(room, missing)
                if back > 0:
                    return_gpus_to_ask(ask_id=ask.pk, gpus=back, now=now)
                    room -= back
    log.info("node %s: asks rebalanced to healthy capacity", node.pk)


def on_gpu_health_changed(sender, *, node: Node, unhealthy: list[str], recovered: list[str],
                          back: bool = False, **kwargs) -> None:
    if back:
        log.warning("node %s: heartbeating again after missing heartbeats", node.pk)
    if unhealthy or recovered:
        log.warning("node %s: GPUs unhealthy %s, recovered %s", node.pk, unhealthy, recovered)
        tell_health(node=node, unhealthy=unhealthy, recovered=recovered)
    rebalance_asks(node=node)


def tell_health(*, node: Node, unhealthy: list[str], recovered: list[str]) -> None:
    """`health.finding` webhooks: to the node's provider (every changed GPU) and to the
    buyer of each active lease on one (its GPUs only): {node, lease?, gpus: [{uuid,
    healthy, findings}]}."""
    healthy = {**dict.fromkeys(unhealthy, False), **dict.fromkeys(recovered, True)}
    findings = dict(Gpu.every.filter(node=node, uuid__in=healthy)
                    .values_list("uuid", "findings"))

    def gpus(uuids):
        return [{"uuid": u, "healthy": healthy[u], "findings": findings.get(u) or []}
                for u in uuids]

    held: dict[tuple[int, int], list[str]] = {}
    for lease_id, buyer_id, uuid in (LeaseGpu.objects
                                     .filter(active=True, gpu__node=node, gpu__uuid__in=healthy)
                                     .values_list("lease_id", "lease__buyer_id", "gpu__uuid")):
        held.setdefault((lease_id, buyer_id), []).append(uuid)
    with transaction.atomic():
        webhooks.emit(node.provider.user_id, "health.finding",
                      {"node": node.pk, "gpus": gpus(healthy)})
        for (lease_id, buyer_id), uuids in held.items():
            webhooks.emit(buyer_id, "health.finding",
                          {"node": node.pk, "lease": lease_id, "gpus": gpus(sorted(uuids))})


def on_units_changed(sender, *, node: Node, **kwargs) -> None:
    """A MIG layout changed (providers/mig.py): fit the node's asks to its new units."""
    log.info("node %s: listed units changed (MIG layout)", node.pk)
    rebalance_asks(node=node)


def fail_silent_nodes(*, now: datetime | None = None) -> list[int]:
    """Fail the pending/starting/running leases of every node silent for longer than
    GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS, with the cause "node <name> missed heartbeats
    since <time>", and withdraw the node's GPUs from its asks. Returns the failed lease ids.

    A running lease is charged up to the later of its start and the node's last heartbeat
    (end_lease(now=that time)): the buyer gets the unserved time back. What periodic
    metering already captured stays captured (end_lease never charges less). Safe to run
    twice or concurrently: a lease ended meanwhile is skipped.
    """
    now = now or timezone.now()
    cutoff = silent_cutoff(now)
    silent = (Node.objects.annotate(seen=Coalesce("last_heartbeat_at", "registered_at"))
              .filter(seen__lt=cutoff)
              .filter(Q(leases__status__in=Lease.ACTIVE)
                      | Q(asks__side=Order.Side.ASK, asks__status__in=Order.ACTIVE,
                          asks__remaining_gpus__gt=0))
              .distinct().order_by("pk"))
    failed = []
    for node in silent:
        since = node.seen
        cause = (f"node {node.name} missed heartbeats since "
                 f"{since.astimezone(UTC).isoformat(timespec='seconds')}")
        for lease in Lease.objects.filter(node=node, status__in=Lease.ACTIVE).order_by("pk"):
            # started after the last heartbeat (events still came through): charge nothing
            # past the start; never started: nothing to charge, ended now
            end = max(lease.started_at, since) if lease.started_at else now
            try:
                end_lease(lease_id=lease.pk, status="failed", cause=cause, now=end,
                          detail={"last_heartbeat_at": since.isoformat()})
            except Conflict:
                continue  # ended by the runner or another sweep meanwhile
            failed.append(lease.pk)
            log.warning("lease %s failed: %s", lease.pk, cause)
        rebalance_asks(node=node)
    return failed
