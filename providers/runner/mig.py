"""The units a runner offers: each GPU whole, or, MIG-enabled with MIG devices, as its
slices (docs/RUNNER_PROTOCOL.md, "MIG slices").

A slice's market is its parent's class and its GPU instance profile,
`catalog.gpu_class_for(product) + "." + profile` (e.g. "h100-sxm-80gb.1g.10gb"). Its
parent is sent too, with `listed: false`: the marketplace keeps it for health (a fatal
finding on it fails every slice) but never offers it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .nvsmi import GpuInfo, Inventory
from .xid import XidEvent


def sliced(gpu: GpuInfo) -> bool:
    """Whether `gpu` is offered as MIG slices: MIG mode on and MIG devices present."""
    return gpu.mig_mode == "Enabled" and bool(gpu.mig_devices)


def inventory_items(inventory: Inventory) -> list[dict]:
    """The `gpus[]` of POST /api/v1/runner/inventory/: a GPU's item, or its parent item
    (listed false) followed by one item per MIG device."""
    items = []
    for gpu in inventory.gpus:
        item = gpu.as_protocol()
        if not sliced(gpu):
            items.append(item)
            continue
        items.append({**item, "listed": False})
        for dev in sorted(gpu.mig_devices, key=lambda d: d.index):
            items.append({
                "uuid": dev.uuid, "parent_uuid": gpu.uuid, "mig_profile": dev.profile,
                "gpu_class": f"{gpu.gpu_class}.{dev.profile}",
                "product_name": gpu.product_name, "memory_mib": dev.memory_mib,
                "pci_bus_id": gpu.pci_bus_id, "mig_mode": gpu.mig_mode,
                "sm_count": dev.sm_count, "gpu_instance_id": dev.gpu_instance_id,
                "compute_instance_id": dev.compute_instance_id,
            })
    return items


@dataclass(frozen=True)
class Unit:
    """One leasable unit. uuid: "GPU-…" or "MIG-…"; parent: the GPU's UUID of a slice
    (its own UUID for a whole GPU); gpu_instance_id: the slice's, None for a GPU."""

    uuid: str
    parent: str
    gpu_instance_id: int | None = None


def units(inventory: Inventory) -> list[Unit]:
    """Every unit of the inventory, in the order inventory_items lists them (parents of
    slices are not units)."""
    out = []
    for gpu in inventory.gpus:
        if sliced(gpu):
            out += [Unit(d.uuid, gpu.uuid, d.gpu_instance_id)
                    for d in sorted(gpu.mig_devices, key=lambda d: d.index)]
        else:
            out.append(Unit(gpu.uuid, gpu.uuid))
    return out


def summary(inventory: Inventory) -> str:
    """'4 MIG slices of GPU-…: 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb' per sliced GPU, joined
    by '; ' ('' when none is sliced), for the register/inventory output."""
    parts = []
    for gpu in inventory.gpus:
        if sliced(gpu):
            profiles = ", ".join(d.profile for d in sorted(gpu.mig_devices,
                                                         key=lambda d: d.index))
            parts.append(f"{len(gpu.mig_devices)} MIG slices of {gpu.uuid}: {profiles}")
    return "; ".join(parts)


def parents(inventory: Inventory) -> dict[str, str]:
    """{slice UUID: its GPU's UUID} of every sliced GPU."""
    return {u.uuid: u.parent for u in units(inventory) if u.uuid != u.parent}


def scope_xids(events: list[XidEvent], inventory: Inventory) -> list[XidEvent]:
    """`events` (mapped to GPUs) with an XID the driver attributes to a GPU instance
    moved to the slice of that instance (and compute instance, where the line names one),
    so that only that slice's lease fails. An XID without an instance, or naming one that
    is no slice here, stays on its GPU: it takes every slice of the GPU out."""
    slices: dict[tuple[str, int], list] = {}
    for gpu in inventory.gpus:
        if sliced(gpu):
            for dev in gpu.mig_devices:
                slices.setdefault((gpu.uuid, dev.gpu_instance_id), []).append(dev)
    out = []
    for event in events:
        found = slices.get((event.uuid, event.gpu_instance_id)) if event.uuid else None
        if found and event.compute_instance_id is not None:
            found = [d for d in found if d.compute_instance_id == event.compute_instance_id]
        out.append(replace(event, uuid=found[0].uuid) if found and len(found) == 1 else event)
    return out
