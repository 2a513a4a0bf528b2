"""The runner's loop: announce the GPUs, heartbeat, and reconcile leases with workloads.

Once per poll the lease list and the workloads are brought in line (start, report, stop,
remove); health is evaluated on every heartbeat, a GPU with a fatal finding gets no lease,
and after a lease's workload is removed no process may still hold its GPUs (the lease
reconciliation itself: reconcile.py, a mixin of Agent). The rules: docs/RUNNER.md
("Reconciliation", "GPUs free after a lease"); the wire protocol, push and polling:
docs/RUNNER_PROTOCOL.md.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from . import __version__, mig
from .benchmark import post_result, run_in_subprocess, run_slices
from .checkpoint import CheckpointSync
from .client import MarketplaceClient, MarketplaceError, Unauthorized
from .gpu_guard import ReleaseGuard
from .gpu_links import topology_fields
from .gpu_processes import GpuProcess, source_for
from .health import Finding, evaluate
from .lease import RunnerLease
from .logtail import LOG_LINES, lease_tail
from .notice import NoticeDesk
from .nvml import PROTOCOL_KEYS, GpuSource
from .pull import normalize
from .reconcile import Reconciler, _parse_time
from .runtime_common import Runtime, RuntimeFailure
from .telemetry import lease_telemetry

MAX_BACKOFF_S = 30.0
RESYNC_S = 30.0  # with push up, the lease list is still fetched this often
UNREACHABLE_REMIND_S = 300.0  # at startup, "still retrying" at least this often


def print_line(message: str) -> None:
    """Default log: one timestamped line on stdout, flushed at once."""
    print(f"{datetime.now().strftime('%H:%M:%S')} {message}", flush=True)


class Agent(Reconciler):
    """One runner. client: MarketplaceClient; gpus: an nvml.GpuSource (NvmlGpus, DumpGpus);
    runtime: a runtime_common.Runtime (DockerRuntime, ProcessRuntime). Intervals in seconds;
    grace_s: seconds between SIGTERM and SIGKILL when stopping a workload; push:
    push.PushListener (started and stopped by run()) or None to poll only; resync_interval:
    seconds between lease-list fetches while push is connected and quiet (a lease's own
    stop_grace_seconds, when listed, wins over grace_s: notice.py). Attributes a
    caller may set: gpu_processes (gpu_processes.py source, None: no release check) and
    release_settle_s (seconds a GPU may stay held after its workload is removed). baseline:
    {uuid: processes already there at startup}, None until taken (take_baseline)."""

    def __init__(self, client: MarketplaceClient, gpus: GpuSource, runtime: Runtime, *,
                 poll_interval: float = 2.0,
                 heartbeat_interval: float = 10.0, grace_s: float = 10.0,
                 logs_interval: float = 5.0, push=None, resync_interval: float = RESYNC_S,
                 log: Callable[[str], None] = print_line) -> None:
        self.client, self.gpus, self.runtime = client, gpus, runtime
        self.poll_interval = poll_interval
        self.push = push  # push.PushListener or None (polling only); started by run()
        self.resync_interval = resync_interval
        self._wake = threading.Event()  # set by a notice: tick now
        self._stopping: threading.Event | None = None  # run()'s stop event
        self._stale = True  # the cached lease list must be fetched again
        self._leases: list[RunnerLease] | None = None  # the last list fetched
        self._next_resync = 0.0
        self.heartbeat_interval = heartbeat_interval
        self.grace_s = grace_s
        self.logs_interval = logs_interval
        self._next_logs = 0.0
        self._sent_tails: dict[int, str] = {}  # lease id → the tail last accepted
        # lease id → its secret values as last listed: redacted from its tails (logtail)
        self._secret_values: dict[int, list[str]] = {}
        self.log = log
        self.notices = NoticeDesk(log)  # what each workload was told (notice.py)
        self.node: dict | None = None
        self._inventory = inventory = gpus.inventory()
        self._uuids = [g.uuid for g in inventory.gpus]  # the physical GPUs: read for health
        self._parents = mig.parents(inventory)  # MIG slice → its GPU
        self._units = units = [u.uuid for u in mig.units(inventory)]  # what leases name
        self._next_heartbeat = 0.0
        self._skew = timedelta(0)  # server clock minus ours, from the last heartbeat
        self.findings: list[Finding] = []  # the last evaluation, ok ones included
        self._xid_fatal: dict[str, Finding] = {}  # sticky: first fatal XID per GPU
        self.fatal: dict[str, Finding] = {}  # GPU uuid → the finding that takes it out
        self._xid_note_logged = False
        self.last_xid: dict[str, int] = {}  # unit uuid → the last XID code seen (metrics.py)
        # no process may hold a lease's GPUs after its workload (source None: no check)
        self.guard = ReleaseGuard(units, source_for(gpus), self._describe, log)
        self._lease_gpus: dict[int, list[str]] = {}  # lease id → its GPUs, as last listed
        self._running: set[int] = set()  # leases running here (their telemetry is sent)
        self.telemetry_errors: list[str] = []  # the last heartbeat's refused readings
        # benchmark.BenchmarkSchedule, or None: `run` sets it (benchmarks while idle)
        self.benchmark_schedule = None
        # a MIG slice is benchmarked in a child that sees only it (benchmark.run_slices)
        self.benchmark_run = ((lambda: run_slices(units)) if self._parents
                              else run_in_subprocess)
        # runtimes a previous runner may have left workloads in (switch.py); set by `run`
        self.previous_runtimes: list = []
        # a lease's checkpoint uploads and restore (checkpoint.py; issue 15)
        self.checkpoints = CheckpointSync(client, getattr(runtime, "workspaces", None), log)
        # images.Prefetcher (pre-pulls while idle) or None; `run` sets it (Docker only)
        self.prefetcher = None
        puller = getattr(runtime, "puller", None)
        if puller is not None:  # a pull that ends wakes the loop: the lease starts at once
            puller.notify = self._wake.set
        self._progress_sent: dict[int, tuple[str, float]] = {}  # lease → (text, monotonic)
        self._pending_seen: set[int] = set()  # leases this process saw pending (pull.resumed)

    # -- marketplace calls -------------------------------------------------------------
    def announce(self) -> dict:
        """POST the inventory (each GPU with its NVLink and PCIe link: gpu_links); return
        the `node` object the marketplace answers with."""
        inventory = self.gpus.inventory()
        try:
            readings = {r["uuid"]: r for r in self.gpus.sample_health(
                [g.uuid for g in inventory.gpus])}
        except Exception as exc:  # the PCIe link is a detail: register without it
            self.log(f"could not read the PCIe links ({exc}); registering without them")
            readings = {}
        links = topology_fields(inventory.gpus, readings)
        body = {
            "hostname": socket.gethostname(),
            "driver_version": inventory.driver_version,
            "cuda_version": inventory.cuda_version,
            "runner_version": __version__,
            "source": inventory.source,
            # a GPU's item, or its parent's (listed false) and its MIG slices' (mig.py);
            # each GPU's with its NVLink and PCIe link (gpu_links)
            "gpus": [{**item, **links.get(item["uuid"], {})}
                     for item in mig.inventory_items(inventory)],
        }
        answer = self.client.post_inventory(body)
        for warning in answer.get("warnings") or []:  # e.g. an NVLink peer it ignored
            self.log(f"the marketplace ignored part of the inventory: {warning}")
        self.node = answer.get("node") or {}
        label = str(self.node.get("uid") or self.node.get("id") or self.node.get("name")
                    or "default")  # the node's uid is unique across marketplace databases
        for runtime in (self.runtime, *self.previous_runtimes):
            if runtime.node is None:  # label containers with the node id
                runtime.node = label
        return self.node

    def evaluate_health(self, readings: list[dict] | None = None) -> list[Finding]:
        """Run the health rules on `readings` (default: read the GPUs now) and the XIDs
        since the last call; update `fatal` (GPU → finding); return the non-ok findings to
        send. Logs each GPU that turns fatal, once."""
        if readings is None:
            readings = self.gpus.sample_health(self._uuids)
        self.take_baseline()
        xids = mig.scope_xids(self.gpus.xid_events(), self._inventory)
        self.last_xid.update((e.uuid, e.code) for e in xids if e.uuid)
        note = self.gpus.xid_note
        if note and not self._xid_note_logged:
            self.log(note)
            self._xid_note_logged = True
        self.findings = evaluate(readings, xids) + self.guard.foreign_findings()
        fatal: dict[str, Finding] = {}
        for finding in self.findings:
            if finding.severity != "fatal":
                continue
            if finding.rule == "xid":
                self._xid_fatal.setdefault(finding.uuid, finding)
            fatal.setdefault(finding.uuid, finding)
        for uuid, finding in self._xid_fatal.items():
            fatal.setdefault(uuid, finding)
        self.guard.recheck_busy()
        for uuid, finding in self.guard.busy.items():
            fatal.setdefault(uuid, finding)
        for uuid, finding in fatal.items():
            if uuid not in self.fatal:
                self.log(f"GPU {uuid}: fatal: {finding.rule}: {finding.evidence}")
        self.fatal = fatal
        sent = [f for f in self.findings if f.severity != "ok"]
        sent += [f for u, f in self._xid_fatal.items() if f not in sent]
        sent += [f for u, f in self.guard.busy.items() if f not in sent]
        return sent

    # -- GPUs free after a lease (gpu_guard.py) -------------------------------------------
    @property
    def gpu_processes(self):
        """The guard's process source (gpu_processes.py); None: no release check."""
        return self.guard.source

    @gpu_processes.setter
    def gpu_processes(self, source) -> None:
        self.guard.source = source

    @property
    def release_settle_s(self) -> float:
        """Seconds a GPU may stay held after its workload is removed."""
        return self.guard.settle_s

    @release_settle_s.setter
    def release_settle_s(self, seconds: float) -> None:
        self.guard.settle_s = seconds

    @property
    def baseline(self) -> dict[str, list[GpuProcess]] | None:
        """{uuid: processes already there at startup}, None until taken."""
        return self.guard.baseline

    def take_baseline(self) -> None:
        """Once, at startup (the first heartbeat or reconciliation): ReleaseGuard.take_baseline."""
        self.guard.take_baseline()

    def check_released(self, lease_id: int, uuids: list[str]) -> list[Finding]:
        """After lease `lease_id`'s workload was removed: ReleaseGuard.check_released; a GPU
        still held is fatal (no lease starts on it) and the next heartbeat goes out at
        once. Returns the new findings."""
        found = self.guard.check_released(lease_id, uuids)
        for finding in found:
            self.fatal[finding.uuid] = finding
        if found:
            self._next_heartbeat = 0.0  # the marketplace takes the GPU out of the asks now
        return found


    def heartbeat(self) -> None:
        """Evaluate health, POST the readings and non-ok findings now, and learn the
        server's clock from the answer."""
        readings = self.gpus.sample_health(self._uuids)
        findings = self.evaluate_health(readings)
        gpus = [{k: r.get(k) for k in PROTOCOL_KEYS} for r in readings]
        for item in gpus:  # the server takes whole numbers for these
            for key in ("temperature_c", "utilization_pct", "ecc_uncorrectable"):
                if isinstance(item[key], float):
                    item[key] = round(item[key])
        items = lease_telemetry(readings, self._lease_gpus, self._running)
        cache = getattr(self.runtime, "images", None)
        images = cache.report_due() if cache is not None else None
        sent = datetime.now(UTC)
        answer = self.client.heartbeat(self.runtime.name, gpus,
                                       findings=[f.as_protocol() for f in findings],
                                       telemetry=items, images=images)
        if images is not None:
            cache.sent(images)
        errors = answer.get("telemetry_errors") or []
        if errors and errors != self.telemetry_errors:  # logged once, not every beat
            self.log("telemetry refused: " + "; ".join(str(e) for e in errors[:5]))
        self.telemetry_errors = list(errors)
        received = datetime.now(UTC)
        server_time = _parse_time(answer.get("server_time"))
        if server_time is not None:
            # the server read its clock somewhere between sent and received: compare with
            # the midpoint (NTP's estimate), and take no skew within that uncertainty
            half_trip = (received - sent) / 2
            skew = server_time - (sent + half_trip)
            self._skew = skew if abs(skew) > half_trip else timedelta(0)

    def _now(self) -> datetime:
        return datetime.now(UTC) + self._skew

    # -- reconciliation ------------------------------------------------------------------
    def notify(self, seq: int | None = None) -> None:
        """A push notice (any thread): the lease list changed; tick at once."""
        self._stale = True
        self._wake.set()

    @property
    def push_live(self) -> bool:
        """True while the push websocket is connected and the marketplace's notices are
        complete (then the list is fetched on notices, and every resync_interval). With
        partial notices (hello `"notices": "partial"`, push.py) every tick fetches it too."""
        return (self.push is not None and self.push.connected
                and not self.push.partial)

    def fetch_due(self) -> bool:
        """Whether this tick fetches the lease list (module docstring)."""
        return (self._leases is None or self._stale or not self.push_live
                or time.monotonic() >= self._next_resync)

    def tick(self) -> None:
        """Heartbeat if due, fetch the leases when due (fetch_due), reconcile them once."""
        if time.monotonic() >= self._next_heartbeat:
            self.heartbeat()
            self._next_heartbeat = time.monotonic() + self.heartbeat_interval
        if self.fetch_due():
            self._stale = False  # cleared before the call: a notice during it fetches again
            try:
                self._leases = self.client.leases()
            except BaseException:
                self._stale = True
                raise
            self._next_resync = time.monotonic() + self.resync_interval
        leases = self._leases
        self.reconcile(leases)
        self.tend_images(leases)
        self.maybe_benchmark(leases)
        if time.monotonic() >= self._next_logs:
            self.send_logs(leases)
            self._next_logs = time.monotonic() + self.logs_interval

    # -- the image cache (images.py; docs/IMAGES.md) ---------------------------------------
    def tend_images(self, leases: list[RunnerLease]) -> None:
        """Evict least-recently-used pulled images while over the bound (never one a listed
        lease or a container of this node uses), then pre-pull while no lease waits to
        start. A Docker error is logged by the loop and tried again next tick."""
        cache = getattr(self.runtime, "images", None)
        if cache is None:
            return
        puller = self.runtime.puller
        waiting = {normalize(lease.image) for lease in leases
                   if lease.image and lease.status in ("pending", "starting")}
        current = self.prefetcher.current if self.prefetcher is not None else None
        for ref, state in list(puller.pulls.items()):  # pulls no lease waits for any more
            if state.phase != "pulling" and ref not in waiting and ref != current:
                if state.phase == "done":
                    cache.pulled_now(ref)
                puller.forget(ref)
        listed = {lease.image for lease in leases if lease.image}
        if cache.total() > cache.bound:
            removed = cache.evict(listed | self.runtime.images_in_use())
            if self.prefetcher is not None:
                self.prefetcher.evicted(removed)
        if self.prefetcher is not None:  # the engine is asked only when a pre-pull is weighed
            self.prefetcher.tick(idle=not waiting,
                                 in_use=lambda: listed | self.runtime.images_in_use())

    # -- benchmark -----------------------------------------------------------------------
    def maybe_benchmark(self, leases: list[RunnerLease]) -> bool:
        """Benchmark and report when the schedule says so and the node is idle (no lease
        listed, no workload left). True if it ran. A host without a GPU stack logs why once
        and stops trying; a refused report is logged; an outage propagates (retried)."""
        schedule = self.benchmark_schedule
        if schedule is None or not schedule.due(busy=bool(leases)
                                                or bool(self.runtime.list_leases())):
            return False
        schedule.done()
        result = self.benchmark_run()
        if not result.ran:
            self.log(f"{result.reason}; no further benchmarks")
            self.benchmark_schedule = None
            return True
        try:
            post_result(self.client, result, __version__, self._units, self.log)
        except MarketplaceError as exc:
            if exc.transient or isinstance(exc, Unauthorized):
                raise
            self.log(f"benchmark not reported: {exc}")
        return True

    # -- log tails -----------------------------------------------------------------------
    def send_log(self, lease_id: int) -> bool:
        """Send the workload's tail if it changed since the last accepted one. True if sent.
        Failures are logged and dropped (the next round retries), except a 401."""
        try:
            tail = lease_tail(self.runtime.logs(lease_id, LOG_LINES),
                              self._secret_values.get(lease_id, ()))
        except RuntimeFailure:
            return False
        if self._sent_tails.get(lease_id) == tail:
            return False
        try:
            self.client.post_logs(lease_id, tail)
        except Unauthorized:
            raise
        except MarketplaceError as exc:
            if not exc.transient:  # an outage is logged once by the loop
                self.log(f"lease {lease_id}: log tail not sent: {exc}")
            return False
        self._sent_tails[lease_id] = tail
        return True

    def send_logs(self, leases: list[RunnerLease]) -> None:
        """Send the changed tails of the listed leases that have a workload."""
        handles = self.runtime.list_leases()
        for lease in leases:
            if lease.id in handles:
                self.send_log(lease.id)
        for lease_id in list(self._sent_tails):
            if lease_id not in handles:
                del self._sent_tails[lease_id]

    # -- the loop --------------------------------------------------------------------------
    def _sleep(self, stop: threading.Event, seconds: float) -> None:
        """Wait up to `seconds`; return at once on a push notice, within 0.2 s on `stop`."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._wake.wait(min(left, 0.2)):
                self._wake.clear()
                return

    def run(self, stop: threading.Event) -> None:
        """Announce, then tick every poll_interval (at once on a push notice) until `stop`
        is set. The push listener, if any, is started after the announcement and stopped
        at the end.

        Transient marketplace failures (unreachable, 5xx) are logged once and retried with
        a doubling back-off up to 30 s, at startup too (the runner waits for the
        marketplace however long it takes). Raises Unauthorized (401) and non-transient
        errors of the inventory call; workloads keep running when the loop ends. Once
        `stop` is set no further lease is started or ended in the current round.
        """
        self._stopping = stop
        try:
            self._run(stop)
        finally:
            if self.push is not None:
                self.push.stop()
            self.checkpoints.join(timeout=60)  # a last upload under way finishes

    def _announce_until_answered(self, stop: threading.Event) -> bool:
        """Send the inventory until the marketplace takes it (True) or `stop` is set
        (False). While it does not answer (or answers 5xx/429) the runner keeps trying,
        every poll_interval doubling up to MAX_BACKOFF_S: the first failure is logged in
        full, a changed reason again, and a reminder every UNREACHABLE_REMIND_S."""
        backoff = self.poll_interval
        failed_since: float | None = None
        last_reason, next_remind = "", 0.0
        while not stop.is_set():
            try:
                node = self.announce()
            except MarketplaceError as exc:
                if not exc.transient:
                    raise
                now = time.monotonic()
                reason = str(exc)
                if failed_since is None:
                    failed_since = now
                    self.log(f"{reason}; retrying every {backoff:g} s, backing off to "
                             f"{MAX_BACKOFF_S:g} s, until it answers (no lease starts before "
                             "then; SIGTERM or Ctrl-C stops the runner)")
                    next_remind = now + UNREACHABLE_REMIND_S
                elif reason != last_reason or now >= next_remind:
                    self.log(f"{reason}: still retrying (for {now - failed_since:.0f} s)")
                    next_remind = now + UNREACHABLE_REMIND_S
                last_reason = reason
                stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            again = "" if failed_since is None else \
                f" (the marketplace answered after {time.monotonic() - failed_since:.0f} s)"
            self.log(f"node {node.get('name', '?')}: inventory sent "
                     f"({len(self._uuids)} GPU(s){self._slices_text()}), runtime "
                     f"{self.runtime.name}{again}")
            return True
        return False

    def _run(self, stop: threading.Event) -> None:
        if not self._announce_until_answered(stop):
            self.log("stopped before the marketplace answered; no lease workload was "
                     "started or touched")
            return
        if self.push is not None and not stop.is_set():
            self.push.start(self.notify)
        failing = False
        backoff = self.poll_interval
        while not stop.is_set():
            wait = self.poll_interval
            try:
                self.tick()
                if failing:
                    self.log("marketplace reachable again")
                failing, backoff = False, self.poll_interval
            except Unauthorized:
                raise
            except MarketplaceError as exc:
                if not failing:
                    self.log(f"{exc}: retrying with back-off up to {MAX_BACKOFF_S:.0f} s")
                failing, wait = True, backoff
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            except Exception as exc:  # a Docker hiccup must not kill the agent
                self.log(f"error during reconciliation: {exc.__class__.__name__}: {exc}")
            self._sleep(stop, wait)
        self.log(f"stopped; {self._left_running()} left running for re-adoption")

    def _slices_text(self) -> str:
        """', of which 1 as 4 MIG slices' for the inventory log line ('' when none)."""
        sliced = set(self._parents.values())
        return (f", of which {len(sliced)} as {len(self._parents)} MIG slices"
                if sliced else "")

    def _left_running(self) -> str:
        """'N lease workload(s)' for the last log line; never raises (the engine may be
        gone too)."""
        try:
            return f"{len(self.runtime.list_leases())} lease workload(s)"
        except Exception as exc:  # RuntimeFailure, DockerException: say so, exit anyway
            return f"the lease workloads (cannot list them: {exc.__class__.__name__})"
