"""How `inventory` and `doctor` describe a GPU's MIG devices and NVLinks, one line each.

    GPU 0 NVIDIA H100 80GB HBM3 MIG Enabled: 1 × 3g.40gb, 1 × 2g.20gb, 2 × 1g.10gb
    NVLink: 18/18 links active
"""

from __future__ import annotations

from collections import Counter

from .mig import not_offered
from .nvsmi import TIMES, GpuInfo


def mig_summary(gpu: GpuInfo) -> str:
    """"MIG Enabled: 7 × 1g.10gb" (profiles in index order), "MIG Enabled: no MIG devices listed",
    "MIG Disabled" or "MIG N/A"."""
    if gpu.mig_mode != "Enabled":
        return f"MIG {gpu.mig_mode}"
    if not gpu.mig_devices:
        return "MIG Enabled: no MIG devices listed"
    counts = Counter(m.profile for m in gpu.mig_devices)  # insertion order: first index
    return "MIG Enabled: " + ", ".join(f"{n} {TIMES} {p}" for p, n in counts.items())


def nvlink_summary(gpu: GpuInfo) -> str | None:
    """"NVLink: 18/18 links active" (peers named when known, e.g. "… to 00000000:53:00.0,
    …" for a bridge); None for a GPU without NVLinks."""
    if not gpu.nvlinks:
        return None
    up = [link for link in gpu.nvlinks if link.active]
    text = f"NVLink: {len(up)}/{len(gpu.nvlinks)} links active"
    peers = sorted({link.remote_pci_bus_id for link in up if link.remote_pci_bus_id})
    if peers and len(peers) <= 4:
        text += " to " + ", ".join(peers)
    elif peers:
        text += f" to {len(peers)} peers"
    return text


def mig_lines(gpu: GpuInfo) -> list[str]:
    """One line per MIG device: index, UUID, profile, GI/CI ids, memory, SMs."""
    return [f"MIG {m.index}  {m.uuid}  {m.compute_profile or m.profile}  GI "
            f"{m.gpu_instance_id} CI "
            f"{m.compute_instance_id}  {m.memory_mib} MiB  "
            f"{'?' if m.sm_count is None else m.sm_count} SMs" for m in gpu.mig_devices]


def doctor_lines(gpus: list[GpuInfo]) -> list[tuple[bool | None, str, str, str]]:
    """(ok, check name, detail, fix) per GPU for MIG (MIG Enabled without MIG devices: FAIL,
    nothing on it can be leased; a GPU instance split into compute instances: FAIL, it is
    not offered, the GPU's other slices are) and NVLink (some links down: FAIL; none up: SKIP)."""
    out: list[tuple[bool | None, str, str, str]] = []
    for index, gpu in enumerate(gpus):
        name = f"GPU {index} {gpu.product_name}"
        if gpu.mig_mode == "Enabled":
            ok = bool(gpu.mig_devices)
            out.append((ok, "MIG", f"{name} {mig_summary(gpu)}",
                        "" if ok else "create MIG devices (`sudo nvidia-smi mig -cgi "
                        "<profiles> -C`) or disable MIG (`sudo nvidia-smi -i "
                        f"{index} -mig 0`)"))
            if ok:  # GPU instances split into compute instances: the rest is offered
                out += [(False, "MIG", f"{name}: {line.split(': not offered')[0]}: not "
                         "offered", "a slice is one GPU instance with one compute instance "
                         "covering it: " + line.split("; ", 1)[1])
                        for line in not_offered(gpu)]
        summary = nvlink_summary(gpu)
        if summary is not None:
            up = sum(1 for link in gpu.nvlinks if link.active)
            ok = True if up == len(gpu.nvlinks) else (None if up == 0 else False)
            out.append((ok, "NVLink", f"{name} {summary}",
                        "" if ok else "check the NVLink bridge / NVSwitch fabric "
                        "(`nvidia-smi nvlink -s`, `systemctl status nvidia-fabricmanager`)"))
    return out
