"""Health readings recorded in a report (text or XML form, as a nvsmi_tree Node tree)."""

from __future__ import annotations

import re

from .nvsmi_tree import _GPU_HEADER, Node


def _number(value: str | None) -> float | None:
    match = re.match(r"^-?\d+(\.\d+)?", value or "")
    return float(match.group(0)) if match else None


def _yes(value: str | None) -> bool | None:
    """"Yes"/"Active" → True, "No"/"Not Active" → False, anything else (N/A) → None."""
    text = (value or "").strip().lower()
    if text in ("yes", "active"):
        return True
    if text in ("no", "not active"):
        return False
    return None


def _int(value: str | None) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _slowdown_temp(section: Node, temp: float | None) -> int | None:
    """The GPU's HW slowdown temperature in °C: "GPU Slowdown Temp" when the report gives it
    absolutely; in T.Limit mode (Hopper, Ada on driver ≥ 530) the report gives the margin
    to T.Limit ("GPU T.Limit Temp", positive = below T.Limit) and the slowdown point as a
    margin ("GPU Slowdown T.Limit Temp", e.g. -2 C); slowdown starts when the margin falls
    to that value, i.e. at current + margin − slowdown margin °C."""
    absolute = _number(section.value_at("Temperature", "GPU Slowdown Temp"))
    if absolute is not None:
        return int(absolute)
    margin = _number(section.value_at("Temperature", "GPU T.Limit Temp"))
    slowdown_margin = _number(section.value_at("Temperature", "GPU Slowdown T.Limit Temp"))
    if temp is None or margin is None or slowdown_margin is None:
        return None
    return int(temp + margin - slowdown_margin)


def health_from_tree(root: Node) -> dict[str, dict]:
    """Health readings recorded in a report, by GPU UUID (the keys of health.py's readings).

    Each value: {"temperature_c": int|None ("Temperature / GPU Current Temp", °C),
    "power_w": float|None ("GPU Power Readings" or "Power Readings" / "Power Draw", else
    "Instantaneous Power Draw", else "Average Power Draw" (driver ≥ 570), W),
    "utilization_pct": int|None ("Utilization / Gpu" or "GPU", %),
    "ecc_uncorrectable": int|None (sum of "ECC Errors / Volatile / *Uncorrectable*"),
    "slowdown_temp_c": int|None (see _slowdown_temp),
    "retired_pages": int|None (sum of "Retired Pages / Single Bit ECC, Double Bit ECC"),
    "retired_pages_pending": bool|None ("Retired Pages / Pending Page Blacklist"),
    "remapped_rows_pending", "remapping_failure": bool|None ("Remapped Rows / Pending",
    "… / Remapping Failure Occurred"), "hw_thermal_slowdown", "hw_power_brake": bool|None
    ("Clocks Event Reasons" (or "Clocks Throttle Reasons") / "HW Slowdown" / "HW Thermal
    Slowdown", "HW Power Brake Slowdown"), "pcie_gen_current", "pcie_gen_max",
    "pcie_width_current", "pcie_width_max": int|None ("PCI / GPU Link Info"),
    "fb_used_mib", "fb_free_mib": int|None ("FB Memory Usage / Used, Free", MiB),
    "sm_clock_mhz", "mem_clock_mhz": int|None ("Clocks / SM, Memory", MHz),
    "lost": False}.
    None where the report says N/A. `root`: a tree nvsmi.parse_text accepted.
    """
    out: dict[str, dict] = {}
    for section in (n for n in root.children if _GPU_HEADER.match(n.key)):
        temp = _number(section.value_at("Temperature", "GPU Current Temp"))
        power = next((p for p in (_number(section.value_at(group, key))
                                   for group in ("GPU Power Readings", "Power Readings")
                                   for key in ("Power Draw", "Instantaneous Power Draw",
                                               "Average Power Draw")) if p is not None), None)
        util = _number(section.value_at("Utilization", "Gpu")
                       or section.value_at("Utilization", "GPU"))
        volatile = section.find("ECC Errors", "Volatile")
        ecc = None
        if volatile is not None:
            counts = [_number(c.value) for c in volatile.children if "Uncorrectable" in c.key]
            counts = [c for c in counts if c is not None]
            ecc = int(sum(counts)) if counts else None
        retired = [_int(section.value_at("Retired Pages", k))
                   for k in ("Single Bit ECC", "Double Bit ECC")]
        retired = [c for c in retired if c is not None]
        reasons = section.find("Clocks Event Reasons") or section.find("Clocks Throttle Reasons")
        hw = reasons.find("HW Slowdown") if reasons is not None else None
        link = ("PCI", "GPU Link Info")
        out[section.value_at("GPU UUID")] = {
            "temperature_c": None if temp is None else int(temp),
            "power_w": power,
            "utilization_pct": None if util is None else int(util),
            "ecc_uncorrectable": ecc,
            "slowdown_temp_c": _slowdown_temp(section, temp),
            "retired_pages": sum(retired) if retired else None,
            "retired_pages_pending": _yes(section.value_at("Retired Pages",
                                                           "Pending Page Blacklist")),
            "remapped_rows_pending": _yes(section.value_at("Remapped Rows", "Pending")),
            "remapping_failure": _yes(section.value_at("Remapped Rows",
                                                       "Remapping Failure Occurred")),
            "hw_thermal_slowdown": _yes(hw.value_at("HW Thermal Slowdown")) if hw else None,
            "hw_power_brake": _yes(hw.value_at("HW Power Brake Slowdown")) if hw else None,
            "pcie_gen_current": _int(section.value_at(*link, "PCIe Generation", "Current")),
            "pcie_gen_max": _int(section.value_at(*link, "PCIe Generation", "Max")),
            "pcie_width_current": _int(section.value_at(*link, "Link Width", "Current")),
            "pcie_width_max": _int(section.value_at(*link, "Link Width", "Max")),
            "fb_used_mib": _int(section.value_at("FB Memory Usage", "Used")),
            "fb_free_mib": _int(section.value_at("FB Memory Usage", "Free")),
            "sm_clock_mhz": _int(section.value_at("Clocks", "SM")),
            "mem_clock_mhz": _int(section.value_at("Clocks", "Memory")),
            "lost": False,
        }
    return out
