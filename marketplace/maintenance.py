"""Maintenance windows (providers.models.MaintenanceWindow; docs/LEASE_CONTRACT.md,
"Maintenance windows"): a provider announces (`announce`) or withdraws (`withdraw`) a
window [starts_at, ends_at) of a node.

- Its asks sell no time past the start of the node's next window not yet over
  (Node.maintenance_from, kept by `_refresh`; locking.sells_until cuts the engine's
  available_until there). A change takes the node's markets' locks as a foreign writer,
  so the book caches are rebuilt.
- Its unended leases that would still run at starts_at get their notice at starts_at
  minus GPUMARKET_PREEMPTION_NOTICE_SECONDS (`give_due_notices`) and end `preempted` at
  starts_at (lease_notice.end_noticed_leases), charged up to starts_at.
- `sweep` (the worker's beat, every second) does both and reopens the asks once a window
  is over.

Errors: NotFound (not your node / window), InvalidInput naming the field (a start less
than the notice period ahead, an end not after the start, an overlap with another window),
Conflict (withdrawing a window that is over).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marketplace import lease_notice, locking
from marketplace.errors import Conflict, InvalidInput, NotFound
from marketplace.models import Lease
from providers.models import Gpu, MaintenanceWindow, Node

log = logging.getLogger("gpumarket.market")

MAX_WINDOW = timedelta(days=31)  # a longer one is a typo; the node can leave the market


def notice_seconds() -> int:
    """The notice period running leases get (the preemption notice setting, reused)."""
    return settings.GPUMARKET_PREEMPTION_NOTICE_SECONDS


def _lock_markets(node_id: int) -> None:
    """Take the market lock of every GPU class the node has units of, in id order (a
    foreign lock holder: the book caches of those markets are rebuilt)."""
    markets = sorted(set(Gpu.every.filter(node_id=node_id).values_list("gpu_class_id",
                                                                       flat=True)))
    for market_id in markets:
        locking.lock_market(market_id)


def _own_node(user_id: int, node_id: int) -> Node:
    node = Node.objects.select_for_update().filter(pk=node_id, provider__user_id=user_id).first()
    if node is None:
        raise NotFound(f"no node {node_id} of yours")
    return node


def _refresh(node: Node, now: datetime) -> None:
    """Node.maintenance_from = the start of its first window not over at `now`."""
    first = (MaintenanceWindow.objects.filter(node=node, ends_at__gt=now)
             .order_by("starts_at").values_list("starts_at", flat=True).first())
    if node.maintenance_from != first:
        node.maintenance_from = first
        node.save(update_fields=["maintenance_from"])


def announce(*, user_id: int, node_id: int, starts_at: datetime, ends_at: datetime,
             reason: str = "", now: datetime | None = None) -> MaintenanceWindow:
    """Announce a window of the user's node. starts_at at least the notice period ahead
    (the running leases' notice), ends_at after it (at most MAX_WINDOW later), overlapping
    no other window of the node; all or nothing."""
    now = now or timezone.now()
    earliest = now + timedelta(seconds=notice_seconds())
    if starts_at < earliest:
        raise InvalidInput(f"must be at least {notice_seconds()} s ahead (the notice "
                           f"running leases get): {earliest.isoformat()} or later",
                           field="starts_at")
    if ends_at <= starts_at:
        raise InvalidInput("must be after the window's start", field="ends_at")
    if ends_at - starts_at > MAX_WINDOW:
        raise InvalidInput(f"a window lasts at most {MAX_WINDOW.days} days", field="ends_at")
    with transaction.atomic():
        if not Node.objects.filter(pk=node_id, provider__user_id=user_id).exists():
            raise NotFound(f"no node {node_id} of yours")
        _lock_markets(node_id)  # market locks first, then the node row (the usual order)
        node = _own_node(user_id, node_id)
        other = (MaintenanceWindow.objects.filter(node=node, starts_at__lt=ends_at,
                                                  ends_at__gt=starts_at)
                 .order_by("starts_at").first())
        if other is not None:
            raise InvalidInput(f"overlaps window {other.pk} ({other.starts_at.isoformat()} – "
                               f"{other.ends_at.isoformat()})", field="starts_at")
        window = MaintenanceWindow.objects.create(node=node, starts_at=starts_at,
                                                  ends_at=ends_at, reason=reason.strip())
        _refresh(node, now)
    log.info("node %s: maintenance window %s announced, %s – %s", node.pk, window.pk,
             starts_at.isoformat(), ends_at.isoformat())
    return window


def withdraw(*, user_id: int, node_id: int, window_id: int,
             now: datetime | None = None) -> None:
    """Withdraw a window not yet over: the notices it gave are taken back (leases whose
    deadline came have ended already), the asks sell its time again."""
    now = now or timezone.now()
    with transaction.atomic():
        if not Node.objects.filter(pk=node_id, provider__user_id=user_id).exists():
            raise NotFound(f"no node {node_id} of yours")
        _lock_markets(node_id)
        node = _own_node(user_id, node_id)
        window = MaintenanceWindow.objects.filter(pk=window_id, node=node).first()
        if window is None:
            raise NotFound(f"no maintenance window {window_id} of node {node_id}",
                           field="window")
        if window.ends_at <= now:
            raise Conflict(f"maintenance window {window_id} is over", field="window")
        for lease in Lease.objects.select_for_update().filter(
                node=node, status__in=Lease.ACTIVE, notice_reason=lease_notice.MAINTENANCE,
                notice_deadline=window.starts_at):
            lease_notice.withdraw_notice(
                lease, reason=lease_notice.MAINTENANCE, now=now,
                cause=f"maintenance window {window.pk} withdrawn by the provider: the notice "
                      "is taken back")
        window.delete()
        _refresh(node, now)
    log.info("node %s: maintenance window %s withdrawn", node_id, window_id)


def _would_overlap(lease: Lease, starts_at: datetime, now: datetime) -> bool:
    """Whether `lease` would still run at `starts_at` (unstarted: if started now)."""
    end = lease.ends_at or now + timedelta(seconds=lease.duration_seconds)
    return end > starts_at


def give_due_notices(*, now: datetime | None = None) -> list[int]:
    """Give the notice of every window within the notice period to its node's unended
    leases that would overlap it; returns the lease ids told. Running it again tells
    nobody twice (lease_notice.give_notice keeps the earliest deadline)."""
    now = now or timezone.now()
    horizon = now + timedelta(seconds=notice_seconds())
    told = []
    for window in (MaintenanceWindow.objects.select_related("node")
                   .filter(starts_at__lte=horizon, ends_at__gt=now).order_by("starts_at")):
        candidates = (Lease.objects.filter(node_id=window.node_id, status__in=Lease.ACTIVE)
                      .filter(Q(notice_deadline__isnull=True)
                              | Q(notice_deadline__gt=window.starts_at))
                      .values_list("pk", flat=True))
        for lease_id in list(candidates):
            with transaction.atomic():
                lease = Lease.objects.select_for_update().get(pk=lease_id)
                if lease.status not in Lease.ACTIVE or not _would_overlap(
                        lease, window.starts_at, now):
                    continue
                reason = f": {window.reason}" if window.reason else ""
                if lease_notice.give_notice(
                        lease, reason=lease_notice.MAINTENANCE, deadline=window.starts_at,
                        now=now,
                        cause=f"notice: node {window.node.name} goes into maintenance at "
                              f"{window.starts_at.isoformat()}{reason}; the lease ends then"):
                    told.append(lease_id)
    if told:
        log.info("maintenance notice given to leases %s", told)
    return told


def reopen_after_windows(*, now: datetime | None = None) -> list[int]:
    """Nodes whose window is over: maintenance_from moves to the next window (or none) and
    their markets' books are rebuilt; returns the node ids."""
    now = now or timezone.now()
    done = []
    for node_id in list(Node.objects.filter(maintenance_from__lte=now)
                        .values_list("pk", flat=True)):
        with transaction.atomic():
            if not MaintenanceWindow.objects.filter(node_id=node_id, starts_at__lte=now,
                                                    ends_at__gt=now).exists():
                _lock_markets(node_id)
                node = Node.objects.select_for_update().get(pk=node_id)
                before = node.maintenance_from
                _refresh(node, now)
                if node.maintenance_from != before:
                    done.append(node_id)
    return done


def sweep(*, now: datetime | None = None) -> dict[str, list[int]]:
    """The beat's round: notices due, leases at their deadline ended, asks reopened."""
    now = now or timezone.now()
    return {"noticed": give_due_notices(now=now),
            "ended": lease_notice.end_noticed_leases(now=now),
            "reopened": reopen_after_windows(now=now)}


def upcoming(node_ids, now: datetime | None = None) -> dict[int, list[MaintenanceWindow]]:
    """{node id: its windows not over at `now`, by start} for the listing pages/API."""
    now = now or timezone.now()
    found: dict[int, list[MaintenanceWindow]] = {}
    for window in MaintenanceWindow.objects.filter(node_id__in=list(node_ids), ends_at__gt=now):
        found.setdefault(window.node_id, []).append(window)
    return found
