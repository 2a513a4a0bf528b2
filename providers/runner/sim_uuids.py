"""Own UUIDs for a recording whose UUIDs were zeroed (`--simulate`).

Some public captures scrub their UUIDs to GPU-00000000-0000-0000-0000-000000000000 (and
MIG-00000001-0000-0000-0000-000000000001 …, keeping the device index). A real NVML never
reports such a UUID, and two nodes registering the same scrubbed recording would claim one
GPU (409). A zeroed UUID — at most two of its 32 hex digits not 0 — is replaced by
uuid5(NAMESPACE_URL, "gpumarket-simulate:<state dir id>/<file name>/<GPU or MIG>/<GPU
index>[/<MIG index>]"): stable across restarts of one state dir, distinct between state
dirs (config.simulate_id). docs/RUNNER.md, "Reading the GPUs".
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import replace

from .nvsmi import Inventory


def zeroed(value: str) -> bool:
    """Whether a "GPU-…" / "MIG-…" UUID is a scrubbed one (≤ 2 non-zero hex digits)."""
    digits = value.split("-", 1)[-1].replace("-", "")
    return len(digits) == 32 and sum(1 for c in digits if c != "0") <= 2


def _own(kind: str, salt: str, file: str, *where: int) -> str:
    path = "/".join([salt, file, kind, *map(str, where)])
    return f"{kind}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, 'gpumarket-simulate:' + path)}"


def own_uuids(inventory: Inventory, salt: str, file: str) -> tuple[Inventory, dict[str, str]]:
    """(inventory with its zeroed UUIDs replaced, {recorded UUID: new one}); the
    inventory unchanged and {} when none is zeroed. A note says what was replaced."""
    mapping: dict[str, str] = {}
    gpus = []
    for i, gpu in enumerate(inventory.gpus):
        new_uuid = _own("GPU", salt, file, i) if zeroed(gpu.uuid) else gpu.uuid
        if new_uuid != gpu.uuid:
            mapping[gpu.uuid] = new_uuid
        devices = []
        for dev in gpu.mig_devices:
            if zeroed(dev.uuid):
                mapping[dev.uuid] = _own("MIG", salt, file, i, dev.index)
                dev = replace(dev, uuid=mapping[dev.uuid])
            devices.append(dev)
        gpus.append(replace(gpu, uuid=new_uuid, mig_devices=tuple(devices)))
    if not mapping:
        return inventory, {}
    note = (f"{file} has zeroed UUIDs (a scrubbed recording): {len(mapping)} replaced by "
            "UUIDs derived from this state dir and the file, e.g. "
            + ", ".join(f"{old} → {new}" for old, new in list(mapping.items())[:2]))
    return replace(inventory, gpus=gpus, notes=(*inventory.notes, note)), mapping
