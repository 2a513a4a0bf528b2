"""Retiring a node: the provider takes a host out of the market for good.

`retire_node` refuses while the node has an active lease (pending, starting, running) or
an open sealed-bid auction, naming them; otherwise, under the market locks of every
market the node's units and orders are in, it cancels the node's standing asks (no hold
to free: an ask holds nothing; its GPUs stop coming back to the market) and marks the node
retired (providers.services.node_retire_mark: its runner token dies, its websocket
closes). The node is then listed nowhere, takes no ask or auction, and its leases,
fills and earnings stay as they were (docs/MATCHING.md, "Retired nodes").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marketplace import locking, matching
from marketplace.errors import Conflict, NotFound
from marketplace.models import Auction, Lease, Order
from providers.models import Gpu, Node
from providers.services import node_retire_mark

log = logging.getLogger("gpumarket.market")
RETIRE_CAUSE = "its node was retired by the provider"


@dataclass(frozen=True)
class Retired:
    node: Node
    cancelled_asks: list[int]  # the asks this retirement cancelled, by id


def _ids(rows) -> str:
    ids = [f"#{pk}" for pk in rows[:5]]
    return ", ".join(ids) + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")


def refusal(node: Node) -> str | None:
    """Why `node` cannot be retired now (its active leases, its open auctions), or None.
    The node page shows it next to the button."""
    leases = list(Lease.objects.filter(node=node, status__in=Lease.ACTIVE)
                  .order_by("pk").values_list("pk", flat=True))
    if leases:
        n = len(leases)
        return (f"node {node.name} has {n} active lease{'' if n == 1 else 's'} "
                f"({_ids(leases)}): retire it once {'it ends' if n == 1 else 'they end'}")
    lots = list(Auction.objects.filter(node=node, status=Auction.Status.OPEN)
                .order_by("pk").values_list("pk", flat=True))
    if lots:
        n = len(lots)
        return (f"node {node.name} has {n} open sealed-bid auction{'' if n == 1 else 's'} "
                f"({_ids(lots)}): retire it once {'it closes' if n == 1 else 'they close'}")
    return None


def retire_node(*, user_id: int, node_id: int, now: datetime | None = None) -> Retired:
    """Retire the node `node_id` of the provider `user_id`. Raises NotFound (404) for a
    node that is not the user's, Conflict (409, field `node`) naming the active leases or
    open auctions that keep it. A node retired already is returned unchanged."""
    now = now or timezone.now()
    node = Node.objects.filter(pk=node_id, provider__user_id=user_id).first()
    if node is None:
        raise NotFound(f"no node {node_id} of yours", field="node")
    if node.retired_at is not None:
        return Retired(node=node, cancelled_asks=[])
    markets = (set(Gpu.every.filter(node=node).values_list("gpu_class_id", flat=True))
               | set(Order.objects.filter(node=node).values_list("market_id", flat=True))
               | set(Auction.objects.filter(node=node).values_list("market_id", flat=True)))
    with transaction.atomic():
        # lock order: the markets (by id), then the node's row; no lease, fill or sealed
        # close can reach the node while its markets are locked
        for market_id in sorted(markets):
            locking.lock_market(market_id)
        node = Node.objects.select_for_update(of=("self",)).get(pk=node.pk)
        if node.retired_at is not None:
            return Retired(node=node, cancelled_asks=[])
        why = refusal(node)
        if why:
            raise Conflict(why, field="node")
        asks = (Order.objects.filter(node=node, side=Order.Side.ASK)
                .filter(Q(status__in=Order.ACTIVE)
                        | Q(status=Order.Status.FILLED, available_until__gt=now))
                .order_by("pk"))
        cancelled = []
        for ask in asks:
            matching.close_order(ask, "cancelled", RETIRE_CAUSE, now)
            cancelled.append(ask.pk)
        node_retire_mark(node, now=now)
    log.info("node %s retired by user %s; asks cancelled: %s", node.pk, user_id, cancelled)
    return Retired(node=node, cancelled_asks=cancelled)


def is_retired(node_id: int) -> bool:
    """Whether the node is retired (read again under a market lock by place_ask and
    open_auction, so that an ask never lands on a node retired meanwhile)."""
    return Node.objects.filter(pk=node_id, retired_at__isnull=False).exists()
