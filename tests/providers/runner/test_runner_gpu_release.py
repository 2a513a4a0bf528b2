"""After a lease's container is removed, no process may still hold its GPUs.

There is no GPU (and no NVML) on this machine: the GPUs and their processes come from the
recorded 8 × H100 `nvidia-smi -q` report (`--simulate` data: its third GPU has a recorded
process, pid 1002127 /usr/bin/python, 9212 MiB), and the NVML source is driven by a stand-in
pynvml module. The containers run on the real Docker Engine; the marketplace is the stand-in
of runner_helpers (HTTP on 127.0.0.1).
"""

from __future__ import annotations

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.gpu_processes import (
    DumpProcesses,
    GpuProcess,
    NvmlProcesses,
    processes_from_text,
    source_for,
)
from providers.runner.nvml import DumpGpus
from providers.runner.nvsmi import read_text
from providers.runner.runtime import DockerRuntime

from .runner_helpers import A10, H100, TOKEN, FakeMarketplace

FREE = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"  # first H100 of the dump: no process
HELD = "GPU-973565ff-45cf-12ea-4e91-33386720f7bb"  # third: pid 1002127 in the dump


def test_the_dumps_processes_sections_are_read_per_gpu():
    table = processes_from_text(read_text(H100))
    assert len(table) == 8
    assert table[HELD] == [GpuProcess(1002127, "/usr/bin/python", "C", 9212)]
    assert all(table[u] == [] for u in table if u != HELD)  # "Processes : None"
    assert table[HELD][0].describe() == "pid 1002127 /usr/bin/python (compute, 9212 MiB)"
    [a10] = processes_from_text(read_text(A10)).values()
    assert a10 == []
    source = source_for(DumpGpus(H100))
    assert isinstance(source, DumpProcesses)
    assert source([FREE, HELD, "GPU-unknown"]) == {FREE: [], HELD: table[HELD]}


class _FakeNvml:
    """Stand-in for pynvml (no GPU here): two GPUs, one with a compute and graphics process,
    one NVML cannot reach."""

    class NVMLError(Exception):
        pass

    class _Proc:
        def __init__(self, pid, used):
            self.pid, self.usedGpuMemory = pid, used

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes):
        if uuid == b"GPU-lost":
            raise self.NVMLError("GPU is lost")
        return uuid.decode()

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [self._Proc(7, 512 * 2**20), self._Proc(8, None)] if handle == "GPU-a" else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return [self._Proc(7, None)] if handle == "GPU-a" else []

    def nvmlSystemGetProcessName(self, pid):
        if pid == 8:
            raise self.NVMLError("Not Found")
        return b"/usr/bin/python3"


def test_nvml_processes_merge_compute_and_graphics_and_skip_unreachable_gpus():
    found = NvmlProcesses(_FakeNvml())(["GPU-a", "GPU-b", "GPU-lost"])
    assert found == {"GPU-a": [GpuProcess(7, "/usr/bin/python3", "C+G", 512),
                               GpuProcess(8, "", "C", None)],
                     "GPU-b": []}


@pytest.fixture
def agent(marketplace: FakeMarketplace, docker_client, docker_node):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True)
    lines: list[str] = []
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=0,
                  heartbeat_interval=0, log=lines.append)
    agent.release_settle_s = 0
    agent.lines = lines
    yield agent
    client.close()


def _findings(marketplace: FakeMarketplace) -> list[dict]:
    return [f for f in marketplace.heartbeats[-1].get("findings", [])
            if f["rule"] == "process_left"]


@pytest.mark.docker
def test_a_gpu_still_held_after_its_lease_is_reported_and_not_leased_until_free(
        agent, marketplace, docker_client, docker_node, test_image):
    marketplace.add_lease(31, [HELD], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert [e["status"] for e in marketplace.events_for(31)] == ["starting", "running"]

    del marketplace.leases[31]  # the marketplace ended it
    agent.tick()
    assert docker_client.containers.list(all=True,
                                         filters={"label": f"gpumarket.node={docker_node}"}) == []
    evidence = ("pid 1002127 /usr/bin/python (compute, 9212 MiB) still holds the GPU after "
                "lease 31's workload was removed")
    assert f"GPU {HELD}: {evidence}; no lease starts on it until it is free" in agent.lines
    assert agent.fatal[HELD].rule == "process_left"

    # The next heartbeat carries the finding (the marketplace takes the GPU out of its asks)
    # and a lease that was already on its way to that GPU is failed, never started.
    marketplace.add_lease(32, [HELD, FREE], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert _findings(marketplace) == [{"uuid": HELD, "rule": "process_left",
                                       "severity": "fatal", "evidence": evidence}]
    [failed] = marketplace.events_for(32)
    assert failed["status"] == "failed"
    assert failed["cause"] == f"GPU {HELD}: process_left: {evidence}"
    assert docker_client.containers.list(all=True,
                                         filters={"label": f"gpumarket.node={docker_node}"}) == []

    # The process exits: the next heartbeat finds the GPU free; it is leased again.
    agent.gpu_processes.set(HELD, [])
    marketplace.add_lease(33, [HELD], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert f"GPU {HELD}: no process holds it any more; back in service" in agent.lines
    assert _findings(marketplace) == []
    assert [e["status"] for e in marketplace.events_for(33)] == ["starting", "running"]
    assert agent.lines.count(f"GPU {HELD}: {evidence}; no lease starts on it until it is "
                             "free") == 1


@pytest.mark.docker
def test_a_free_gpu_stays_in_service_and_a_late_process_is_caught(
        agent, marketplace, docker_client, test_image):
    marketplace.add_lease(34, [FREE], image=test_image, command=["sleep", "60"],
                          duration_seconds=1)
    agent.tick()
    del marketplace.leases[34]
    agent.tick()
    assert FREE not in agent.fatal
    assert not any("still holds" in line for line in agent.lines)

    # a process that escaped the container (simulated: it appears in the dump's table)
    marketplace.add_lease(35, [FREE], image=test_image, command=["sleep", "60"])
    agent.tick()
    agent.gpu_processes.set(FREE, [GpuProcess(4242, "/opt/conda/bin/python", "C", 1024)])
    del marketplace.leases[35]
    agent.tick()
    assert agent.fatal[FREE].evidence.startswith(
        "pid 4242 /opt/conda/bin/python (compute, 1024 MiB) still holds the GPU")
