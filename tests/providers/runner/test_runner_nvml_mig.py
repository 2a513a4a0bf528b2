"""NvmlGpus reads MIG devices and NVLinks. No GPU or driver here: NVML is a fake `pynvml`
module object (the one thing that cannot run), answering with the values of the recorded
H100 MIG host (data/nvidia-smi, `-q` + `-L`), so both paths must give the same inventory."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

import pytest

from providers.runner.doctor import doctor_checks
from providers.runner.nvml import NvmlGpus
from providers.runner.nvsmi import NvLinkInfo, parse_dump

from .runner_helpers import DUMPS

H100_MIG = DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt"
#: H100 80GB GI profiles (nvidia-smi mig -lgip): index → (id, name, slices, memory MB).
PROFILES = {0: (19, "MIG 1g.10gb", 1, 9984), 1: (20, "MIG 1g.10gb+me", 1, 9984),
            2: (15, "MIG 1g.20gb", 1, 20096), 3: (14, "MIG 2g.20gb", 2, 20096),
            4: (9, "MIG 3g.40gb", 3, 40448), 5: (5, "MIG 4g.40gb", 4, 40448),
            6: (0, "MIG 7g.80gb", 7, 81559)}
PROFILE_OF_GI = {2: 9, 3: 14, 9: 19, 10: 19}


class NVMLError(Exception):
    def __init__(self, value):
        self.value = value
        super().__init__(f"NVML error {value}")


def fake_pynvml(recorded, *, gi_permission=True, nvlink_links=0):
    """A module object with the NVML calls NvmlGpus and nvml_mig make."""
    [gpu] = recorded.gpus
    migs = {m.index: m for m in gpu.mig_devices}
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVML_ERROR_NOT_FOUND, nv.NVML_ERROR_NOT_SUPPORTED = 6, 3
    nv.NVML_ERROR_INVALID_ARGUMENT, nv.NVML_ERROR_NO_PERMISSION = 2, 4
    nv.NVML_GPU_INSTANCE_PROFILE_COUNT, nv.NVML_NVLINK_MAX_LINKS = 14, 18
    nv.nvmlInit = lambda: None
    nv.nvmlSystemGetDriverVersion = lambda: recorded.driver_version.encode()
    nv.nvmlSystemGetCudaDriverVersion = lambda: 13010
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    nv.nvmlDeviceGetName = lambda h: gpu.product_name
    nv.nvmlDeviceGetMigMode = lambda h: (1, 1)
    nv.nvmlDeviceGetPciInfo = lambda h: NS(busId=gpu.pci_bus_id.encode())

    def uuid(h):
        return gpu.uuid if h[0] == "gpu" else migs[h[1]].uuid

    def memory(h):
        mib = gpu.memory_mib if h[0] == "gpu" else migs[h[1]].memory_mib
        return NS(total=mib * 2**20)

    def mig_handle(h, index):
        if index not in migs:
            raise NVMLError(nv.NVML_ERROR_NOT_FOUND)
        return ("mig", index)

    def profile_info(h, index):
        if index not in PROFILES:
            raise NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        pid, name, slices, mb = PROFILES[index]
        return NS(id=pid, name=name.encode(), sliceCount=slices, memorySizeMB=mb)

    def gi_by_id(h, gi):
        if not gi_permission:
            raise NVMLError(nv.NVML_ERROR_NO_PERMISSION)
        return ("gi", gi)

    def attributes(h):
        m = migs[h[1]]
        slices = next(p[2] for p in PROFILES.values() if p[0] == PROFILE_OF_GI[m.gpu_instance_id])
        return NS(multiprocessorCount=m.sm_count, gpuInstanceSliceCount=slices,
                  memorySizeMB=m.memory_mib)

    def link_state(h, link):
        if link >= nvlink_links:
            raise NVMLError(nv.NVML_ERROR_NOT_SUPPORTED if link == 0 else
                            nv.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link == 3 else 1

    nv.nvmlDeviceGetUUID = uuid
    nv.nvmlDeviceGetMemoryInfo = memory
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7
    nv.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    nv.nvmlDeviceGetGpuInstanceId = lambda h: migs[h[1]].gpu_instance_id
    nv.nvmlDeviceGetComputeInstanceId = lambda h: migs[h[1]].compute_instance_id
    nv.nvmlDeviceGetAttributes = attributes
    nv.nvmlDeviceGetGpuInstanceProfileInfo = profile_info
    nv.nvmlDeviceGetGpuInstanceById = gi_by_id
    nv.nvmlGpuInstanceGetInfo = lambda gi: NS(profileId=PROFILE_OF_GI[gi[1]])
    nv.nvmlDeviceGetNvLinkState = link_state
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: NS(
        busId=f"0000:{0x10 + link:02x}:00.0".encode())
    return nv


@pytest.mark.parametrize("gi_permission", [True, False])
def test_nvml_reads_the_mig_devices_the_recording_shows(monkeypatch, gi_permission):
    recorded = parse_dump(H100_MIG)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(recorded,
                                                           gi_permission=gi_permission))
    inv = NvmlGpus().inventory()
    [gpu] = inv.gpus
    assert gpu.mig_mode == "Enabled"
    assert gpu.mig_devices == recorded.gpus[0].mig_devices
    assert [m.profile for m in gpu.mig_devices] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert (gpu.nvlinks, inv.notes) == ((), ())


def test_nvml_reads_nvlink_state_and_peers(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(parse_dump(H100_MIG),
                                                           nvlink_links=4))
    [gpu] = NvmlGpus().inventory().gpus
    assert gpu.nvlinks == (
        NvLinkInfo(0, True, "00000000:10:00.0"), NvLinkInfo(1, True, "00000000:11:00.0"),
        NvLinkInfo(2, True, "00000000:12:00.0"), NvLinkInfo(3, False, None))


def test_nvml_without_profile_names_leaves_the_slices_out_with_a_note(monkeypatch):
    nv = fake_pynvml(parse_dump(H100_MIG), gi_permission=False)
    nv.NVML_GPU_INSTANCE_PROFILE_COUNT = 0  # an NVML that lists no GI profile
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    inv = NvmlGpus().inventory()
    assert inv.gpus[0].mig_devices == ()
    [note] = inv.notes
    assert "MIG devices left out" in note and "GPU instance 2" in note


def test_doctor_prints_mig_devices_and_nvlinks(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(parse_dump(H100_MIG),
                                                           nvlink_links=4))
    lines = [line for _ok, line in doctor_checks(None, None)]
    assert lines[0].startswith("PASS  NVIDIA driver / NVML: driver 590.48.01, CUDA 13.1")
    assert lines[1] == ("PASS  MIG: GPU 0 NVIDIA H100 80GB HBM3 MIG Enabled: 1 \u00d7 3g.40gb, "
                        "1 \u00d7 2g.20gb, 2 \u00d7 1g.10gb")
    assert lines[2].startswith("FAIL  NVLink: GPU 0 NVIDIA H100 80GB HBM3 NVLink: 3/4 links "
                               "active to 00000000:10:00.0, 00000000:11:00.0, 00000000:12:00.0")
