"""The GPU-release guard: no process may still hold a lease's GPUs once its workload is gone.

ReleaseGuard takes the startup baseline (processes that are not the marketplace's), gives
`process_foreign` warnings while they run, and a fatal `process_left` finding to a GPU that
another process still holds after a lease's workload was removed, until it is free. The
rule: docs/RUNNER.md, "GPUs free after a lease"; the sources: gpu_processes.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .gpu_processes import DumpProcesses, GpuProcess, ProcessSource, describe_all
from .health import Finding

RELEASE_SETTLE_S = 2.0  # how long a process may take to let go of a GPU after its container


class ReleaseGuard:
    """The guard of a node's GPUs `uuids`. source: a gpu_processes.py source (None: no
    check, everything passes); describe: () -> the runtime's workloads ([{"lease", "gpus":
    "uuid,uuid", ...}], for the baseline); log: one line per event. settle_s: seconds a GPU
    may stay held after its workload is removed. baseline: {uuid: processes already there
    at startup}, None until taken; busy: {uuid: process_left finding} until free."""

    def __init__(self, uuids: list[str], source: ProcessSource | None,
                 describe: Callable[[], list[dict]],
                 log: Callable[[str], None], *, settle_s: float = RELEASE_SETTLE_S) -> None:
        self.uuids = list(uuids)
        self.source = source
        self.settle_s = settle_s
        self.log = log
        self._describe = describe
        self.baseline: dict[str, list[GpuProcess]] | None = None
        self.busy: dict[str, Finding] = {}

    def take_baseline(self) -> None:
        """Once, at startup (the first heartbeat or reconciliation): record the processes
        on each GPU as not the marketplace's, and log them. On a live source (NVML) a GPU
        that a lease workload already holds gets none (its processes are the lease's); a
        workload whose GPUs are unknown leaves every GPU without a baseline."""
        if self.baseline is not None:
            return
        self.baseline = {}
        if self.source is None:
            return
        leased: set[str] = set()
        unknown = False
        if self.source.live:
            for workload in self._describe():
                gpus = [u for u in (workload.get("gpus") or "").split(",") if u]
                leased.update(gpus)
                unknown = unknown or not gpus
        for uuid, processes in self.source(list(self.uuids)).items():
            if not processes:
                continue
            if unknown or uuid in leased:
                whose = "a lease workload's GPU" if uuid in leased else \
                    "a lease workload with unrecorded GPUs runs"
                self.log(f"GPU {uuid}: {describe_all(processes)} at startup ({whose}): not "
                         "taken as the baseline; checked when the lease ends")
                continue
            self.baseline[uuid] = list(processes)
            self.log(f"GPU {uuid}: {describe_all(processes)} already running at startup: not "
                     "a marketplace workload; the GPU stays offered (a lease on it shares it) "
                     "and the release check leaves it alone")

    def foreign_findings(self) -> list[Finding]:
        """A `process_foreign` warning per GPU on which a baseline process still runs;
        baseline processes that exited are dropped from the baseline (logged)."""
        if not self.baseline or self.source is None:
            return []
        current = self.source(list(self.baseline))
        found = []
        for uuid in list(self.baseline):
            if uuid not in current:  # cannot ask now: judged on a later heartbeat
                continue
            now = {p.key: p for p in current[uuid]}
            still = [now[p.key] for p in self.baseline[uuid] if p.key in now]
            for gone in (p for p in self.baseline[uuid] if p.key not in now):
                self.log(f"GPU {uuid}: {gone.describe()} (running at startup) has exited")
            if still:
                self.baseline[uuid] = still
                found.append(Finding(uuid, "process_foreign", "warn",
                                     f"{describe_all(still)} already running when the runner "
                                     "started: not a marketplace workload; a lease on this GPU "
                                     "shares it"))
            else:
                del self.baseline[uuid]
        return found

    def _not_baseline(self, uuid: str, processes: list[GpuProcess]) -> list[GpuProcess]:
        """`processes` of GPU `uuid` less those of its startup baseline."""
        known = {p.key for p in (self.baseline or {}).get(uuid, [])}
        return [p for p in processes if p.key not in known]

    def held(self, uuids: list[str], settle_s: float = 0.0) -> dict:
        """{uuid: processes} of the GPUs in `uuids` that some process outside the startup
        baseline holds; a GPU still held is asked again every 0.5 s for up to `settle_s`
        seconds. {} when no source."""
        if self.source is None or not uuids:
            return {}
        self.take_baseline()
        deadline = time.monotonic() + settle_s
        while True:
            held = {u: p for u, p in ((u, self._not_baseline(u, p)) for u, p in
                                      self.source(list(uuids)).items()) if p}
            if not held or time.monotonic() >= deadline:
                return held
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            uuids = list(held)

    def check_released(self, lease_id: int, uuids: list[str]) -> list[Finding]:
        """After lease `lease_id`'s workload was removed: the GPUs of `uuids` that a
        process still holds (after settle_s seconds of grace) each get a fatal
        `process_left` finding (evidence: the processes), logged once, and stay in `busy`
        until recheck_busy finds them free. Processes of the startup baseline do not count.
        Returns the new findings."""
        if isinstance(self.source, DumpProcesses):  # --simulate: replayed leftovers appear now
            self.source.workload_removed(list(uuids))
        found = []
        for uuid, processes in self.held(uuids, self.settle_s).items():
            finding = Finding(uuid, "process_left", "fatal",
                              f"{describe_all(processes)} still holds the GPU after lease "
                              f"{lease_id}'s workload was removed")
            if uuid not in self.busy:
                self.log(f"GPU {uuid}: {finding.evidence}; no lease starts on it until it "
                         "is free")
            self.busy[uuid] = finding
            found.append(finding)
        return found

    def recheck_busy(self) -> None:
        """Drop the GPUs no process holds any more from `busy` (logged)."""
        if not self.busy:
            return
        held = self.held(list(self.busy))
        for uuid in list(self.busy):
            if uuid not in held:
                del self.busy[uuid]
                self.log(f"GPU {uuid}: no process holds it any more; back in service")
