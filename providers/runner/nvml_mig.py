"""MIG devices and NVLinks of one GPU, read through NVML (pynvml, package nvidia-ml-py).

MIG (NVIDIA Multi-Instance GPU user guide, "Device enumeration"): a MIG-enabled GPU has up
to nvmlDeviceGetMaxMigDeviceCount MIG devices, each a compute instance (CI) inside a GPU
instance (GI). For each index, nvmlDeviceGetMigDeviceHandleByIndex gives the MIG device
(NVML_ERROR_NOT_FOUND: no device at that index); its UUID ("MIG-…"), GI and CI ids, memory
(nvmlDeviceGetMemoryInfo, bytes) and nvmlDeviceGetAttributes (multiprocessorCount, the GI's
and the CI's slice counts and memory) come from that handle; a CI with fewer slices than
its GI gets compute_profile "<CI slices>c.<GI profile>", as `nvidia-smi -L` prints it.
The GI profile's name ("1g.10gb") is the `name` of nvmlDeviceGetGpuInstanceProfileInfo
(v2) for the GI's profile id (nvmlDeviceGetGpuInstanceById + nvmlGpuInstanceGetInfo);
where the GI cannot be opened (no permission), the profile whose slice count and memory
equal the device's attributes.

NVLink: nvmlDeviceGetNvLinkState per link 0 … NVML_NVLINK_MAX_LINKS-1 (a link past the
GPU's last answers NVML_ERROR_INVALID_ARGUMENT or NOT_SUPPORTED), and for an active link
the peer's PCI bus id from nvmlDeviceGetNvLinkRemotePciInfo (the C call's `_v2`).
"""

from __future__ import annotations

from .nvsmi import MigDevice, NvLinkInfo, normal_bus_id


class ProfileUnknown(LookupError):
    """NVML gives no GPU instance profile name for a MIG device (driver or binding too old)."""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _code(exc) -> int | None:
    return getattr(exc, "value", None)


def gi_profiles(nv, handle) -> dict[int, tuple[str, int, int]]:
    """{GI profile id: (name without "MIG ", slice count, memory MB)} of the GPU; profiles
    the GPU lacks (NVML_ERROR_NOT_SUPPORTED / INVALID_ARGUMENT) are left out."""
    out = {}
    for profile in range(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except nv.NVMLError:
            continue
        name = _text(getattr(info, "name", b"") or b"").removeprefix("MIG ").strip()
        out[info.id] = (name, info.sliceCount, info.memorySizeMB)
    return out


def _profile_name(nv, handle, gi_id: int, attrs, profiles) -> str:
    try:
        profile_id = nv.nvmlGpuInstanceGetInfo(
            nv.nvmlDeviceGetGpuInstanceById(handle, gi_id)).profileId
        name = profiles.get(profile_id, ("", 0, 0))[0]
    except nv.NVMLError:  # e.g. NVML_ERROR_NO_PERMISSION for a user outside the GI's owners
        name = next((n for n, slices, mb in profiles.values()
                     if slices == attrs.gpuInstanceSliceCount and mb == attrs.memorySizeMB),
                    "")
    if not name:
        raise ProfileUnknown(f"NVML names no GPU instance profile for GPU instance {gi_id}")
    return name


def mig_devices(nv, handle) -> tuple[MigDevice, ...]:
    """The MIG devices of a MIG-enabled GPU, by index. NVMLError propagates (the caller
    turns it into NoDriverError); ProfileUnknown when no profile name can be read."""
    not_found = getattr(nv, "NVML_ERROR_NOT_FOUND", 6)
    profiles = gi_profiles(nv, handle)
    out = []
    for index in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except nv.NVMLError as exc:
            if _code(exc) == not_found:
                continue
            raise
        gi_id = nv.nvmlDeviceGetGpuInstanceId(mig)
        attrs = nv.nvmlDeviceGetAttributes(mig)
        profile = _profile_name(nv, handle, gi_id, attrs, profiles)
        part = getattr(attrs, "computeInstanceSliceCount", None)
        whole = getattr(attrs, "gpuInstanceSliceCount", None)
        out.append(MigDevice(
            uuid=_text(nv.nvmlDeviceGetUUID(mig)),
            profile=profile,
            compute_profile=(f"{part}c.{profile}" if part and whole and part != whole
                             else ""),
            gpu_instance_id=gi_id,
            compute_instance_id=nv.nvmlDeviceGetComputeInstanceId(mig),
            memory_mib=nv.nvmlDeviceGetMemoryInfo(mig).total // 2**20,
            sm_count=attrs.multiprocessorCount,
            index=index,
        ))
    return tuple(out)


def nvlinks(nv, handle) -> tuple[NvLinkInfo, ...]:
    """The GPU's NVLinks; () on a GPU without NVLink. A link whose peer NVML cannot name
    has remote_pci_bus_id None."""
    out = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            active = bool(nv.nvmlDeviceGetNvLinkState(handle, link))
        except nv.NVMLError:  # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past the last)
            break
        remote = None
        if active:
            try:
                remote = normal_bus_id(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle,
                                                                                link).busId))
            except nv.NVMLError:
                remote = None
        out.append(NvLinkInfo(link, active, remote))
    return tuple(out)
