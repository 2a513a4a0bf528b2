"""The checks an order passes before it is written, shared by the order paths (book.py's
place_bid/place_bids and place_ask, auctions.py's sealed auctions): the market named,
the node's market and its free GPUs, a bid's terms and its hold amount. None takes a
lock; each refusal is InvalidInput, Conflict (or NotFound) naming the field.
book.py re-exports the public names, so callers keep importing them from there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connections
from django.db.models import Count

from marketplace import matching, runtimes
from marketplace.bid_request import BidRequest
from marketplace.env_templates import check_terms
from marketplace.errors import Conflict, InvalidInput
from marketplace.lease_notice import check_stop_terms
from marketplace.models import GpuClass, Interconnect, Order
from marketplace.ports import clean_port_roles, clean_ports, with_ssh
from marketplace.ssh_keys import require_key
from marketplace.workload_env import clean_env_and_secrets
from providers.models import Gpu, Node
from providers.services import runner_heard
from settlement.money import MAX_USD_MICROS

MAX_GPUS = 4096
MAX_DURATION_SECONDS = 366 * 24 * 3600
CLIENT_ORDER_ID = re.compile(r"\A[A-Za-z0-9._:-]{1,64}\Z")
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
    unsliced = mig_without_slices(node, market_slug)
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

def check_client_order_id(client_order_id: str | None) -> None:
    if client_order_id is not None and not CLIENT_ORDER_ID.fullmatch(client_order_id):
        raise InvalidInput("must be 1 to 64 characters of A–Z, a–z, 0–9, '.', '_', ':' or '-'",
                           field="client_order_id")

def mig_without_slices(node: Node, market_slug: str | None) -> tuple[str, str] | None:
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


def check_common(*, price: int, gpus: int) -> None:
    if price <= 0:
        raise InvalidInput("must be greater than zero", field="price")
    if not 0 < gpus <= MAX_GPUS:
        raise InvalidInput(f"must be between 1 and {MAX_GPUS}", field="gpus")

def largest_node(market: GpuClass) -> int:
    """The most listed units (GPUs, or slices in a profile market) of `market` that one
    node has; 0 when no node has any."""
    counts = (Gpu.objects.filter(gpu_class=market).values("node").annotate(units=Count("pk"))
              .order_by("-units").values_list("units", flat=True)[:1])
    return next(iter(counts), 0)


@dataclass(frozen=True)
class MarketFacts:
    """What place_bids checks every bid of one market against, read once per call:
    `market` (get_market), `largest` (largest_node) and `runs_images`
    (runtimes.market_runs_images)."""

    market: GpuClass
    largest: int
    runs_images: bool


def market_facts(slug: str) -> MarketFacts:
    """get_market, largest_node and runtimes.market_runs_images of the market `slug` in
    one statement (the same conditions as theirs; the bid path's fixed cost per call).
    Raises InvalidInput naming `gpu_class` for an unknown slug."""
    fields = GpuClass._meta.concrete_fields
    connection = connections[GpuClass.objects.db]
    q = connection.ops.quote_name
    columns = ", ".join(f"c.{q(f.column)}" for f in fields)
    gpus, nodes = q(Gpu._meta.db_table), q(Node._meta.db_table)
    sql = (f"SELECT {columns}, "  # noqa: S608  (names from the models; the slug is bound)
           f"(SELECT COUNT(*) FROM {gpus} g WHERE g.listed AND g.gpu_class_id = c.id "
           "GROUP BY g.node_id ORDER BY 1 DESC LIMIT 1), "
           "(SELECT MAX(CASE WHEN n.runtime IS NULL OR n.runtime <> %s THEN 1 ELSE 0 END) "
           f"FROM {nodes} n JOIN {gpus} g "
           "ON n.id = g.node_id WHERE g.gpu_class_id = c.id AND n.retired_at IS NULL) "
           f"FROM {q(GpuClass._meta.db_table)} c WHERE c.slug = %s")
    with connection.cursor() as cursor:
        cursor.execute(sql, [runtimes.PROCESS, slug])
        row = cursor.fetchone()
    if row is None:
        raise InvalidInput(f"unknown GPU class '{slug}'", field="gpu_class")
    *values, largest, images = row
    market = GpuClass.from_db(connection.alias, [f.attname for f in fields], values)
    # market_runs_images: no node at all (NULL), or one whose runtime is not `process` (1);
    # (MAX of CASE, not bool_or: SQLite, the embedded default, has no bool_or)
    return MarketFacts(market=market, largest=largest or 0, runs_images=images != 0)


def check_fits_a_node(r: BidRequest, market: GpuClass, largest: int) -> None:
    """Conflict (409) for a gang larger than the largest node of the market: a gang runs on
    one node, so it could never fill (docs/MATCHING.md, "Gangs larger than any node")."""
    gang = r.gpus if r.gang_size is None else r.gang_size
    if 0 < largest < gang:
        unit = "MIG slices" if market.parent_id else "GPUs"
        field = "gpus" if gang == r.gpus else "gang_size"
        raise Conflict(f"a gang of {gang} runs on one node, and the largest node of "
                       f"{market.slug} has {largest} {unit}: ask for at most {largest}, or "
                       "split the bid into gangs with gang_size", field=field)


def check_bid(r: BidRequest, now: datetime) -> int:
    """The checks of place_bid that need no lock; returns the hold amount (micro-USD)."""
    gang_size = r.gpus if r.gang_size is None else r.gang_size
    check_common(price=r.price, gpus=r.gpus)
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
