"""What the inventory says of each GPU's interconnect: NVLink state and peers, PCIe link.

`topology_fields(gpus, readings)` gives, per GPU UUID, the extra keys of its `gpus[]` item
of POST /api/v1/runner/inventory/ (docs/RUNNER_PROTOCOL.md, "Topology"):
- "nvlink": {"links_active": 18, "peers": ["00000000:53:00.0", …]} — for a GPU that has
  NVLinks; `peers` are the bus ids of this host's other GPUs it reaches over an active
  link: directly (the link's remote PCI bus id is that GPU's), or through an NVSwitch
  (a remote bus id that is no GPU of the host) that the other GPU's active links reach
  too. Links whose remote is unknown (`nvidia-smi nvlink -s` names none) give no peers.
- "pcie_generation", "pcie_width": the link's maximum generation and lane count, from the
  health reading (pcie_gen_max, pcie_width_max); left out when unknown.
"""

from __future__ import annotations

from .nvsmi import GpuInfo


def nvlink_peers(gpus: list[GpuInfo]) -> dict[str, list[str]]:
    """Peers by GPU UUID (sorted bus ids, see the module docstring), for GPUs with links."""
    buses = {g.pci_bus_id.upper(): g for g in gpus}
    remotes = {g.uuid: {link.remote_pci_bus_id.upper() for link in g.nvlinks
                        if link.active and link.remote_pci_bus_id} for g in gpus}
    out = {}
    for gpu in gpus:
        if not gpu.nvlinks:
            continue
        mine = remotes[gpu.uuid]
        switches = {r for r in mine if r not in buses}
        peers = {r for r in mine if r in buses and r != gpu.pci_bus_id.upper()}
        peers |= {other.pci_bus_id.upper() for other in gpus
                  if other.uuid != gpu.uuid and switches & remotes[other.uuid]}
        out[gpu.uuid] = sorted(peers)
    return out


def topology_fields(gpus: list[GpuInfo], readings: dict[str, dict]) -> dict[str, dict]:
    """The topology keys of each GPU's inventory item, by UUID (module docstring);
    readings: health readings by UUID (may lack a GPU or its PCIe keys)."""
    peers = nvlink_peers(gpus)
    out: dict[str, dict] = {}
    for gpu in gpus:
        fields: dict = {}
        if gpu.nvlinks:
            fields["nvlink"] = {"links_active": sum(1 for x in gpu.nvlinks if x.active),
                                "peers": peers[gpu.uuid]}
        reading = readings.get(gpu.uuid) or {}
        for key, name in (("pcie_gen_max", "pcie_generation"),
                          ("pcie_width_max", "pcie_width")):
            if isinstance(reading.get(key), int) and reading[key] > 0:
                fields[name] = reading[key]
        out[gpu.uuid] = fields
    return out
