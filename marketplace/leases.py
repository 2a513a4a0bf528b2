"""Leases: created from a fill or a sealed-bid win, driven by the runner's reports,
ended and settled exactly once.

Lifecycle (marketplace.models.Lease.TRANSITIONS):
pending → starting → running → completed | failed | preempted, and
pending/starting → failed | cancelled. Each move is recorded with time and cause.

Billing: the lease clock starts when the runner reports `running`; at the end the
buyer pays price × gpus × seconds // 3600 for the seconds that ran (capped at the
leased duration), the provider gets 85 % and the platform 15 % (settlement.split),
and the rest of the lease's hold returns to the buyer — one journal entry. A long
lease is also metered every GPUMARKET_METER_INTERVAL_SECONDS (default hourly):
what it owes so far is captured and split then, so the provider is paid for what
ran even if the lease later fails; the final settlement captures only the rest.

Preemption: an interruptible lease outbid by a resting bid is scheduled by
marketplace/book.py (`preempt_at`, `preempted_for`, an event with the deadline).
`preempt_due_leases` (beat, every second) ends each due one `preempted` through
end_lease, under the market lock: charged from started_at to the moment it is ended
(0 if it never ran), its GPUs back to the ask, which fills the waiting bid. Called off
(event, `preempt_at` cleared) when the waiting bid is no longer active by then; the
lease is then offered at once to the other resting bids (book.reconsider_preemptions).
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.errors import Conflict, InvalidInput
from marketplace.models import Fill, GpuClass, Lease, LeaseGpu, Order
from marketplace.states import IllegalTransition
from providers.models import Gpu, Node
from settlement import services as ledger
from settlement.models import Hold
from settlement.money import lease_cost

log = logging.getLogger("gpumarket.leases")


MAX_PORTS = 8
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?$")


def clean_ports(ports: list[int] | None, *, field: str = "ports") -> list[int]:
    """A bid's container ports to expose: at most MAX_PORTS distinct TCP ports, each
    1–65535 (booleans refused); returned sorted. None or [] → []. Raises InvalidInput
    naming `field`."""
    if not ports:
        return []
    if not isinstance(ports, list) or len(ports) > MAX_PORTS:
        raise InvalidInput(f"must be a list of at most {MAX_PORTS} ports", field=field)
    for port in ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidInput(f"{port!r} is not a TCP port (1 to 65535)", field=field)
    if len(set(ports)) != len(ports):
        raise InvalidInput("lists a port twice", field=field)
    return sorted(ports)


def clean_endpoints(lease: Lease, endpoints: list[dict] | None) -> list[dict]:
    """The endpoints a runner reports for `lease` ([{container_port, host, host_port}]),
    checked: each container_port one the lease asked for, at most once; host a host name
    or an IP address (no scheme, no path, not 0.0.0.0 or ::, which nobody can reach);
    host_port 1–65535. Returned in container-port order. Raises InvalidInput naming
    `endpoints[i].<field>`."""
    out, seen = [], set()
    for i, e in enumerate(endpoints or []):
        port, host, host_port = e.get("container_port"), e.get("host"), e.get("host_port")
        if port not in (lease.ports or []):
            raise InvalidInput(f"port {port} is not one this lease exposes "
                               f"({', '.join(map(str, lease.ports)) or 'none'})",
                               field=f"endpoints[{i}].container_port")
        if port in seen:
            raise InvalidInput("is reported twice", field=f"endpoints[{i}].container_port")
        seen.add(port)
        if not isinstance(host, str) or not _HOST.match(host) or host in ("0.0.0.0", "::"):
            raise InvalidInput("must be the host name or IP address buyers connect to",
                               field=f"endpoints[{i}].host")
        if isinstance(host_port, bool) or not isinstance(host_port, int) \
                or not 1 <= host_port <= 65535:
            raise InvalidInput("must be a TCP port (1 to 65535)",
                               field=f"endpoints[{i}].host_port")
        out.append({"container_port": port, "host": host, "host_port": host_port})
    return sorted(out, key=lambda e: e["container_port"])


def endpoint_text(endpoint: dict) -> str:
    """"host:port" ("[v6]:port" for an IPv6 address), as the buyer connects to it."""
    host = endpoint["host"]
    return f"[{host}]:{endpoint['host_port']}" if ":" in host else \
        f"{host}:{endpoint['host_port']}"


def _pick_gpus(node: Node, market: GpuClass, count: int) -> list[Gpu]:
    """`count` healthy GPUs of the class on `node` that are in no active lease, by bus id.
    The partial unique index on LeaseGpu makes a double booking fail even if two
    writers raced here."""
    free = list(
        Gpu.objects.filter(node=node, gpu_class=market, healthy=True)
        .exclude(lease_gpus__active=True)
        .order_by("pci_bus_id")[:count]
    )
    if len(free) < count:
        raise Conflict(f"node {node.name} has only {len(free)} free {market.slug} GPUs, "
                       f"{count} needed")
    return free


def create_lease(*, market: GpuClass, buyer_id: int, provider_id: int, node: Node, gpus: int,
                 price: int, duration_seconds: int, image: str, command: list[str] | None,
                 now: datetime, cause: str, fill: Fill | None = None, ask: Order | None = None,
                 sealed_bid=None, hold_id: int | None = None,
                 interruptible: bool = False, ports: list[int] | None = None) -> Lease:
    """Create a pending lease on `gpus` free GPUs of `node`, secured by a hold of its full
    cost at `price` (a new hold unless `hold_id` is given). Runs in the caller's
    transaction, under the market lock."""
    chosen = _pick_gpus(node, market, gpus)
    if hold_id is None:
        hold_id = ledger.hold_place(
            buyer_id=buyer_id, amount=lease_cost(price, gpus, duration_seconds),
            reference=f"lease-of:{fill.pk if fill else sealed_bid.pk}",
        ).pk
    lease = Lease.objects.create(
        market=market, buyer_id=buyer_id, provider_id=provider_id, node=node, price=price,
        gpu_count=gpus, duration_seconds=duration_seconds,
        image=image or settings.GPUMARKET_DEFAULT_IMAGE, command=command, fill=fill, ask=ask,
        sealed_bid=sealed_bid, hold_id=hold_id, interruptible=interruptible,
        ports=list(ports or []),
    )
    LeaseGpu.objects.bulk_create([LeaseGpu(lease=lease, gpu=g) for g in chosen])
    lease.events.create(from_status="", to_status="pending", at=now, cause=cause,
                        detail={"gpus": [g.uuid for g in chosen]})
    log.info("lease %s: %s × %s on node %s for %s s at %s/GPU-h", lease.pk, gpus, market.slug,
             node.name, duration_seconds, price)
    return lease


def lease_from_fill(*, fill: Fill, bid: Order, ask: Order, now: datetime) -> Lease:
    return create_lease(
        market=fill.market, buyer_id=bid.owner_id, provider_id=ask.owner_id, node=ask.node,
        gpus=fill.gpus, price=fill.price, duration_seconds=bid.duration_seconds,
        image=bid.image, command=bid.command, now=now, fill=fill, ask=ask,
        cause=f"fill {fill.pk}: bid {bid.pk} × ask {ask.pk}", interruptible=bid.interruptible,
        ports=bid.ports,
    )


def gpu_uuids(lease: Lease) -> list[str]:
    return list(lease.lease_gpus.order_by("gpu__pci_bus_id").values_list("gpu__uuid", flat=True))


def mark_starting(*, lease: Lease, container_id: str = "") -> Lease:
    with transaction.atomic():
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        if lease.status == Lease.Status.STARTING:
            return lease
        lease.container_id = container_id or lease.container_id
        _move(lease, "starting", cause="runner is starting the container",
              update_fields=("container_id",))
    return lease


def mark_running(*, lease: Lease, container_id: str, now: datetime | None = None,
                 endpoints: list[dict] | None = None) -> Lease:
    """The runner's container is up: start the lease clock (started_at, ends_at) and keep
    the endpoints it published (clean_endpoints; InvalidInput when one is wrong). A
    repeated report (same container) changes nothing but endpoints it newly carries."""
    now = now or timezone.now()
    with transaction.atomic():
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        cleaned = clean_endpoints(lease, endpoints) if endpoints is not None else None
        if lease.status == Lease.Status.RUNNING and lease.container_id == container_id:
            if cleaned and cleaned != lease.endpoints:
                lease.endpoints = cleaned
                lease.save(update_fields=["endpoints"])
            return lease  # a repeated report changes nothing else
        lease.container_id = container_id
        lease.started_at = now
        lease.ends_at = now + timedelta(seconds=lease.duration_seconds)
        lease.endpoints = cleaned or []
        _move(lease, "running", cause=f"container {container_id[:12]} running", at=now,
              update_fields=("container_id", "started_at", "ends_at", "endpoints"))
    log.info("lease %s: running in container %s", lease.pk, container_id[:12])
    return lease


def _move(lease: Lease, to: str, *, cause: str, at: datetime | None = None,
          update_fields: tuple[str, ...] = (), detail: dict | None = None) -> None:
    try:
        lease.set_status(to, cause=cause, at=at, update_fields=update_fields, detail=detail)
    except IllegalTransition as exc:
        raise Conflict(str(exc)) from None


def end_lease(*, lease_id: int, status: str, cause: str, now: datetime | None = None,
              detail: dict | None = None) -> Lease:
    """End a lease (completed, failed, preempted or cancelled) and settle it, once.

    Charged seconds: from started_at to `now`, at most the leased duration (0 if it
    never ran). One journal entry pays provider and platform by the take-rate split and
    releases the rest of the hold. The GPUs become free and return to the ask they were
    sold from. Raises Conflict if the lease has already ended.
    """
    from marketplace.book import lock_market, return_gpus_to_ask

    now = now or timezone.now()
    market_id = Lease.objects.values_list("market_id", flat=True).get(pk=lease_id)
    with transaction.atomic():
        lock_market(market_id)
        lease = Lease.objects.select_for_update().get(pk=lease_id)
        if lease.status in Lease.ENDED:
            raise Conflict(f"lease {lease_id} has already ended ({lease.status})")
        seconds = 0
        if lease.started_at is not None:
            seconds = int(min((now - lease.started_at).total_seconds(), lease.duration_seconds))
            seconds = max(seconds, 0)
            reported = (detail or {}).get("runner_usage_seconds")
            if status == "failed" and isinstance(reported, int) and 0 <= reported < seconds:
                # a failure: the buyer pays only the healthy seconds the runner saw
                seconds = reported
        # never below what periodic settlement already paid out of the hold
        cost = max(lease_cost(lease.price, lease.gpu_count, seconds),
                   Hold.objects.values_list("captured", flat=True).get(pk=lease.hold_id))
        settled = ledger.hold_settle(hold_id=lease.hold_id, cost=cost,
                                     provider_id=lease.provider_id,
                                     reference=f"lease:{lease.pk}")
        lease.ended_at = now
        lease.cause = cause[:300]
        lease.cost = cost
        lease.platform_fee = settled.fee_total  # periodic captures included
        lease.provider_amount = cost - settled.fee_total
        lease.settled_at = now
        _move(lease, status, cause=cause, at=now, detail={**(detail or {}), "seconds": seconds},
              update_fields=("ended_at", "cause", "cost", "provider_amount", "platform_fee",
                             "settled_at"))
        lease.lease_gpus.update(active=False)
        if lease.ask_id:
            return_gpus_to_ask(ask_id=lease.ask_id, gpus=lease.gpu_count, now=now)
    log.info("lease %s: %s after %s s; cost %s = provider %s + platform %s; released %s",
             lease.pk, status, seconds, cost, lease.provider_amount, lease.platform_fee,
             settled.released)
    return lease


def end_overdue_leases(*, now: datetime | None = None) -> list[int]:
    """End running leases whose ends_at passed more than GPUMARKET_LEASE_GRACE_SECONDS ago
    without the runner reporting the end. Charged up to ends_at only."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.GPUMARKET_LEASE_GRACE_SECONDS)
    ended = []
    for lease_id in Lease.objects.filter(status=Lease.Status.RUNNING, ends_at__lt=cutoff) \
            .values_list("pk", flat=True):
        try:
            end_lease(lease_id=lease_id, status="completed",
                      cause="lease time is over; the runner did not report the end")
        except Conflict:
            continue  # ended by the runner meanwhile
        ended.append(lease_id)
    return ended


def preempt_lease(*, lease_id: int, now: datetime | None = None) -> Lease | None:
    """End lease `lease_id` `preempted` if its preemption is due at `now`, under the market
    lock; returns it, or None when there is nothing to do (already ended, not scheduled,
    not yet due) or the preemption was called off because the bid it was for is no
    longer active. Safe to run twice or concurrently: the second run finds it ended."""
    from marketplace.book import lock_market, reconsider_preemptions

    now = now or timezone.now()
    market_id = Lease.objects.values_list("market_id", flat=True).get(pk=lease_id)
    with transaction.atomic():
        lock_market(market_id)
        lease = Lease.objects.select_for_update().get(pk=lease_id)
        if lease.status in Lease.ENDED or lease.preempt_at is None or lease.preempt_at > now:
            return None
        bid = Order.objects.get(pk=lease.preempted_for_id)
        if bid.status not in Order.ACTIVE or (bid.expires_at and bid.expires_at <= now):
            gone = bid.status if bid.status not in Order.ACTIVE else "expired"
            lease.preempt_at = None
            lease.save(update_fields=["preempt_at"])
            lease.events.create(from_status=lease.status, to_status=lease.status, at=now,
                                cause=f"preemption called off: the bid it was for is {gone}")
            log.info("lease %s: preemption called off (bid %s %s)", lease.pk, bid.pk, gone)
            reconsider_preemptions(market_id, now)  # it may be another resting bid's now
            return None
        return end_lease(
            lease_id=lease.pk, status="preempted", now=now,
            cause=f"preempted at {now.isoformat()} for a higher bid (notice deadline "
                  f"{lease.preempt_at.isoformat()})",
            detail={"preempt_at": lease.preempt_at.isoformat()})


def preempt_due_leases(*, now: datetime | None = None) -> list[int]:
    """End every unended lease whose `preempt_at` has come (one transaction each);
    returns the ids preempted by this run. Running it again changes nothing."""
    now = now or timezone.now()
    due = (Lease.objects.filter(status__in=Lease.ACTIVE, preempt_at__lte=now)
           .order_by("preempt_at", "pk").values_list("pk", flat=True))
    return [lease_id for lease_id in list(due) if preempt_lease(lease_id=lease_id, now=now)]


def meter_lease(*, lease_id: int, now: datetime | None = None) -> int | None:
    """Capture what a running lease owes up to `now` (whole metering periods only).

    The period index is floor(seconds run / GPUMARKET_METER_INTERVAL_SECONDS); each
    index is captured at most once (settlement.hold_capture's idempotency key), so a
    retried or duplicated run changes nothing. Returns the micro-USD captured, or None.
    """
    now = now or timezone.now()
    interval = settings.GPUMARKET_METER_INTERVAL_SECONDS
    with transaction.atomic():
        lease = Lease.objects.select_for_update().get(pk=lease_id)
        if lease.status != Lease.Status.RUNNING or lease.started_at is None:
            return None
        ran = min(int((now - lease.started_at).total_seconds()), lease.duration_seconds)
        period = ran // interval
        if period <= 0:
            return None
        through = lease_cost(lease.price, lease.gpu_count, period * interval)
        settled = ledger.hold_capture(hold_id=lease.hold_id, through_cost=through,
                                      provider_id=lease.provider_id,
                                      reference=f"lease:{lease.pk}", period=str(period))
    if settled is None:
        return None
    log.info("lease %s: metered through %s s, captured %s", lease_id, period * interval,
             settled.split.gross)
    return settled.split.gross


def meter_running_leases(*, now: datetime | None = None) -> list[int]:
    """Meter every running lease; returns the ids that were charged this run."""
    now = now or timezone.now()
    charged = []
    for lease_id in Lease.objects.filter(status=Lease.Status.RUNNING).values_list("pk",
                                                                                  flat=True):
        if meter_lease(lease_id=lease_id, now=now):
            charged.append(lease_id)
    return charged
