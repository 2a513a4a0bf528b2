"""Provider services: onboarding, nodes and their runner tokens, the runner's
inventory and heartbeats. Called by the API views and the demo."""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from core import metrics
from providers import cuda_driver, mig, push
from providers.models import Gpu, LeaseLog, Node, Provider, hash_token, new_token
from providers.signals import (
    gpu_health_changed,
    node_cuda_changed,
    node_runtime_changed,
    units_changed,
)

MAX_GPUS_PER_NODE = 64
MAX_WARNINGS = 20  # a heartbeat's warnings: answered and logged (one line), the rest counted
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
        sql = (f"SELECT * FROM {Node._meta.db_table} "  # noqa: S608
               "WHERE token_hash = %s AND retired_at IS NULL")
        return next(iter(Node.objects.raw(sql, [hash_token(token)])), None)
    return (Node.objects.select_related("provider__user")
            .filter(token_hash=hash_token(token), retired_at__isnull=True).first())


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


#: A GPU's stored reading (`last_health`, with its "at") is rewritten when a value changed,
#: and otherwise only once its "at" is this old: an unchanged heartbeat writes no GPU row.
HEALTH_AT_REFRESH_SECONDS = 30


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

    Writes only what changed (docs/RUNNER_PROTOCOL.md, "Heartbeat"): the node's
    `last_heartbeat_at` (and `runtime`) always, a GPU's row only when its findings or a
    reading changed or its reading's "at" is HEALTH_AT_REFRESH_SECONDS old, all such rows
    in one statement. The GPUs are locked (FOR UPDATE, in id order) only when a GPU's
    health flips. `leases`, when given, is filled with {running lease id: its active GPUs'
    UUIDs} from the same read (what telemetry.record checks readings against).
    """
    now = timezone.now()
    timeout = timedelta(seconds=getattr(settings, "GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS", 90))
    last_seen = node.last_heartbeat_at or node.registered_at
    back = last_seen is not None and last_seen < now - timeout
    units = _unit_rows(node, leases)
    mine = {u.uuid for u in units}
    if len(gpus) > len(mine):
        raise ProviderError(f"lists {len(gpus)} readings but the node has {len(mine)} GPUs "
                            "registered: at most one reading per GPU", field="gpus")
    warnings = [f"{name}[{i}].uuid: {item['uuid']} is not a GPU of this node; ignored"
                for name, items in (("gpus", gpus), ("findings", findings or []))
                for i, item in enumerate(items) if item["uuid"] not in mine]
    if len(warnings) > MAX_WARNINGS:
        warnings = [*warnings[:MAX_WARNINGS],
                    f"and {len(warnings) - MAX_WARNINGS} more items ignored"]
    if warnings:
        log.warning("heartbeat of node %s: %s", node.pk, "; ".join(warnings))
    found: dict[str, list[dict[str, Any]]] = {}
    for f in findings or []:
        if f["uuid"] in mine:
            found.setdefault(f["uuid"], []).append(f)
    by_uuid = {g["uuid"]: g for g in gpus if g["uuid"] in mine}
    metrics.heartbeat(node.last_heartbeat_at, now,
                      getattr(settings, "GPUMARKET_METRICS_HEARTBEAT_LATE_SECONDS", 30))
    old_runtime = node.runtime
    node.last_heartbeat_at, node.runtime = now, runtime[:16]
    stale = now - timedelta(seconds=HEALTH_AT_REFRESH_SECONDS)
    uuid_of = {u.pk: u.uuid for u in units}
    if any(_fatal(_findings_of(u, uuid_of, found)) != (not u.healthy) for u in units):
        unhealthy, recovered = _record_flips(node, found, by_uuid, now)
    else:
        unhealthy, recovered = [], []
        changed = []
        for u in units:
            new = _findings_of(u, uuid_of, found)
            reading = by_uuid.get(u.uuid)
            health = u.last_health
            if reading is not None and (_without_at(health) != reading
                                        or (_reading_at(health) or stale) <= stale):
                health = {**reading, "at": now.isoformat()}
            if new != u.findings or health is not u.last_health:
                changed.append((u.pk, health, new))
        _write_beat(node, changed)
    if old_runtime != node.runtime:
        transaction.on_commit(lambda: node_runtime_changed.send(
            sender=Node, node=node, old=old_runtime, new=node.runtime))
    if unhealthy or recovered or back:
        transaction.on_commit(lambda: gpu_health_changed.send(
            sender=Node, node=node, unhealthy=unhealthy, recovered=recovered, back=back))
    return warnings


@dataclass
class _Unit:
    pk: int
    uuid: str
    parent_id: int | None
    healthy: bool
    findings: list
    last_health: dict


def _unit_rows(node: Node, leases: dict[int, set[str]] | None) -> list[_Unit]:
    """The node's reported units (_reported_units), in id order, in one SELECT; with
    `leases`, the same SELECT reads every unit of the node with its running lease (an
    active LeaseGpu of a running lease on this node), added to `leases` — telemetry's
    check, a replaced layout's slice included. Plain SQL: the ORM's compiling of it
    cost more CPU than the query (bench/README.md, "Heartbeats at fleet scale")."""
    # the market's lease tables are named, not imported (providers imports no marketplace)
    lease_gpu = Gpu._meta.get_field("lease_gpus").related_model
    lease = lease_gpu._meta.get_field("lease").related_model
    running = "NULL"
    params: list[Any] = [node.pk]
    if leases is not None:
        running = (f"(SELECT lg.lease_id FROM {lease_gpu._meta.db_table} lg "  # noqa: S608
                   f"JOIN {lease._meta.db_table} l ON l.id = lg.lease_id "
                   "WHERE lg.gpu_id = g.id AND lg.active AND l.node_id = %s "
                   "AND l.status = 'running' LIMIT 1)")
        params.insert(0, node.pk)
    sql = (f"SELECT g.id, g.uuid, g.parent_id, g.healthy, g.findings, "  # noqa: S608
           f"g.last_health, g.listed, {running} FROM {Gpu._meta.db_table} g "
           "WHERE g.node_id = %s ORDER BY g.id")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    out = []
    for pk, uuid, parent_id, healthy, findings, health, listed, lease_id in rows:
        if listed or parent_id is None:  # what _reported_units holds
            out.append(_Unit(pk, uuid, parent_id, bool(healthy), _json(findings),
                             _json(health)))
        if lease_id is not None:
            leases.setdefault(lease_id, set()).add(uuid)
    return out


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _findings_of(u: _Unit, uuid_of: dict[int, str], found: dict[str, list]) -> list:
    # a MIG slice carries its parent GPU's findings: a fatal one takes it out too
    inherited = found.get(uuid_of.get(u.parent_id), []) if u.parent_id else []
    return found.get(u.uuid, []) + inherited


def _reading_at(health: dict) -> datetime | None:
    try:
        at = datetime.fromisoformat(health["at"])
    except (KeyError, TypeError, ValueError):
        return None
    return at if at.tzinfo is not None else None


def _fatal(findings: list) -> bool:
    return any(f["severity"] == "fatal" for f in findings)


def _without_at(health: dict) -> dict:
    return {k: v for k, v in health.items() if k != "at"}


def _write_beat(node: Node, changed: list[tuple[int, dict, list]]) -> None:
    """The node's heartbeat time and runtime, and the changed GPU rows (id, last_health,
    findings): on PostgreSQL one statement (an UPDATE … FROM unnest(…) after the node's
    in a WITH), elsewhere one UPDATE each in a transaction."""
    if connection.vendor != "postgresql":
        with transaction.atomic():
            Node.objects.filter(pk=node.pk).update(last_heartbeat_at=node.last_heartbeat_at,
                                                   runtime=node.runtime)
            for pk, health, found in changed:
                Gpu.every.filter(pk=pk).update(last_health=health, findings=found)
        return
    node_sql = (f"UPDATE {Node._meta.db_table} SET last_heartbeat_at = %s, "  # noqa: S608
                "runtime = %s WHERE id = %s")
    params: list[Any] = [node.last_heartbeat_at, node.runtime, node.pk]
    if not changed:
        with connection.cursor() as cursor:
            cursor.execute(node_sql, params)
        return
    table = Gpu._meta.db_table
    changed = sorted(changed, key=lambda c: c[0])  # in id order (unnest keeps it)
    params += [[c[0] for c in changed], [json.dumps(c[1]) for c in changed],
               [json.dumps(c[2]) for c in changed]]
    # only our own table names are formatted in; every value is a parameter; one query
    # text whatever the number of rows (psycopg parses it once)
    sql = (f"WITH beat AS ({node_sql} RETURNING id) "  # noqa: S608
           f"UPDATE {table} AS g SET last_health = v.health, findings = v.found "
           "FROM unnest(%s::bigint[], %s::jsonb[], %s::jsonb[]) AS v(id, health, found) "
           "WHERE g.id = v.id")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _record_flips(node: Node, found: dict[str, list], by_uuid: dict[str, dict],
                  now) -> tuple[list[str], list[str]]:
    """A GPU's health flips: in one transaction, the node's heartbeat and every reported
    unit locked (FOR UPDATE, in id order, as leases and layout changes lock theirs) and
    written, as before issue 17. Returns (UUIDs now unhealthy, UUIDs recovered)."""
    unhealthy, recovered = [], []
    with transaction.atomic():
        node.save(update_fields=["last_heartbeat_at", "runtime"])
        locked = (_reported_units(node).select_for_update(of=("self",))
                  .select_related("parent").order_by("pk"))
        for gpu in locked:
            inherited = found.get(gpu.parent.uuid, []) if gpu.parent_id else []
            gpu.findings = found.get(gpu.uuid, []) + inherited
            fatal = _fatal(gpu.findings)
            if gpu.uuid in by_uuid:
                gpu.last_health = {**by_uuid[gpu.uuid], "at": now.isoformat()}
            if fatal and gpu.healthy:
                gpu.healthy, gpu.unhealthy_since = False, now
                unhealthy.append(gpu.uuid)
            elif not fatal and not gpu.healthy:
                gpu.healthy, gpu.unhealthy_since = True, None
                recovered.append(gpu.uuid)
            gpu.save(update_fields=["last_health", "findings", "healthy", "unhealthy_since"])
    return unhealthy, recovered


def _reported_units(node: Node):
    """The node's units a heartbeat speaks of: its listed GPUs and slices, and the
    parents of its slices (never a slice of a replaced MIG layout)."""
    return Gpu.every.filter(node=node).filter(Q(listed=True) | Q(parent__isnull=True))


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

