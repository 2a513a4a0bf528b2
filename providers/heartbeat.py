"""The runner's heartbeat, its rule and its SQL (issue 17): `heartbeat_plan` says what one
beat writes given the node's stored units (only what changed), `unit_rows` reads those
units for one node or many (one SELECT), `write_beats` writes the plans of one beat or of
a group (one statement), `record_flips` the rare beat that flips a GPU's health (locked).
providers.services.heartbeat_record (one beat) and marketplace/api/heartbeat_batch.py (a
group of beats, one transaction) both use them: one rule. docs/RUNNER_PROTOCOL.md,
"What a heartbeat writes".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

from core import pg
from providers.models import Gpu, Node

MAX_WARNINGS = 20  # a heartbeat's warnings: answered and logged (one line), the rest counted

#: A GPU's stored reading (`last_health`, with its "at") is rewritten when a value changed,
#: and otherwise only once its "at" is this old: an unchanged heartbeat writes no GPU row.
HEALTH_AT_REFRESH_SECONDS = 30


@dataclass
class Unit:
    """A reported unit of a node as stored (unit_rows)."""
    pk: int
    uuid: str
    parent_id: int | None
    healthy: bool
    findings: list
    last_health: dict


@dataclass
class Plan:
    """What one heartbeat writes. `refusal`: the message of the ProviderError (field
    `gpus`) that refuses the whole beat (nothing written); `flips`: a GPU's health
    changes, so the beat takes record_flips' locked path instead of `changed`;
    `changed`: the GPU rows to write, (id, last_health, findings); `back`: the node had
    been silent longer than GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS; `runtime`, `old_runtime`:
    the node's runtime after and before the beat."""
    runtime: str
    old_runtime: str
    warnings: list[str] = field(default_factory=list)
    refusal: str | None = None
    flips: bool = False
    changed: list[tuple[int, dict, list]] = field(default_factory=list)
    back: bool = False
    found: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    by_uuid: dict[str, dict[str, Any]] = field(default_factory=dict)


def heartbeat_plan(*, node: Node, units: list[Unit], runtime: str,
                   gpus: list[dict[str, Any]], findings: list[dict[str, Any]] | None,
                   now: datetime) -> Plan:
    """The plan of one beat of `node` at `now` (reads and writes nothing). A reading or
    finding naming no unit of `units` is a warning ("findings[2].uuid: GPU-… is not a
    GPU of this node; ignored"), at most MAX_WARNINGS then counted; more readings than
    units is a refusal. A unit's row is in `changed` when its findings (its own and, for
    a MIG slice, its parent's) or its reading changed, or its reading's "at" is
    HEALTH_AT_REFRESH_SECONDS old; `flips` when a unit's fatal findings disagree with its
    `healthy`."""
    timeout = timedelta(seconds=getattr(settings, "GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS", 90))
    last_seen = node.last_heartbeat_at or node.registered_at
    plan = Plan(runtime=runtime[:16], old_runtime=node.runtime,
                back=last_seen is not None and last_seen < now - timeout)
    mine = {u.uuid for u in units}
    if len(gpus) > len(mine):
        plan.refusal = (f"lists {len(gpus)} readings but the node has {len(mine)} GPUs "
                        "registered: at most one reading per GPU")
        return plan
    warnings = [f"{name}[{i}].uuid: {item['uuid']} is not a GPU of this node; ignored"
                for name, items in (("gpus", gpus), ("findings", findings or []))
                for i, item in enumerate(items) if item["uuid"] not in mine]
    if len(warnings) > MAX_WARNINGS:
        warnings = [*warnings[:MAX_WARNINGS],
                    f"and {len(warnings) - MAX_WARNINGS} more items ignored"]
    plan.warnings = warnings
    for f in findings or []:
        if f["uuid"] in mine:
            plan.found.setdefault(f["uuid"], []).append(f)
    plan.by_uuid = {g["uuid"]: g for g in gpus if g["uuid"] in mine}
    uuid_of = {u.pk: u.uuid for u in units}
    news = [_findings_of(u, uuid_of, plan.found) for u in units]
    if any(_fatal(new) != (not u.healthy) for u, new in zip(units, news, strict=True)):
        plan.flips = True
        return plan
    stale = now - timedelta(seconds=HEALTH_AT_REFRESH_SECONDS)
    at = None
    for u, new in zip(units, news, strict=True):
        reading = plan.by_uuid.get(u.uuid)
        health = u.last_health
        if reading is not None and (_without_at(health) != reading
                                    or (_reading_at(health) or stale) <= stale):
            at = at or now.isoformat()
            health = {**reading, "at": at}
        if new != u.findings or health is not u.last_health:
            plan.changed.append((u.pk, health, new))
    return plan


def unit_rows(node_ids: list[int], *, with_leases: bool
              ) -> dict[int, tuple[list[Unit], dict[int, set[str]]]]:
    """{node id: (its reported units in id order — listed GPUs and slices, and the
    parents of slices — , {running lease id: its active units' UUIDs})} for `node_ids`,
    in one SELECT, bound on the server (core/pg.py; leases read only `with_leases`, else
    empty). A replaced layout's slice
    is not a reported unit but counts for its lease (telemetry's check). Plain SQL: the
    ORM's compiling of it cost more CPU than the query (bench/README.md)."""
    # the market's lease tables are named, not imported (providers imports no marketplace)
    lease_gpu = Gpu._meta.get_field("lease_gpus").related_model
    lease = lease_gpu._meta.get_field("lease").related_model
    running = "NULL"
    if with_leases:
        running = (f"(SELECT lg.lease_id FROM {lease_gpu._meta.db_table} lg "  # noqa: S608
                   f"JOIN {lease._meta.db_table} l ON l.id = lg.lease_id "
                   "WHERE lg.gpu_id = g.id AND lg.active AND l.node_id = g.node_id "
                   "AND l.status = 'running' LIMIT 1)")
    where, params = "g.node_id = ANY(%s::bigint[])", [list(node_ids)]
    if connection.vendor != "postgresql":
        where, params = ("g.node_id IN (" + ", ".join(["%s"] * len(node_ids)) + ")",
                         list(node_ids))
    sql = (f"SELECT g.node_id, g.id, g.uuid, g.parent_id, g.healthy, "  # noqa: S608
           f"g.findings, g.last_health, g.listed, {running} FROM {Gpu._meta.db_table} g "
           f"WHERE {where} ORDER BY g.node_id, g.id")
    out: dict[int, tuple[list[Unit], dict[int, set[str]]]] = {n: ([], {}) for n in node_ids}
    with pg.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    for node_id, pk, uuid, parent_id, healthy, findings, health, listed, lease_id in rows:
        units, leases = out[node_id]
        if listed or parent_id is None:
            units.append(Unit(pk, uuid, parent_id, bool(healthy), _json(findings),
                              _json(health)))
        if lease_id is not None:
            leases.setdefault(lease_id, set()).add(uuid)
    return out


def write_beats(beats: list[tuple[Node, list[tuple[int, dict, list]]]]) -> None:
    """Each node's heartbeat time and runtime (as set on the Node) and the changed GPU
    rows (id, last_health, findings) of its plan: on PostgreSQL one statement (an UPDATE
    … FROM jsonb_to_recordset(…) of the nodes in a WITH, then the GPUs'), its text the
    same whatever the number of beats and rows, bound on the server (core/pg.py);
    elsewhere one UPDATE each in a transaction. Nodes and rows are written in id order."""
    beats = sorted(beats, key=lambda b: b[0].pk)
    changed = sorted((c for _node, rows in beats for c in rows), key=lambda c: c[0])
    if connection.vendor != "postgresql":
        with transaction.atomic():
            for node, _rows in beats:
                Node.objects.filter(pk=node.pk).update(
                    last_heartbeat_at=node.last_heartbeat_at, runtime=node.runtime)
            for pk, health, found in changed:
                Gpu.every.filter(pk=pk).update(last_health=health, findings=found)
        return
    # Every value travels in one JSON document per table (jsonb_to_recordset): one
    # json.dumps, in C, where psycopg dumps an array's elements one by one in Python
    # (about 8× the CPU for a group's rows: bench/README.md, "Heartbeats at fleet scale")
    node_sql = (f"UPDATE {Node._meta.db_table} AS n SET "  # noqa: S608
                "last_heartbeat_at = v.at, runtime = v.runtime FROM jsonb_to_recordset(%s::jsonb) "
                "AS v(id bigint, at timestamptz, runtime text) WHERE n.id = v.id")
    params: list[Any] = [json.dumps([
        {"id": n.pk, "at": n.last_heartbeat_at.isoformat(), "runtime": n.runtime}
        for n, _ in beats])]
    if not changed:
        with pg.cursor() as cursor:
            cursor.execute(node_sql, params)
        return
    params.append(json.dumps([{"id": pk, "health": health, "found": found}
                              for pk, health, found in changed]))
    # only our own table names are formatted in; every value is a parameter
    sql = (f"WITH beat AS ({node_sql} RETURNING n.id) "  # noqa: S608
           f"UPDATE {Gpu._meta.db_table} AS g SET last_health = v.health, findings = v.found "
           "FROM jsonb_to_recordset(%s::jsonb) AS v(id bigint, health jsonb, found jsonb) "
           "WHERE g.id = v.id")
    with pg.cursor() as cursor:
        cursor.execute(sql, params)


def record_flips(node: Node, plan: Plan, now: datetime) -> tuple[list[str], list[str]]:
    """A beat whose plan flips a GPU's health: in one transaction, the node's heartbeat
    and every reported unit locked (FOR UPDATE, in id order, as leases and layout changes
    lock theirs) and written. Returns (UUIDs now unhealthy, UUIDs recovered)."""
    unhealthy, recovered = [], []
    found, by_uuid = plan.found, plan.by_uuid
    with transaction.atomic():
        node.save(update_fields=["last_heartbeat_at", "runtime"])
        locked = (reported_units(node).select_for_update(of=("self",))
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


def reported_units(node: Node):
    """The node's units a heartbeat speaks of: its listed GPUs and slices, and the
    parents of its slices (never a slice of a replaced MIG layout)."""
    return Gpu.every.filter(node=node).filter(Q(listed=True) | Q(parent__isnull=True))


def _json(value: Any) -> Any:
    # jsonb comes as text (Django's loader); most units' findings are empty: no parse
    if value == "[]":
        return []
    return json.loads(value) if isinstance(value, str | bytes) else value


def _findings_of(u: Unit, uuid_of: dict[int, str], found: dict[str, list]) -> list:
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
