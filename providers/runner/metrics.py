"""The runner's /metrics (`gpumarket-runner run --metrics-port N`, off by default, bound to
127.0.0.1 unless --metrics-bind says otherwise): the host's GPUs under dcgm-exporter's
names, help texts and labels, so a provider's DCGM dashboards and alerts work unchanged.

Read at each scrape through the runner's NVML layer (nvml.py: NVML, or the dump with
--simulate). One series per physical GPU, labelled gpu (NVML index), UUID, device
(nvidiaN), pci_bus_id, modelName, Hostname, and lease: the ids of the leases on it now,
comma-separated ("" when idle). A value the source cannot give is left out, not 0.
Every field is a gauge (dcgm-exporter's counters keep their names without a _total suffix
here; rules read them with `> 0` or delta()). No Django (tests/test_import_graph.py).
"""

from __future__ import annotations

import socket

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily

#: (DCGM field, reading key of nvml.READING_KEYS, dcgm-exporter's help text)
FIELDS = (
    ("DCGM_FI_DEV_GPU_UTIL", "utilization_pct", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "fb_used_mib", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "fb_free_mib", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", "Power draw (in W)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrectable",
     "Total number of double-bit volatile ECC errors."),
)
XID = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
LABELS = ("gpu", "UUID", "device", "pci_bus_id", "modelName", "Hostname", "lease")


class DcgmCollector:
    """The GPUs of `agent` (agent.Agent: its GPU source, inventory, the leases it last
    listed and the last XID per GPU it saw) as DCGM series."""

    def __init__(self, agent, hostname: str | None = None) -> None:
        self.agent = agent
        self.hostname = hostname or socket.gethostname()

    def _leases_by_gpu(self) -> dict[str, str]:
        parents = getattr(self.agent, "_parents", {})  # MIG slice → its GPU
        on: dict[str, list[int]] = {}
        for lease_id, units in dict(getattr(self.agent, "_lease_gpus", {})).items():
            for unit in units:
                on.setdefault(parents.get(unit, unit), []).append(lease_id)
        return {gpu: ",".join(str(i) for i in sorted(set(ids))) for gpu, ids in on.items()}

    def collect(self):
        inventory = self.agent.gpus.inventory()
        gpus = inventory.gpus
        readings = {r["uuid"]: r for r in self.agent.gpus.sample_health([g.uuid for g in gpus])}
        leases = self._leases_by_gpu()
        parents = getattr(self.agent, "_parents", {})
        last_xid: dict[str, int] = {}
        for uuid, code in dict(getattr(self.agent, "last_xid", {})).items():
            last_xid[parents.get(uuid, uuid)] = code
        families = {name: GaugeMetricFamily(name, text, labels=LABELS)
                    for name, _, text in FIELDS}
        xid = GaugeMetricFamily(*XID, labels=LABELS)
        for index, gpu in enumerate(gpus):
            labels = [str(index), gpu.uuid, f"nvidia{index}", gpu.pci_bus_id,
                      gpu.product_name, self.hostname, leases.get(gpu.uuid, "")]
            reading = readings.get(gpu.uuid, {})
            if reading.get("lost"):
                continue  # a lost GPU answers nothing; the runner's health says why
            for name, key, _ in FIELDS:
                value = reading.get(key)
                if isinstance(value, bool) or value is None:
                    continue
                families[name].add_metric(labels, float(value))
            xid.add_metric(labels, float(last_xid.get(gpu.uuid, 0)))
        yield from families.values()
        yield xid


def serve(agent, port: int, bind: str = "127.0.0.1"):
    """Serve /metrics for `agent` on bind:port in a daemon thread; returns the server
    (call .shutdown()). OSError when the port cannot be bound."""
    registry = CollectorRegistry()
    registry.register(DcgmCollector(agent))
    server, _thread = start_http_server(port, addr=bind, registry=registry)
    return server
