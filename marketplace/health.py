"""GPU health and the market: an unhealthy GPU is taken out of its node's asks, and put
back (re-matching resting bids) when the runner reports it healthy again.

Runs on `providers.signals.gpu_health_changed`, after the heartbeat's commit, under
the market lock. The GPUs an ask offers never exceed the node's healthy GPUs of that
class that no active lease or open auction holds.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from marketplace.book import lock_market, return_gpus_to_ask
from marketplace.models import Auction, Lease, Order
from providers.models import Gpu, Node

log = logging.getLogger("gpumarket.health")


def rebalance_asks(*, node: Node) -> None:
    """Shrink or regrow the node's standing asks to its healthy, unleased capacity."""
    now = timezone.now()
    for market_id in (Gpu.objects.filter(node=node).order_by().values_list("gpu_class_id",
                                                                            flat=True)
                      .distinct()):
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
            capacity = max(healthy_free - in_auctions, 0)
            offered = sum(a.remaining_gpus for a in asks if a.status in Order.ACTIVE)
            excess = offered - capacity
            for ask in asks:  # newest first lose GPUs first
                if excess <= 0 or ask.status not in Order.ACTIVE or not ask.remaining_gpus:
                    continue
                cut = min(excess, ask.remaining_gpus)
                ask.remaining_gpus -= cut
                ask.save(update_fields=["remaining_gpus"])
                ask.events.create(from_status=ask.status, to_status=ask.status, at=now,
                                  cause=f"{cut} GPUs withdrawn: unhealthy")
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
                          **kwargs) -> None:
    log.warning("node %s: GPUs unhealthy %s, recovered %s", node.pk, unhealthy, recovered)
    rebalance_asks(node=node)
