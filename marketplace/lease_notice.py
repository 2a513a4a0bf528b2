"""The lease's notice, marketplace side (docs/LEASE_CONTRACT.md): a deadline a lease did
not have — a preemption scheduled (preemption.py), a provider's maintenance window
(providers/maintenance.py) — stored on the lease (notice_reason, notice_deadline,
notice_since), sent in its runner payload (`runner_notice`) and pushed to the runner
(runner_push watches notice_deadline). At the deadline the lease ends (preemption:
lease_end.preempt_lease; maintenance: `end_noticed_leases`), charged up to the deadline
only (lease_end). The bid's stop terms: `notice_signal`, `stop_grace_seconds`
(`check_stop_terms`).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.utils import timezone

from marketplace.errors import Conflict, InvalidInput
from marketplace.models import Lease
from providers.runner.notice import (
    DEFAULT_STOP_GRACE_SECONDS,
    MAX_STOP_GRACE_SECONDS,
    NOTICE_SIGNALS,
)

log = logging.getLogger("gpumarket.leases")

PREEMPTION, MAINTENANCE = "preemption", "maintenance"
NOTICE_FIELDS = ("notice_reason", "notice_deadline", "notice_since")

__all__ = ["DEFAULT_STOP_GRACE_SECONDS", "MAX_STOP_GRACE_SECONDS", "NOTICE_SIGNALS",
           "check_stop_terms", "cleared_fields", "end_noticed_leases", "give_notice",
           "runner_notice", "set_fields", "withdraw_notice"]


def check_stop_terms(notice_signal: str, stop_grace_seconds: int) -> None:
    """A bid's stop terms: notice_signal "" or one of NOTICE_SIGNALS, stop_grace_seconds a
    whole number 0..MAX_STOP_GRACE_SECONDS. InvalidInput naming the field."""
    if notice_signal not in ("", *NOTICE_SIGNALS):
        raise InvalidInput(f"must be empty or one of {', '.join(NOTICE_SIGNALS)}",
                           field="notice_signal")
    if (isinstance(stop_grace_seconds, bool) or not isinstance(stop_grace_seconds, int)
            or not 0 <= stop_grace_seconds <= MAX_STOP_GRACE_SECONDS):
        raise InvalidInput(f"must be a whole number of seconds from 0 to "
                           f"{MAX_STOP_GRACE_SECONDS}", field="stop_grace_seconds")


def give_notice(lease: Lease, *, reason: str, deadline: datetime, now: datetime,
                cause: str) -> bool:
    """Give `lease` (row locked by the caller) a notice of `deadline`, unless it already
    has one no later: saved with an event (`cause`, for the buyer) and pushed to its
    runner after commit. True if given."""
    if not set_fields(lease, reason=reason, deadline=deadline, now=now):
        return False
    lease.note(cause=cause, at=now, update_fields=NOTICE_FIELDS,
               detail={"notice": {"reason": reason, "deadline": deadline.isoformat(),
                                  "since": now.isoformat()}})
    return True


def withdraw_notice(lease: Lease, *, reason: str, now: datetime, cause: str) -> bool:
    """Take back `lease`'s notice if it is of `reason` (the runner removes the workload's
    notice file), falling back to its preemption's, if one is scheduled. True if
    withdrawn."""
    if lease.notice_deadline is None or not cleared_fields(lease, reason):
        return False
    if lease.preempt_at is not None and reason != PREEMPTION:  # that deadline still holds
        set_fields(lease, reason=PREEMPTION, deadline=lease.preempt_at, now=now)
    lease.note(cause=cause, at=now, update_fields=NOTICE_FIELDS,
               detail={"notice": runner_notice(lease)})
    return True


def set_fields(lease: Lease, *, reason: str, deadline: datetime, now: datetime
               ) -> tuple[str, ...]:
    """Set `lease`'s notice (unsaved) unless it has one no later; the fields to save."""
    if lease.notice_deadline is not None and lease.notice_deadline <= deadline:
        return ()
    lease.notice_reason, lease.notice_deadline, lease.notice_since = reason, deadline, now
    return NOTICE_FIELDS


def cleared_fields(lease: Lease, reason: str) -> tuple[str, ...]:
    """Clear `lease`'s notice (unsaved) if it is of `reason`; the fields to save."""
    if lease.notice_reason != reason:
        return ()
    lease.notice_reason, lease.notice_deadline, lease.notice_since = "", None, None
    return NOTICE_FIELDS


def runner_notice(lease: Lease) -> dict | None:
    """The runner payload's `notice`: {reason, deadline, since} (ISO 8601), or None."""
    if lease.notice_deadline is None:
        return None
    since = lease.notice_since or lease.notice_deadline
    return {"reason": lease.notice_reason, "deadline": lease.notice_deadline.isoformat(),
            "since": since.isoformat()}


def end_noticed_leases(*, now: datetime | None = None) -> list[int]:
    """End `preempted` every unended lease whose maintenance notice deadline has come
    (lease_end.end_lease, charged up to the deadline); returns their ids. Running it
    again changes nothing. (A preemption's deadline is lease_end.preempt_lease's.)"""
    from marketplace.lease_end import end_lease  # lease_end imports preemption → this

    now = now or timezone.now()
    due = list(Lease.objects.filter(status__in=Lease.ACTIVE, notice_reason=MAINTENANCE,
                                    notice_deadline__lte=now)
               .order_by("notice_deadline", "pk").values_list("pk", "notice_deadline"))
    ended = []
    for lease_id, deadline in due:
        try:
            end_lease(lease_id=lease_id, status="preempted", now=now,
                      cause=f"ended at {deadline.isoformat()} for the provider's "
                            "maintenance window", detail={"notice_deadline": deadline.isoformat()})
        except Conflict:
            continue  # ended meanwhile
        ended.append(lease_id)
    if ended:
        log.info("leases %s ended for maintenance", ended)
    return ended
