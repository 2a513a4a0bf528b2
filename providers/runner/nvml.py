"""GPU inventory and health, read through NVML (pynvml) or, when simulating, from a dump.

Two sources with one interface (`inventory()`, `sample_health(uuids)`, `source`, `simulate`):
- NvmlGpus: the real driver, via the NVIDIA Management Library (package nvidia-ml-py).
- DumpGpus: a recorded `nvidia-smi -q` report (`--simulate FILE`), for hosts without a GPU.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from .catalog import gpu_class_for
from .nvsmi import GpuInfo, Inventory, health_from_text, parse_text, read_text


class NoDriverError(RuntimeError):
    """No usable NVIDIA driver: libnvidia-ml missing, driver not loaded, or NVML init failed."""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml():
    """Import pynvml and call nvmlInit(); raise NoDriverError with NVML's own reason."""
    try:
        import pynvml
    except ImportError as exc:  # the package is a declared dependency; be clear anyway
        raise NoDriverError(f"the nvidia-ml-py package is not installed ({exc})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoDriverError(str(exc)) from None
    return pynvml


def _cuda_version(driver_int: int) -> str:
    """NVML's CUDA driver version 12020 → '12.2'."""
    return f"{driver_int // 1000}.{(driver_int % 1000) // 10}"


class NvmlGpus:
    """The host's GPUs through NVML. Constructing it raises NoDriverError without a driver."""

    simulate = False
    source = "nvml"

    def __init__(self) -> None:
        self._nvml = _nvml()

    def inventory(self) -> Inventory:
        """Every GPU NVML sees, in index order; memory in MiB (bytes // 2**20).

        Raises NoDriverError on an NVML failure, catalog.UnknownGpuProduct for an
        unknown model.
        """
        nv = self._nvml
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
            cuda = _cuda_version(nv.nvmlSystemGetCudaDriverVersion())
            gpus = []
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                name = _text(nv.nvmlDeviceGetName(handle))
                try:
                    current, _pending = nv.nvmlDeviceGetMigMode(handle)
                    mig = "Enabled" if current else "Disabled"
                except nv.NVMLError:  # NVML_ERROR_NOT_SUPPORTED on GPUs without MIG
                    mig = "N/A"
                gpus.append(
                    GpuInfo(
                        uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                        product_name=name,
                        memory_mib=nv.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                        pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(handle).busId),
                        mig_mode=mig,
                        gpu_class=gpu_class_for(name),
                    )
                )
        except nv.NVMLError as exc:
            raise NoDriverError(f"NVML failed while reading the GPUs: {exc}") from None
        return Inventory(driver, cuda, gpus, source="nvml")

    def sample_health(self, uuids: list[str]) -> list[dict]:
        """One reading per UUID, as the heartbeat's `gpus[]`: uuid, temperature_c (°C),
        power_w (W), utilization_pct (%), ecc_uncorrectable (volatile count); None where
        NVML cannot say."""
        nv = self._nvml
        out = []
        for uuid in uuids:
            reading = {"uuid": uuid, "temperature_c": None, "power_w": None,
                       "utilization_pct": None, "ecc_uncorrectable": None}
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid.encode())
            except nv.NVMLError:
                out.append(reading)
                continue
            probes = {
                "temperature_c": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                "power_w": lambda h: round(nv.nvmlDeviceGetPowerUsage(h) / 1000, 2),
                "utilization_pct": lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu,
                "ecc_uncorrectable": lambda h: nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                ),
            }
            for key, probe in probes.items():
                with contextlib.suppress(nv.NVMLError):  # unsupported here: leave None
                    reading[key] = probe(handle)
            out.append(reading)
        return out


class DumpGpus:
    """GPUs read from a recorded `nvidia-smi -q` report (`--simulate FILE`).

    Constructing it parses the file and raises nvsmi.DumpError if it is malformed.
    """

    simulate = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        text = read_text(self.path)
        self._inventory = parse_text(text, name=self.path.name)
        self._health = health_from_text(text, name=self.path.name)
        self.source = self._inventory.source

    def inventory(self) -> Inventory:
        """The inventory recorded in the file (source "simulate:<file name>")."""
        return self._inventory

    def sample_health(self, uuids: list[str]) -> list[dict]:
        """The readings recorded in the file (same shape as NvmlGpus.sample_health)."""
        empty = {"temperature_c": None, "power_w": None, "utilization_pct": None,
                 "ecc_uncorrectable": None}
        return [{"uuid": u, **self._health.get(u, empty)} for u in uuids]


def read_inventory() -> Inventory:
    """The host's inventory through NVML (raises NoDriverError without a driver)."""
    return NvmlGpus().inventory()


def sample_health(uuids: list[str]) -> list[dict]:
    """Health of `uuids` through NVML (see NvmlGpus.sample_health)."""
    return NvmlGpus().sample_health(uuids)
