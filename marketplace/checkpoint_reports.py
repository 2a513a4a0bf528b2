"""The runner's checkpoint reports on a lease (issue 15): each one a LeaseEvent note (no
state move) whose detail holds {"checkpoint": {...}}, so the lease's events, page and API
show them; `listed` reads them back as the API's `checkpoints`. docs/CHECKPOINTS.md."""

from __future__ import annotations

from marketplace.models import Lease, LeaseEvent

#: what a report says happened
STATUSES = ("uploaded", "restored", "none", "failed", "too_large")
#: when the runner took it: the lease's notice, its end (at the deadline, by the buyer's
#: stop, the marketplace's end, a failure), or before it started (restore)
REASONS = ("notice", "stop", "deadline", "end", "failure", "restore")

SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "at": {"type": "string", "format": "date-time"},
    "status": {"type": "string", "enum": list(STATUSES)},
    "reason": {"type": "string", "enum": list(REASONS)},
    "bytes": {"type": "integer"}, "files": {"type": "integer"},
    "seconds": {"type": "number"}, "key": {"type": "string"},
    "message": {"type": "string"}}}}


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def cause_text(report: dict) -> str:
    """One line for the lease's events: "checkpoint uploaded at stop: 2 files, 1.2 MiB in
    0.4 s" / "checkpoint restore failed: …"."""
    status, reason = report["status"], report["reason"]
    amount = f"{report.get('files', 0)} files, {_size(report.get('bytes', 0))}"
    took = f" in {report.get('seconds', 0):.1f} s"
    message = report.get("message") or ""
    if status == "uploaded":
        return f"checkpoint uploaded at {reason}: {amount}{took}"
    if status == "restored":
        return f"checkpoint restored: {amount}{took} from {report.get('key', '')}"
    if status == "none" and reason == "restore":
        return "no checkpoint to restore yet: the workload starts without one"
    if status == "none":
        return f"no checkpoint to upload at {reason}: {message}"
    what = "restore" if reason == "restore" else f"upload at {reason}"
    if status == "too_large":
        return f"checkpoint {what} refused: {message}"
    return f"checkpoint {what} failed: {message}"


def record(lease: Lease, report: dict) -> None:
    """Store one report (already checked) as a note event of `lease`, at its `at`."""
    lease.note(cause=cause_text(report), at=report["at"],
               detail={"checkpoint": {k: (v.isoformat() if k == "at" else v)
                                      for k, v in report.items()}})


def by_lease(lease_ids: list[int], *, last: int = 3) -> dict[int, list[dict]]:
    """For pages: {lease id: its `last` reports, oldest first, as {at, cause}} (one
    query for all the leases)."""
    found: dict[int, list[dict]] = {}
    events = (LeaseEvent.objects.filter(lease_id__in=lease_ids, detail__has_key="checkpoint")
              .order_by("at", "pk").values_list("lease_id", "at", "cause"))
    for lease_id, at, cause in events:
        found.setdefault(lease_id, []).append({"at": at, "cause": cause})
    return {k: v[-last:] for k, v in found.items()}


def listed(lease: Lease) -> list[dict]:
    """The lease's reports, oldest first: [{at, status, reason, bytes, files, seconds,
    key, message}] (reads the lease's events: prefetched ones when they are)."""
    return [dict(event.detail["checkpoint"]) for event in lease.events.all()
            if isinstance(event.detail, dict) and "checkpoint" in event.detail]
