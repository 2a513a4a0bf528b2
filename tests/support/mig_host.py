"""The recorded MIG-partitioned H100 host as the runner sees it (no Django: the runner's
tests use it too)."""

from __future__ import annotations

from providers.runner.nvsmi import GpuInfo, Inventory, MigDevice

#: The recorded MIG-partitioned H100 host (data/nvidia-smi/h100-80gb-hbm3-mig-x1.*: the
#: UUIDs and profiles from its `nvidia-smi -L`, GPU instance ids, SM counts and memory from
#: its `nvidia-smi -q`), built here while the dump parser cannot read MIG devices. The
#: recording's all-zero GPU and MIG UUIDs, which the marketplace refuses (no NVML reports
#: them; a runner with --simulate replaces them: runner/sim_uuids.py), are 0…01 here.
#: needs: nvsmi (parse_dump of the recording gives the same GpuInfo once it reads MIG)
H100_MIG = Inventory("590.48.01", "13.1", [GpuInfo(
    "GPU-00000000-0000-0000-0000-0000000000a1", "NVIDIA H100 80GB HBM3", 81559,
    "00000000:00:09.0", "Enabled", "h100-sxm-80gb", mig_devices=(
        MigDevice("MIG-00000000-0000-0000-0000-0000000000a1", "3g.40gb", 2, 0, 40448, 60, 0),
        MigDevice("MIG-00000001-0000-0000-0000-000000000001", "2g.20gb", 3, 0, 20096, 32, 1),
        MigDevice("MIG-00000002-0000-0000-0000-000000000002", "1g.10gb", 9, 0, 9984, 16, 2),
        MigDevice("MIG-00000003-0000-0000-0000-000000000003", "1g.10gb", 10, 0, 9984, 16, 3),
    ))], source="simulate:h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt")

#: The recorded MIG-partitioned A100 host (data/nvidia-smi's a100-sxm4-80gb-mig-x1of4
#: .telegraf.xml, `nvidia-smi -q -x`: GPU UUID, bus, memory, and 4 MIG devices of 14 SMs
#: and 19968 MiB each — the 1g.20gb profile of the A100 80GB — in GPU instances 3 to 6).
#: `-q -x` prints no MIG device UUIDs: these four are made here.
A100_MIG = Inventory("535.54.03", "12.2", [GpuInfo(
    "GPU-513536b6-7d19-9063-b049-1e69664bb298", "NVIDIA A100-SXM4-80GB", 81920,
    "00000000:01:00.0", "Enabled", "a100-sxm-80gb", mig_devices=tuple(
        MigDevice(f"MIG-a1000000-0000-0000-0000-00000000000{gi}", "1g.20gb", gi, 0, 19968, 14,
                  gi - 3) for gi in (3, 4, 5, 6)))],
    source="simulate:a100-sxm4-80gb-mig-x1of4.telegraf.xml")
