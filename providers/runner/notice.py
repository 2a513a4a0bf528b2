"""The notice a lease's workload gets before it is stopped (docs/LEASE_CONTRACT.md).

Whenever a lease gets a deadline it did not have (the lease payload's `notice`: a
preemption, a maintenance window) — or is stopped without one (its buyer's stop, its time
over, a fatal GPU finding) — the runner writes `notice` (JSON: lease_id, reason, deadline,
since; ISO 8601 UTC) into a directory of the lease's own that the workload sees read-only
(Docker: bind-mounted `ro` at MOUNT; the process runtime: the directory of
GPUMARKET_NOTICE_FILE), and sends the bid's `notice_signal` if it named one. At the stop:
SIGTERM, then SIGKILL after the lease's `stop_grace_seconds` (at most
MAX_STOP_GRACE_SECONDS). The directory holds that one file and nothing of the runner.

`NoticeDesk` keeps, per lease, what was delivered and the stop terms last listed; the
runtimes give it the directory (`notice_dir(lease_id)`) and the signal
(`send_signal(lease_id, name)`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

NOTICE_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGTERM")
DEFAULT_STOP_GRACE_SECONDS = 10
MAX_STOP_GRACE_SECONDS = 300
MOUNT = "/run/gpumarket"  # where a container sees its notice directory (read-only)
FILE_NAME = "notice"
MOUNTED_FILE = f"{MOUNT}/{FILE_NAME}"

# reasons the runner itself gives (the marketplace's: "preemption", "maintenance")
STOPPED, ENDED, HEALTH = "stop", "end", "health"


def bounded_grace(seconds) -> float | None:
    """`seconds` (the lease's stop_grace_seconds) within 0..MAX_STOP_GRACE_SECONDS; None
    when it is not a number (the runner's --grace applies)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    return float(min(max(seconds, 0), MAX_STOP_GRACE_SECONDS))


def make_dir(directory: Path) -> Path:
    """Create the lease's notice directory: 0755, the runner's (the workload reads it,
    never writes it)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)  # noqa: S103 - the workload (another uid) must read it
    return directory


def write_notice(directory: Path, lease_id: int, notice: dict) -> Path:
    """Write `notice` ({reason, deadline, since}) as `<directory>/notice`, atomically
    (a temporary file renamed over it: a reader sees the old or the new one whole)."""
    make_dir(directory)
    body = {"lease_id": lease_id, "reason": str(notice.get("reason") or ""),
            "deadline": notice.get("deadline"), "since": notice.get("since")}
    tmp = directory / f".{FILE_NAME}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as out:
        json.dump(body, out)
        out.write("\n")
    os.chmod(tmp, 0o644)
    path = directory / FILE_NAME
    tmp.replace(path)
    return path


def clear_notice(directory: Path) -> None:
    """Remove the notice (withdrawn: e.g. a preemption called off)."""
    with contextlib.suppress(FileNotFoundError):
        (directory / FILE_NAME).unlink()


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat()


@dataclass(frozen=True)
class StopTerms:
    """notice_signal ("" or a NOTICE_SIGNALS name) and grace_s (bounded; None: the
    runner's default), as last listed."""

    notice_signal: str = ""
    grace_s: float | None = None


class NoticeDesk:
    """What each lease's workload was told. deliver(): the payload's notice, once per
    (reason, deadline); final(): before the stop, a notice of `now` unless the workload
    was already told of a deadline no later than that."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self._delivered: dict[int, tuple[str, str] | None] = {}
        self._terms: dict[int, StopTerms] = {}

    def remember(self, lease) -> None:
        """Keep the listed lease's stop terms (a lease no longer listed is stopped with
        the terms it was last listed with)."""
        signal = lease.notice_signal if lease.notice_signal in NOTICE_SIGNALS else ""
        self._terms[lease.id] = StopTerms(signal, bounded_grace(lease.stop_grace_seconds))

    @property
    def told(self) -> set[int]:
        """The leases whose workload holds a notice now."""
        return {lease_id for lease_id, key in self._delivered.items() if key is not None}

    def grace_s(self, lease_id: int, default: float) -> float:
        """The lease's grace as last listed, else `default` (the runner's --grace)."""
        terms = self._terms.get(lease_id)
        return terms.grace_s if terms and terms.grace_s is not None else default

    def forget(self, lease_id: int) -> None:
        self._delivered.pop(lease_id, None)
        self._terms.pop(lease_id, None)

    def deliver(self, runtime, lease) -> bool:
        """Bring the workload's notice in line with the payload's `notice`: written (and
        the signal sent) when new or changed, removed when withdrawn. True if it acted."""
        notice = lease.notice
        key = (str(notice.get("reason")), str(notice.get("deadline"))) if notice else None
        if self._delivered.get(lease.id) == key:
            return False
        directory = runtime.notice_dir(lease.id)
        if notice is None:
            clear_notice(directory)
            self.log(f"lease {lease.id}: notice withdrawn")
        else:
            write_notice(directory, lease.id, notice)
            sent = self._signal(runtime, lease.id)
            self.log(f"lease {lease.id}: notice ({key[0]}, deadline {key[1]}) delivered"
                     + (f", {sent} sent" if sent else ""))
        self._delivered[lease.id] = key
        return True

    def final(self, runtime, lease_id: int, reason: str, now: datetime) -> None:
        """Before the stop of a workload still running: tell it `reason` with deadline
        `now` (and send the signal, unless it is SIGTERM, which the stop sends) — unless
        it was told of a deadline already come."""
        told = self._delivered.get(lease_id)
        if told is not None:
            try:
                deadline = datetime.fromisoformat(told[1])
            except ValueError:
                deadline = None
            if deadline is not None and deadline <= now:
                return
        stamp = _iso(now)
        write_notice(runtime.notice_dir(lease_id), lease_id,
                     {"reason": reason, "deadline": stamp, "since": stamp})
        sent = self._signal(runtime, lease_id, skip="SIGTERM")
        self._delivered[lease_id] = (reason, stamp)
        self.log(f"lease {lease_id}: notice ({reason}, now) delivered"
                 + (f", {sent} sent" if sent else ""))

    def _signal(self, runtime, lease_id: int, skip: str = "") -> str:
        terms = self._terms.get(lease_id)
        name = terms.notice_signal if terms else ""
        if not name or name == skip:
            return ""
        try:
            runtime.send_signal(lease_id, name)
        except Exception as exc:  # the workload may be gone already; the stop follows
            self.log(f"lease {lease_id}: {name} not sent ({exc.__class__.__name__})")
            return ""
        return name
