"""XID events: parse NVIDIA kernel log lines, map them to GPUs, classify them, wait for them.

An XID is an error report of the NVIDIA driver. It reaches us two ways:
- the kernel log (`dmesg`, journald), one line per event, as recorded in
  data/dmesg-with-xid-119.log:

      NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s ...

  older drivers omit "PCI:" or the pid/name part ("NVRM: Xid (0000:01:00): 79, GPU has
  fallen off the bus."); the driver also logs "NVRM: GPU at PCI:0000:9b:00: GPU-<uuid>"
  when it first reports on a GPU, which maps the bus id to the UUID by itself;
- NVML: an event set registered for `nvmlEventTypeXidCriticalError` on each GPU
  (NvmlXidWatcher below); the event's `eventData` is the XID code.

`--replay-xid FILE` (with `--simulate`) feeds a kernel log through parse_kernel_log, so every
XID rule is testable without a GPU.

Which XIDs are fatal follows NVIDIA's XID catalog — "XID Errors", "Analyzing Xid Errors with
the Xid Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html —
column "Resolution Bucket (Immediate Action)". Policy of this runner:
- RESET_GPU, RESTART_BM (reboot the node), WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, and XID 154
  naming a reset/reboot → **fatal**: the GPU must be reset (or the node rebooted) before it
  can be trusted again, so the leases on it cannot continue;
- RESTART_APP → **warn**: the buyer's application got the error and may restart; the GPU
  itself stays usable;
- IGNORE → **warn**: recorded as evidence (a rising rate of 63 precedes a 64);
- a code not in the table → **warn**, evidence says it is not in the runner's table.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, replace

#: XID code → (mnemonic, description, NVIDIA immediate action, runner severity).
#: Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
#: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (Ampere and newer).
XID_CATALOG: dict[int, tuple[str, str, str, str]] = {
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP", "warn"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP",
         "warn"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", "warn"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", "fatal"),
    62: ("PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU", "fatal"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", "warn"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU",
         "fatal"),
    74: ("NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", "fatal"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus",
         "RESTART_BM", "fatal"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", "warn"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", "warn"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", "fatal"),
    119: ("GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", "fatal"),
    120: ("GSP_ERROR", "GSP Error", "RESET_GPU", "fatal"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU", "fatal"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154", "warn"),
}

#: XID 154's recovery actions (catalog: "None", "Drain P2P", "Drain and Reset",
#: "GPU Reset Required", "Node Reboot Required"); these three mean the GPU is out of service.
XID_154_FATAL = ("Drain and Reset", "GPU Reset Required", "Node Reboot Required")

_BUS = r"(?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?"
# On a MIG-enabled GPU the driver attributes an XID to a GPU instance (and compute
# instance) where it can: "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, …", or
# "(PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u)" (decimal ids; NVIDIA open-gpu-kernel-modules,
# kernel_rc, and "A100 GPU memory error management", docs.nvidia.com/deploy).
_XID_LINE = re.compile(r"NVRM: Xid \(" + _BUS + r"(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?"
                       r"\): (?P<code>\d+)(?:, (?P<rest>.*))?$")
_PID_NAME = re.compile(r"^pid=(?P<pid>'?[^,]*?'?), name=(?P<name>[^,]*), ?(?P<message>.*)$")
_GPU_AT = re.compile(r"NVRM: GPU at " + _BUS + r": (?P<uuid>GPU-[0-9A-Fa-f-]+)")
_STAMP = re.compile(r"^\s*\[(?P<stamp>[^\]]*)\]")


def normalise_bus_id(bus_id: str) -> str:
    """A PCI bus id in one canonical form, "dddd:bb:dd" lower-case (domain of 4 hex digits,
    bus, device; the function is dropped): NVML's "00000000:53:00.0", the kernel's
    "PCI:0000:53:00" and "0000:53:00.0" all become "0000:53:00"."""
    text = bus_id.strip()
    if text.upper().startswith("PCI:"):
        text = text[4:]
    text = text.split(".", 1)[0]
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, device = parts
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


@dataclass(frozen=True)
class XidEvent:
    """One XID. code: the XID number; bus_id: normalised ("0000:9b:00"), None from NVML
    when unknown; uuid: the GPU, once mapped (None if no GPU of the inventory has that bus
    id); pid/name: the process named by the driver ("" when absent); message: the rest of
    the line; stamp: the kernel log's time stamp text ("" when absent); line: the raw line."""

    code: int
    bus_id: str | None
    uuid: str | None = None
    pid: str = ""
    name: str = ""
    message: str = ""
    stamp: str = ""
    line: str = ""
    gpu_instance_id: int | None = None  # MIG: the GPU instance the driver attributes it to
    compute_instance_id: int | None = None

    @property
    def mnemonic(self) -> str:
        entry = XID_CATALOG.get(self.code)
        return entry[0] if entry else "UNKNOWN"


def classify(event: XidEvent) -> tuple[str, str]:
    """(severity "warn"|"fatal", NVIDIA immediate action) for `event`, per XID_CATALOG.

    XID 154 is fatal when its message names one of XID_154_FATAL; a code the table does not
    hold is "warn" with action "UNKNOWN".
    """
    entry = XID_CATALOG.get(event.code)
    if entry is None:
        return "warn", "UNKNOWN"
    _mnemonic, _description, action, severity = entry
    if event.code == 154:
        target = event.message.rsplit(" to ", 1)[-1]
        if any(words in target for words in XID_154_FATAL):
            return "fatal", action
    return severity, action


def parse_kernel_log(text: str) -> tuple[list[XidEvent], dict[str, str]]:
    """Every XID line of a kernel log, in order, and the log's own bus id → UUID map (from
    "NVRM: GPU at PCI:…: GPU-…" lines). Lines that are not XIDs are skipped."""
    events: list[XidEvent] = []
    gpu_at: dict[str, str] = {}
    for raw in text.splitlines():
        found = _GPU_AT.search(raw)
        if found:
            gpu_at[normalise_bus_id(found.group("bus"))] = found.group("uuid")
            continue
        match = _XID_LINE.search(raw.rstrip())
        if not match:
            continue
        rest = match.group("rest") or ""
        pid = name = ""
        message = rest
        pid_name = _PID_NAME.match(rest)
        if pid_name:
            pid, name = pid_name.group("pid").strip("'"), pid_name.group("name").strip()
            message = pid_name.group("message")
        stamp = _STAMP.match(raw)
        events.append(XidEvent(
            code=int(match.group("code")), bus_id=normalise_bus_id(match.group("bus")),
            pid=pid, name=name, message=message.strip(),
            stamp=stamp.group("stamp") if stamp else "", line=raw.strip(),
            gpu_instance_id=_id(match.group("gi")), compute_instance_id=_id(match.group("ci")),
        ))
    return events, gpu_at


def map_to_gpus(events: list[XidEvent], gpus) -> list[XidEvent]:
    """`events` with `uuid` set from the inventory's GPUs (objects with `uuid` and
    `pci_bus_id`), matching normalised bus ids. An event whose bus id no GPU has keeps
    uuid None (the kernel log's own "GPU at" line is not trusted over the inventory)."""
    by_bus = {normalise_bus_id(g.pci_bus_id): g.uuid for g in gpus}
    out = []
    for event in events:
        uuid = event.uuid or (by_bus.get(event.bus_id) if event.bus_id else None)
        out.append(replace(event, uuid=uuid))
    return out


def _id(text: str | None) -> int | None:
    return None if text is None else int(text)


def _nvml_id(value) -> int | None:
    """nvmlEventData_t's gpuInstanceId / computeInstanceId: None when absent or 0xFFFFFFFF
    (the driver's "not attributed to an instance")."""
    return value if isinstance(value, int) and 0 <= value < 0xFFFFFFFF else None


class XidUnsupported(RuntimeError):
    """NVML cannot deliver XID events here; the message says why and what still works."""


class NvmlXidWatcher:
    """XID events from NVML: one event set, `nvmlEventTypeXidCriticalError` registered on
    every GPU that supports it (nvmlEventSetCreate, nvmlDeviceGetSupportedEventTypes,
    nvmlDeviceRegisterEvents); `poll()` drains what is waiting with nvmlEventSetWait.

    nv: the initialised pynvml module; gpus: the inventory's GPUs (uuid, pci_bus_id).
    Raises XidUnsupported when no GPU supports XID events (e.g. inside some VMs, or a
    driver without the feature). GPUs that do not support it are listed in `unsupported`.
    """

    def __init__(self, nv, gpus) -> None:
        self.nv = nv
        self.unsupported: list[str] = []
        self._bus = {g.uuid: normalise_bus_id(g.pci_bus_id) for g in gpus}
        xid_type = getattr(nv, "nvmlEventTypeXidCriticalError", None)
        if xid_type is None or not hasattr(nv, "nvmlEventSetCreate"):
            raise XidUnsupported("this nvidia-ml-py has no XID event API; XIDs are not watched")
        try:
            self._set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            raise XidUnsupported(f"NVML cannot create an event set ({exc}); XIDs are not "
                                 "watched") from None
        registered = 0
        for gpu in gpus:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid.encode())
                supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
                if not supported & xid_type:
                    self.unsupported.append(gpu.uuid)
                    continue
                nv.nvmlDeviceRegisterEvents(handle, xid_type, self._set)
                registered += 1
            except nv.NVMLError as exc:
                self.unsupported.append(f"{gpu.uuid} ({exc})")
        if not registered:
            self.close()
            raise XidUnsupported("no GPU supports NVML XID events (nvmlEventTypeXidCriticalError)"
                                 "; XIDs are not watched, the other health rules still run")

    def poll(self, timeout_ms: int = 0, limit: int = 1000) -> list[XidEvent]:
        """Every XID waiting now (waits up to timeout_ms for the first one)."""
        nv = self.nv
        out: list[XidEvent] = []
        wait = timeout_ms
        while len(out) < limit:
            try:
                data = nv.nvmlEventSetWait(self._set, wait)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    break
                if getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_GPU_IS_LOST", -1):
                    # A lost GPU is reported by the health rule gpu_lost, not here.
                    break
                raise
            wait = 0
            if not data.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            uuid = None
            try:
                raw = nv.nvmlDeviceGetUUID(data.device)
                uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
            except nv.NVMLError:
                pass
            out.append(XidEvent(code=int(data.eventData), bus_id=self._bus.get(uuid),
                                uuid=uuid, message="reported by NVML event",
                                gpu_instance_id=_nvml_id(getattr(data, "gpuInstanceId", None)),
                                compute_instance_id=_nvml_id(
                                    getattr(data, "computeInstanceId", None))))
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):  # freeing is best effort at shutdown
            self.nv.nvmlEventSetFree(self._set)
