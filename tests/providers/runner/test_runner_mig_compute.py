"""A slice is one GPU instance with one compute instance covering it (runner/mig.py)."""

from __future__ import annotations

from dataclasses import replace

from providers.runner import mig
from providers.runner.gpu_text import doctor_lines
from providers.runner.nvml import DumpGpus
from providers.runner.nvsmi import covering
from tests.conftest import DATA
from tests.support.mig_host import H100_MIG

H200_MIG = DATA / "nvidia-smi" / "h200-mig-x1.utku-exporter-590.48.01.q-idle.txt"


def test_the_h200_recordings_split_instance_is_left_out_and_said():
    inventory = DumpGpus(H200_MIG).inventory()
    [gpu] = inventory.gpus
    assert [d.compute_profile for d in gpu.mig_devices[:2]] == ["1c.3g.71gb", "2c.3g.71gb"]
    items = mig.inventory_items(inventory)
    assert items[0]["listed"] is False
    assert [(i["mig_profile"], i["gpu_instance_id"]) for i in items[1:]] == [
        ("2g.35gb", 3), ("1g.18gb", 9), ("1g.18gb", 10)]
    assert sum(i["memory_mib"] for i in items[1:]) <= gpu.memory_mib
    assert [u.gpu_instance_id for u in mig.units(inventory)] == [3, 9, 10]
    [note] = mig.notes(inventory)
    assert "GPU instance 2 (3g.71gb) is split into 2 compute instances" in note
    fails = [d for ok, name, d, _fix in doctor_lines(inventory.gpus) if name == "MIG" and not ok]
    assert fails == ["GPU 0 NVIDIA H200: GPU " + gpu.uuid + " GPU instance 2 (3g.71gb) is "
                     "split into 2 compute instances (1c.3g.71gb, 2c.3g.71gb): not offered"]


def test_a_lone_compute_instance_on_part_of_its_instance_is_not_a_slice():
    gpu = H100_MIG.gpus[0]
    part = replace(gpu.mig_devices[0], compute_profile="1c.3g.40gb")
    inventory = replace(H100_MIG, gpus=[replace(gpu, mig_devices=(part,
                                                                  *gpu.mig_devices[1:]))])
    assert part.uuid not in {u.uuid for u in mig.units(inventory)}
    assert "has one compute instance (1c.3g.40gb) using part of it" in mig.notes(inventory)[0]
    assert covering("3c.3g.40gb", "3g.40gb") == "" and covering("1c.3g.40gb", "3g.40gb")


def test_a_mig_enabled_gpu_without_devices_is_sent_unlisted_never_whole():
    bare = replace(H100_MIG, gpus=[replace(H100_MIG.gpus[0], mig_devices=())])
    assert mig.inventory_items(bare) == [{**bare.gpus[0].as_protocol(), "listed": False}]
    assert mig.units(bare) == []
    assert "is MIG-enabled with no usable MIG device" in mig.notes(bare)[0]
