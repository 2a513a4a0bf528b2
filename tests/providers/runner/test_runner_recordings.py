"""Every recording of data/nvidia-smi/ (real hosts' output, SOURCE.md) parses as recorded;
registering them: tests/marketplace/api/test_inventory_recordings.py."""

from __future__ import annotations

import pytest

from providers.runner.nvsmi import dump_files, parse_dump

from .runner_helpers import DUMPS

#: file → (GPUs, product name exactly as recorded, driver, CUDA, MIG mode).
RECORDINGS = {
    "a10-x1.driver-535.129.03.txt": (1, "NVIDIA A10", "535.129.03", "12.2", "N/A"),
    "a100-sxm4-40gb-x8.xuesongtap-blog.q.txt":
        (8, "NVIDIA A100-SXM4-40GB", "535.129.03", "12.2", "Disabled"),
    "a100-sxm4-80gb-mig-x1of4.telegraf.xml":
        (1, "NVIDIA A100-SXM4-80GB", "535.54.03", "12.2", "Enabled"),
    "a10g-x1.telegraf.xml": (1, "NVIDIA A10G", "515.105.01", "11.7", "N/A"),
    "a40-x10.thamada-gls.q.txt": (10, "NVIDIA A40", "550.127.05", "12.4", "N/A"),
    "gh200-480gb-x1.thamada-gls.q.txt":
        (1, "NVIDIA GH200 480GB", "550.127.05", "12.4", "Disabled"),
    "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt":
        (1, "NVIDIA H100 80GB HBM3", "590.48.01", "13.1", "Enabled"),
    "h100-80gb-hbm3-x8.driver-535.183.01.txt":
        (8, "NVIDIA H100 80GB HBM3", "535.183.01", "12.2", "Disabled"),
    "h100-nvl-x2.thamada-gls.q.txt": (2, "NVIDIA H100 NVL", "550.54.14", "12.4", "Disabled"),
    "h200-mig-x1.utku-exporter-590.48.01.q-idle.txt":
        (1, "NVIDIA H200", "590.48.01", "13.1", "Enabled"),
    "h200-x1.thamada-gls.q.txt": (1, "NVIDIA H200", "550.90.12", "12.4", "Disabled"),
    "h200-x1.utku-exporter-590.48.01.q-idle.txt":
        (1, "NVIDIA H200", "590.48.01", "13.1", "Disabled"),
    "l4-x1.thamada-gls.q.txt": (1, "NVIDIA L4", "550.90.07", "12.4", "N/A"),
    "l40s-x1.thamada-gls.q.txt": (1, "NVIDIA L40S", "550.127.05", "12.4", "N/A"),
    "rtx-4090-x8.driver-535.154.05.txt":
        (8, "NVIDIA GeForce RTX 4090", "535.154.05", "12.2", "N/A"),
    "rtx3090-x2.thamada-gls.q.txt": (2, "NVIDIA GeForce RTX 3090", "560.35.03", "12.6", "N/A"),
    "rtx5090-x1.thamada-gls.q.txt": (1, "NVIDIA GeForce RTX 5090", "570.124.06", "12.8", "N/A"),
    "rtx6000ada-x8.thamada-gls.q.txt":
        (8, "NVIDIA RTX 6000 Ada Generation", "550.127.05", "12.4", "N/A"),
    "rtxa6000-x9.thamada-gls.q.txt": (9, "NVIDIA RTX A6000", "550.127.05", "12.4", "N/A"),
    "rtxpro6000-blackwell-maxq-x1.telegraf.xml":
        (1, "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "590.44.01", "13.1",
         "N/A"),
    "t4-x1.telegraf.xml": (1, "Tesla T4", "515.105.01", "11.7", "N/A"),
    "titan-v-x1.driver-560.35.03.txt": (1, "NVIDIA TITAN V", "560.35.03", "12.6", "N/A"),
    "v100-sxm2-16gb-x8.thamada-gls.q.txt":
        (8, "Tesla V100-SXM2-16GB", "550.127.05", "12.4", "N/A"),
}
NOT_REPORTS = {"SOURCE.md", "h100-80gb-hbm3-x8.truncated.txt",  # refused: test_runner_nvsmi
               "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.L.txt",
               "h200-mig-x1.utku-exporter-590.48.01.L.txt"}
#: The `-L` listings of the MIG recordings: (MIG UUID, profile, MiB, SMs, GI, CI) by index.
H100_MIG = [
    ("MIG-00000000-0000-0000-0000-000000000000", "3g.40gb", 40448, 60, 2, 0),
    ("MIG-00000001-0000-0000-0000-000000000001", "2g.20gb", 20096, 32, 3, 0),
    ("MIG-00000002-0000-0000-0000-000000000002", "1g.10gb", 9984, 16, 9, 0),
    ("MIG-00000003-0000-0000-0000-000000000003", "1g.10gb", 9984, 16, 10, 0),
]
H200_MIG = [  # "1c.3g.71gb" and "2c.3g.71gb": two compute instances of one GPU instance
    ("MIG-00000000-0000-0000-0000-000000000000", "3g.71gb", 71424, 16, 2, 0),
    ("MIG-00000001-0000-0000-0000-000000000001", "3g.71gb", 71424, 32, 2, 1),
    ("MIG-00000002-0000-0000-0000-000000000002", "2g.35gb", 33280, 32, 3, 0),
    ("MIG-00000003-0000-0000-0000-000000000003", "1g.18gb", 16384, 16, 9, 0),
    ("MIG-00000004-0000-0000-0000-000000000004", "1g.18gb", 16384, 16, 10, 0),
]


def test_the_table_names_every_recording():
    on_disk = {p.name for p in DUMPS.iterdir()}
    assert on_disk - NOT_REPORTS == set(RECORDINGS)


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_recording_parses_with_its_real_names(name):
    count, product, driver, cuda, mig = RECORDINGS[name]
    inv = parse_dump(DUMPS / name, classify=False)
    assert (inv.driver_version, inv.cuda_version) == (driver, cuda)
    assert inv.source == f"simulate:{name}"
    assert len(inv.gpus) == count
    assert {g.product_name for g in inv.gpus} == {product}
    assert {g.mig_mode for g in inv.gpus} == {mig}
    assert len({g.uuid for g in inv.gpus}) == count
    assert len({g.pci_bus_id for g in inv.gpus}) == count
    assert all(g.memory_mib > 10_000 for g in inv.gpus)


@pytest.mark.parametrize(("name", "expected"), [
    ("h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt", H100_MIG),
    ("h200-mig-x1.utku-exporter-590.48.01.q-idle.txt", H200_MIG),
])
def test_mig_recordings_name_their_slices_from_the_listing_beside_them(name, expected):
    files = dump_files(DUMPS / name)
    assert files.listing == DUMPS / name.replace(".q-idle.txt", ".L.txt")
    [gpu] = parse_dump(DUMPS / name, classify=False).gpus
    got = [(m.uuid, m.profile, m.memory_mib, m.sm_count, m.gpu_instance_id,
            m.compute_instance_id) for m in gpu.mig_devices]
    assert got == expected
    assert [m.index for m in gpu.mig_devices] == list(range(len(expected)))


def test_a100_mig_xml_without_a_listing_says_why_its_slices_are_left_out():
    inv = parse_dump(DUMPS / "a100-sxm4-80gb-mig-x1of4.telegraf.xml", classify=False)
    [gpu] = inv.gpus
    assert (gpu.uuid, gpu.memory_mib, gpu.mig_mode) == (
        "GPU-513536b6-7d19-9063-b049-1e69664bb298", 81920, "Enabled")
    assert gpu.mig_devices == ()
    assert any("4 MIG device(s) left out" in n and "nvidia-smi -L" in n for n in inv.notes)
    assert any("1 of the 4 attached GPUs" in n for n in inv.notes)  # `-q -i 1`
