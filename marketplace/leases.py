"""Lease records: created from a fill or a sealed-bid win (`create_lease`), moved by the
runner's reports (`mark_starting`, `mark_running`), metered while they run
(`meter_lease`). Lifecycle: marketplace.models.Lease.TRANSITIONS, every move recorded.

Billing: price × gpus × seconds // 3600 for the seconds that ran, split 85/15
(settlement.split); long leases are captured each GPUMARKET_METER_INTERVAL_SECONDS.
Ending and settling a lease under the market lock: marketplace/lease_end.py.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from core import metrics
from core.bulk import execute_arrays
from marketplace import interconnect, ssh_keys
from marketplace.env_templates import cuda_ok
from marketplace.errors import Conflict
from marketplace.jupyter import new_jupyter_token
from marketplace.models import Fill, GpuClass, Lease, LeaseExtension, LeaseGpu, Order
from marketplace.ports import clean_endpoints
from marketplace.runtimes import can_run, needs_command
from marketplace.states import IllegalTransition
from providers.models import Gpu, Node
from settlement import bulk as ledger_bulk
from settlement import services as ledger
from settlement.money import lease_cost
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.leases")


def _pick_gpus(node: Node, market: GpuClass, count: int, nvlink_gang: int = 0) -> list[Gpu]:
    """`count` healthy GPUs of the class on `node` that are in no active lease, by bus id;
    with `nvlink_gang`, whole gangs of that many GPUs all NVLink-connected
    (interconnect.pick, the rule the engine counted with). The partial unique index on
    LeaseGpu makes a double booking fail even if two writers raced here."""
    if not nvlink_gang:  # one query, as every fill of the bid path makes a lease
        free = sorted(Gpu.objects.filter(node=node, gpu_class=market, healthy=True)
                      .exclude(lease_gpus__active=True),
                      key=lambda g: interconnect.gpu_order(g.uuid, g.pci_bus_id))
        if len(free) < count:
            raise Conflict(f"node {node.name} has only {len(free)} free {market.slug} GPUs, "
                           f"{count} needed")
        return free[:count]
    uuids = interconnect.pick(node.pk, market.pk, count, nvlink_gang)
    if uuids is None:
        free_count = len(interconnect.free_gpus(node.pk, market.pk)[0])
        raise Conflict(f"node {node.name} has {free_count} free {market.slug} GPUs: not "
                       f"{count} in NVLink-connected gangs of {nvlink_gang}")
    by_uuid = Gpu.objects.in_bulk(uuids, field_name="uuid")
    return [by_uuid[u] for u in uuids]


def _locked(node: Node, market: GpuClass, chosen: list[Gpu]) -> list[Gpu]:
    """`chosen`, once each is locked (FOR UPDATE, by primary key: the order a new MIG
    layout or a health change locks a node's units, providers/services.py), so that a
    layout change cannot delete or unlist them before this lease commits. One it deleted,
    unlisted or marked unhealthy meanwhile is gone when the lock is had: a Conflict naming
    `gpus` (409; nothing is written; RUNNER_PROTOCOL.md, "A layout change racing a lease")."""
    gone = units_gone([g.pk for g in chosen])
    if gone:
        raise Conflict(f"the units of node {node.name} changed while this lease was being "
                       f"made (a new MIG layout or a health change): {gone}"
                       f" of the {market.slug} units picked for it left the market; nothing "
                       "was written: retry", field="gpus")
    return chosen


def units_gone(gpu_ids: list[int]) -> int:
    """Lock the units `gpu_ids` (FOR UPDATE, by primary key: see _locked) and return how
    many of them are gone (deleted, or no longer healthy) once the lock is had."""
    locked = (Gpu.objects.select_for_update().filter(pk__in=gpu_ids, healthy=True)
              .order_by("pk").values_list("pk", flat=True))
    return len(gpu_ids) - len(list(locked))


def _next_lease_id() -> int:
    """The id the next lease takes, so that its hold, placed first, can name it:
    "lease:<id>". PostgreSQL: its sequence's next value. SQLite (the demo's default): one
    writer at a time, and the caller holds the market lock, whose write came first, so the
    largest id + 1 is this transaction's alone."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))",
                           [Lease._meta.db_table])
            return cursor.fetchone()[0]
    return (Lease.objects.aggregate(last=Max("pk"))["last"] or 0) + 1


def next_lease_ids(count: int) -> list[int]:
    """The ids the next `count` leases take (as _next_lease_id, in one statement)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id')) "
                           "FROM generate_series(1, %s)", [Lease._meta.db_table, count])
            return [row[0] for row in cursor.fetchall()]
    last = Lease.objects.aggregate(last=Max("pk"))["last"] or 0
    return list(range(last + 1, last + 1 + count))


def create_lease(*, market: GpuClass, buyer_id: int, provider_id: int, node: Node, gpus: int,
                 price: int, duration_seconds: int, image: str, command: list[str] | None,
                 now: datetime, cause: str, fill: Fill | None = None, ask: Order | None = None,
                 sealed_bid=None, hold_id: int | None = None,
                 interruptible: bool = False, ports: list[int] | None = None,
                 template: str = "", min_cuda: str = "",
                 port_roles: dict[str, str] | None = None, ssh: bool = False,
                 env: dict[str, str] | None = None, secrets_sealed: str = "",
                 nvlink_gang: int = 0, checkpoint: dict | None = None,
                 checkpoint_sealed: str = "", failover: bool = False,
                 min_reliability=None, notice_signal: str = "",
                 stop_grace_seconds: int = 10) -> Lease:
    """Create a pending lease on `gpus` free GPUs of `node` (in NVLink-connected gangs of
    `nvlink_gang` when given), secured by a hold of its full cost at `price` (a new hold
    unless `hold_id` is given). Runs in the caller's transaction, under the market lock;
    Conflict (nothing written) when the node cannot give them. The hold is named
    "lease:<id>" (a given one, a sealed bid's, is renamed so). The bid's workload terms
    are copied (template, min_cuda, port_roles, ssh, env, its sealed secrets and its
    checkpoint store with its sealed credentials, as they are, the stop terms
    notice_signal and stop_grace_seconds);
    a node below `min_cuda` is refused (Conflict naming min_cuda: matching never gets here
    with one, docs/MATCHING.md), and so is a process-only node without `command`
    (runtimes.py); with `ssh`, the buyer's SSH public keys as they are now
    (ssh_keys.authorized_lines); a lease with a "jupyter" port role gets a new Jupyter
    token, sealed (jupyter.py)."""
    check_node(node, min_cuda=min_cuda, command=command)
    chosen = _locked(node, market, _pick_gpus(node, market, gpus, nvlink_gang))
    lease_id = _next_lease_id()
    if hold_id is None:
        hold_id = ledger.hold_place(
            buyer_id=buyer_id, amount=lease_cost(price, gpus, duration_seconds),
            reference=f"lease:{lease_id}",
        ).pk
    else:
        ledger.hold_relabel(hold_id=hold_id, reference=f"lease:{lease_id}")
    lease = lease_row(
        lease_id=lease_id, hold_id=hold_id, market=market, buyer_id=buyer_id,
        provider_id=provider_id, node=node, gpus=gpus, price=price,
        duration_seconds=duration_seconds, image=image, command=command, fill=fill, ask=ask,
        sealed_bid=sealed_bid, interruptible=interruptible, ports=ports, template=template,
        min_cuda=min_cuda, port_roles=port_roles, ssh=ssh, env=env,
        secrets_sealed=secrets_sealed, checkpoint=checkpoint,
        checkpoint_sealed=checkpoint_sealed, failover=failover,
        min_reliability=min_reliability, notice_signal=notice_signal,
        stop_grace_seconds=stop_grace_seconds)
    lease.save(force_insert=True)
    LeaseGpu.objects.bulk_create([LeaseGpu(lease=lease, gpu=g) for g in chosen])
    lease.created(cause=cause, at=now, detail={"gpus": [g.uuid for g in chosen]})
    log.info("lease %s: %s × %s on node %s for %s s at %s/GPU-h", lease.pk, gpus, market.slug,
             node.name, duration_seconds, price)
    return lease


def check_node(node: Node, *, min_cuda: str, command: list[str] | None) -> None:
    """Conflict when `node` cannot run the lease: CUDA below `min_cuda` (naming min_cuda),
    or a process-only node without `command` (runtimes.py)."""
    if not cuda_ok(node.cuda_version, min_cuda):
        raise Conflict(f"node {node.name} reports CUDA {node.cuda_version or 'unknown'}, "
                       f"below the {min_cuda} this lease needs", field="min_cuda")
    if not can_run(node.runtime, command):
        raise Conflict(f"command {needs_command(f'node {node.name}')}", field="command")


def lease_row(*, lease_id: int, hold_id: int, market: GpuClass, buyer_id: int,
              provider_id: int, node: Node, gpus: int, price: int, duration_seconds: int,
              image: str, command: list[str] | None, fill: Fill | None = None,
              ask: Order | None = None, sealed_bid=None, interruptible: bool = False,
              ports: list[int] | None = None, template: str = "", min_cuda: str = "",
              port_roles: dict[str, str] | None = None, ssh: bool = False,
              env: dict[str, str] | None = None, secrets_sealed: str = "",
              checkpoint: dict | None = None, checkpoint_sealed: str = "",
              failover: bool = False, min_reliability=None, notice_signal: str = "",
              stop_grace_seconds: int = 10) -> Lease:
    """The unsaved pending Lease `create_lease` writes (id and hold given): the terms
    copied, the buyer's SSH keys read when `ssh`, a new sealed Jupyter token for a
    "jupyter" port role."""
    port_roles = dict(port_roles or {})
    return Lease(
        pk=lease_id, market=market, buyer_id=buyer_id, provider_id=provider_id, node=node,
        price=price,
        gpu_count=gpus, duration_seconds=duration_seconds,
        image=image or settings.GPUMARKET_DEFAULT_IMAGE, command=command, fill=fill, ask=ask,
        sealed_bid=sealed_bid, hold_id=hold_id, interruptible=interruptible,
        ports=list(ports or []), template=template, min_cuda=min_cuda,
        port_roles=port_roles, ssh=ssh,
        ssh_public_keys=ssh_keys.authorized_lines(buyer_id) if ssh else [],
        env=dict(env or {}), secrets_sealed=secrets_sealed,
        checkpoint=dict(checkpoint or {}), checkpoint_sealed=checkpoint_sealed,
        notice_signal=notice_signal, stop_grace_seconds=stop_grace_seconds,
        jupyter_token_sealed=new_jupyter_token(port_roles),
        failover=failover, min_reliability=min_reliability,
    )


def fill_terms(*, fill: Fill, bid: Order, ask: Order) -> dict:
    """create_lease's arguments (but `now`) for a fill of `bid` × `ask`."""
    return {
        "market": fill.market, "buyer_id": bid.owner_id, "provider_id": ask.owner_id,
        "node": ask.node, "gpus": fill.gpus, "price": fill.price,
        "duration_seconds": bid.duration_seconds, "image": bid.image,
        "command": bid.command, "fill": fill, "ask": ask,
        "cause": f"fill {fill.pk}: bid {bid.pk} × ask {ask.pk}",
        "interruptible": bid.interruptible, "ports": bid.ports, "template": bid.template,
        "min_cuda": bid.min_cuda, "port_roles": bid.port_roles, "ssh": bid.ssh,
        "env": bid.env, "secrets_sealed": bid.secrets_sealed, "checkpoint": bid.checkpoint,
        "checkpoint_sealed": bid.checkpoint_sealed, "notice_signal": bid.notice_signal,
        "stop_grace_seconds": bid.stop_grace_seconds,
        "nvlink_gang": bid.gang_size if bid.interconnect == "nvlink" else 0,
        "failover": bid.failover, "min_reliability": bid.min_reliability,
    }


def lease_from_fill(*, fill: Fill, bid: Order, ask: Order, now: datetime) -> Lease:
    lease = create_lease(**fill_terms(fill=fill, bid=bid, ask=ask), now=now)
    if bid.continues_lease_id:  # a bid resting for a failed lease's remaining time
        _join_chain(lease, bid, now)
    return lease


def _join_chain(lease: Lease, bid: Order, now: datetime) -> None:
    """The first lease of a bid resting for failed lease `bid.continues_lease_id`
    (marketplace/failover.py) continues that lease's chain; the failed lease says so."""
    failed = Lease.objects.filter(pk=bid.continues_lease_id).first()
    if failed is None or Lease.objects.filter(continues=failed).exists():
        return
    lease.chain_id, lease.continues = failed.chain, failed
    lease.save(update_fields=["chain_id", "continues"])
    failed.note(cause=f"continued as lease {lease.pk} on node {lease.node.name} at "
                      f"{now.strftime('%H:%M:%S')} (resting bid {bid.pk})",
                detail={"continuation": lease.pk}, at=now)


def hold_ids(lease: Lease) -> list[int]:
    """The holds securing `lease`, in the order a charge fills them: its own hold, then
    one per extension (oldest first)."""
    extra = LeaseExtension.objects.filter(lease=lease).order_by("pk").values_list("hold_id",
                                                                                 flat=True)
    return [lease.hold_id, *extra]


def gpu_uuids(lease: Lease) -> list[str]:
    return list(lease.lease_gpus.order_by("gpu__pci_bus_id").values_list("gpu__uuid", flat=True))


MAX_PROGRESS_EVENTS = 500  # progress notes kept as events per lease; later ones update only


def mark_starting(*, lease: Lease, container_id: str = "", progress: str = "") -> Lease:
    """The runner is starting the lease (pending → starting), or says how far it got
    (`progress`, e.g. an image pull's "312 MiB of 1024 MiB"): stored in `progress` and
    recorded as a starting → starting event when it changed (at most
    MAX_PROGRESS_EVENTS of them). The lease clock does not run before `running`.
    Conflict (409) for a lease past starting."""
    with transaction.atomic():
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        if lease.status != Lease.Status.STARTING:
            lease.container_id = container_id or lease.container_id
            move(lease, "starting", cause="runner is starting the container",
                  update_fields=("container_id",))
        progress = progress.strip()[:300]
        if progress and progress != lease.progress:
            lease.progress = progress
            notes = lease.events.filter(from_status="starting", to_status="starting")
            if notes.count() < MAX_PROGRESS_EVENTS:
                lease.note(cause=progress[:200], update_fields=("progress",))
            else:
                lease.save(update_fields=["progress"])
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
        move(lease, "running", cause=f"container {container_id[:12]} running", at=now,
              update_fields=("container_id", "started_at", "ends_at", "endpoints"))
        metrics.lease_running(lease.market.slug, lease.created_at, now)
    log.info("lease %s: running in container %s", lease.pk, container_id[:12])
    return lease


def move(lease: Lease, to: str, *, cause: str, at: datetime | None = None,
          update_fields: tuple[str, ...] = (), detail: dict | None = None) -> None:
    """set_status, with an illegal move answered as Conflict (the API's 409)."""
    try:
        lease.set_status(to, cause=cause, at=at, update_fields=update_fields, detail=detail)
    except IllegalTransition as exc:
        raise Conflict(str(exc)) from None
    if to in LEASE_WEBHOOKS:
        webhooks.emit(lease.buyer_id, LEASE_WEBHOOKS[to], lease_event(lease, cause))


# a lease's move → the webhook event its buyer gets (docs/WEBHOOKS.md)
LEASE_WEBHOOKS = {"running": "lease.started", "completed": "lease.stopped",
                  "cancelled": "lease.stopped", "preempted": "lease.stopped",
                  "failed": "lease.failed"}


def lease_event(lease: Lease, cause: str) -> dict:
    """A lease's webhook payload: ids, status and cause, integer micro-USD, ISO times."""
    def iso(t):
        return t.isoformat() if t else None
    return {"lease": lease.pk, "status": lease.status, "cause": cause[:300],
            "node": lease.node_id, "gpus": lease.gpu_count, "price_usd_micros": lease.price,
            "started_at": iso(lease.started_at), "ends_at": iso(lease.ends_at),
            "ended_at": iso(lease.ended_at), "cost_usd_micros": lease.cost}


def meter_lease(*, lease_id: int, now: datetime | None = None) -> int | None:
    """Capture what a running lease owes up to `now` (whole metering periods only).

    The period index is floor(seconds run / GPUMARKET_METER_INTERVAL_SECONDS); each
    index is captured at most once (settlement.hold_capture_many's idempotency key), so a
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
        settled = ledger.hold_capture_many(hold_ids=hold_ids(lease), through_cost=through,
                                           provider_id=lease.provider_id,
                                           reference=f"lease:{lease.pk}", period=str(period))
    if settled is None:
        return None
    log.info("lease %s: metered through %s s, captured %s", lease_id, period * interval,
             settled.split.gross)
    return settled.split.gross


METER_BATCH = 1000  # running leases metered per transaction (bench/README.md, "Metering")


def meter_running_leases(*, now: datetime | None = None, batch: int = METER_BATCH) -> list[int]:
    """Meter every running lease, `batch` leases per transaction (meter_leases); returns
    the ids that were charged this run."""
    now = now or timezone.now()
    ids = list(Lease.objects.filter(status=Lease.Status.RUNNING).order_by("pk")
               .values_list("pk", flat=True))
    charged: list[int] = []
    for start in range(0, len(ids), batch):
        charged += meter_leases(lease_ids=ids[start:start + batch], now=now)
    return charged


def meter_leases(*, lease_ids: list[int], now: datetime) -> list[int]:
    """meter_lease of each of `lease_ids`, set-based: the running leases' rows locked in
    one statement, their extensions' holds read in one, and one
    settlement.bulk.holds_capture_batch for all (the same entries, holds and
    idempotency keys meter_lease writes). Returns the ids charged; logs one line."""
    interval = settings.GPUMARKET_METER_INTERVAL_SECONDS
    with transaction.atomic():
        rows = _running_lease_rows(lease_ids, now)
        charges, leases = [], []
        for pk, price, gpus, ran, provider_id, hold_ids in rows:
            period = ran // interval
            if period <= 0:
                continue
            charges.append(ledger_bulk.Charge(
                hold_ids=hold_ids, cost=lease_cost(price, gpus, period * interval),
                provider_id=provider_id, reference=f"lease:{pk}", period=str(period)))
            leases.append(pk)
        settled = ledger_bulk.holds_capture_batch(charges)
    charged = [pk for pk, paid in zip(leases, settled, strict=True) if paid is not None]
    if charged:
        log.info("metered %s leases (%s to %s), captured %s", len(charged), charged[0],
                 charged[-1], sum(paid.split.gross for paid in settled if paid is not None))
    return charged


def _running_lease_rows(lease_ids: list[int], now: datetime) -> list[tuple]:
    """The running, started leases of `lease_ids` locked in primary-key order, read with
    their extensions' holds (one statement, the ids as one array): (id, price, gpus,
    whole seconds run by `now` but at most the duration, provider id, hold ids: the
    lease's own, then its extensions' in the order made), as meter_lease counts them (the
    seconds computed by PostgreSQL: no timestamps to parse)."""
    if connection.vendor == "postgresql":
        return [(*row[:5], [row[5], *row[6]]) for row in execute_arrays(
            connection, "SELECT id, price, gpu_count, LEAST(trunc(extract(epoch FROM "
            "%s::timestamptz - started_at))::bigint, duration_seconds), provider_id, hold_id, "
            "ARRAY(SELECT e.hold_id FROM marketplace_leaseextension e "
            "WHERE e.lease_id = marketplace_lease.id ORDER BY e.id) "
            "FROM marketplace_lease WHERE id = ANY(%s::bigint[]) AND status = %s "
            "AND started_at IS NOT NULL ORDER BY id FOR UPDATE OF marketplace_lease",
            [now, list(lease_ids), Lease.Status.RUNNING.value])]
    rows = list(Lease.objects.select_for_update()
                .filter(pk__in=lease_ids, status=Lease.Status.RUNNING,
                        started_at__isnull=False).order_by("pk")
                .values_list("pk", "price", "gpu_count", "started_at", "duration_seconds",
                             "provider_id", "hold_id"))
    extra: dict[int, list[int]] = {}
    for lease_id, hold_id in (LeaseExtension.objects.filter(lease_id__in=[r[0] for r in rows])
                              .order_by("pk").values_list("lease_id", "hold_id")):
        extra.setdefault(lease_id, []).append(hold_id)
    return [(pk, price, gpus, min(int((now - started).total_seconds()), duration), provider,
             [hold, *extra.get(pk, [])])
            for pk, price, gpus, started, duration, provider, hold in rows]
