"""Lease reconciliation: the part of the runner's loop that brings the workloads in line
with the marketplace's lease list (start, report, stop, remove) — docs/RUNNER.md
("Reconciliation", "GPUs free after a lease").

`Reconciler` is a mixin of agent.Agent: it reads the Agent's client, runtime, log, fatal,
guard state and clock (`_now`), and reports lease events through the client. Kept apart so
the stop sequence (notice, deadline, checkpoints) has a module of its own to grow in.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from .checkpoint import NOTICE_SETTLE_S
from .client import Conflict, MarketplaceError, Unauthorized
from .health import Finding
from .lease import RunnerLease
from .notice import ENDED, HEALTH, STOPPED
from .runtime_common import RuntimeFailure
from .switch import stop_previous


def _parse_time(value: str | None) -> datetime | None:
    """ISO 8601 ('2025-01-01T00:00:00Z' or with an offset) → aware datetime, or None."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _short(handle: str) -> str:
    return handle if handle.startswith("pid-") else handle[:12]


def _gpus(uuids: list[str]) -> str:
    return ",".join(u[:12] + "…" if len(u) > 12 else u for u in uuids) or "no GPU"


PROGRESS_EVERY_S = 2.0  # seconds between two progress events of one lease's pull

# the workload's notice at a stop, by the stop's reason (checkpoint_reports.REASONS or a
# notice.py reason): the lease's time over is "end" to the workload
NOTICE_REASON = {"deadline": ENDED}


class Reconciler:
    """The reconcile half of agent.Agent (a mixin; the Agent's __init__ sets the state)."""

    def _event(self, lease_id: int, status: str, **fields) -> bool:
        """Report an event; True if accepted, False on 409 (already known, logged)."""
        self._stale = True  # the list changes with it (or was out of date): fetch it again
        try:
            self.client.post_event(lease_id, status, **fields)
        except Conflict as exc:
            self.log(f"lease {lease_id}: marketplace already knows ({status}: {exc.detail})")
            return False
        return True

    def _stop(self, lease_id: int, reason: str = STOPPED) -> None:
        """The stop sequence (docs/LEASE_CONTRACT.md): a workload still running is told
        (notice.NoticeDesk.final; `reason` as the notice names it: NOTICE_REASON), then
        SIGTERM, SIGKILL after the lease's grace; send the final tail, remove the
        workload, start the last checkpoint upload in the background (`reason`:
        checkpoint_reports.REASONS or a notice.py reason), then check that no process still
        holds its GPUs (check_released)."""
        uuids = self._lease_gpus.pop(lease_id, None)
        self._running.discard(lease_id)
        if uuids is None:  # ended while the runner was down: the container knows its GPUs
            uuids = next((w["gpus"].split(",") for w in self._describe()
                          if w["lease"] == lease_id and w.get("gpus")), [])
        if self._still_running(lease_id):
            try:
                self.notices.final(self.runtime, lease_id, NOTICE_REASON.get(reason, reason),
                                   self._now())
            except (OSError, RuntimeFailure) as exc:  # the stop goes on without it
                self.log(f"lease {lease_id}: notice not written: {exc}")
        self.send_log(lease_id)
        self._sent_tails.pop(lease_id, None)
        self.runtime.stop(lease_id, self.notices.grace_s(lease_id, self.grace_s))
        self.notices.forget(lease_id)
        self.checkpoints.finish(lease_id, reason)
        self.check_released(lease_id, uuids)

    def _still_running(self, lease_id: int) -> bool:
        try:
            return self.runtime.exit_status(lease_id) is None
        except RuntimeFailure:
            return False

    def _describe(self) -> list[dict]:
        try:
            return self.runtime.describe()
        except RuntimeFailure:
            return []

    def reconcile(self, leases: list[RunnerLease]) -> None:
        """Bring the workloads in line with `leases` (the GET /leases/ list)."""
        self.take_baseline()  # before anything is stopped or started
        # a lease its buyer stopped is treated as no longer listed: stopped and removed
        listed = {lease.id: lease for lease in leases if not lease.stop_requested}
        if self.previous_runtimes:  # first: a lease never runs in two runtimes
            stop_previous(self, listed)
        handles = self.runtime.list_leases()
        for lease_id, lease in listed.items():
            self._lease_gpus[lease_id] = list(lease.gpu_uuids)
            self._secret_values[lease_id] = list(lease.secrets.values())
            self.notices.remember(lease)
            self.checkpoints.remember(lease)
        for lease_id in sorted(handles.keys() - listed.keys()):  # free GPUs before reuse
            self._stop(lease_id)
            self.log(f"lease {lease_id}: no longer listed by the marketplace; "
                     f"container {_short(handles[lease_id])} stopped and removed")
        for lease_id in list(self._lease_gpus.keys() - listed.keys()):
            del self._lease_gpus[lease_id]  # ended without a workload here
        for lease_id in list(self._progress_sent.keys() - listed.keys()):
            del self._progress_sent[lease_id]
        self._pending_seen &= listed.keys()
        self._running = {i for i, lease in listed.items()
                         if lease.status == "running" and i in handles}
        for lease_id in list(self._secret_values.keys() - listed.keys()):
            del self._secret_values[lease_id]  # its last tail was sent by _stop
        for lease_id, lease in listed.items():
            if self._stopping is not None and self._stopping.is_set():
                return  # stopping: the next run picks up where this one left off
            try:
                self._reconcile_lease(lease, handles.get(lease_id))
            except RuntimeFailure as exc:
                self.log(f"lease {lease_id}: {exc}")
            except MarketplaceError as exc:
                if exc.transient or isinstance(exc, Unauthorized):
                    raise
                self.log(f"lease {lease_id}: {exc}")  # e.g. 400/404 for this lease only

    def _unhealthy(self, lease: RunnerLease) -> Finding | None:
        """The fatal finding of the first leased GPU that has one (a MIG slice: its own,
        else its parent GPU's), else None."""
        for uuid in lease.gpu_uuids:
            for unit in (uuid, self._parents.get(uuid)):
                if unit in self.fatal:
                    return self.fatal[unit]
        return None

    def _fail_unhealthy(self, lease: RunnerLease, handle: str | None, finding: Finding
                        ) -> None:
        """Report the lease `failed` with the finding as cause, then stop its workload."""
        lease_id, status = lease.id, lease.status
        usage = self._usage(lease) if status == "running" else None
        self._event(lease_id, "failed", container_id=handle, cause=finding.cause,
                    usage_seconds=usage)
        if handle is not None:
            self._stop(lease_id, HEALTH)
        where = f"container {_short(handle)} stopped and removed" if handle else "not started"
        self.log(f"lease {lease_id}: failed: {finding.cause} ({where})")

    def _reconcile_lease(self, lease: RunnerLease, handle: str | None) -> None:
        lease_id, status = lease.id, lease.status
        unhealthy = self._unhealthy(lease)
        if unhealthy is not None and status in ("pending", "starting", "running"):
            self._fail_unhealthy(lease, handle, unhealthy)
            return
        if status in ("pending", "starting"):
            if handle is None:
                if status == "pending":
                    self._pending_seen.add(lease_id)  # before the event: its answer may be lost
                    self._event(lease_id, "starting")
                if not self._image_ready(lease):
                    return  # pulling (progress sent) or failed (reported)
                restore_failed = self.checkpoints.restore(lease)
                if restore_failed:  # before running: charged nothing
                    self._event(lease_id, "failed", cause=restore_failed)
                    self.log(f"lease {lease_id}: failed: {restore_failed}")
                    return
                try:
                    handle = self.runtime.start(lease)
                except RuntimeFailure as exc:
                    self._event(lease_id, "failed", cause=str(exc))
                    self.log(f"lease {lease_id}: failed to start: {exc}")
                    return
                images = getattr(self.runtime, "images", None)
                if images is not None and lease.image:
                    images.used(lease.image)  # the most recently used now (LRU)
                self.log(f"lease {lease_id}: started container {_short(handle)} "
                         f"on {_gpus(lease.gpu_uuids)}")
                mismatch = self.runtime.verify_gpus(lease)
                if mismatch is not None:
                    cause = f"GPU check failed: {mismatch}"[:300]
                    self._event(lease_id, "failed", container_id=handle, cause=cause)
                    self._stop(lease_id, "failure")
                    self.log(f"lease {lease_id}: failed: {cause} (container removed)")
                    return
                check = self.runtime.last_check
                if self.runtime.name == "docker" and " sees " not in check:
                    self.log(f"lease {lease_id}: GPUs not verified from inside: {check}")
            else:
                self.log(f"lease {lease_id}: re-adopted container {_short(handle)}")
            endpoints = self._endpoints(lease)
            if self._event(lease_id, "running", container_id=handle, endpoints=endpoints):
                self._running.add(lease_id)
                self.log(f"lease {lease_id}: running")
            return
        if status != "running":
            return
        if handle is None:
            cause = "the lease's container is gone (removed outside the runner)"
            self._event(lease_id, "failed", cause=cause, usage_seconds=self._usage(lease))
            self.log(f"lease {lease_id}: failed: {cause}")
            return
        over = self.checkpoints.over_bound(lease)
        if over:
            self._event(lease_id, "failed", container_id=handle, cause=over,
                        usage_seconds=self._usage(lease))
            self._stop(lease_id, "failure")
            self.log(f"lease {lease_id}: failed: {over}")
            return
        ends_at = _parse_time(lease.ends_at)
        if ends_at is not None and self._now() >= ends_at:
            usage = self._usage(lease)
            self._event(lease_id, "completed", container_id=handle, usage_seconds=usage)
            self._stop(lease_id, "deadline")
            self.log(f"lease {lease_id}: completed after {usage} s, container removed")
            return
        if lease.notice is not None or lease.id in self.notices.told:
            try:
                delivered = self.notices.deliver(self.runtime, lease)
                if delivered and lease.notice is not None and lease.checkpoint:
                    # the workload's time to write its checkpoint, then its upload
                    self.checkpoints.upload(lease, "notice", delay_s=NOTICE_SETTLE_S)
            except (OSError, RuntimeFailure) as exc:
                self.log(f"lease {lease_id}: notice not delivered: {exc}")
        code = self.runtime.exit_status(lease_id)
        if code is None:
            return
        usage = self._usage(lease)
        if code == 0:
            self._event(lease_id, "completed", container_id=handle, usage_seconds=usage)
            self.log(f"lease {lease_id}: container exited with status 0; completed after "
                     f"{usage} s, container removed")
        else:
            cause = f"container exited with status {code}"
            self._event(lease_id, "failed", container_id=handle, cause=cause,
                        usage_seconds=usage)
            self.log(f"lease {lease_id}: failed: {cause} after {usage} s, container removed")
        self._stop(lease_id, "end" if code == 0 else "failure")

    def _image_ready(self, lease: RunnerLease) -> bool:
        """Whether the lease's image is on the engine (runtime.prepare; a runtime without
        images: always). While its background pull runs, the progress goes to the buyer as
        a `starting` event (at most every PROGRESS_EVERY_S, when it changed; "again" when a
        previous runner process began the lease's pull) and False is returned; a failed
        pull fails the lease with the engine's cause (it never ran: no charge), False;
        a finished pull is recorded in the image cache, True."""
        prepare = getattr(self.runtime, "prepare", None)
        state = prepare(lease) if prepare is not None else None
        if state is None:
            return True
        if state.phase == "pulling":
            if lease.id not in self._pending_seen and state.layers == 0:
                state.resumed = True  # a previous runner process began it (the text says so)
            self._progress(lease.id, state.text())
            return False
        self.runtime.puller.forget(state.ref)
        if state.phase == "failed":
            cause = state.text()[:300]
            self._event(lease.id, "failed", cause=cause)
            self.log(f"lease {lease.id}: failed: {cause}")
            return False
        self.runtime.images.pulled_now(state.ref)
        self._progress(lease.id, state.text(), force=True)
        self.log(f"lease {lease.id}: {state.text()} ({state.total >> 20} MiB)")
        return True

    def _progress(self, lease_id: int, text: str, force: bool = False) -> None:
        """Send `text` as the lease's `starting` progress when it changed and
        PROGRESS_EVERY_S passed since the last one (`force`: whenever it changed). A 409
        (the lease moved on) is logged; an outage propagates (the loop retries)."""
        last_text, last_at = self._progress_sent.get(lease_id, ("", 0.0))
        now = time.monotonic()
        if text == last_text or (not force and now < last_at + PROGRESS_EVERY_S):
            return
        try:
            self.client.post_event(lease_id, "starting", cause=text[:300])
        except Conflict as exc:
            self.log(f"lease {lease_id}: progress not sent ({exc.detail})")
        self._progress_sent[lease_id] = (text, now)

    def _endpoints(self, lease: RunnerLease) -> list[dict] | None:
        """Where the buyer reaches the lease's ports (runtime.endpoints), sent with
        `running`; None (not sent) when the lease exposes none or the runtime cannot
        publish. An engine error is logged and leaves the endpoints out."""
        if not lease.ports:
            return None
        try:
            return self.runtime.endpoints(lease)
        except Exception as exc:  # a Docker hiccup must not keep the lease from running
            self.log(f"lease {lease.id}: endpoints not read: {exc.__class__.__name__}")
            return None

    def _usage(self, lease: RunnerLease) -> int:
        """Whole seconds from started_at to now (or ends_at, whichever is first); 0 if
        the lease never started."""
        started = _parse_time(lease.started_at)
        if started is None:
            return 0
        end = self._now()
        ends_at = _parse_time(lease.ends_at)
        if ends_at is not None:
            end = min(end, ends_at)
        return max(0, int((end - started).total_seconds()))
