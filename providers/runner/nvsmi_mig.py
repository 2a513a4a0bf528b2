"""MIG blocks of a report (before `-L` names them) and the rules they must keep.

A MIG-enabled GPU's section of `nvidia-smi -q` (text or XML, as a nvsmi_tree Node tree)
holds one "MIG Device" block per MIG device (directly or inside "MIG Devices"): Index,
GPU Instance ID, Compute Instance ID, "Device Attributes / Shared / Multiprocessor count"
and "Shared FB Memory Usage / Total" (MiB), but neither the UUID nor the profile.
The rules (docs/RUNNER.md, "Reading the GPUs"): mig_contradictions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .nvsmi_tree import Node


def _int_at(node: Node, *path: str) -> int | None:
    match = re.fullmatch(r"(\d+)( MiB)?", (node.value_at(*path) or "").strip())
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class RawMig:
    """A MIG block of a report before `-L` names it (uuid/profile "" when the report lacks
    them); line: its first line."""

    index: int
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int
    sm_count: int | None
    uuid: str
    profile: str
    line: int
    compute_profile: str = ""  # "1c.3g.71gb" where the report prints a "Nc." prefix


def mig_blocks(section: Node, problems: list[tuple[int, str]]) -> list[RawMig]:
    """The "MIG Device" blocks of a GPU section (directly or under "MIG Devices")."""
    blocks = section.all("MIG Device")
    for holder in section.all("MIG Devices"):
        blocks += holder.all("MIG Device")
    out = []
    for block in blocks:
        fields = {
            "Index": _int_at(block, "Index"),
            "GPU Instance ID": _int_at(block, "GPU Instance ID"),
            "Compute Instance ID": _int_at(block, "Compute Instance ID"),
            "FB Memory Usage / Total": _int_at(block, "Shared FB Memory Usage", "Total")
            if block.find("Shared FB Memory Usage") else _int_at(block, "FB Memory Usage",
                                                                 "Total"),
        }
        missing = [k for k, v in fields.items() if v is None]
        if missing:
            problems.append((block.line, f"MIG Device lacks {', '.join(missing)} (or it is "
                                         "not a number)"))
            continue
        index, gi, ci, memory = fields.values()
        sm = _int_at(block, "Device Attributes", "Shared", "Multiprocessor count")
        uuid = block.known_at("UUID") or block.known_at("MIG UUID") or ""
        named = block.known_at("Profile") or ""
        profile = re.sub(r"^\d+c\.", "", named)
        out.append(RawMig(index, gi, ci, memory, sm, uuid, profile, block.line,
                          named if named != profile else ""))
    return out


def mig_contradictions(gpu, raws: list[RawMig]) -> list[tuple[int, str]]:
    """(line, reason) for each thing a GPU's (nvsmi.GpuInfo) MIG blocks say that cannot all
    be true (docs/RUNNER.md, "MIG rules")."""
    out: list[tuple[int, str]] = []
    where = f"GPU {gpu.pci_bus_id}"
    if raws and gpu.mig_mode != "Enabled":
        out.append((raws[0].line, f"{where} lists MIG devices but its MIG mode is "
                                  f"{gpu.mig_mode}"))
    seen_index: dict[int, int] = {}
    seen_ids: dict[tuple[int, int], int] = {}
    instance_memory: dict[int, tuple[int, int]] = {}  # GI id → (MiB, line)
    for raw in raws:
        if raw.index in seen_index:
            out.append((raw.line, f"{where}: MIG device index {raw.index} repeats line "
                                  f"{seen_index[raw.index]}"))
        seen_index.setdefault(raw.index, raw.line)
        ids = (raw.gpu_instance_id, raw.compute_instance_id)
        if ids in seen_ids:
            out.append((raw.line, f"{where}: GPU instance {ids[0]} compute instance {ids[1]} "
                                  f"repeats line {seen_ids[ids]}"))
        seen_ids.setdefault(ids, raw.line)
        if raw.memory_mib > gpu.memory_mib:
            out.append((raw.line, f"{where}: GPU instance {raw.gpu_instance_id} has "
                                  f"{raw.memory_mib} MiB, more than the GPU's "
                                  f"{gpu.memory_mib} MiB"))
        known = instance_memory.setdefault(raw.gpu_instance_id, (raw.memory_mib, raw.line))
        if known[0] != raw.memory_mib:
            out.append((raw.line, f"{where}: GPU instance {raw.gpu_instance_id} has "
                                  f"{raw.memory_mib} MiB here but {known[0]} MiB on line "
                                  f"{known[1]} (its compute instances share one memory)"))
    total = sum(mib for mib, _ in instance_memory.values())
    if total > gpu.memory_mib and raws:
        out.append((raws[0].line, f"{where}: its GPU instances hold {total} MiB together, "
                                  f"more than the GPU's {gpu.memory_mib} MiB"))
    return out
