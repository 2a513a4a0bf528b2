"""Per-lease GPU telemetry (issue 16): the runner's heartbeat `telemetry` items, checked
and kept as a bounded, downsampled series per lease (models.LeaseSample), read back for
the lease's buyer (API, page, /ws/me/, CLI) and for idle detection. docs/TELEMETRY.md.

Buckets are placed by the marketplace's clock at receipt (a runner's clock is not
trusted): each reading updates its 10 s bucket and its 60 s bucket (a running mean), and
the same write deletes that lease's buckets older than an hour (10 s) or a day (60 s).
So a lease holds at most 360 + 1440 rows per GPU, whatever the runner sends.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Min, Q
from django.dispatch import Signal
from django.utils import timezone

from core import pg
from marketplace.models import Lease, LeaseGpu, LeaseSample
from settlement.money import format_usd

#: reading key → (lowest, highest) accepted; DCGM's fields GPU_UTIL, FB_USED, POWER_USAGE,
#: GPU_TEMP, SM_CLOCK, MEM_CLOCK (docs/METRICS.md)
FIELDS: dict[str, tuple[float, float]] = {
    "utilization_pct": (0, 100),
    "fb_used_mib": (0, 2**31),
    "power_w": (0, 10_000),
    "temperature_c": (-60, 200),
    "sm_clock_mhz": (0, 100_000),
    "mem_clock_mhz": (0, 100_000),
}
#: throttle reason names (NVML's clocks event reasons, as the runner's readings name
#: them) → their bit in LeaseSample.throttle_reasons
THROTTLE_REASONS = ("hw_thermal_slowdown", "hw_power_brake", "hw_slowdown",
                    "sw_thermal_slowdown", "sw_power_cap")
#: (bucket seconds, kept seconds): 360 buckets of 10 s, 1440 of 60 s
RESOLUTIONS = ((10, 3600), (60, 86400))
RANGES = {"1h": 10, "24h": 60}  # ?range= → the resolution it reads
MAX_LEASES = 64  # telemetry items in one heartbeat (a node has at most 64 GPUs)
MAX_GPUS = 64  # GPU readings in one item
MAX_ERRORS = 20

#: sent inside the recording transaction with lease_ids (the buyer's feed notes them)
telemetry_recorded = Signal()


def _bucket(now: datetime, seconds: int) -> datetime:
    epoch = math.floor(now.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=now.tzinfo)


def _clean_gpu(where: str, item: Any, allowed: set[str]) -> tuple[dict | None, str | None]:
    """(values, None) for a good GPU reading, else (None, the error naming the field)."""
    if not isinstance(item, dict):
        return None, f"{where}: must be an object"
    uuid = item.get("uuid")
    if not isinstance(uuid, str) or uuid not in allowed:
        return None, f"{where}.uuid: {str(uuid)[:64]!r} is not a GPU of this lease"
    unknown = sorted(set(item) - {"uuid", "throttle_reasons", *FIELDS})
    if unknown:
        return None, f"{where}.{unknown[0][:40]}: is not a known field"
    values: dict[str, Any] = {"uuid": uuid}
    for key, (low, high) in FIELDS.items():
        value = item.get(key)
        # NaN and infinities fail the comparison; a huge int is never turned into a float
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not low <= value <= high):
            return None, f"{where}.{key}: must be a number from {low} to {high} or null"
        values[key] = None if value is None else float(value)
    reasons = item.get("throttle_reasons") or []
    if not isinstance(reasons, list) or len(reasons) > len(THROTTLE_REASONS) or any(
            r not in THROTTLE_REASONS for r in reasons):
        return None, (f"{where}.throttle_reasons: must be a list of "
                      f"{', '.join(THROTTLE_REASONS)}")
    values["throttle_reasons"] = sum(1 << THROTTLE_REASONS.index(r) for r in set(reasons))
    return values, None


def record(*, node, items: list[Any], now: datetime | None = None,
           gpus_of: dict[int, set[str]] | None = None) -> tuple[int, list[str]]:
    """Keep the heartbeat's `telemetry` items of `node`: [{"lease": id, "gpus": [{uuid,
    utilization_pct, fb_used_mib, power_w, temperature_c, sm_clock_mhz, mem_clock_mhz,
    throttle_reasons: [name]}]}]. Returns (readings kept, errors): a reading naming a GPU
    not in its lease, a lease not running on this node, or a value out of range is
    refused with an error naming it ("telemetry[0].gpus[1].uuid: …; refused"); the rest
    is kept. `gpus_of`: {running lease id of this node: its active GPUs' UUIDs} when the
    caller read it already (providers' heartbeat_record `leases`), else one SELECT. On
    PostgreSQL one statement (the upsert, with the delete of the expired buckets in its
    WITH); elsewhere both in one transaction."""
    now = now or timezone.now()
    if gpus_of is None:
        wanted = [i.get("lease") for i in items if isinstance(i, dict)]
        wanted = [w for w in wanted if isinstance(w, int) and not isinstance(w, bool)
                  and 0 < w < 2**63]
        gpus_of = {}
        if wanted:
            for lease_id, uuid in LeaseGpu.objects.filter(
                    lease_id__in=wanted, lease__node=node, lease__status=Lease.Status.RUNNING,
                    active=True).values_list("lease_id", "gpu__uuid"):
                gpus_of.setdefault(lease_id, set()).add(uuid)
    rows, errors = checked(items, gpus_of)
    write(rows, now)
    return len(rows), errors


def checked(items: list[Any], gpus_of: dict[int, set[str]]
            ) -> tuple[list[tuple[int, dict]], list[str]]:
    """record's check of one heartbeat's items against {running lease id of its node: its
    active GPUs' UUIDs}, reading nothing: (rows to write, (lease id, values); errors, at
    most MAX_ERRORS then counted)."""
    errors: list[str] = []
    rows: list[tuple[int, dict]] = []
    seen_leases: set[int] = set()
    for i, item in enumerate(items):
        where = f"telemetry[{i}]"
        lease_id = item.get("lease") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("gpus"), list):
            errors.append(f"{where}: must be an object with lease and gpus")
            continue
        if (not isinstance(lease_id, int) or isinstance(lease_id, bool)
                or lease_id not in gpus_of or lease_id in seen_leases):
            errors.append(f"{where}.lease: {str(lease_id)[:20]} is not a running lease of "
                          "this node (or is sent twice); refused")
            continue
        seen_leases.add(lease_id)
        if len(item["gpus"]) > MAX_GPUS:
            errors.append(f"{where}.gpus: at most {MAX_GPUS} readings; refused")
            continue
        seen: set[str] = set()
        for j, gpu in enumerate(item["gpus"]):
            values, error = _clean_gpu(f"{where}.gpus[{j}]", gpu, gpus_of[lease_id] - seen)
            if error:
                errors.append(error + "; refused")
                continue
            seen.add(values["uuid"])
            rows.append((lease_id, values))
    if len(errors) > MAX_ERRORS:
        errors = [*errors[:MAX_ERRORS], f"and {len(errors) - MAX_ERRORS} more refused"]
    return rows, errors


def write(rows: list[tuple[int, dict]], now: datetime) -> None:
    """Keep checked rows (of one heartbeat or of a group's, leases distinct per beat) in
    their buckets at `now` and send telemetry_recorded with their leases: on PostgreSQL
    one statement, elsewhere in one transaction. No rows: nothing."""
    if not rows:
        return
    lease_ids = sorted({lease for lease, _ in rows})
    if connection.vendor == "postgresql":
        _upsert_pg(rows, now)  # one statement, atomic
        telemetry_recorded.send(sender=LeaseSample, lease_ids=lease_ids)
        return
    with transaction.atomic():
        _upsert(rows, now)
        _prune(set(lease_ids), now)
        telemetry_recorded.send(sender=LeaseSample, lease_ids=lease_ids)


_COLUMNS = ("lease_id", "gpu_uuid", "resolution", "bucket_at", "samples", *FIELDS,
            "throttle_reasons")


def _upsert(rows: list[tuple[int, dict]], now: datetime) -> None:
    """One INSERT … ON CONFLICT DO UPDATE (PostgreSQL and SQLite): each bucket's running
    mean, a value left as it was where the new reading has none."""
    table = LeaseSample._meta.db_table
    params: list[Any] = []
    for seconds, _keep in RESOLUTIONS:
        bucket = _bucket(now, seconds)
        for lease_id, v in rows:
            params += [lease_id, v["uuid"], seconds, bucket, 1,
                       *(v[k] for k in FIELDS), v["throttle_reasons"]]
    one = "(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
    # only our own table and column names are formatted in; every value is a parameter
    sql = (f"INSERT INTO {table} ({', '.join(_COLUMNS)}) VALUES "  # noqa: S608
           + ", ".join([one] * (len(params) // len(_COLUMNS))) + _on_conflict(table))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _on_conflict(table: str) -> str:
    means = ", ".join(
        f"{k} = CASE WHEN excluded.{k} IS NULL THEN {table}.{k} "
        f"WHEN {table}.{k} IS NULL THEN excluded.{k} "
        f"ELSE ({table}.{k} * {table}.samples + excluded.{k}) / ({table}.samples + 1) END"
        for k in FIELDS)
    return (" ON CONFLICT (lease_id, resolution, bucket_at, gpu_uuid) DO UPDATE SET "
            + means + f", samples = {table}.samples + 1, "
            f"throttle_reasons = {table}.throttle_reasons | excluded.throttle_reasons")


_PG_TYPES = ("bigint", "text", "integer", "timestamptz", "integer",
             *("float8" for _ in FIELDS), "integer")


def _upsert_pg(rows: list[tuple[int, dict]], now: datetime) -> None:
    """_upsert and _prune in one PostgreSQL statement: the delete of these leases' expired
    buckets in a WITH (never the buckets written), the rows as one JSON document
    (jsonb_to_recordset: one json.dumps in C, where an array per column was dumped
    element by element in Python), so the statement's text is the same whatever the
    number of readings."""
    table = LeaseSample._meta.db_table
    records = []
    for seconds, _keep in RESOLUTIONS:
        bucket = _bucket(now, seconds).isoformat()
        for lease_id, v in rows:
            records.append({"lease_id": lease_id, "gpu_uuid": v["uuid"],
                            "resolution": seconds, "bucket_at": bucket, "samples": 1,
                            **{k: v[k] for k in FIELDS},
                            "throttle_reasons": v["throttle_reasons"]})
    expired: list[Any] = [sorted({lease for lease, _ in rows})]
    for seconds, keep in RESOLUTIONS:
        expired += [seconds, _bucket(now, seconds) - timedelta(seconds=keep)]
    kept = " OR ".join(["(resolution = %s AND bucket_at <= %s)"] * len(RESOLUTIONS))
    shape = ", ".join(f"{c} {t}" for c, t in zip(_COLUMNS, _PG_TYPES, strict=True))
    # only our own table and column names are formatted in; every value is a parameter
    sql = (f"WITH pruned AS (DELETE FROM {table} WHERE lease_id = ANY(%s) "  # noqa: S608
           f"AND ({kept})) INSERT INTO {table} ({', '.join(_COLUMNS)}) "
           f"SELECT {', '.join(_COLUMNS)} FROM jsonb_to_recordset(%s::jsonb) AS v({shape})"
           + _on_conflict(table))
    with pg.cursor() as cursor:  # bound on the server
        cursor.execute(sql, [*expired, json.dumps(records)])


def _prune(lease_ids: set[int], now: datetime) -> None:
    expired = Q()
    for seconds, keep in RESOLUTIONS:
        expired |= Q(resolution=seconds,
                     bucket_at__lte=_bucket(now, seconds) - timedelta(seconds=keep))
    LeaseSample.objects.filter(expired, lease_id__in=lease_ids).delete()


def drop_ended(now: datetime | None = None) -> int:
    """Delete the series of leases ended more than GPUMARKET_TELEMETRY_KEEP_SECONDS ago;
    returns the rows deleted. So the table holds at most a day of each running lease and
    of each lease ended in the last GPUMARKET_TELEMETRY_KEEP_SECONDS."""
    before = (now or timezone.now()) - timedelta(
        seconds=settings.GPUMARKET_TELEMETRY_KEEP_SECONDS)
    deleted, _ = LeaseSample.objects.filter(lease__status__in=Lease.ENDED,
                                            lease__ended_at__lt=before).delete()
    return deleted


def _num(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def reasons_of(bits: int) -> list[str]:
    return [name for i, name in enumerate(THROTTLE_REASONS) if bits & (1 << i)]


def series(lease: Lease, range_: str = "1h", now: datetime | None = None) -> dict[str, Any]:
    """The lease's series over `range_` ("1h": 10 s buckets, "24h": 60 s), per GPU in
    columns: {"lease", "range", "resolution_seconds", "gpus": [{"uuid", "at": [ISO …],
    "utilization_pct": […], …, "throttle_reasons": [[name …] …]}], "idle"}."""
    seconds = RANGES[range_]
    now = now or timezone.now()
    keep = dict(RESOLUTIONS)[seconds]
    rows = LeaseSample.objects.filter(
        lease=lease, resolution=seconds,
        bucket_at__gt=_bucket(now, seconds) - timedelta(seconds=keep),
    ).order_by("gpu_uuid", "bucket_at")
    gpus: dict[str, dict[str, list]] = {}
    for row in rows:
        col = gpus.setdefault(row.gpu_uuid, {"at": [], **{k: [] for k in FIELDS},
                                             "throttle_reasons": []})
        col["at"].append(row.bucket_at.isoformat())
        for k in FIELDS:
            col[k].append(_num(getattr(row, k)))
        col["throttle_reasons"].append(reasons_of(row.throttle_reasons))
    return {"lease": lease.pk, "range": range_, "resolution_seconds": seconds,
            "gpus": [{"uuid": uuid, **col} for uuid, col in gpus.items()],
            "idle": idle_states([lease], now).get(lease.pk)}


def latest(lease_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Each lease's newest 10 s bucket per GPU (what /ws/me/ sends after a heartbeat):
    {lease id: {"at", "gpus": [{"uuid", fields…, "throttle_reasons"}]}}."""
    newest = dict(LeaseSample.objects.filter(lease_id__in=lease_ids, resolution=10)
                  .values_list("lease_id").annotate(at=Max("bucket_at")))
    out: dict[int, dict[str, Any]] = {}
    q = Q()
    for lease_id, at in newest.items():
        q |= Q(lease_id=lease_id, bucket_at=at)
    if not newest:
        return out
    for row in LeaseSample.objects.filter(q, resolution=10).order_by("lease_id", "gpu_uuid"):
        entry = out.setdefault(row.lease_id, {"at": row.bucket_at.isoformat(), "gpus": []})
        entry["gpus"].append({"uuid": row.gpu_uuid,
                              **{k: _num(getattr(row, k)) for k in FIELDS},
                              "throttle_reasons": reasons_of(row.throttle_reasons)})
    return out


def idle_states(leases: list[Lease], now: datetime | None = None) -> dict[int, dict]:
    """For each running lease with readings: {"idle": bool, "idle_seconds", "since",
    "threshold_pct", "paying_usd_per_hour", "text"}. Idle: every GPU's bucket mean under
    GPUMARKET_IDLE_UTILIZATION_PCT for GPUMARKET_IDLE_AFTER_SECONDS or longer, with a
    reading within GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS (a silent runner proves nothing).
    One aggregate query for all the leases."""
    now = now or timezone.now()
    running = [lease for lease in leases if lease.status == Lease.Status.RUNNING]
    if not running:
        return {}
    threshold = settings.GPUMARKET_IDLE_UTILIZATION_PCT
    after = settings.GPUMARKET_IDLE_AFTER_SECONDS
    stale = timedelta(seconds=settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS)
    known = Q(utilization_pct__isnull=False)
    busy = Q(utilization_pct__gte=threshold)
    aggregates = LeaseSample.objects.filter(lease__in=running).values("lease_id").annotate(
        first=Min("bucket_at", filter=known), last=Max("bucket_at", filter=known),
        busy10=Max("bucket_at", filter=busy & Q(resolution=10)),
        busy60=Max("bucket_at", filter=busy & Q(resolution=60)))
    by_lease = {a["lease_id"]: a for a in aggregates}
    out: dict[int, dict] = {}
    for lease in running:
        a = by_lease.get(lease.pk)
        if not a or a["last"] is None:
            continue
        if a["busy10"] is not None:  # the 10 s buckets cover the whole last hour
            since = a["busy10"] + timedelta(seconds=10)
        elif a["busy60"] is not None:
            since = a["busy60"] + timedelta(seconds=60)
        else:
            since = a["first"]
        idle_seconds = max(0, int((now - since).total_seconds()))
        idle = a["last"] >= now - stale and idle_seconds >= after
        paying = format_usd(lease.price * lease.gpu_count)
        text = ""
        if idle:  # the highest bucket mean while idle (a few leases: one query each)
            peak = LeaseSample.objects.filter(lease=lease, bucket_at__gte=since) \
                .aggregate(p=Max("utilization_pct"))["p"] or 0
            text = (f"{round(peak)} % for {idle_seconds // 60} min — paying "
                    f"${_short_usd(paying)}/h")
        out[lease.pk] = {
            "idle": idle, "idle_seconds": idle_seconds if idle else 0,
            "since": since.isoformat() if idle else None, "threshold_pct": threshold,
            "paying_usd_per_hour": paying, "text": text,
        }
    return out


def _short_usd(text: str) -> str:
    """'4.980000' → '4.98' (at least two places; exact, never rounded)."""
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.rstrip('0').ljust(2, '0')}"
