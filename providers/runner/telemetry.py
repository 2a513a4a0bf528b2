"""The heartbeat's `telemetry` (docs/RUNNER_PROTOCOL.md, "Telemetry"): for each running
lease, its GPUs' readings under the marketplace's keys (DCGM's fields GPU_UTIL, FB_USED,
POWER_USAGE, GPU_TEMP, SM_CLOCK, MEM_CLOCK and the throttle reasons), taken from the same
readings as the heartbeat's health (nvml.py). Only the running leases' own GPUs; a GPU
the driver lost sends nothing. No Django (tests/test_import_graph.py)."""

from __future__ import annotations

KEYS = ("utilization_pct", "fb_used_mib", "power_w", "temperature_c", "sm_clock_mhz",
        "mem_clock_mhz")
#: reading keys (bool) that are throttle reasons, named as the marketplace names them
THROTTLE_KEYS = ("hw_thermal_slowdown", "hw_power_brake")


def gpu_item(reading: dict) -> dict:
    item = {"uuid": reading["uuid"]}
    for key in KEYS:
        value = reading.get(key)
        item[key] = None if isinstance(value, bool) else value
    item["throttle_reasons"] = [k for k in THROTTLE_KEYS if reading.get(k) is True]
    return item


def lease_telemetry(readings: list[dict], lease_gpus: dict[int, list[str]],
                    running: set[int]) -> list[dict]:
    """[{"lease": id, "gpus": [gpu_item …]}] for the leases in `running`, in id order."""
    by_uuid = {r["uuid"]: r for r in readings if not r.get("lost")}
    out = []
    for lease_id in sorted(running & lease_gpus.keys()):
        gpus = [gpu_item(by_uuid[u]) for u in lease_gpus[lease_id] if u in by_uuid]
        if gpus:
            out.append({"lease": lease_id, "gpus": gpus})
    return out
