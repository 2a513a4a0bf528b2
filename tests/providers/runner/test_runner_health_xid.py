"""XID kernel-log parsing on the real XID 119 log, bus-id mapping, replay inputs."""

from __future__ import annotations

import pytest

from providers.runner import health
from providers.runner.nvml import DumpGpus, ReplayError, load_replay_health
from providers.runner.nvsmi import GpuInfo
from providers.runner.xid import map_to_gpus, normalise_bus_id, parse_kernel_log

from .runner_helpers import H100, ROOT

XID_LOG = ROOT / "data" / "dmesg-with-xid-119.log"
LOG_UUID = "GPU-509665ad-b600-ac93-3616-d754b23d636d"  # "NVRM: GPU at PCI:0000:9b:00: …"


def gpu(uuid: str, bus: str) -> GpuInfo:
    return GpuInfo(uuid, "NVIDIA H100 80GB HBM3", 81559, bus, "Disabled", "h100-sxm-80gb")


def test_bus_ids_are_normalised_across_nvml_and_kernel_spellings():
    assert normalise_bus_id("00000000:9B:00.0") == "0000:9b:00"
    assert normalise_bus_id("PCI:0000:9b:00") == "0000:9b:00"
    assert normalise_bus_id("0000:9b:00.0") == "0000:9b:00"
    with pytest.raises(ValueError):
        normalise_bus_id("9b:00")


def test_the_real_xid_119_log_is_parsed_and_classified_on_the_right_gpu():
    events, gpu_at = parse_kernel_log(XID_LOG.read_text())
    assert [e.code for e in events] == [119] * 5
    first = events[0]
    assert first.bus_id == "0000:9b:00"
    assert (first.pid, first.name) == ("2024380", "nvidia-smi")
    assert first.stamp == "Sun Feb 23 16:24:18 2025"
    assert first.message == ("Timeout after 6s of waiting for RPC response from GPU4 GSP! "
                             "Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")
    assert gpu_at == {"0000:9b:00": LOG_UUID}
    # An inventory as NVML reports it: the GPU at 9B and another one.
    inventory = [gpu("GPU-566e6f65-c38e-b12f-4824-6944218668b9", "00000000:53:00.0"),
                 gpu(LOG_UUID, "00000000:9B:00.0")]
    mapped = map_to_gpus(events, inventory)
    assert {e.uuid for e in mapped} == {LOG_UUID}  # agrees with the log's own "GPU at" line
    finding = health.xid(mapped[0])
    assert (finding.uuid, finding.rule, finding.severity) == (LOG_UUID, "xid", "fatal")
    assert finding.evidence.startswith(
        "XID 119 GSP_RPC_TIMEOUT (GSP RPC Timeout) at Sun Feb 23 16:24:18 2025, "
        "NVIDIA immediate action RESET_GPU, pid=2024380 name=nvidia-smi: Timeout after 6s")
    # A node without that bus id gets no event mapped to any of its GPUs.
    assert {e.uuid for e in map_to_gpus(events, inventory[:1])} == {None}


def test_other_driver_spellings_of_an_xid_line():
    log = (
        "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
        "Jan 18 11:38:05 kernel: [ 269.51] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007\n"
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
        "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 1, SM 0)\n"
        "NVRM: not an xid line\n"
    )
    events, _ = parse_kernel_log(log)
    assert [(e.code, e.bus_id) for e in events] == [
        (79, "0000:2b:00"), (3, "0000:01:00"), (13, "0000:cb:00")]
    assert events[0].message == "GPU has fallen off the bus."
    assert (events[2].pid, events[2].name) == ("<unknown>", "<unknown>")
    assert events[2].message.startswith("Graphics SM Warp Exception")


def test_replay_xid_maps_onto_the_simulated_dump(tmp_path):
    # The real 119 line, moved to the bus of the H100 dump's first GPU (53).
    log = tmp_path / "xid.log"
    log.write_text(XID_LOG.read_text().replace("0000:9b:00", "0000:53:00"))
    gpus = DumpGpus(H100, replay_xid=log)
    events = gpus.xid_events()
    assert {e.uuid for e in events} == {"GPU-566e6f65-c38e-b12f-4824-6944218668b9"}
    assert gpus.xid_events() == []  # delivered once


def test_replay_inputs_are_checked(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    with pytest.raises(ReplayError, match="no 'NVRM: Xid' line"):
        DumpGpus(H100, replay_xid=empty)
    with pytest.raises(ReplayError, match="not a GPU of"):
        DumpGpus(H100, replay_health={"GPU-00000000-0000": {"temperature_c": 90}})
    with pytest.raises(ReplayError, match="unknown reading"):
        load_replay_health('{"GPU-1": {"temprature_c": 90}}')
    with pytest.raises(ReplayError, match="not JSON"):
        load_replay_health("{oops")
    file = tmp_path / "h.json"
    file.write_text('{"GPU-1": {"temperature_c": 90}}')
    assert load_replay_health(str(file)) == {"GPU-1": {"temperature_c": 90}}
