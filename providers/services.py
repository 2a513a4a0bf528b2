"""Provider services: onboarding, nodes and their runner tokens, the runner's
inventory and heartbeats. Called by the API views and the demo."""

from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from core import metrics, pg
from providers import cuda_driver, heartbeat, mig, push
from providers.models import Gpu, LeaseLog, Node, Provider, hash_token, new_token
from providers.signals import (
    gpu_health_changed,
    node_cuda_changed,
    node_runtime_changed,
    units_changed,
)

MAX_GPUS_PER_NODE = 64
MAX_WARNINGS = heartbeat.MAX_WARNINGS  # a heartbeat's and an inventory's warnings
log = logging.getLogger(__name__)


class ProviderError(Exception):
    status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InventoryConflict(ProviderError):
    status = 409


class ProviderConflict(ProviderError):
    status = 409


def provider_onboard(*, user_id: int, display_name: str) -> Provider:
    """Make a user a provider; again later, rename it (idempotent). The name is cut to
    100 characters; empty, or with a control or format character, is a ProviderError."""
    if not display_name.strip():
        raise ProviderError("must not be empty", field="display_name")
    display_name = _name(display_name.strip()[:100], field="display_name")
    provider, created = Provider.objects.get_or_create(
        user_id=user_id, defaults={"display_name": display_name})
    if not created and provider.display_name != display_name:
        provider.display_name = display_name
        provider.save(update_fields=["display_name"])
    return provider


@dataclass(frozen=True)
class NewNode:
    node: Node
    runner_token: str  # shown once; only its hash is stored


def node_create(*, provider: Provider, name: str) -> NewNode:
    """Create a node and its runner token. Raises ProviderError for a duplicate name."""
    name = _name(name)
    if Node.objects.filter(provider=provider, name=name).exists():
        raise ProviderError(f"you already have a node named '{name}'", field="name")
    token = new_token()
    node = Node.objects.create(provider=provider, name=name, token_hash=hash_token(token))
    return NewNode(node=node, runner_token=token)


class NodeNotFound(ProviderError):
    status = 404


def node_rotate_token(*, user_id: int, node_id: int) -> NewNode:
    """Give the node `node_id` of the provider `user_id` a new runner token; the old one
    stops working at once: every HTTP call with it is a 401 from the commit on, and the
    node's open `/ws/runner/` connections are closed with 4401 (push.token_rotated).

    Returns the node (with `token_rotated_at` set) and the new token, to be shown once;
    only its SHA-256 is stored. Raises NodeNotFound (404) when the user has no such node,
    whoever else may have one (the answer never tells)."""
    with transaction.atomic():
        node = (Node.objects.select_for_update(of=("self",)).select_related("provider")
                .filter(pk=node_id, provider__user_id=user_id).first())
        if node is None:
            raise NodeNotFound(f"no node {node_id} of yours", field="node")
        if node.retired_at is not None:
            raise ProviderConflict("this node is retired: it has no runner token",
                                   field="node")
        token = new_token()
        node.token_hash = hash_token(token)
        node.token_rotated_at = timezone.now()
        node.save(update_fields=["token_hash", "token_rotated_at"])
        push.token_rotated(node.pk)
    log.info("runner token of node %s rotated by user %s", node.pk, user_id)
    return NewNode(node=node, runner_token=token)


def _name(name: str, field: str = "name") -> str:
    """`name` stripped; 1 to 100 characters with no control or format character (a
    bidi override such as U+202E, a zero-width space: names show on pages and in feeds)."""
    name = name.strip()
    if not name or len(name) > 100:
        raise ProviderError("must be 1 to 100 characters", field=field)
    hidden = next((c for c in name if unicodedata.category(c) in ("Cc", "Cf")), None)
    if hidden is not None:
        raise ProviderError(f"must not contain control or formatting characters "
                            f"(U+{ord(hidden):04X})", field=field)
    return name


def node_rename(*, user_id: int, node_id: int, name: str) -> Node:
    """Rename the node `node_id` of the provider `user_id` (names are unique per provider,
    retired nodes included). Raises NodeNotFound (404) for a node not the user's,
    ProviderError naming `name` for an empty, too long (over 100) or taken name, and
    ProviderConflict for a retired node. The same name again changes nothing."""
    name = _name(name)
    with transaction.atomic():
        node = (Node.objects.select_for_update(of=("self",)).select_related("provider")
                .filter(pk=node_id, provider__user_id=user_id).first())
        if node is None:
            raise NodeNotFound(f"no node {node_id} of yours", field="node")
        if node.retired_at is not None:
            raise ProviderConflict("this node is retired: it cannot be renamed", field="node")
        if node.name == name:
            return node
        if Node.objects.filter(provider=node.provider, name=name).exists():
            raise ProviderError(f"you already have a node named '{name}'", field="name")
        old, node.name = node.name, name
        try:
            with transaction.atomic():
                node.save(update_fields=["name"])
        except IntegrityError:  # the same name taken meanwhile
            raise ProviderError(f"you already have a node named '{name}'",
                                field="name") from None
    log.info("node %s renamed by user %s (%r → %r)", node.pk, user_id, old, name)
    return node


def node_retire_mark(node: Node, *, now=None) -> Node:
    """Inside the caller's transaction, with the node's row locked and its asks already
    withdrawn (marketplace/node_retire.py does both, under the market locks): mark `node`
    retired and replace its runner token by one nobody knows, so that the runner's HTTP
    calls get 401 and its `/ws/runner/` closes with 4401 after commit (as after a
    rotation). Its GPUs, leases, logs and earnings stay."""
    node.retired_at = now or timezone.now()
    node.token_hash = hash_token(new_token())  # never shown: the old token is dead
    node.save(update_fields=["retired_at", "token_hash"])
    push.token_rotated(node.pk)
    return node


def node_for_token(token: str, *, with_user: bool = True) -> Node | None:
    """The node in service whose current runner token this is (a retired node's: None),
    with its provider and user loaded; `with_user=False`: the node's row only, by plain
    SQL (the heartbeat's fast path, which needs no user)."""
    if not with_user:
        return nodes_for_tokens([token]).get(token)
    return (Node.objects.select_related("provider__user")
            .filter(token_hash=hash_token(token), retired_at__isnull=True).first())


def nodes_for_tokens(tokens) -> dict[str, Node]:
    """{token: its node in service} for the runner tokens `tokens` that name one (row
    only, no provider), in one plain SELECT on the unique token hash index (on
    PostgreSQL bound on the server, core/pg.py, and built with Node.from_db: the raw
    queryset's machinery cost more CPU than the query)."""
    hashes = {hash_token(t): t for t in tokens}
    if not hashes:
        return {}
    table = Node._meta.db_table
    if connection.vendor != "postgresql":
        marks = ", ".join(["%s"] * len(hashes))
        sql = (f"SELECT * FROM {table} "  # noqa: S608
               f"WHERE token_hash IN ({marks}) AND retired_at IS NULL")
        return {hashes[n.token_hash]: n for n in Node.objects.raw(sql, list(hashes))}
    fields = Node._meta.concrete_fields
    sql = (f"SELECT {', '.join(f.column for f in fields)} FROM {table} "  # noqa: S608
           "WHERE token_hash = ANY(%s::text[]) AND retired_at IS NULL")
    with pg.cursor() as cursor:
        cursor.execute(sql, [list(hashes)])
        rows = cursor.fetchall()
    names = [f.attname for f in fields]
    nodes = [Node.from_db(connection.alias, names, row) for row in rows]
    return {hashes[n.token_hash]: n for n in nodes}


def _gpu_class_model():
    # GPU classes belong to the market; the FK names the model without importing it.
    return Gpu._meta.get_field("gpu_class").related_model


def inventory_record(*, node: Node, hostname: str, driver_version: str, cuda_version: str,
                     runner_version: str, source: str, gpus: list[dict[str, Any]],
                     warnings: list[str] | None = None) -> Node:
    """Record what the runner found on its host: create or update each unit by UUID.

    `gpus`: dicts with uuid, product_name, gpu_class (slug), memory_mib, pci_bus_id,
    mig_mode, and optionally nvlink {links_active, peers} and pcie_generation/pcie_width
    (topology_values); a MIG slice also parent_uuid, mig_profile, sm_count,
    gpu_instance_id, compute_instance_id, and its parent `listed` false (providers/mig.py
    checks them). Raises ProviderError naming `cuda_version` for a CUDA the driver cannot
    support (providers/cuda_driver.py), `gpus[i].<field>` for an unknown class or a
    contradictory slice, and InventoryConflict for a UUID registered to another node or a
    MIG layout change under a running lease. All or nothing. A layout change sends
    `units_changed` after commit, and the market fits the node's asks to its units again.
    What is ignored (an NVLink peer that is no GPU of this inventory) is appended to
    `warnings`.

    Concurrency: one transaction; the listed GPUs that exist are locked (FOR UPDATE, in
    UUID order) before their node is compared, and new ones are inserted in UUID order, so
    of two nodes registering the same new UUID at once, the second waits on the unique
    index, fails, and gets the 409 — exactly one node owns a GPU, and nothing ever moves
    it to another node. A same-node race (one runner registering twice at once) is
    retried once and succeeds.
    """
    if not gpus or len(gpus) > MAX_GPUS_PER_NODE:
        raise ProviderError(f"must list 1 to {MAX_GPUS_PER_NODE} GPUs", field="gpus")
    refused = cuda_driver.refusal(driver_version, cuda_version)
    if refused:
        raise ProviderError(refused[1], field=refused[0])
    classes = {c.slug: c for c in _gpu_class_model().objects.all()}
    for i, g in enumerate(gpus):
        if g["gpu_class"] not in classes:
            raise ProviderError(f"unknown GPU class '{g['gpu_class']}'",
                                field=f"gpus[{i}].gpu_class")
    mig.check_report(gpus, classes, (ProviderError,))
    warnings = warnings if warnings is not None else []
    gpus = mig.unlist_unsliced(gpus, warnings)
    uuids = [g["uuid"] for g in gpus]
    gpus = topology_values(gpus, warnings)
    if len(warnings) > MAX_WARNINGS:
        warnings[MAX_WARNINGS:] = [f"and {len(warnings) - MAX_WARNINGS} more items ignored"]
    if warnings:
        log.warning("inventory of node %s: %s", node.pk, "; ".join(warnings))
    for _attempt in range(2):
        try:
            with transaction.atomic():
                if _inventory_write(node, classes, sorted(gpus, key=lambda g: g["uuid"])):
                    transaction.on_commit(lambda: units_changed.send(sender=Node, node=node))
                node.hostname = hostname[:255]
                node.driver_version = driver_version[:32]
                old_cuda, node.cuda_version = node.cuda_version, cuda_version[:32]
                if old_cuda != node.cuda_version and node.registered_at is not None:
                    transaction.on_commit(lambda old=old_cuda: node_cuda_changed.send(
                        sender=Node, node=node, old=old, new=node.cuda_version))
                node.runner_version = runner_version[:32]
                node.inventory_source = source[:120]
                node.registered_at = node.registered_at or timezone.now()
                node.save()
            return node
        except IntegrityError:
            # another transaction inserted one of these UUIDs first (and committed)
            taken = (Gpu.every.filter(uuid__in=uuids).exclude(node=node)
                     .order_by("uuid").values_list("uuid", flat=True).first())
            if taken is not None:
                raise InventoryConflict(f"GPU {taken} is registered to another node",
                                        field="gpus") from None
    raise InventoryConflict("the GPUs changed while they were recorded; retry", field="gpus")


TOPOLOGY_FIELDS = ("nvlink_links_active", "nvlink_peers", "pcie_generation", "pcie_width")
_BUS = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-9A-Fa-f])$")


def normal_bus_id(value: str) -> str:
    """A PCI bus id as "00000000:53:00.0" (8-digit domain, upper case), so that "0000:53:00.0"
    and "00000000:53:00.0" name one GPU; a string of another shape upper-cased."""
    match = _BUS.match(value.strip())
    if not match:
        return value.strip().upper()
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):08X}:{bus}:{device}.{function}".upper()


def topology_values(gpus: list[dict[str, Any]], warnings: list[str]) -> list[dict[str, Any]]:
    """The inventory's GPUs with their Gpu topology fields (TOPOLOGY_FIELDS) set from
    `nvlink` and `pcie_*`: peers in normal_bus_id form, sorted, and kept only when they are
    the bus id of another GPU of this inventory (else a warning naming `gpus[i].nvlink.peers[j]`,
    appended to `warnings`). A GPU without `nvlink` has no links (null)."""
    buses = {normal_bus_id(g["pci_bus_id"]) for g in gpus}
    out = []
    for i, g in enumerate(gpus):
        nvlink = g.get("nvlink")
        own, peers = normal_bus_id(g["pci_bus_id"]), set()
        for j, peer in enumerate((nvlink or {}).get("peers", [])):
            peer = normal_bus_id(peer)
            if peer in buses and peer != own:
                peers.add(peer)
            else:
                warnings.append(f"gpus[{i}].nvlink.peers[{j}]: {peer} is not another GPU of "
                                "this node; ignored")
        out.append({**g, "nvlink_links_active": nvlink["links_active"] if nvlink else None,
                    "nvlink_peers": sorted(peers), "pcie_generation": g.get("pcie_generation"),
                    "pcie_width": g.get("pcie_width")})
    return out


def _inventory_write(node: Node, classes: dict[str, Any], gpus: list[dict[str, Any]]) -> bool:
    """Inside inventory_record's transaction: lock the node's and the known units, refuse
    another node's or a changed model, update ours, insert the new ones (`gpus` sorted by
    UUID: whole GPUs, "GPU-…", before slices, "MIG-…"), then apply each GPU's MIG layout
    (providers/mig.py). Returns whether a GPU's layout changed."""
    # First every unit of the node and every reported one, by primary key, as
    # marketplace/leases.py locks the units it picks (after its market lock) and health
    # changes lock theirs; no market (GPU class row) is locked here. So a lease being made
    # and a layout change wait for each other, the later one sees the other's result, and
    # neither deadlocks (tests/providers/test_inventory_mig_race.py).
    reported = [g["uuid"] for g in gpus]
    list(Gpu.every.select_for_update().filter(Q(node=node) | Q(uuid__in=reported))
         .order_by("pk").values_list("pk", flat=True))
    known = {g.uuid: g for g in Gpu.every.select_for_update(of=("self",))
             .select_related("gpu_class").filter(uuid__in=reported).order_by("uuid")}
    for g in gpus:
        row = known.get(g["uuid"])
        if row is not None and row.node_id != node.pk:
            raise InventoryConflict(f"GPU {g['uuid']} is registered to another node",
                                    field="gpus")
        # A GPU's UUID names one physical board, whose model never changes: a different
        # class for a known UUID is a wrong report, and accepting it would strand the GPU's
        # asks, leases and auctions in the old market.
        if row is not None and row.gpu_class.slug != g["gpu_class"]:
            raise InventoryConflict(
                f"GPU {g['uuid']} is registered as {row.gpu_class.slug}, not "
                f"{g['gpu_class']}: a GPU's model cannot change (a new board has a new UUID)",
                field="gpus")
    rows = dict(known)
    for whole in (True, False):  # parents first: a new slice's row names its parent's
        fresh = []
        for g in gpus:
            if whole == bool(g.get("parent_uuid")):
                continue
            values = {"product_name": g["product_name"], "memory_mib": g["memory_mib"],
                      "pci_bus_id": g["pci_bus_id"], "mig_mode": g.get("mig_mode", ""),
                      **{k: g[k] for k in TOPOLOGY_FIELDS}}
            if not whole:
                values.update({k: g.get(k) for k in mig.SLICE_FIELDS}, listed=True,
                              parent=rows[g["parent_uuid"]])
                values["mig_profile"] = values["mig_profile"] or ""
            row = rows.get(g["uuid"])
            if row is None:
                fresh.append(Gpu(uuid=g["uuid"], node=node,
                                 gpu_class=classes[g["gpu_class"]], **values))
            elif any(getattr(row, k) != v for k, v in values.items()):
                for k, v in values.items():
                    setattr(row, k, v)
                row.save(update_fields=list(values))
        for row in Gpu.objects.bulk_create(fresh):
            rows[row.uuid] = row
    return mig.apply_layouts(node, gpus, rows, InventoryConflict)


def runner_heard(node: Node, now=None) -> str:
    """"never" (no heartbeat yet: `gpumarket-runner run` never started), "silent" (none
    for GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS) or "heard". A node not heard is offered to
    no bid and shown healthy nowhere."""
    if node.last_heartbeat_at is None:
        return "never"
    timeout = timedelta(seconds=getattr(settings, "GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS", 90))
    return "silent" if node.last_heartbeat_at < (now or timezone.now()) - timeout else "heard"


def heartbeat_record(*, node: Node, runtime: str, gpus: list[dict[str, Any]],
                     findings: list[dict[str, Any]] | None = None,
                     leases: dict[int, set[str]] | None = None) -> list[str]:
    """Store the node's heartbeat time, each GPU's latest reading and health findings.

    Only this node's GPUs are read and written: a reading or finding that names another
    node's GPU, or no registered GPU, changes nothing; it is logged and returned as a
    warning ("findings[2].uuid: GPU-… is not a GPU of this node; ignored") for the
    runner. At most MAX_WARNINGS are answered, in one log line, the rest counted. Raises
    ProviderError naming `gpus` when it lists more readings than the node has GPUs.

    A GPU with a `fatal` finding becomes unhealthy; one whose heartbeat carries no fatal
    finding any more is healthy again. A MIG slice also takes its parent GPU's findings
    (a fatal one on the parent makes every slice of it unhealthy; one naming the slice,
    only that slice). On a change, `gpu_health_changed` is sent after
    commit, and the market takes the GPU out of (or back into) the node's asks. It is also
    sent (with `back=True`) when the node had been silent longer than
    GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS, so the market offers its GPUs again.

    Writes only what changed (providers/heartbeat.py's heartbeat_plan, the rule the
    grouped heartbeats of marketplace/api/heartbeat_batch.py follow too): the node's
    `last_heartbeat_at` (and `runtime`) always, a GPU's row only when its findings or a
    reading changed or its reading's "at" is HEALTH_AT_REFRESH_SECONDS old, all in one
    statement. The GPUs are locked (FOR UPDATE, in id order) only when a GPU's health
    flips. `leases`, when given, is filled with {running lease id: its active GPUs'
    UUIDs} from the same read (what telemetry.record checks readings against).
    """
    now = timezone.now()
    units, running = heartbeat.unit_rows([node.pk], with_leases=leases is not None)[node.pk]
    if leases is not None:
        leases.update(running)
    plan = heartbeat.heartbeat_plan(node=node, units=units, runtime=runtime, gpus=gpus,
                                    findings=findings, now=now)
    if plan.refusal:
        raise ProviderError(plan.refusal, field="gpus")
    unhealthy, recovered = heartbeat_apply(node, plan, now)
    heartbeat_signals(node, plan, unhealthy, recovered)
    return plan.warnings


def heartbeat_apply(node: Node, plan: heartbeat.Plan, now, *, write: bool = True
                    ) -> tuple[list[str], list[str]]:
    """Log the plan's warnings, count the beat (metrics), set the node's heartbeat time
    and runtime and, `write`, write the plan (the locked path for a flip; a group's
    caller writes its beats' rows itself, heartbeat.write_beats). Returns (UUIDs now
    unhealthy, UUIDs recovered)."""
    if plan.warnings:
        log.warning("heartbeat of node %s: %s", node.pk, "; ".join(plan.warnings))
    metrics.heartbeat(node.last_heartbeat_at, now,
                      getattr(settings, "GPUMARKET_METRICS_HEARTBEAT_LATE_SECONDS", 30))
    node.last_heartbeat_at, node.runtime = now, plan.runtime
    if plan.flips:
        return heartbeat.record_flips(node, plan, now)
    if write:
        heartbeat.write_beats([(node, plan.changed)])
    return [], []


def heartbeat_signals(node: Node, plan: heartbeat.Plan, unhealthy: list[str],
                      recovered: list[str]) -> None:
    """Inside the beat's transaction (or its autocommit): the signals a beat sends after
    commit (a runtime change; a health flip or the node back after silence)."""
    if plan.old_runtime != plan.runtime:
        transaction.on_commit(lambda: node_runtime_changed.send(
            sender=Node, node=node, old=plan.old_runtime, new=plan.runtime))
    if unhealthy or recovered or plan.back:
        transaction.on_commit(lambda: gpu_health_changed.send(
            sender=Node, node=node, unhealthy=unhealthy, recovered=recovered,
            back=plan.back))


def lease_log_record(*, node: Node, lease_id: int, tail: str) -> LeaseLog:
    """Keep `tail` as the latest output of the lease's container (one row per lease,
    replaced on every report). The caller checks that the lease runs on `node`.

    Raises ProviderError naming `tail` when it is over LeaseLog.MAX_BYTES in UTF-8. NUL
    characters (which PostgreSQL text cannot hold) are dropped.
    """
    data = tail.replace("\x00", "").encode("utf-8", "replace")  # lone surrogates → "?"
    if len(data) > LeaseLog.MAX_BYTES:
        raise ProviderError(f"must be at most {LeaseLog.MAX_BYTES} bytes (64 KiB) of UTF-8; "
                            "send the last lines only", field="tail")
    log, _ = LeaseLog.objects.update_or_create(
        lease_id=lease_id,
        defaults={"node": node, "tail": data.decode("utf-8"), "updated_at": timezone.now()},
    )
    return log

