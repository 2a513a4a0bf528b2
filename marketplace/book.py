"""Continuous auction services: place and cancel bids and asks, and expire orders, each
matched by the engine (marketplace/engine) under its market's lock (locking.py).

Writers here run as book.py's own writers (`locking.tracked`) and may use the book
cache; fills are written by matching.py, preemptions scheduled by preemption.py.
The book cache, the lock and the preemption rule: docs/MATCHING.md.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Q, Sum
from django.db.models.signals import post_save
from django.utils import timezone

from core import metrics
from core.bulk import execute_arrays, insert_all
from marketplace import locking, matching, offers, preemption, runtimes
from marketplace.checkpoints import Checkpoint
from marketplace.env_templates import check_terms
from marketplace.errors import Conflict, InvalidInput, MarketBusy, NotFound, PermissionDenied
from marketplace.lease_notice import check_stop_terms
from marketplace.models import GpuClass, Interconnect, Lease, Order
from marketplace.ports import clean_port_roles, clean_ports, with_ssh
from marketplace.sealing import same_secrets, seal
from marketplace.ssh_keys import require_key
from marketplace.workload_env import clean_env_and_secrets
from providers import node_images
from providers.models import Gpu, Node
from providers.services import runner_heard
from settlement import services as ledger
from settlement.models import Hold
from settlement.money import MAX_USD_MICROS

log = logging.getLogger("gpumarket.market")

MAX_GPUS = 4096
MAX_DURATION_SECONDS = 366 * 24 * 3600
CLIENT_ORDER_ID = re.compile(r"\A[A-Za-z0-9._:-]{1,64}\Z")
CLIENT_ID_CONSTRAINT = "order_client_id_unique_per_owner"
NVLINK_GANG_OF_ONE = ("needs a gang of 2 GPUs or more: one GPU has no NVLink peer to require "
                      "(give gang_size, or leave interconnect out)")


def get_market(slug: str) -> GpuClass:
    try:
        return GpuClass.objects.get(slug=slug)
    except GpuClass.DoesNotExist:
        raise InvalidInput(f"unknown GPU class '{slug}'", field="gpu_class") from None



def node_market(node: Node, market_slug: str | None) -> GpuClass:
    """The market of an ask or auction on `node`: `market_slug`, one of the node's GPU
    classes, or (None) the node's only class. Raises Conflict naming `node` when it has
    no GPUs registered, InvalidInput naming `gpu_class` for a class it lacks or when a
    node of several classes names none."""
    classes = list(node.gpus.order_by().values_list("gpu_class__slug", flat=True).distinct())
    unsliced = _mig_without_slices(node, market_slug)
    if unsliced and (not classes or market_slug not in (None, *classes)):
        raise Conflict(f"node {node.name} offers no GPU of {unsliced[0]}: GPU {unsliced[1]} is "
                       "MIG-enabled with no MIG devices, and a MIG-enabled GPU is never leased "
                       "whole; create MIG devices (nvidia-smi mig -cgi … -C) or disable MIG, "
                       "then run gpumarket-runner register again", field="node")
    if not classes:
        raise Conflict("this node has no registered GPUs yet: run gpumarket-runner register",
                       field="node")
    require_heartbeating(node)
    if market_slug is None:
        if len(classes) > 1:
            raise InvalidInput("this node has several GPU classes: name one", field="gpu_class")
        market_slug = classes[0]
    elif market_slug not in classes:
        raise InvalidInput(f"node {node.name} has no {market_slug} GPUs", field="gpu_class")
    return get_market(market_slug)


def checked_hold_amount(*, price: int, gpus: int, duration_seconds: int) -> int:
    """bid_hold_amount, refused (InvalidInput on `price`) when it floors to zero or
    exceeds the largest amount the ledger accepts."""
    amount = matching.bid_hold_amount(price=price, gpus=gpus, duration_seconds=duration_seconds)
    if amount <= 0:
        raise InvalidInput("price × gpus × duration rounds down to 0 micro-USD: raise the "
                           "price or the duration", field="price")
    if amount > MAX_USD_MICROS:
        raise InvalidInput("price × gpus × duration is larger than the largest amount "
                           "accepted", field="price")
    return amount



@dataclass(frozen=True)
class Placed:
    """The order placed and the leases its matching made. `created` is False when a
    `client_order_id` was already used: `order` is then the first order with that id and
    `leases` every lease made from its fills so far."""

    order: Order
    leases: list[Lease]
    created: bool = True


def _check_client_order_id(client_order_id: str | None) -> None:
    if client_order_id is not None and not CLIENT_ORDER_ID.fullmatch(client_order_id):
        raise InvalidInput("must be 1 to 64 characters of A–Z, a–z, 0–9, '.', '_', ':' or '-'",
                           field="client_order_id")


def _replay(owner_id: int, client_order_id: str | None,
            terms: dict[str, Any], secrets: dict[str, str] | None = None) -> Placed | None:
    """The first order of `owner_id` with `client_order_id`, as a Placed, or None.

    A replay must repeat the first order's `terms` (its field values, by Order attribute;
    `market` by slug): one that differs is a client reusing an id by mistake, refused with
    Conflict naming client_order_id and the first differing field (Stripe's rule for
    idempotency keys, "Idempotent requests": the same key with other parameters is an
    error), so it never believes a different order was placed. `secrets` (a bid's, in
    clear) are compared with what the first order sealed."""
    if client_order_id is None:
        return None
    order = (Order.objects.select_related("market")
             .filter(owner_id=owner_id, client_order_id=client_order_id).first())
    if order is None:
        return None
    for name, wanted in terms.items():
        have = order.market.slug if name == "market" else getattr(order, name)
        if have != wanted:
            raise Conflict(f"'{client_order_id}' was used for order {order.pk} with another "
                           f"{name.removesuffix('_id')}: a replay must repeat its terms",
                           field="client_order_id")
    if order.side == Order.Side.BID and not same_secrets(order.secrets_sealed, secrets or {}):
        raise Conflict(f"'{client_order_id}' was used for order {order.pk} with other "
                       "secrets: a replay must repeat its terms", field="client_order_id")
    leases = list(Lease.objects.filter(Q(fill__bid=order) | Q(fill__ask=order)).order_by("pk"))
    return Placed(order=order, leases=leases, created=False)


def _is_client_id_clash(exc: IntegrityError) -> bool:
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == CLIENT_ID_CONSTRAINT
    return "client_order_id" in str(exc)  # SQLite names the columns instead


def expire_orders(*, now: datetime | None = None) -> list[int]:
    """Expire every active order past its expires_at (bids) or available_until (asks),
    one market at a time under its lock; returns the ids expired. Safe to run
    concurrently and again: an order already expired is no longer active."""
    now = now or timezone.now()
    market_ids = sorted(set(
        Order.objects.filter(status__in=Order.ACTIVE)
        .filter(matching.past_due(now))
        .values_list("market_id", flat=True)))
    expired: list[int] = []
    for market_id in market_ids:
        with locking.tracked(market_id), transaction.atomic():
            expired += matching.expire_due(locking.lock_market(market_id), now)
    if expired:
        log.info("expired orders %s", expired)
    return expired


def _mig_without_slices(node: Node, market_slug: str | None) -> tuple[str, str] | None:
    """(class slug, UUID) of a GPU of `node` (of `market_slug`, when given) registered
    MIG-enabled with no listed slice: registered, never offered (docs/RUNNER_PROTOCOL.md,
    "MIG slices")."""
    parents = Gpu.every.filter(node=node, parent=None, listed=False, mig_mode="Enabled")
    if market_slug is not None:
        parents = parents.filter(gpu_class__slug=market_slug)
    found = (parents.exclude(slices__listed=True).order_by("uuid")
             .values_list("gpu_class__slug", "uuid").first())
    return tuple(found) if found else None


def require_heartbeating(node: Node) -> None:
    """Conflict naming `node` unless its runner is heard from (providers.services.
    runner_heard): never heard, or silent past GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS (when
    its leases are failed: marketplace/health.py), it offers nothing."""
    heard = runner_heard(node)
    if heard == "never":
        raise Conflict(f"node {node.name} has never sent a heartbeat: start its runner "
                       "(gpumarket-runner run) before offering its GPUs", field="node")
    if heard == "silent":
        seen = node.last_heartbeat_at.astimezone(UTC).isoformat(timespec="seconds")
        raise Conflict(f"node {node.name} is silent (no heartbeat since {seen}): start its "
                       "runner (gpumarket-runner run) before offering its GPUs", field="node")


def free_gpu_count(node: Node, market: GpuClass) -> int:
    """Healthy GPUs of `market`'s class on `node` that no active lease, standing ask or
    open auction already covers (an unhealthy GPU is never offered)."""
    free = (node.gpus.filter(gpu_class=market, healthy=True)
            .exclude(lease_gpus__active=True).count())
    offered = sum(Order.objects.filter(node=node, market=market, side=Order.Side.ASK,
                                       status__in=Order.ACTIVE)
                  .values_list("remaining_gpus", flat=True))
    auctioned = sum(node.auctions.filter(status="open", market=market)
                    .values_list("gpus", flat=True))
    return max(free - offered - auctioned, 0)


def _check_common(*, price: int, gpus: int) -> None:
    if price <= 0:
        raise InvalidInput("must be greater than zero", field="price")
    if not 0 < gpus <= MAX_GPUS:
        raise InvalidInput(f"must be between 1 and {MAX_GPUS}", field="gpus")


@dataclass(frozen=True)
class BidRequest:
    """One bid, the one shape every way in builds (the API's OrderInSerializer.bid_request,
    place_bid's keywords) and place_bids takes.

    price: micro-USD per GPU-hour; gpus: GPUs wanted; duration_seconds: lease length;
    gang_size: GPUs per node (None: all on one node); time_in_force: GTC, IOC or FOK;
    image/command: the container; expires_at: when a resting bid expires (None: never);
    client_order_id: the buyer's own id, unique per buyer (see _replay); interruptible:
    its leases may be preempted by a higher bid; ports: container TCP ports its leases
    expose (ports.clean_ports); template, min_cuda: as env_templates.resolve returns them
    (the API resolves a template into these terms; a min_cuda fills only against asks on
    nodes whose CUDA version meets it); port_roles: {"8888": "jupyter"}
    (ports.clean_port_roles); ssh: its leases get the buyer's SSH keys, port 22 (role ssh)
    added (ports.with_ssh); env / secrets: {NAME: value} for the workload (workload_env;
    secrets in clear here, sealed when written: never in a log or an answer);
    notice_signal, stop_grace_seconds: its leases' stop terms (lease_notice.py).
    checkpoint: the bid's store (checkpoints.Checkpoint, probed by the API; None: none),
    its credentials sealed when written (`checkpoint_sealed`), never in a repr; node: the
    one node it fills on (a node of the offers; None: any).
    """

    buyer_id: int
    market_slug: str
    price: int
    gpus: int
    duration_seconds: int
    gang_size: int | None = None
    time_in_force: str = "GTC"
    image: str = ""
    command: list[str] | None = None
    expires_at: datetime | None = None
    client_order_id: str | None = None
    interruptible: bool = False
    ports: list[int] | None = None
    template: str = ""
    min_cuda: str = ""
    port_roles: dict[str, str] | None = None
    ssh: bool = False
    env: dict[str, str] | None = None
    secrets: dict[str, str] | None = field(default=None, repr=False)
    interconnect: str = "any"
    checkpoint: Checkpoint | None = field(default=None, repr=False)
    failover: bool | None = None  # None: true unless interruptible (docs/FAULTS.md)
    min_reliability: Decimal | None = None
    avoid_node_id: int | None = None  # failover's resting bid: never on the failed node
    node: int | None = None  # fill only on this node (offers.check_bid_node)
    notice_signal: str = ""
    stop_grace_seconds: int = 10
    prefer_cached_image: bool = False  # same-price asks of nodes holding the image first

    def terms(self) -> dict[str, Any]:
        """The bid's order, by Order attribute (`market` by slug; not its owner, id or
        what is left): what _write_bids writes and a replay must repeat (_replay), in
        the order a replay compares them. Ports sorted, as clean_ports returns them.
        Not the secrets: they are sealed apart (`sealed_secrets`), and a replay compares
        them opened."""
        ports, roles = with_ssh(self.ports, self.port_roles, self.ssh)
        return {"side": Order.Side.BID, "market": self.market_slug, "price": self.price,
                "gpus": self.gpus, "duration_seconds": self.duration_seconds,
                "gang_size": self.gpus if self.gang_size is None else self.gang_size,
                "time_in_force": self.time_in_force, "image": self.image,
                "command": self.command, "expires_at": self.expires_at,
                "interruptible": bool(self.interruptible), "ports": ports,
                "template": self.template, "min_cuda": self.min_cuda,
                "port_roles": roles, "ssh": bool(self.ssh), "env": dict(self.env or {}),
                "interconnect": self.interconnect,
                "checkpoint": dict(self.checkpoint.terms) if self.checkpoint else {},
                "failover": (not self.interruptible) if self.failover is None
                else bool(self.failover),
                "min_reliability": self.min_reliability, "avoid_node_id": self.avoid_node_id,
                "node_id": self.node, "notice_signal": self.notice_signal,
                "stop_grace_seconds": self.stop_grace_seconds,
                "prefer_cached_image": bool(self.prefer_cached_image)}


def place_bid(bid: BidRequest | None = None, /, *, now: datetime | None = None,
              **fields: Any) -> Placed:
    """Place one bid — `bid`, or the BidRequest its keyword `fields` make: hold its cost,
    match it, rest what is left (GTC) until cancelled, filled or `expires_at`. A resting
    bid schedules the preemption of interruptible leases it outbids (docs/MATCHING.md,
    "Preemption"). Placing a client_order_id again returns the first order
    (created=False) and writes nothing; again with other terms is a Conflict (_replay).
    Raises InvalidInput naming the field, and settlement.InsufficientFunds when the hold
    cannot be placed; in every refusal nothing is written.
    """
    if bid is None:
        bid = BidRequest(**fields)
    elif fields:
        raise TypeError("place_bid takes a BidRequest or its fields, not both")
    result = place_bids([bid], now=now)[0]
    if isinstance(result, Exception):
        raise result
    return result


def place_bids(requests: list[BidRequest], *,
               now: datetime | None = None) -> list[Placed | Exception]:
    """Place several bids, each exactly as place_bid would, as if one after the other in
    the order given — but with one transaction, one market lock and a fixed number of
    statements per market for all of them (group commit: the API's order endpoint gathers
    concurrent bids into one call, marketplace/api/bid_batcher.py).

    Returns, per request, its Placed or the exception refusing it (InvalidInput,
    InsufficientFunds, …): a refused bid writes nothing and does not affect the others.
    An unexpected error while writing a group of several bids makes each of them run
    again alone, so that error belongs to the bid that causes it only. A client_order_id
    that appears twice in one call (same buyer) is placed once; the second answers as a
    replay of the first.
    """
    now = now or timezone.now()
    results: list[Placed | Exception | None] = [None] * len(requests)
    markets: dict[str, GpuClass] = {}
    largest: dict[int, int] = {}  # market id → the most units one node has in it
    images: dict[int, bool] = {}  # market id → whether a node of it runs images
    groups: dict[int, list[tuple[int, BidRequest, int]]] = {}
    seen_ids: set[tuple[int, str]] = set()
    again: list[int] = []  # a client_order_id repeated within this call
    for i, r in enumerate(requests):
        try:
            _check_client_order_id(r.client_order_id)
            replayed = _replay(r.buyer_id, r.client_order_id, r.terms(), r.secrets)
            if replayed is not None:
                results[i] = replayed
                continue
            if r.client_order_id is not None:
                if (r.buyer_id, r.client_order_id) in seen_ids:
                    again.append(i)
                    continue
                seen_ids.add((r.buyer_id, r.client_order_id))
            market = markets.get(r.market_slug) or get_market(r.market_slug)
            markets[r.market_slug] = market
            hold_amount = _check_bid(r, now)
            if market.pk not in largest:
                largest[market.pk] = largest_node(market)
            _check_fits_a_node(r, market, largest[market.pk])
            if not r.command:  # the image's own command: a node must run images
                if market.pk not in images:
                    images[market.pk] = runtimes.market_runs_images(market.pk)
                if not images[market.pk]:
                    raise InvalidInput(runtimes.needs_command(f"every node of {market.slug}"),
                                       field="command")
            if r.node is not None:
                offers.check_bid_node(r.node, market, r.gpus if r.gang_size is None
                                      else r.gang_size)
        except Exception as exc:  # each refusal is that bid's answer
            results[i] = exc
            continue
        groups.setdefault(market.pk, []).append((i, r, hold_amount))
    for market_id, items in groups.items():
        for (i, _, _), result in zip(items, _place_group(market_id, items, now), strict=True):
            results[i] = result
    metrics.order_outcomes("bid", results)  # (the repeated ones count in the call below)
    if again:
        for i, result in zip(again, place_bids([requests[i] for i in again], now=now),
                             strict=True):
            results[i] = result
    return results  # type: ignore[return-value]  (every slot is filled)


def largest_node(market: GpuClass) -> int:
    """The most listed units (GPUs, or slices in a profile market) of `market` that one
    node has; 0 when no node has any."""
    counts = (Gpu.objects.filter(gpu_class=market).values("node").annotate(units=Count("pk"))
              .order_by("-units").values_list("units", flat=True)[:1])
    return next(iter(counts), 0)


def _check_fits_a_node(r: BidRequest, market: GpuClass, largest: int) -> None:
    """Conflict (409) for a gang larger than the largest node of the market: a gang runs on
    one node, so it could never fill (docs/MATCHING.md, "Gangs larger than any node")."""
    gang = r.gpus if r.gang_size is None else r.gang_size
    if 0 < largest < gang:
        unit = "MIG slices" if market.parent_id else "GPUs"
        field = "gpus" if gang == r.gpus else "gang_size"
        raise Conflict(f"a gang of {gang} runs on one node, and the largest node of "
                       f"{market.slug} has {largest} {unit}: ask for at most {largest}, or "
                       "split the bid into gangs with gang_size", field=field)


def _check_bid(r: BidRequest, now: datetime) -> int:
    """The checks of place_bid that need no lock; returns the hold amount (micro-USD)."""
    gang_size = r.gpus if r.gang_size is None else r.gang_size
    _check_common(price=r.price, gpus=r.gpus)
    if not 0 < r.duration_seconds <= MAX_DURATION_SECONDS:
        raise InvalidInput("must be between 1 second and 366 days", field="hours")
    if gang_size <= 0 or r.gpus % gang_size:
        raise InvalidInput(f"must divide gpus ({r.gpus})", field="gang_size")
    if r.time_in_force not in Order.TimeInForce.values:
        raise InvalidInput("must be GTC, IOC or FOK", field="time_in_force")
    if r.interconnect not in Interconnect.values:
        raise InvalidInput("must be any or nvlink", field="interconnect")
    if r.interconnect == Interconnect.NVLINK and gang_size == 1:
        raise InvalidInput(NVLINK_GANG_OF_ONE, field="interconnect")
    if r.expires_at is not None and r.expires_at <= now:
        raise InvalidInput("must be in the future", field="expires_at")
    ports, roles = with_ssh(r.ports, r.port_roles, r.ssh)
    ports = clean_ports(ports)
    check_terms(ports=ports, port_roles=roles, min_cuda=r.min_cuda, env=r.env)
    check_stop_terms(r.notice_signal, r.stop_grace_seconds)
    clean_port_roles(roles, ports)
    clean_env_and_secrets(r.env, r.secrets)
    require_key(r.buyer_id, r.ssh)
    if r.prefer_cached_image and not r.image:
        raise InvalidInput("needs an image (the bid's or its template's): nodes are "
                           "preferred for holding it", field="prefer_cached_image")
    return checked_hold_amount(price=r.price, gpus=r.gpus, duration_seconds=r.duration_seconds)


def _place_group(market_id: int, items: list[tuple[int, BidRequest, int]],
                 now: datetime) -> list[Placed | Exception]:
    """One market's bids in one transaction; alone again when the group fails."""
    try:
        with locking.tracked(market_id), transaction.atomic():
            return _write_bids(market_id, [(r, amount) for _, r, amount in items], now)
    except _Regroup:
        return [_place_group(market_id, [item], now)[0] for item in items]
    except MarketBusy as exc:  # every bid of the group waited: none is placed
        return [exc] * len(items)
    except Exception as exc:
        if len(items) > 1:
            log.warning("a group of %d bids failed (%r); placing them one by one",
                        len(items), exc)
            return [_place_group(market_id, [item], now)[0] for item in items]
        r = items[0][1]
        # the same client_order_id raced in from another request (possibly another
        # market): that one committed first and stands
        if isinstance(exc, IntegrityError) and _is_client_id_clash(exc):
            try:
                replayed = _replay(r.buyer_id, r.client_order_id, r.terms(), r.secrets)
            except Conflict as conflict:
                return [conflict]
            if replayed is not None:
                return [replayed]
        return [exc]


@metrics.timed_group
def _write_bids(market_id: int, items: list[tuple[BidRequest, int]],
                now: datetime) -> list[Placed | Exception]:
    """Under the market lock: insert the orders (of bids _check_bid passed), hold their
    cost (one statement each for all of them), then match them one by one in the given
    order."""
    market = locking.lock_market(market_id)
    anything_due, victims_possible = _group_flags(market.pk, now)
    if anything_due:
        matching.expire_due(market, now)
        victims_possible = preemption.candidates_exist(market)
    book = locking.load_book(market)  # before the new orders exist: each is submitted below
    orders = []
    for r, _ in items:
        order = Order(**{**r.terms(), "market": market}, owner_id=r.buyer_id,
                      remaining_gpus=r.gpus, client_order_id=r.client_order_id or "",
                      secrets_sealed=seal(r.secrets or {}),
                      checkpoint_sealed=r.checkpoint.sealed() if r.checkpoint else "")
        locking.touch(order)
        orders.append(order)
    orders = insert_all(orders)
    holds = ledger.holds_place_many([(o.owner_id, amount, f"order:{o.pk}")
                                     for o, (_, amount) in zip(orders, items, strict=True)])
    refused = [o.pk for o, h in zip(orders, holds, strict=True) if not isinstance(h, Hold)]
    if refused:
        Order.objects.filter(pk__in=refused).delete()
    placed = [o for o, h in zip(orders, holds, strict=True) if isinstance(h, Hold)]
    for order, hold in zip(placed, [h for h in holds if isinstance(h, Hold)], strict=True):
        order.hold_id = hold.pk
    if placed:
        _set_hold_ids(placed)
        insert_all([o.created_event(cause="bid placed", at=now) for o in placed])
    leases_of: dict[int, list[Lease]] = {}
    holding: dict[str, frozenset[int]] = {}  # image → nodes holding it (preferring bids)
    for order in placed:
        bid = locking.engine_bid(order)
        if order.prefer_cached_image and order.image:
            if order.image not in holding:
                holding[order.image] = frozenset(node_images.nodes_holding(order.image))
            bid.prefer = holding[order.image]
        result = book.submit_bid(bid, locking.epoch(now))
        leases: list[Lease] = []
        if result.fills or result.killed or result.self_trade_cancels or not result.rested:
            leases = matching.apply_result(market, order, result, now)
            victims_possible = victims_possible or any(x.interruptible for x in leases)
        if any(x.interruptible for x in leases):
            preemption.reconsider_preemptions(market.pk, now, through_bid=order.pk)  # `order` too
        elif victims_possible and order.status in Order.ACTIVE and order.remaining_gpus > 0:
            preemption.schedule_preemption(market, order, now)
        leases_of[order.pk] = leases
    # A hold is refused before any bid is matched, but one by one, an earlier bid of the
    # same buyer that filled (its hold moved to the lease at the trade price, never more)
    # or was cancelled would have given money back first: then place them one by one.
    released = {o.owner_id for o in placed if o.status != "open"}
    if any(o.owner_id in released for o, h in zip(orders, holds, strict=True)
           if not isinstance(h, Hold)):
        raise _Regroup
    using = Order.objects.db
    for order in placed:
        post_save.send(sender=Order, instance=order, created=True, raw=False, using=using,
                       update_fields=None)
    return [Placed(order=o, leases=leases_of[o.pk]) if isinstance(h, Hold) else h
            for o, h in zip(orders, holds, strict=True)]


class _Regroup(Exception):
    """Roll the group back and place its bids one by one (see _write_bids)."""


def _set_hold_ids(orders: list[Order]) -> None:
    """Save each order's hold_id, in one UPDATE (arrays on PostgreSQL: Django's
    bulk_update builds an expression object per row, which dominated a group's cost)."""
    connection = transaction.get_connection()
    if connection.vendor != "postgresql":
        Order.objects.bulk_update(orders, ["hold_id"])
        return
    execute_arrays(connection,
                   'UPDATE "marketplace_order" SET "hold_id" = h.hold_id FROM '
                   'unnest(%s::bigint[], %s::bigint[]) AS h(id, hold_id) '
                   'WHERE "marketplace_order"."id" = h.id',
                   [[o.pk for o in orders], [o.hold_id for o in orders]])


def _group_flags(market_id: int, now: datetime) -> tuple[bool, bool]:
    """(any active order of the market past its time, any lease of it preemptible at all)
    in one round trip: the two questions every group of bids asks under the lock, almost
    always answered no (then expire_due's and the preemption search's ORM queries are
    skipped). The same conditions as past_due and candidates_exist."""
    orders, leases = Order._meta.db_table, Lease._meta.db_table
    # the states and the side are written into the statement, not bound, so that the
    # planner sees the partial indexes' predicates (also in a generic plan)
    active = ", ".join(f"'{v}'" for v in Order.ACTIVE)
    unended = ", ".join(f"'{v}'" for v in Lease.ACTIVE)
    sql = (f'SELECT EXISTS (SELECT 1 FROM "{orders}" WHERE "market_id" = %s '  # noqa: S608
           f'AND "status" IN ({active}) AND ("expires_at" <= %s '
           f"OR (\"side\" = '{Order.Side.ASK}' AND \"available_until\" <= %s))), "
           f'EXISTS (SELECT 1 FROM "{leases}" WHERE "market_id" = %s AND "interruptible" '
           f'AND "status" IN ({unended}) AND "preempt_at" IS NULL AND "ask_id" IS NOT NULL)')
    params = [market_id, now, now, market_id]
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(sql, params)
        due, preemptible = cursor.fetchone()
    return bool(due), bool(preemptible)


@metrics.counted_ask
def place_ask(*, provider_id: int, node_id: int, market_slug: str | None, price: int,
              gpus: int, available_until: datetime, client_order_id: str | None = None,
              now: datetime | None = None) -> Placed:
    """Offer `gpus` GPUs of a node at `price` micro-USD per GPU-hour until
    `available_until` (then it expires), matching resting bids at their prices.

    client_order_id: as for place_bid. Raises NotFound/PermissionDenied for a node that
    is not the provider's, and InvalidInput naming the field for more GPUs than are free
    or a past window.
    """
    now = now or timezone.now()
    _check_client_order_id(client_order_id)
    terms = {"side": Order.Side.ASK, "node_id": node_id, "price": price, "gpus": gpus,
             "available_until": available_until}
    if market_slug is not None:  # (None: the node's only class)
        terms["market"] = market_slug
    replayed = _replay(provider_id, client_order_id, terms)
    if replayed is not None:
        return replayed
    try:
        node = Node.objects.select_related("provider").get(pk=node_id)
    except Node.DoesNotExist:
        raise NotFound(f"no node {node_id}", field="node") from None
    if node.provider.user_id != provider_id:
        raise PermissionDenied("that node is not yours", field="node")
    if node.retired_at is not None:
        raise Conflict(f"node {node.name} is retired: it takes no asks", field="node")
    market = node_market(node, market_slug)
    _check_common(price=price, gpus=gpus)
    if available_until <= now:
        raise InvalidInput("must be in the future", field="available_until")
    try:
        with locking.tracked(market.pk), transaction.atomic():
            market = locking.lock_market(market.pk)
            matching.expire_due(market, now)
            if Node.objects.filter(pk=node.pk, retired_at__isnull=False).exists():
                raise Conflict(f"node {node.name} is retired: it takes no asks", field="node")
            free = free_gpu_count(node, market)
            if gpus > free:
                raise InvalidInput(f"only {free} GPUs of node {node.name} are free to offer",
                                   field="gpus")
            order = Order(
                market=market, owner_id=provider_id, side=Order.Side.ASK, price=price,
                gpus=gpus, remaining_gpus=gpus, node=node, available_until=available_until,
                client_order_id=client_order_id or "",
            )
            locking.touch(order)
            order.save(force_insert=True)
            order.created(cause="ask placed", at=now)
            book = locking.load_book(market, exclude=order.pk)
            result = book.submit_ask(locking.engine_ask(order), locking.epoch(now))
            leases = matching.apply_result(market, order, result, now)
            if any(x.interruptible for x in leases):
                preemption.reconsider_preemptions(market.pk, now)
    except IntegrityError as exc:
        replayed = (_replay(provider_id, client_order_id, terms) if _is_client_id_clash(exc)
                    else None)
        if replayed is None:
            raise
        return replayed
    return Placed(order=order, leases=leases)


def cancel_order(*, user_id: int, order_id: int, cause: str = "cancelled by its owner",
                 now: datetime | None = None) -> Order:
    """Cancel an open or partially filled order of `user_id`, releasing a bid's hold and
    calling off at once the preemptions scheduled for it. An ask whose GPUs are all
    leased (`filled`, window still open) can be withdrawn too: its leases run on, and
    their GPUs no longer come back to the market when they end.
    Raises NotFound (also for another user's order) or Conflict when already closed."""
    order = Order.objects.filter(pk=order_id, owner_id=user_id).first()
    if order is None:
        raise NotFound(f"no order {order_id} of yours", field="order")
    now = now or timezone.now()
    with locking.tracked(order.market_id), transaction.atomic():
        locking.lock_market(order.market_id)
        order = Order.objects.get(pk=order_id)
        standing_ask = (order.side == Order.Side.ASK and order.status == "filled"
                        and order.available_until > now)
        if order.status not in Order.ACTIVE and not standing_ask:
            raise Conflict(f"order {order_id} is already {order.status}")
        if standing_ask:
            cause = f"{cause}: its leased GPUs stay off the market when their leases end"
        matching.close_order(order, "cancelled", cause, now)
        if order.side == Order.Side.BID:
            preemption.call_off_preemptions(order, now)
    return order


def depth(market: GpuClass, levels: int = 20) -> tuple[list[tuple[int, int]],
                                                          list[tuple[int, int]]]:
    """Order book depth: (bids high→low, asks low→high) as (price, GPUs) per level —
    the engine's OrderBook.depth, aggregated by the database (no book is loaded)."""
    if levels <= 0:
        return [], []
    resting = locking.resting_orders(market, now=timezone.now()).filter(remaining_gpus__gt=0)

    def side(name: str, order_by: str) -> list[tuple[int, int]]:
        rows = (resting.filter(side=name).order_by().values("price")
                .annotate(gpus=Sum("remaining_gpus")).order_by(order_by)[:levels])
        return [(r["price"], r["gpus"]) for r in rows]

    return side(Order.Side.BID, "-price"), side(Order.Side.ASK, "price")


__all__ = ["BidRequest", "Placed", "cancel_order", "depth", "expire_orders", "place_ask",
           "place_bid", "place_bids"]
