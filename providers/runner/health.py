"""Health rules: each a small pure function of one GPU's readings → a Finding.

A reading is a dict (nvml.NvmlGpus.sample_health / nvml.DumpGpus.sample_health); any key
may be None where the GPU or the driver cannot say, and a rule whose inputs are None returns
None (no finding: the runner never guesses a threshold). Keys:

    uuid, temperature_c, slowdown_temp_c, power_w, utilization_pct, ecc_uncorrectable,
    retired_pages (int), retired_pages_pending (bool), remapped_rows_pending (bool),
    remapping_failure (bool), hw_thermal_slowdown (bool), hw_power_brake (bool),
    pcie_gen_current, pcie_gen_max, pcie_width_current, pcie_width_max, lost (bool),
    lost_reason (str)

Severity: "ok" | "warn" | "fatal". A fatal finding fails the leases that hold that GPU (and
only those) and keeps new leases off it (agent.py). Thresholds that are this runner's own
policy, not NVIDIA's, say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .xid import XID_CATALOG, XidEvent, classify

SEVERITIES = ("ok", "warn", "fatal")
#: Warn this many °C below the GPU's own slowdown threshold (runner policy).
TEMP_WARN_MARGIN_C = 5
#: NVIDIA Dynamic Page Retirement: at most 64 pages of a GPU's memory can be retired.
MAX_RETIRED_PAGES = 64
#: "Under load" for the PCIe rule: GPU utilization at or above this (runner policy).
PCIE_LOAD_PCT = 50


@dataclass(frozen=True)
class Finding:
    """uuid: the GPU; rule: the rule's name (e.g. "temperature", "xid"); severity: "ok",
    "warn" or "fatal"; evidence: one line a buyer can read ("95 °C ≥ slowdown 88 °C")."""

    uuid: str
    rule: str
    severity: str
    evidence: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def cause(self) -> str:
        """The lease-failure cause: "GPU <uuid>: <rule>: <evidence>", at most 300 chars."""
        text = f"GPU {self.uuid}: {self.rule}: {self.evidence}"
        return text if len(text) <= 300 else text[:299] + "…"

    def as_protocol(self) -> dict:
        """As an item of the heartbeat's `findings` (docs/RUNNER_PROTOCOL.md)."""
        return {"uuid": self.uuid, "rule": self.rule, "severity": self.severity,
                "evidence": self.evidence}


def temperature(r: dict) -> Finding | None:
    """GPU temperature against the GPU's own HW slowdown threshold.

    Threshold: fatal at `temperature_c >= slowdown_temp_c`; warn from slowdown − 5 °C
    (TEMP_WARN_MARGIN_C, runner policy); ok below. Source of the threshold: NVML
    `nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)` ("temperature
    at which the GPU will begin HW slowdown"), or `nvidia-smi -q` "GPU Slowdown Temp"
    (dumps in T.Limit mode give it relative to T.Limit; nvsmi_health.health_from_tree
    converts it).
    Fatal because at that temperature the hardware clocks the GPU down: the buyer no longer
    gets the performance of the class that was sold, and shutdown is a few degrees away.
    """
    temp, slowdown = r.get("temperature_c"), r.get("slowdown_temp_c")
    if temp is None or slowdown is None:
        return None
    if temp >= slowdown:
        return Finding(r["uuid"], "temperature", "fatal",
                       f"{temp} °C at or above the GPU's HW slowdown threshold {slowdown} °C")
    if temp >= slowdown - TEMP_WARN_MARGIN_C:
        return Finding(r["uuid"], "temperature", "warn",
                       f"{temp} °C within {TEMP_WARN_MARGIN_C} °C of the HW slowdown "
                       f"threshold {slowdown} °C")
    return Finding(r["uuid"], "temperature", "ok", f"{temp} °C, slowdown at {slowdown} °C")


def ecc_uncorrectable(r: dict) -> Finding | None:
    """Volatile (since the last driver load / GPU reset) uncorrectable ECC errors.

    Threshold: fatal at ≥ 1, ok at 0. Source: NVML `nvmlDeviceGetTotalEccErrors(
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)` / `nvidia-smi -q` "ECC Errors /
    Volatile / *Uncorrectable*". NVIDIA's XID catalog (XID 48, double bit ECC): "A GPU reset
    or node reboot is needed"; the volatile count only returns to 0 after that reset.
    """
    count = r.get("ecc_uncorrectable")
    if count is None:
        return None
    if count >= 1:
        return Finding(r["uuid"], "ecc_uncorrectable", "fatal",
                       f"{count} uncorrectable ECC error(s) since the last GPU reset")
    return Finding(r["uuid"], "ecc_uncorrectable", "ok", "0 uncorrectable ECC errors")


def retired_pages(r: dict) -> Finding | None:
    """Dynamic page retirement (GPUs before Ampere): pages pending, pages retired.

    Thresholds: fatal when `retired_pages` ≥ 64 (MAX_RETIRED_PAGES: NVIDIA "Dynamic Page
    Retirement", docs.nvidia.com/deploy/dynamic-page-retirement — no further page can be
    retired); warn when a retirement is pending (it takes effect at the next GPU reset /
    driver reload); ok otherwise. Source: NVML `nvmlDeviceGetRetiredPages` /
    `nvmlDeviceGetRetiredPagesPendingStatus`, `nvidia-smi -q` "Retired Pages".
    """
    count, pending = r.get("retired_pages"), r.get("retired_pages_pending")
    if count is None and pending is None:
        return None
    if count is not None and count >= MAX_RETIRED_PAGES:
        return Finding(r["uuid"], "retired_pages", "fatal",
                       f"{count} retired pages, the limit is {MAX_RETIRED_PAGES}")
    if pending:
        return Finding(r["uuid"], "retired_pages", "warn",
                       "page retirement pending: reset the GPU to retire the page(s)")
    return Finding(r["uuid"], "retired_pages", "ok", f"{count or 0} retired pages, none pending")


def row_remap(r: dict) -> Finding | None:
    """Row remapping (Ampere and newer): failure and pending remaps.

    Thresholds: fatal when "Remapping Failure Occurred" is Yes (NVIDIA "GPU Memory Error
    Management", docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt: a failed remap means the
    memory can no longer be repaired; XID 64's immediate action is RESET_GPU, investigatory
    CONTACT_SUPPORT); warn when a remap is pending (it takes effect at the next GPU reset);
    ok otherwise. Source: NVML `nvmlDeviceGetRemappedRows`, `nvidia-smi -q` "Remapped Rows".
    """
    pending, failure = r.get("remapped_rows_pending"), r.get("remapping_failure")
    if pending is None and failure is None:
        return None
    if failure:
        return Finding(r["uuid"], "row_remap", "fatal",
                       "row remapping failure occurred: the GPU memory cannot be repaired")
    if pending:
        return Finding(r["uuid"], "row_remap", "warn",
                       "row remap pending: reset the GPU at the next idle window to apply it")
    return Finding(r["uuid"], "row_remap", "ok", "no remap pending, no remapping failure")


def hw_thermal_slowdown(r: dict) -> Finding | None:
    """Clock event reason "HW Thermal Slowdown" (NVML nvmlClocksEventReasonHwThermalSlowdown,
    0x40; `nvidia-smi -q` "Clocks Event Reasons / HW Slowdown / HW Thermal Slowdown").

    Threshold: warn while active, ok otherwise (runner policy: the temperature rule decides
    the fatal case; this is the hardware saying it is already throttling).
    """
    active = r.get("hw_thermal_slowdown")
    if active is None:
        return None
    if active:
        return Finding(r["uuid"], "hw_thermal_slowdown", "warn",
                       "HW thermal slowdown active: clocks reduced by the hardware")
    return Finding(r["uuid"], "hw_thermal_slowdown", "ok", "not active")


def hw_power_brake(r: dict) -> Finding | None:
    """Clock event reason "HW Power Brake Slowdown" (NVML
    nvmlClocksEventReasonHwPowerBrakeSlowdown, 0x80: an external power brake assertion,
    e.g. by the system power supply; `nvidia-smi -q` "HW Power Brake Slowdown").

    Threshold: warn while active, ok otherwise (runner policy: the host's power supply, not
    the GPU, is at fault; the work continues slower).
    """
    active = r.get("hw_power_brake")
    if active is None:
        return None
    if active:
        return Finding(r["uuid"], "hw_power_brake", "warn",
                       "HW power brake active: the host's power supply slows the GPU")
    return Finding(r["uuid"], "hw_power_brake", "ok", "not active")


def pcie_link(r: dict) -> Finding | None:
    """PCIe link degraded under load: current generation or width below the link's max.

    Threshold: warn when utilization_pct ≥ 50 (PCIE_LOAD_PCT, runner policy) and
    (pcie_gen_current < pcie_gen_max or pcie_width_current < pcie_width_max); ok otherwise.
    An idle GPU lowers its link generation to save power (the RTX 4090 dump: Gen 1 of 4 at
    0 %), so the rule only judges a GPU under load. Source: NVML
    `nvmlDeviceGetCurrPcieLinkGeneration` / `…MaxPcieLinkGeneration` / `…CurrPcieLinkWidth`
    / `…MaxPcieLinkWidth`, `nvidia-smi -q` "PCI / GPU Link Info".
    """
    keys = ("pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max")
    gen, gen_max, width, width_max = (r.get(k) for k in keys)
    if None in (gen, gen_max, width, width_max):
        return None
    link = f"Gen{gen} x{width} of Gen{gen_max} x{width_max}"
    util = r.get("utilization_pct")
    if util is None or util < PCIE_LOAD_PCT:
        return Finding(r["uuid"], "pcie_link", "ok", f"{link}, not under load")
    if gen < gen_max or width < width_max:
        return Finding(r["uuid"], "pcie_link", "warn",
                       f"PCIe link degraded under load ({util} %): {link}")
    return Finding(r["uuid"], "pcie_link", "ok", f"{link} at {util} %")


def gpu_lost(r: dict) -> Finding | None:
    """GPU lost: NVML answers NVML_ERROR_GPU_IS_LOST (or no longer finds the UUID) for a GPU
    of the inventory. Threshold: fatal when `lost` is true, ok when false. Source: NVML
    return codes; XID 79 ("GPU has fallen off the bus", immediate action RESTART_BM)."""
    lost = r.get("lost")
    if lost is None:
        return None
    if lost:
        return Finding(r["uuid"], "gpu_lost", "fatal",
                       r.get("lost_reason") or "the GPU no longer answers (GPU is lost)")
    return Finding(r["uuid"], "gpu_lost", "ok", "the GPU answers")


def xid(event: XidEvent) -> Finding | None:
    """One XID event, classified by NVIDIA's XID catalog (xid.XID_CATALOG; source
    https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, column "Resolution
    Bucket (Immediate Action)"): RESET_GPU / RESTART_BM / WORKFLOW_XID_48 /
    WORKFLOW_NVLINK_ERR → fatal; RESTART_APP / IGNORE / unknown codes → warn.
    None for an event that maps to no GPU of this node."""
    if event.uuid is None:
        return None
    severity, action = classify(event)
    entry = XID_CATALOG.get(event.code)
    what = f"{entry[0]} ({entry[1]})" if entry else "not in the runner's XID table"
    where = f" at {event.stamp}" if event.stamp else ""
    who = f", pid={event.pid} name={event.name}" if event.pid or event.name else ""
    detail = f": {event.message}" if event.message else ""
    scope = "" if event.gpu_instance_id is None else \
        f" in MIG GPU instance {event.gpu_instance_id}"
    return Finding(event.uuid, "xid", severity,
                   f"XID {event.code} {what}{scope}{where}, NVIDIA immediate action {action}"
                   f"{who}{detail}")


#: The rules run on every reading, in this order.
READING_RULES = (gpu_lost, temperature, ecc_uncorrectable, retired_pages, row_remap,
                 hw_thermal_slowdown, hw_power_brake, pcie_link)


def evaluate(readings: Iterable[dict], xids: Iterable[XidEvent] = ()) -> list[Finding]:
    """Every finding for `readings` (one dict per GPU) and `xids` (already mapped to GPUs):
    ok, warn and fatal alike, per GPU in reading order then XIDs in event order."""
    out: list[Finding] = []
    for reading in readings:
        for rule in READING_RULES:
            finding = rule(reading)
            if finding is not None:
                out.append(finding)
    for event in xids:
        finding = xid(event)
        if finding is not None:
            out.append(finding)
    return out
