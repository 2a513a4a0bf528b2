"""MIG slices in a runner's inventory: checking the `gpus[]` items of one report and
applying a GPU's layout (whole, or as slices) to the node's units.

Item shapes, the rule "listed whole or as slices, never both" and what a layout change
does to asks and leases: docs/RUNNER_PROTOCOL.md, "MIG slices". Called by
providers.services.inventory_record inside its transaction; errors are its ProviderError
(400, naming `gpus[i].<field>`) and InventoryConflict (409).
"""

from __future__ import annotations

from typing import Any

from providers.models import Gpu

SLICE_FIELDS = ("mig_profile", "sm_count", "gpu_instance_id", "compute_instance_id")


def check_report(gpus: list[dict[str, Any]], classes: dict[str, Any], errors) -> None:
    """Refuse a report whose slices contradict it. `classes`: {slug: GpuClass};
    `errors`: (ProviderError,) — passed in, as services imports this module.

    A slice item (`parent_uuid` set) must name a `MIG-` UUID, a parent item of the same
    report that is MIG-enabled and sent with `listed: false`, the bus id of its parent, a
    profile market of its parent's class whose profile is its `mig_profile`, and memory
    that fits its parent (every slice's together too), and a GPU instance no other slice
    of that parent names. A whole-GPU item carries no slice fields. Duplicate UUIDs are
    refused naming both items, and the all-zero UUID (NVML never reports it)."""
    (error,) = errors
    seen: dict[str, int] = {}
    for i, g in enumerate(gpus):
        if g["uuid"] in seen:
            raise error(f"GPU {g['uuid']} is listed twice (also gpus[{seen[g['uuid']]}])",
                        field=f"gpus[{i}].uuid")
        seen[g["uuid"]] = i
        if not g["uuid"].split("-", 1)[1].strip("0-"):
            raise error(f"{g['uuid']} is the all-zero UUID, which NVML never reports (a "
                        "recording with its UUIDs zeroed): send the GPU's real UUID "
                        "(gpumarket-runner --simulate replaces zeroed ones)",
                        field=f"gpus[{i}].uuid")
    parents = {g["uuid"]: (i, g) for i, g in enumerate(gpus) if not g.get("parent_uuid")}
    used: dict[str, int] = {}
    instances: dict[tuple[str, int], int] = {}  # (parent, GPU instance id) → item
    for i, g in enumerate(gpus):
        parent_uuid = g.get("parent_uuid")
        if not parent_uuid:
            _check_whole(i, g, error)
            continue
        if not g["uuid"].startswith("MIG-"):
            raise error("a MIG slice's UUID starts with MIG-", field=f"gpus[{i}].uuid")
        if parent_uuid not in parents:
            raise error(f"GPU {parent_uuid} is not a GPU of this report: send the MIG "
                        "slice's parent GPU too (listed false)", field=f"gpus[{i}].parent_uuid")
        j, parent = parents[parent_uuid]
        if parent.get("mig_mode") != "Enabled":
            raise error(f"GPU {parent_uuid} is not MIG-enabled (mig_mode "
                        f"{parent.get('mig_mode') or 'empty'}): it has no slices",
                        field=f"gpus[{i}].parent_uuid")
        if parent.get("listed", True):
            raise error(f"GPU {parent_uuid} is offered whole and as MIG slices (gpus[{i}]): "
                        "a GPU is listed either whole or as slices; send it with listed false",
                        field=f"gpus[{j}].listed")
        if not g.get("mig_profile"):
            raise error("is required for a MIG slice", field=f"gpus[{i}].mig_profile")
        if g["pci_bus_id"] != parent["pci_bus_id"]:
            raise error(f"must be its parent's ({parent['pci_bus_id']})",
                        field=f"gpus[{i}].pci_bus_id")
        _check_profile(i, g, classes[g["gpu_class"]], classes[parent["gpu_class"]], error)
        gi = g.get("gpu_instance_id")
        if gi is not None and instances.setdefault((parent_uuid, gi), i) != i:
            raise error(f"GPU instance {gi} of GPU {parent_uuid} is sent twice (also "
                        f"gpus[{instances[parent_uuid, gi]}]): a slice is one whole GPU "
                        "instance; one split into several compute instances is not offered",
                        field=f"gpus[{i}].gpu_instance_id")
        used[parent_uuid] = used.get(parent_uuid, 0) + g["memory_mib"]
        if g["memory_mib"] > parent["memory_mib"] or used[parent_uuid] > parent["memory_mib"]:
            raise error(f"the slices of GPU {parent_uuid} would hold {used[parent_uuid]} MiB, "
                        f"more than its {parent['memory_mib']} MiB",
                        field=f"gpus[{i}].memory_mib")


def unlist_unsliced(gpus: list[dict[str, Any]], warnings: list[str]) -> list[dict[str, Any]]:
    """`gpus` with each MIG-enabled GPU that has no slice in the report sent `listed`
    false (a MIG-enabled GPU is never leased whole: its memory and SMs belong to its GPU
    instances), a warning appended for each one the runner sent listed."""
    parents = {g["parent_uuid"] for g in gpus if g.get("parent_uuid")}
    out = []
    for i, g in enumerate(gpus):
        if (not g.get("parent_uuid") and g.get("mig_mode") == "Enabled"
                and g["uuid"] not in parents):
            if g.get("listed", True):
                warnings.append(f"gpus[{i}]: GPU {g['uuid']} is MIG-enabled with no MIG "
                                "slices: registered, not offered (a MIG-enabled GPU is never "
                                "leased whole)")
            g = {**g, "listed": False}
        out.append(g)
    return out


def _check_whole(i: int, g: dict[str, Any], error) -> None:
    if g["uuid"].startswith("MIG-"):
        raise error("a MIG slice names its parent GPU", field=f"gpus[{i}].parent_uuid")
    for name in SLICE_FIELDS:
        if g.get(name) not in (None, ""):
            raise error("is for a MIG slice only (one with parent_uuid)",
                        field=f"gpus[{i}].{name}")


def _check_profile(i: int, g: dict[str, Any], market, parent_market, error) -> None:
    known = sorted(type(parent_market).objects.filter(parent=parent_market)
                   .values_list("mig_profile", flat=True))
    if g["mig_profile"] not in known:
        raise error(f"MIG profile {g['mig_profile']} is unknown for {parent_market.slug} "
                    f"(known: {', '.join(known) or 'none'})", field=f"gpus[{i}].mig_profile")
    if market.parent_id != parent_market.pk or market.mig_profile != g["mig_profile"]:
        raise error(f"is the market of a {g['mig_profile']} slice of {parent_market.slug}, "
                    f"not {market.slug}", field=f"gpus[{i}].gpu_class")


def apply_layouts(node, gpus: list[dict[str, Any]], rows: dict[str, Any], conflict) -> bool:
    """Bring the node's units of each reported GPU to the report's layout: the parent
    listed or not, slices of the report listed, older slices retired (deleted when no lease
    ever named them, else kept unlisted). `rows`: {uuid: Gpu} of every reported UUID, as
    written; `conflict`: InventoryConflict. Raises it naming the lease when a unit that
    leaves the market is in an active lease. Returns whether any unit changed."""
    changed = False
    for g in gpus:
        if g.get("parent_uuid"):
            continue
        parent = rows[g["uuid"]]
        wanted = {s["uuid"] for s in gpus if s.get("parent_uuid") == g["uuid"]}
        old = list(Gpu.every.select_for_update().filter(parent=parent, listed=True)
                   .order_by("uuid"))
        leaving = [s for s in old if s.uuid not in wanted]
        if not g.get("listed", True) and parent.listed:
            leaving.append(parent)
        for unit in leaving:
            lease_id = (unit.lease_gpus.filter(active=True).values_list("lease_id", flat=True)
                        .first())
            if lease_id is not None:
                what = f"MIG slice {unit.uuid}" if unit.parent_id else "it whole"
                raise conflict(f"the MIG layout of GPU {parent.uuid} changed, but lease "
                               f"{lease_id} runs on {what}: change the layout once the "
                               "lease has ended", field="gpus")
        for unit in leaving:
            changed = True
            if unit.pk == parent.pk:
                continue
            if unit.lease_gpus.exists():
                unit.listed = False
                unit.save(update_fields=["listed"])
            else:
                unit.delete()
        listed = bool(g.get("listed", True))
        if parent.listed != listed:
            parent.listed = listed
            parent.save(update_fields=["listed"])
            changed = True
    return changed
