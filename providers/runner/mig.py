"""The units a runner offers: each GPU whole, or, MIG-enabled, as its slices
(docs/RUNNER_PROTOCOL.md, "MIG slices"; the rule: docs/RUNNER.md, "MIG slices").

A slice is one GPU instance with exactly one compute instance covering it (`offered`). A
GPU instance split into several compute instances ("1c.3g.71gb" and "2c.3g.71gb" in
`nvidia-smi -L`), or whose one compute instance uses only part of it, is not offered:
each compute instance would be a MIG device of the same memory, and selling them as
slices would sell that memory twice. `not_offered` says why, for `inventory`, `doctor`
and `register`. A MIG-enabled GPU is never offered whole, even with no slice.

A slice's market is its parent's class and its GPU instance profile,
`catalog.gpu_class_for(product) + "." + profile` (e.g. "h100-sxm-80gb.1g.10gb"). Its
parent is sent too, with `listed: false`: the marketplace keeps it for health (a fatal
finding on it fails every slice) but never offers it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from .nvsmi import GpuInfo, Inventory, MigDevice
from .xid import XidEvent


def sliced(gpu: GpuInfo) -> bool:
    """Whether `gpu` is MIG-enabled: offered as its slices (`offered`), never whole."""
    return gpu.mig_mode == "Enabled"


def _instances(gpu: GpuInfo) -> dict[int, list[MigDevice]]:
    by_gi: dict[int, list[MigDevice]] = defaultdict(list)
    for dev in sorted(gpu.mig_devices, key=lambda d: d.index):
        by_gi[dev.gpu_instance_id].append(dev)
    return by_gi


def offered(gpu: GpuInfo) -> list[MigDevice]:
    """The MIG devices of `gpu` offered as slices, by index: each the only compute
    instance of its GPU instance, covering all of it."""
    return sorted((devs[0] for devs in _instances(gpu).values()
                   if len(devs) == 1 and not devs[0].compute_profile),
                  key=lambda d: d.index)


def not_offered(gpu: GpuInfo) -> list[str]:
    """One sentence per part of a MIG-enabled `gpu` that is not offered, and why."""
    if not sliced(gpu):
        return []
    if not gpu.mig_devices:
        return [f"GPU {gpu.uuid} is MIG-enabled with no usable MIG device: registered, not offered "
                "(a MIG-enabled GPU is never leased whole); create MIG devices (`sudo "
                "nvidia-smi mig -cgi <profiles> -C`) or disable MIG"]
    out = []
    for gi, devs in _instances(gpu).items():
        if len(devs) == 1 and not devs[0].compute_profile:
            continue
        names = ", ".join(d.compute_profile or d.profile for d in devs)
        what = (f"is split into {len(devs)} compute instances ({names})" if len(devs) > 1
                else f"has one compute instance ({names}) using part of it")
        out.append(f"GPU {gpu.uuid} GPU instance {gi} ({devs[0].profile}) {what}: not "
                   "offered (a slice is one GPU instance with one compute instance covering "
                   f"it); make it one with `sudo nvidia-smi mig -dci -gi {gi}` then `sudo "
                   f"nvidia-smi mig -cci -gi {gi}`")
    return out


def notes(inventory: Inventory) -> list[str]:
    """not_offered of every GPU of the inventory."""
    return [line for gpu in inventory.gpus for line in not_offered(gpu)]


def inventory_items(inventory: Inventory) -> list[dict]:
    """The `gpus[]` of POST /api/v1/runner/inventory/: a GPU's item, or, MIG-enabled, its
    item (listed false) followed by one item per offered slice."""
    items = []
    for gpu in inventory.gpus:
        item = gpu.as_protocol()
        if not sliced(gpu):
            items.append(item)
            continue
        items.append({**item, "listed": False})
        for dev in offered(gpu):
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
            out += [Unit(d.uuid, gpu.uuid, d.gpu_instance_id) for d in offered(gpu)]
        else:
            out.append(Unit(gpu.uuid, gpu.uuid))
    return out


def summary(inventory: Inventory) -> str:
    """'4 MIG slices of GPU-…: 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb' per sliced GPU, joined
    by '; ' ('' when none is sliced), for the register/inventory output."""
    parts = []
    for gpu in inventory.gpus:
        if sliced(gpu):
            devs = offered(gpu)
            profiles = ", ".join(d.profile for d in devs)
            parts.append(f"{len(devs)} MIG slices of {gpu.uuid}" + (f": {profiles}"
                                                                    if devs else ""))
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
            for dev in offered(gpu):
                slices.setdefault((gpu.uuid, dev.gpu_instance_id), []).append(dev)
    out = []
    for event in events:
        found = slices.get((event.uuid, event.gpu_instance_id)) if event.uuid else None
        if found and event.compute_instance_id is not None:
            found = [d for d in found if d.compute_instance_id == event.compute_instance_id]
        out.append(replace(event, uuid=found[0].uuid) if found and len(found) == 1 else event)
    return out
