"""MIG slices in the runner (issue 13): the inventory offers a MIG-partitioned GPU as its
slices, a lease of slices starts a container of exactly those MIG devices, an XID the
driver attributes to a GPU instance fails only that slice's lease, one on the GPU every
slice's lease and no other. Real Docker (--simulate), the stand-in marketplace."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest

from providers.runner import benchmark as bench
from providers.runner import mig
from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime
from providers.runner.runtime_common import RuntimeFailure
from providers.runner.xid import XidEvent, parse_kernel_log
from tests.support.containers import inspected
from tests.support.mig_host import H100_MIG

from .runner_helpers import H100, ROOT, TOKEN, FakeMarketplace, lease_for

PARENT = H100_MIG.gpus[0].uuid
SLICE_3G, SLICE_2G, SLICE_9, SLICE_10 = (d.uuid for d in H100_MIG.gpus[0].mig_devices)
GPU0 = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"  # bus 00000000:53:00.0 in the H100 dump
GPU1 = "GPU-9930d717-21dd-7692-054e-3d0a2bae76b5"  # bus 00000000:64:00.0
XID_LOG = ROOT / "data" / "dmesg-with-xid-119.log"


def test_a_mig_enabled_gpu_is_reported_as_its_slices_and_an_unlisted_parent():
    items = mig.inventory_items(H100_MIG)
    assert items[0] == {**H100_MIG.gpus[0].as_protocol(), "listed": False}
    assert items[3] == {
        "uuid": SLICE_9, "parent_uuid": PARENT, "mig_profile": "1g.10gb",
        "gpu_class": "h100-sxm-80gb.1g.10gb", "product_name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 9984, "pci_bus_id": "00000000:00:09.0", "mig_mode": "Enabled",
        "sm_count": 16, "gpu_instance_id": 9, "compute_instance_id": 0}
    assert [i["gpu_class"] for i in items[1:]] == [
        "h100-sxm-80gb.3g.40gb", "h100-sxm-80gb.2g.20gb", "h100-sxm-80gb.1g.10gb",
        "h100-sxm-80gb.1g.10gb"]
    # MIG disabled, or enabled without MIG devices: the GPU whole, as before
    off = replace(H100_MIG, gpus=[replace(H100_MIG.gpus[0], mig_mode="Disabled")])
    assert mig.inventory_items(off) == [off.gpus[0].as_protocol()]
    assert [u.uuid for u in mig.units(off)] == [PARENT]


def test_kernel_xid_lines_carry_the_gpu_instance_they_are_attributed_to():
    # the shapes the driver prints (open-gpu-kernel-modules; NVIDIA's A100 memory error
    # management guide shows the first)
    events, _ = parse_kernel_log(
        "NVRM: Xid (PCI:0000:00:09 GPU-I:09): 94, pid=7194, Contained: CE User Channel "
        "(0x9). RST: No, D-RST: No\n"
        "NVRM: Xid (PCI:0000:00:09 GPU-I:10 GPU-CI:00): 43, pid=9, name=a, Ch 00000010\n"
        "NVRM: Xid (PCI:0000:00:09): 79, pid=1, name=b, GPU has fallen off the bus.\n")
    assert [(e.code, e.gpu_instance_id, e.compute_instance_id) for e in events] == [
        (94, 9, None), (43, 10, 0), (79, None, None)]

    on_parent = [replace(e, uuid=PARENT) for e in events]
    unknown = XidEvent(48, "0000:00:09", PARENT, gpu_instance_id=5)
    scoped = mig.scope_xids([*on_parent, unknown], H100_MIG)
    # instance 9 and 10 are slices here; no instance, or one that is no slice: the GPU
    assert [e.uuid for e in scoped] == [SLICE_9, SLICE_10, PARENT, PARENT]


class _SlicedDump(DumpGpus):
    """The recorded 8 × H100 host with its first GPU (bus 53) MIG-partitioned as the
    recorded MIG H100 (no recording has whole and sliced GPUs on one host)."""

    def __init__(self, path):
        super().__init__(path)
        first, *rest = self._inventory.gpus
        devices = tuple(replace(d, uuid=d.uuid.replace("MIG-0000", "MIG-5353"))
                        for d in H100_MIG.gpus[0].mig_devices)
        self._inventory = replace(self._inventory, gpus=[
            replace(first, mig_mode="Enabled", mig_devices=devices), *rest])


def _running(docker_client, node: str) -> dict[str, str]:
    found = inspected(docker_client, label=f"gpumarket.node={node}")
    return {c.labels["gpumarket.lease"]: c.status for c in found}


@pytest.mark.docker
def test_slice_leases_run_on_their_mig_devices_and_fail_by_scope(
        marketplace: FakeMarketplace, docker_client, docker_node, test_image, tmp_path):
    gpus = _SlicedDump(H100)
    one, other = (d.uuid for d in gpus.inventory().gpus[0].mig_devices
                  if d.profile == "1g.10gb")
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    lines: list[str] = []
    agent = Agent(client, gpus, runtime, poll_interval=0.2, heartbeat_interval=0.0, grace_s=1,
                  log=lines.append)
    try:
        agent.announce()
        sent = marketplace.inventories[-1]["gpus"]
        assert [(g["uuid"], g.get("listed", True)) for g in sent[:5]] == [
            (GPU0, False), *((d.uuid, True) for d in gpus.inventory().gpus[0].mig_devices)]
        assert len(sent) == 12  # 7 whole GPUs, the parent, its 4 slices
        assert agent._slices_text() == ", of which 1 as 4 MIG slices"

        marketplace.add_lease(41, [one], image=test_image, command=["sleep", "60"])
        marketplace.add_lease(42, [other], image=test_image, command=["sleep", "60"])
        marketplace.add_lease(43, [GPU1], image=test_image, command=["sleep", "60"])
        agent.tick()
        assert _running(docker_client, docker_node) == {"41": "running", "42": "running",
                                                        "43": "running"}
        [c41] = inspected(docker_client, label="gpumarket.lease=41")
        env = dict(e.split("=", 1) for e in c41.attrs["Config"]["Env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == one  # and its in-container check passed
        assert not any("GPU check failed" in line for line in lines)

        # XID 119 attributed by the driver to GPU instance 9 (lease 41's slice)
        real = XID_LOG.read_text().replace("PCI:0000:9b:00", "PCI:0000:53:00")
        scoped = tmp_path / "scoped.log"
        scoped.write_text(real.replace("(PCI:0000:53:00)", "(PCI:0000:53:00 GPU-I:09)"))
        gpus.replay_xid(scoped)
        agent.tick()
        assert marketplace.leases[41]["status"] == "failed"
        assert "in MIG GPU instance 9" in marketplace.events_for(41)[-1]["cause"]
        assert _running(docker_client, docker_node) == {"42": "running", "43": "running"}
        fatal = [f for f in marketplace.heartbeats[-1]["findings"] if f["severity"] == "fatal"]
        assert {f["uuid"] for f in fatal} == {one}

        # the same XID on the GPU itself: every slice's lease fails, GPU1's runs on
        whole = tmp_path / "whole.log"
        whole.write_text(real)
        gpus.replay_xid(whole)
        agent.tick()
        assert marketplace.leases[42]["status"] == "failed"
        assert marketplace.events_for(42)[-1]["cause"].startswith(f"GPU {GPU0}: xid: XID 119")
        assert _running(docker_client, docker_node) == {"43": "running"}
        assert marketplace.leases[43]["status"] == "running"
    finally:
        client.close()


def _device(index: int, uuid: str | None, tflops: float):
    return bench.DeviceResult(index, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16", tflops, 401.0,
                        0.003, True, uuid=uuid, bf16_tflops=tflops)


def test_each_slice_is_benchmarked_alone_and_reported_by_its_mig_uuid():
    # torch's device UUID carries no type: nvml_uuid reads it as a GPU's
    assert bench.nvml_uuid("00000002-0000-0000-0000-000000000002") == \
        "GPU-00000002-0000-0000-0000-000000000002"
    seen = []

    def child(*, visible):  # one child per unit, seeing only it (no GPU here: given)
        seen.append(visible)
        return bench.BenchmarkResult(True, "measured", "torch", [_device(
            0, bench.nvml_uuid(visible[4:]), 120.4 if visible == SLICE_9 else 118.0)], n=8192)

    units = [u.uuid for u in mig.units(H100_MIG)]
    result = bench.run_slices(units, run=child)
    assert seen == units
    assert [d.index for d in result.devices] == [0, 1, 2, 3]
    body, notes = bench.report_body(result, "test", units)
    assert notes == []
    assert [(r["uuid"], r["bf16_tflops"]) for r in body["results"]] == [
        (SLICE_3G, 118.0), (SLICE_2G, 118.0), (SLICE_9, 120.4), (SLICE_10, 118.0)]
    # a device of no unit here is still left out, named
    _body, notes = bench.report_body(
        bench.BenchmarkResult(True, "m", "torch", [_device(0, GPU1, 1.0)]), "test", units)
    assert notes == [f"GPU 0 NVIDIA H100 80GB HBM3 MIG 1g.10gb: UUID {GPU1} is not in this "
                     "node's inventory; its result is not reported"]


@pytest.mark.docker
def test_a_slice_lease_requests_exactly_its_mig_devices_from_docker(docker_client, docker_node,
                                                                     test_image):
    """Without --simulate: the container is created with a device request for the MIG
    UUIDs (the engine here has no NVIDIA toolkit, so it is created but cannot start)."""
    leased = [SLICE_9, SLICE_10]
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=False)
    with contextlib.suppress(RuntimeFailure):  # "could not select device driver nvidia"
        runtime.start(lease_for(61, test_image, ["true"], uuids=leased))
    [container] = inspected(docker_client, label="gpumarket.lease=61")
    [request] = container.attrs["HostConfig"]["DeviceRequests"]
    assert (request["Driver"], request["DeviceIDs"]) == ("nvidia", leased)
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(leased)
