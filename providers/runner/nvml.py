"""GPU inventory and health, read through NVML (pynvml) or, when simulating, from a dump.

Two sources with one interface (GpuSource: `inventory()`, `sample_health(uuids)`,
`xid_events()`, `xid_note`, `source`, `simulate`):
- NvmlGpus: the real driver, via the NVIDIA Management Library (package nvidia-ml-py).
- DumpGpus: a recorded `nvidia-smi -q` report (`--simulate FILE`), for hosts without a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, runtime_checkable

from . import nvml_mig
from .catalog import gpu_class_for
from .nvsmi import GpuInfo, Inventory, load_dump
from .nvsmi_health import health_from_tree
from .sim_uuids import own_uuids
from .xid import NvmlXidWatcher, XidEvent, XidUnsupported, map_to_gpus, parse_kernel_log

#: The keys of a heartbeat `gpus[]` item (docs/RUNNER_PROTOCOL.md); readings hold more.
PROTOCOL_KEYS = ("uuid", "temperature_c", "power_w", "utilization_pct", "ecc_uncorrectable")
#: Every reading key (health.py); None where unknown.
READING_KEYS = (
    *PROTOCOL_KEYS, "slowdown_temp_c", "retired_pages", "retired_pages_pending",
    "remapped_rows_pending",
    "remapping_failure", "hw_thermal_slowdown", "hw_power_brake", "pcie_gen_current",
    "pcie_gen_max", "pcie_width_current", "pcie_width_max", "lost", "lost_reason",
    # telemetry (metrics.py: DCGM_FI_DEV_FB_USED, _FB_FREE, _SM_CLOCK, _MEM_CLOCK)
    "fb_used_mib", "fb_free_mib", "sm_clock_mhz", "mem_clock_mhz",
)


@runtime_checkable
class GpuSource(Protocol):
    """The host's GPUs as the agent reads them (NvmlGpus, DumpGpus). simulate: read from a
    dump; source: the inventory's `source` field; xid_note: why XIDs are not watched (for
    the log, once), None while they are."""

    simulate: bool
    source: str
    xid_note: str | None

    def inventory(self) -> Inventory: ...
    def sample_health(self, uuids: list[str]) -> list[dict]: ...
    def xid_events(self) -> list[XidEvent]: ...


class NoDriverError(RuntimeError):
    """No usable NVIDIA driver: libnvidia-ml missing, driver not loaded, or NVML init failed."""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml():
    """Import pynvml and call nvmlInit(); raise NoDriverError with NVML's own reason."""
    try:
        import pynvml
    except ImportError as exc:  # the package is a declared dependency; be clear anyway
        raise NoDriverError(f"the nvidia-ml-py package is not installed ({exc})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoDriverError(str(exc)) from None
    return pynvml


def _cuda_version(driver_int: int) -> str:
    """NVML's CUDA driver version 12020 → '12.2'."""
    return f"{driver_int // 1000}.{(driver_int % 1000) // 10}"


class NvmlGpus:
    """The host's GPUs through NVML. Constructing it raises NoDriverError without a driver."""

    simulate = False
    source = "nvml"

    def __init__(self) -> None:
        self._nvml = _nvml()
        self._xid: NvmlXidWatcher | None = None
        self.xid_note: str | None = None  # why XIDs are not watched, once known

    def inventory(self) -> Inventory:
        """Every GPU NVML sees, in index order; memory in MiB (bytes // 2**20); MIG
        devices and NVLinks as nvml_mig reads them.

        Raises NoDriverError on an NVML failure, catalog.UnknownGpuProduct for an
        unknown model.
        """
        nv = self._nvml
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
            cuda = _cuda_version(nv.nvmlSystemGetCudaDriverVersion())
            gpus, notes = [], []
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                name = _text(nv.nvmlDeviceGetName(handle))
                try:
                    current, _pending = nv.nvmlDeviceGetMigMode(handle)
                    mig = "Enabled" if current else "Disabled"
                except nv.NVMLError:  # NVML_ERROR_NOT_SUPPORTED on GPUs without MIG
                    mig = "N/A"
                bus_id = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
                slices: tuple = ()
                if mig == "Enabled":
                    try:
                        slices = nvml_mig.mig_devices(nv, handle)
                    except nvml_mig.ProfileUnknown as exc:
                        notes.append(f"GPU {bus_id}: MIG devices left out: {exc}")
                gpus.append(
                    GpuInfo(
                        uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                        product_name=name,
                        memory_mib=nv.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                        pci_bus_id=bus_id,
                        mig_mode=mig,
                        gpu_class=gpu_class_for(name),
                        mig_devices=slices,
                        nvlinks=nvml_mig.nvlinks(nv, handle),
                    )
                )
        except nv.NVMLError as exc:
            raise NoDriverError(f"NVML failed while reading the GPUs: {exc}") from None
        return Inventory(driver, cuda, gpus, source="nvml", notes=tuple(notes))

    def sample_health(self, uuids: list[str]) -> list[dict]:
        """One reading per UUID with every key of READING_KEYS (health.py names them);
        None where NVML cannot say (NVML_ERROR_NOT_SUPPORTED and the like). A GPU whose
        handle NVML no longer finds, or that answers NVML_ERROR_GPU_IS_LOST, has lost=True."""
        nv = self._nvml
        lost_code = getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15)
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        out = []
        for uuid in uuids:
            reading = dict.fromkeys(READING_KEYS)
            reading["uuid"] = uuid
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid.encode())
            except nv.NVMLError as exc:
                reading["lost"] = True
                reading["lost_reason"] = f"NVML cannot reach the GPU: {exc}"
                out.append(reading)
                continue
            reading["lost"] = False

            def retired(h):
                causes = (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                          nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
                return sum(len(nv.nvmlDeviceGetRetiredPages(h, c)) for c in causes)

            probes = {
                "temperature_c": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                "slowdown_temp_c": lambda h: nv.nvmlDeviceGetTemperatureThreshold(
                    h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                "power_w": lambda h: round(nv.nvmlDeviceGetPowerUsage(h) / 1000, 2),
                "utilization_pct": lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu,
                "ecc_uncorrectable": lambda h: nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                ),
                "retired_pages": retired,
                "retired_pages_pending": lambda h: bool(
                    nv.nvmlDeviceGetRetiredPagesPendingStatus(h)),
                "remapped_rows_pending": lambda h: bool(nv.nvmlDeviceGetRemappedRows(h)[2]),
                "remapping_failure": lambda h: bool(nv.nvmlDeviceGetRemappedRows(h)[3]),
                "hw_thermal_slowdown": lambda h: bool(
                    reasons(h) & nv.nvmlClocksThrottleReasonHwThermalSlowdown),
                "hw_power_brake": lambda h: bool(
                    reasons(h) & nv.nvmlClocksThrottleReasonHwPowerBrakeSlowdown),
                "pcie_gen_current": lambda h: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
                "pcie_gen_max": lambda h: nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
                "pcie_width_current": lambda h: nv.nvmlDeviceGetCurrPcieLinkWidth(h),
                "pcie_width_max": lambda h: nv.nvmlDeviceGetMaxPcieLinkWidth(h),
                "fb_used_mib": lambda h: nv.nvmlDeviceGetMemoryInfo(h).used // 2**20,
                "fb_free_mib": lambda h: nv.nvmlDeviceGetMemoryInfo(h).free // 2**20,
                "sm_clock_mhz": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            }
            for key, probe in probes.items():
                try:
                    reading[key] = probe(handle)
                except nv.NVMLError as exc:  # unsupported here: leave None
                    if getattr(exc, "value", None) == lost_code:
                        reading["lost"] = True
                        reading["lost_reason"] = f"NVML: {exc} (while reading {key})"
                        break
                except (AttributeError, TypeError):  # an older nvidia-ml-py lacks the call
                    pass
            out.append(reading)
        return out

    def xid_events(self) -> list[XidEvent]:
        """XIDs NVML reported since the last call (never blocks). The first call registers
        the event set; where XID events are unsupported, `xid_note` says why (once) and
        this returns [] ever after: the other rules still run."""
        if self._xid is None and self.xid_note is None:
            try:
                self._xid = NvmlXidWatcher(self._nvml, self.inventory().gpus)
            except XidUnsupported as exc:
                self.xid_note = str(exc)
        if self._xid is None:
            return []
        try:
            return self._xid.poll(timeout_ms=0)
        except self._nvml.NVMLError as exc:
            self.xid_note = f"NVML XID event wait failed ({exc}); XIDs are no longer watched"
            self._xid.close()
            self._xid = None
            return []


class ReplayError(ValueError):
    """A --replay-xid / --replay-health input that cannot be used; the message says why."""


def load_replay_health(value: str) -> dict[str, dict]:
    """--replay-health: inline JSON, or the path of a JSON file, holding
    {"GPU-…": {reading key: value, …}}; keys must be reading keys (health.py)."""
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text(encoding="utf-8")
        except OSError as exc:
            raise ReplayError(f"--replay-health {value}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ReplayError(f"--replay-health is not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ReplayError('--replay-health must be {"GPU-…": {"temperature_c": 95, …}}')
    for uuid, values in data.items():
        unknown = sorted(set(values) - set(READING_KEYS) - {"uuid"})
        if unknown:
            raise ReplayError(f"--replay-health {uuid}: unknown reading(s) {', '.join(unknown)}"
                              f" (known: {', '.join(READING_KEYS[1:])})")
    return data


class DumpGpus:
    """GPUs read from a recorded `nvidia-smi -q` report (`--simulate FILE`).

    replay_xid: a kernel log whose XID lines are delivered (mapped to GPUs by PCI bus id)
    on the first xid_events() call; replay_health: {uuid: {reading key: value}} laid over
    the recorded readings (nvml.load_replay_health); replay_process_left: {uuid: [processes]}
    that appear on a GPU when the first lease workload on it is removed
    (gpu_processes.load_replay_process_left; kept here for gpu_processes.source_for).
    uuid_salt: the state dir's id (config.simulate_id): zeroed UUIDs of the recording are
    replaced by ones derived from it (sim_uuids; replays may name either; uuid_map).
    Constructing it parses the file and raises nvsmi.DumpError if it is malformed,
    ReplayError for an unusable replay.
    """

    simulate = True
    xid_note = None

    def __init__(self, path: str | Path, *, replay_xid: str | Path | None = None,
                 replay_health: dict[str, dict] | None = None,
                 replay_process_left: dict[str, list] | None = None,
                 uuid_salt: str | None = None) -> None:
        self.path = Path(path)
        self._inventory, tree = load_dump(self.path)
        self._health = health_from_tree(tree)
        # zeroed UUIDs replaced by ones of this state dir (sim_uuids), where salt is given
        self.uuid_map: dict[str, str] = {}
        if uuid_salt is not None:
            self._inventory, self.uuid_map = own_uuids(self._inventory, uuid_salt,
                                                       self.path.name)
            self._health = {self.uuid_map.get(u, u): v for u, v in self._health.items()}
            replay_health = {self.uuid_map.get(u, u): v for u, v in (replay_health or {}).items()}
            replay_process_left = {self.uuid_map.get(u, u): v
                                   for u, v in (replay_process_left or {}).items()}
        self.source = self._inventory.source
        known = {g.uuid for g in self._inventory.gpus}
        for uuid, values in (replay_health or {}).items():
            if uuid not in known:
                raise ReplayError(f"--replay-health names {uuid}, which is not a GPU of "
                                  f"{self.path.name}")
            self._health[uuid] = {**self._health[uuid], **values}
        for uuid in replay_process_left or {}:
            if uuid not in known:
                raise ReplayError(f"--replay-process-left names {uuid}, which is not a GPU of "
                                  f"{self.path.name}")
        self.replay_process_left = dict(replay_process_left or {})
        self._pending_xids: list[XidEvent] = []
        if replay_xid is not None:
            self.replay_xid(replay_xid)

    def replay_xid(self, path: str | Path) -> list[XidEvent]:
        """Queue the XID lines of the kernel log at `path` (mapped to this dump's GPUs by
        PCI bus id) for the next xid_events() call; return them. ReplayError when the file
        is unreadable or holds no XID line."""
        try:
            log = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ReplayError(f"--replay-xid {path}: {exc.strerror or exc}") from None
        events, _gpu_at = parse_kernel_log(log)
        if not events:
            raise ReplayError(f"--replay-xid {path}: no 'NVRM: Xid' line in it")
        mapped = map_to_gpus(events, self._inventory.gpus)
        self._pending_xids.extend(mapped)
        return mapped

    def inventory(self) -> Inventory:
        """The inventory recorded in the file (source "simulate:<file name>")."""
        return self._inventory

    def sample_health(self, uuids: list[str]) -> list[dict]:
        """The readings recorded in the file, with the replayed ones laid over them (same
        keys as NvmlGpus.sample_health)."""
        empty = dict.fromkeys(READING_KEYS[1:])
        return [{**empty, "uuid": u, **self._health.get(u, {})} for u in uuids]

    def xid_events(self) -> list[XidEvent]:
        """The replayed XIDs, once (the first call); then []."""
        events, self._pending_xids = self._pending_xids, []
        return events

