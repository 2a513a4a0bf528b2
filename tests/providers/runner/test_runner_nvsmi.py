"""The `nvidia-smi -q` parser and the GPU class catalog, on recorded real dumps."""

from __future__ import annotations

import pytest

from providers.runner.catalog import UnknownGpuProduct, gpu_class_for
from providers.runner.nvml import DumpGpus
from providers.runner.nvsmi import DumpError, parse_dump, parse_text

from .runner_helpers import A10, H100, RTX4090, TITAN_V, TRUNCATED

H100_UUIDS = [  # copied from the "GPU UUID" lines of the dump, in order
    "GPU-566e6f65-c38e-b12f-4824-6944218668b9",
    "GPU-9930d717-21dd-7692-054e-3d0a2bae76b5",
    "GPU-973565ff-45cf-12ea-4e91-33386720f7bb",
    "GPU-6b932a61-abfd-5ea1-b26a-7dea7f2fa601",
    "GPU-726d356b-f548-bbfd-c81e-b9c68f2f1587",
    "GPU-06db64f6-6181-5a90-cf95-5ce52a58c4e5",
    "GPU-a5271aa6-4cdb-28c7-0ef5-5da271d0caae",
    "GPU-7e78e6c8-c71c-66c7-9ded-f8836cecab32",
]
H100_BUS_IDS = [f"00000000:{b}:00.0" for b in ("53", "64", "75", "86", "97", "A8", "B9", "CA")]


def test_h100_host():
    inv = parse_dump(H100)
    assert inv.driver_version == "535.183.01"
    assert inv.cuda_version == "12.2"
    assert inv.source == "simulate:h100-80gb-hbm3-x8.driver-535.183.01.txt"
    assert [g.uuid for g in inv.gpus] == H100_UUIDS
    assert [g.pci_bus_id for g in inv.gpus] == H100_BUS_IDS
    assert {g.product_name for g in inv.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.memory_mib for g in inv.gpus} == {81559}
    assert {g.gpu_class for g in inv.gpus} == {"h100-sxm-80gb"}
    assert {g.mig_mode for g in inv.gpus} == {"Disabled"}
    assert inv.summary() == (
        "8 \u00d7 NVIDIA H100 80GB HBM3 (h100-sxm-80gb), driver 535.183.01, CUDA 12.2"
    )


def test_rtx_4090_host():
    inv = parse_dump(RTX4090)
    assert (inv.driver_version, inv.cuda_version) == ("535.154.05", "12.2")
    assert len(inv.gpus) == 8
    assert len({g.uuid for g in inv.gpus}) == 8
    assert inv.gpus[0].uuid == "GPU-988008fc-0059-17f4-9001-0ab4143e0e63"
    assert inv.gpus[0].pci_bus_id == "00000000:01:00.0"
    assert {(g.product_name, g.gpu_class, g.memory_mib) for g in inv.gpus} == {
        ("NVIDIA GeForce RTX 4090", "rtx-4090", 24564)
    }


def test_a10_and_titan_v_hosts():
    a10 = parse_dump(A10)
    assert (a10.driver_version, a10.cuda_version) == ("535.129.03", "12.2")
    [gpu] = a10.gpus
    assert (gpu.uuid, gpu.product_name, gpu.gpu_class, gpu.memory_mib, gpu.pci_bus_id) == (
        "GPU-73d12ef7-f589-f867-4259-c7090ab44736", "NVIDIA A10", "a10", 23028,
        "00000000:07:00.0",
    )
    titan = parse_dump(TITAN_V)
    assert (titan.driver_version, titan.cuda_version) == ("560.35.03", "12.6")
    [gpu] = titan.gpus
    assert (gpu.uuid, gpu.gpu_class, gpu.memory_mib, gpu.mig_mode) == (
        "GPU-f4c353ff-b56c-c1de-bcb9-7dad861b589a", "titan-v", 12288, "N/A",
    )


def test_simulated_health_comes_from_the_dump():
    gpus = DumpGpus(H100)
    [reading] = gpus.sample_health([H100_UUIDS[0]])
    protocol = {k: reading[k] for k in ("uuid", "temperature_c", "power_w", "utilization_pct",
                                        "ecc_uncorrectable")}
    assert protocol == {"uuid": H100_UUIDS[0], "temperature_c": 36, "power_w": 71.97,
                        "utilization_pct": 0, "ecc_uncorrectable": 0}
    # T.Limit mode: 36 °C + 50 °C margin − (−2 °C slowdown margin) = slowdown at 88 °C.
    assert reading["slowdown_temp_c"] == 88
    assert (reading["remapped_rows_pending"], reading["remapping_failure"]) == (False, False)
    assert (reading["hw_thermal_slowdown"], reading["hw_power_brake"]) == (False, False)
    assert (reading["pcie_gen_current"], reading["pcie_gen_max"]) == (5, 5)
    assert (reading["pcie_width_current"], reading["pcie_width_max"]) == (16, 16)
    assert reading["retired_pages"] is None  # "N/A" on an H100 (row remapping instead)
    assert reading["lost"] is False
    [titan] = DumpGpus(TITAN_V).sample_health(["GPU-f4c353ff-b56c-c1de-bcb9-7dad861b589a"])
    assert titan["temperature_c"] == 44
    assert titan["ecc_uncorrectable"] is None  # ECC N/A on a TITAN V
    assert titan["slowdown_temp_c"] == 97  # "GPU Slowdown Temp : 97 C", absolute
    assert titan["remapped_rows_pending"] is None  # "Remapped Rows : N/A" before Ampere
    a10_gpus = DumpGpus(A10)
    [a10] = a10_gpus.sample_health([a10_gpus.inventory().gpus[0].uuid])
    assert a10["remapped_rows_pending"] is True  # the recorded A10 has a remap pending


def test_truncated_dump_is_refused_naming_file_and_lines():
    with pytest.raises(DumpError) as caught:
        parse_dump(TRUNCATED)
    err = caught.value
    assert err.path == "h100-80gb-hbm3-x8.truncated.txt"
    # First the three mangled "Invalid HW … Slowdown" lines, whose " : " is out of column.
    assert err.line == 86
    message = str(err)
    assert message.startswith("h100-80gb-hbm3-x8.truncated.txt:86: corrupted lines 86-88")
    # Then the only GPU section, cut before its memory, and the missing 7 sections.
    assert "also line 8: section 'GPU 00000000:53:00.0' lacks FB Memory Usage / Total" in message
    assert "(the report ends inside it)" in message
    assert "line 91" in message
    assert "1 GPU section(s) but line 7 announces 'Attached GPUs : 8'" in message


GOOD_HEAD = """==============NVSMI LOG==============

Timestamp                                 : Fri Jun 21 02:03:08 2024
Driver Version                            : 535.183.01
CUDA Version                              : 12.2

Attached GPUs                             : 1
GPU 00000000:53:00.0
"""
GOOD_GPU = """    Product Name                          : NVIDIA A10
    GPU UUID                              : GPU-00000000-0000-0000-0000-000000000001
    PCI
        Bus Id                            : 00000000:53:00.0
    FB Memory Usage
        Total                             : 23028 MiB
"""


def test_synthetic_good_input_parses():
    inv = parse_text(GOOD_HEAD + GOOD_GPU, "ok.txt")
    assert [(g.uuid, g.memory_mib) for g in inv.gpus] == [
        ("GPU-00000000-0000-0000-0000-000000000001", 23028)
    ]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("", 1, "empty file"),
        ("Driver Version : 1\n", 1, "banner"),
        (GOOD_HEAD + GOOD_GPU.replace("    GPU UUID", "    Board ID"), 8, "lacks GPU UUID"),
        (GOOD_HEAD + GOOD_GPU.replace("        Bus Id", "      Bus Id"), 12,
         "not a multiple of 4"),
        (GOOD_HEAD + GOOD_GPU.replace("    PCI\n", "    PCI\n            Extra : 1\n"), 12,
         "more than 4 deeper"),
        (GOOD_HEAD + GOOD_GPU.replace("    PCI\n", "    PCI:thing\n"), 11,
         "not 'key : value' nor a section header"),
        (GOOD_HEAD + GOOD_GPU.replace("        Total    ", "\tTotal"), 14, "tab"),
        (GOOD_HEAD.replace(": 1\n", ": 2\n"), 8, "(the report ends inside it)"),
        (GOOD_HEAD.replace("CUDA Version", "CUDA Versoin"), 1, "'CUDA Version' is missing"),
        (GOOD_HEAD + GOOD_GPU.replace("23028 MiB", "lots"), 14, "not 'N MiB'"),
    ],
)
def test_bad_inputs_are_refused(text, line, words):
    with pytest.raises(DumpError) as caught:
        parse_text(text, "bad.txt")
    assert caught.value.line == line, str(caught.value)
    assert str(caught.value).startswith(f"bad.txt:{line}: ")
    assert words in str(caught.value)


def test_a_report_of_selected_gpus_parses_with_a_note():
    # `nvidia-smi -q -i 0` prints "Attached GPUs : 2" and the one selected GPU, complete.
    inv = parse_text(GOOD_HEAD.replace(": 1\n", ": 2\n") + GOOD_GPU, "one.txt")
    assert len(inv.gpus) == 1
    assert inv.notes == ("the report shows 1 of the 2 attached GPUs (recorded with "
                         "`nvidia-smi -q -i …`?); only those are simulated",)


def test_unknown_product_in_a_dump_is_refused():
    with pytest.raises(UnknownGpuProduct, match="'NVIDIA B300'"):
        parse_text(GOOD_HEAD + GOOD_GPU.replace("NVIDIA A10", "NVIDIA B300"), "b300.txt")


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA TITAN V", "titan-v"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ],
)
def test_catalog_maps_known_names(name, slug):
    assert gpu_class_for(name) == slug


@pytest.mark.parametrize(
    "name", ["NVIDIA H100", "NVIDIA A10 G", "NVIDIA GeForce RTX 4090 D", ""]
)
def test_catalog_refuses_unknown_names(name):
    with pytest.raises(UnknownGpuProduct) as caught:
        gpu_class_for(name)
    assert repr(name) in str(caught.value)
