"""After a lease's container is removed, no process may still hold its GPUs, except the
processes that were already there when the runner started (gpu_processes.py: the baseline).

There is no GPU (and no NVML) on this machine: the GPUs and their processes come from the
recorded `nvidia-smi -q` reports (`--simulate` data: the 8 × H100 host's third GPU ran pid
1002127 /usr/bin/python, 9212 MiB, when it was recorded; every GPU of the 8 × RTX 4090 host
ran one), a leftover is replayed (`--replay-process-left`, DumpProcesses.set), and the NVML
source is driven by a stand-in pynvml module. The containers run on the real Docker Engine;
the marketplace is the stand-in of runner_helpers (HTTP on 127.0.0.1).
"""

from __future__ import annotations

import time

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.gpu_processes import (
    DumpProcesses,
    GpuProcess,
    NvmlProcesses,
    load_replay_process_left,
    processes_from_text,
    source_for,
)
from providers.runner.nvml import DumpGpus, ReplayError
from providers.runner.nvsmi import read_text
from providers.runner.runtime import DockerRuntime
from tests.support.containers import inspected

from .runner_helpers import A10, H100, RTX4090, TOKEN, FakeMarketplace

FREE = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"  # first H100 of the dump: no process
HELD = "GPU-973565ff-45cf-12ea-4e91-33386720f7bb"  # third: pid 1002127 in the dump
RECORDED = GpuProcess(1002127, "/usr/bin/python", "C", 9212)
LEFT = GpuProcess(4242, "/opt/conda/bin/python", "C", 1024)  # a replayed leftover
FOREIGN = ("pid 1002127 /usr/bin/python (compute, 9212 MiB) already running when the runner "
           "started: not a marketplace workload; a lease on this GPU shares it")


def test_the_dumps_processes_sections_are_read_per_gpu():
    table = processes_from_text(read_text(H100))
    assert len(table) == 8
    assert table[HELD] == [RECORDED]
    assert all(table[u] == [] for u in table if u != HELD)  # "Processes : None"
    assert table[HELD][0].describe() == "pid 1002127 /usr/bin/python (compute, 9212 MiB)"
    [a10] = processes_from_text(read_text(A10)).values()
    assert a10 == []
    rtx = processes_from_text(read_text(RTX4090))
    assert len(rtx) == 8 and all(len(p) == 1 for p in rtx.values())  # every GPU was busy
    celery = next(p for [p] in rtx.values() if p.name.startswith("[celeryd"))
    assert len(celery.name) > 200
    assert celery.describe().startswith("pid 3229670 [celeryd: expand_image_with_self_")
    assert len(celery.describe()) < 120  # a long name is cut in evidence
    source = source_for(DumpGpus(H100))
    assert isinstance(source, DumpProcesses) and source.live is False
    assert source([FREE, HELD, "GPU-unknown"]) == {FREE: [], HELD: table[HELD]}


def test_replayed_leftovers_are_checked_and_appear_once_after_a_workload(tmp_path):
    left = load_replay_process_left(
        f'{{"{HELD}": [{{"pid": 4242, "name": "/opt/conda/bin/python", "used_mib": 1024}}],'
        f' "{FREE}": [{{"pid": 9, "type": "G"}}]}}')
    assert left == {HELD: [LEFT], FREE: [GpuProcess(9, "", "G", None)]}
    path = tmp_path / "left.json"
    path.write_text(f'{{"{HELD}": [{{"pid": 4242}}]}}')
    assert load_replay_process_left(str(path)) == {HELD: [GpuProcess(4242)]}
    for bad, says in (("[1]", "must be {"), (f'{{"{HELD}": [{{"pid": 0}}]}}', "[0].pid"),
                      (f'{{"{HELD}": [{{"pid": 1, "memory": 3}}]}}', "unknown field(s) memory"),
                      (f'{{"{HELD}": [{{"pid": 1, "type": "X"}}]}}', "[0].type: one of C"),
                      (f'{{"{HELD}": [{{"pid": 1, "used_mib": -1}}]}}', "[0].used_mib"),
                      ("{oops", "is not JSON"), (str(tmp_path / "nope.json"), "nope.json")):
        with pytest.raises(ReplayError) as caught:
            load_replay_process_left(bad)
        assert says in str(caught.value), (bad, str(caught.value))
    with pytest.raises(ReplayError, match="GPU-nope, which is not a GPU of"):
        DumpGpus(H100, replay_process_left={"GPU-nope": [LEFT]})

    source = source_for(DumpGpus(H100, replay_process_left={HELD: [LEFT]}))
    assert source([HELD]) == {HELD: [RECORDED]}
    source.workload_removed([FREE])
    assert source([HELD, FREE]) == {HELD: [RECORDED], FREE: []}
    source.workload_removed([HELD, FREE])
    assert source([HELD]) == {HELD: [RECORDED, LEFT]}
    source.workload_removed([HELD])  # once: a later workload leaves nothing more
    assert source([HELD]) == {HELD: [RECORDED, LEFT]}


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
    source = NvmlProcesses(_FakeNvml())
    assert source.live is True
    found = source(["GPU-a", "GPU-b", "GPU-lost"])
    assert found == {"GPU-a": [GpuProcess(7, "/usr/bin/python3", "C+G", 512),
                               GpuProcess(8, "", "C", None)],
                     "GPU-b": []}


# -- the baseline on a live source (NVML): no Docker, no marketplace -----------------------
class _LiveSource:
    """A live process source (as NvmlProcesses) whose table the test changes."""

    live = True

    def __init__(self, table: dict[str, list[GpuProcess]]) -> None:
        self.table = table

    def __call__(self, uuids):
        return {u: list(self.table.get(u, [])) for u in uuids}


class _Workloads:
    """A runtime that only describes the workloads found at startup."""

    name = "docker"

    def __init__(self, workloads: list[dict]) -> None:
        self.workloads = workloads

    def describe(self) -> list[dict]:
        return self.workloads


XORG = GpuProcess(2101, "/usr/lib/xorg/Xorg", "G", 20)
LEASED = GpuProcess(3300, "python", "C", 4000)  # a re-adopted lease's process


def _live_agent(table, workloads) -> Agent:
    lines: list[str] = []
    agent = Agent(None, DumpGpus(H100), _Workloads(workloads), log=lines.append)
    agent.gpu_processes = _LiveSource(table)
    agent.release_settle_s = 0
    agent.lines = lines
    return agent


def test_live_baseline_spares_the_providers_processes_not_a_readopted_leases():
    table = {FREE: [XORG], HELD: [LEASED]}
    agent = _live_agent(table, [{"lease": 5, "handle": "c5", "state": "running",
                                 "gpus": HELD}])
    agent.take_baseline()
    assert agent.baseline == {FREE: [XORG]}
    assert (f"GPU {FREE}: pid 2101 /usr/lib/xorg/Xorg (graphics, 20 MiB) already running at "
            "startup: not a marketplace workload; the GPU stays offered (a lease on it shares "
            "it) and the release check leaves it alone") in agent.lines
    assert any(line.startswith(f"GPU {HELD}: pid 3300 python") and "a lease workload's GPU"
               in line for line in agent.lines)
    sent = agent.evaluate_health()
    assert [(f.uuid, f.rule, f.severity) for f in sent if f.rule.startswith("process")] == [
        (FREE, "process_foreign", "warn")]
    assert FREE not in agent.fatal and HELD not in agent.fatal

    # Lease 5 ends and its process stays: left behind. Xorg after lease 6 on FREE: not.
    assert [f.rule for f in agent.check_released(5, [HELD])] == ["process_left"]
    assert agent.check_released(6, [FREE]) == []
    assert HELD in agent.fatal and FREE not in agent.fatal

    # Xorg exits (dropped from the baseline); a process with its pid and name that shows up
    # after a later lease is a new one and counts.
    table[FREE] = []
    assert not any(f.rule == "process_foreign" for f in agent.evaluate_health())
    assert agent.baseline == {}
    assert f"GPU {FREE}: {XORG.describe()} (running at startup) has exited" in agent.lines
    table[FREE] = [XORG]
    [finding] = agent.check_released(7, [FREE])
    assert finding.evidence == ("pid 2101 /usr/lib/xorg/Xorg (graphics, 20 MiB) still holds "
                                "the GPU after lease 7's workload was removed")


def test_live_baseline_is_empty_while_a_workload_of_unknown_gpus_runs():
    agent = _live_agent({FREE: [XORG]}, [{"lease": 5, "handle": "pid-1", "state": "running",
                                          "gpus": ""}])
    agent.take_baseline()
    assert agent.baseline == {}
    assert [f.rule for f in agent.check_released(5, [FREE])] == ["process_left"]


def test_the_dumps_processes_are_always_a_baseline_even_with_workloads():
    agent = _live_agent({}, [{"lease": 5, "handle": "c5", "state": "running", "gpus": HELD}])
    agent.gpu_processes = source_for(agent.gpus)  # the dump: not live
    agent.take_baseline()
    assert agent.baseline == {HELD: [RECORDED]}
    assert agent.check_released(5, [HELD]) == []


# -- with Docker and the stand-in marketplace ----------------------------------------------
def _agent(marketplace: FakeMarketplace, docker_client, docker_node, gpus):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True)
    lines: list[str] = []
    agent = Agent(client, gpus, runtime, poll_interval=0.2, grace_s=0,
                  heartbeat_interval=0, log=lines.append)
    agent.release_settle_s = 0
    agent.lines = lines
    return agent, client


@pytest.fixture
def agent(marketplace, docker_client, docker_node):
    agent, client = _agent(marketplace, docker_client, docker_node, DumpGpus(H100))
    yield agent
    client.close()


@pytest.fixture
def leaving_agent(marketplace, docker_client, docker_node):
    """An agent whose simulated HELD GPU keeps pid 4242 after its first lease workload."""
    gpus = DumpGpus(H100, replay_process_left={HELD: [LEFT]})
    agent, client = _agent(marketplace, docker_client, docker_node, gpus)
    yield agent
    client.close()


def _findings(marketplace: FakeMarketplace, rule: str = "process_left") -> list[dict]:
    return [f for f in marketplace.heartbeats[-1].get("findings", []) if f["rule"] == rule]


def _containers(docker_client, docker_node) -> list:
    return inspected(docker_client, label=f"gpumarket.node={docker_node}")


@pytest.mark.docker
def test_the_dumps_recorded_process_does_not_fail_its_gpu_after_a_lease(
        agent, marketplace, docker_client, docker_node, test_image):
    marketplace.add_lease(31, [HELD, FREE], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert [e["status"] for e in marketplace.events_for(31)] == ["starting", "running"]
    assert any(line.startswith(f"GPU {HELD}: pid 1002127 /usr/bin/python (compute, 9212 MiB) "
                               "already running at startup: not a marketplace workload")
               for line in agent.lines)
    assert _findings(marketplace, "process_foreign") == [
        {"uuid": HELD, "rule": "process_foreign", "severity": "warn", "evidence": FOREIGN}]

    del marketplace.leases[31]  # the marketplace ended it
    agent.tick()
    assert _containers(docker_client, docker_node) == []
    assert agent.fatal == {}
    assert not any("still holds" in line for line in agent.lines)

    marketplace.add_lease(32, [HELD], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert [e["status"] for e in marketplace.events_for(32)] == ["starting", "running"]
    assert _findings(marketplace) == []
    assert [f["uuid"] for f in _findings(marketplace, "process_foreign")] == [HELD]


@pytest.mark.docker
def test_every_recorded_rtx_4090_gpu_stays_in_service_after_a_completed_lease(
        marketplace, docker_client, docker_node, test_image):
    gpus = DumpGpus(RTX4090)
    agent, client = _agent(marketplace, docker_client, docker_node, gpus)
    try:
        uuids = [g.uuid for g in gpus.inventory().gpus]
        marketplace.add_lease(41, uuids, image=test_image, command=["sleep", "60"],
                              duration_seconds=1)
        agent.tick()
        assert [e["status"] for e in marketplace.events_for(41)] == ["starting", "running"]
        time.sleep(1.1)
        agent.tick()  # ends_at passed: completed, container removed, GPUs checked
        assert marketplace.events_for(41)[-1]["status"] == "completed"
        assert _containers(docker_client, docker_node) == []
        assert agent.fatal == {}
        agent.tick()
        assert _findings(marketplace) == []
        assert not any(f["severity"] == "fatal" for f in marketplace.heartbeats[-1]["findings"])
        assert sorted(f["uuid"] for f in _findings(marketplace, "process_foreign")) == \
            sorted(uuids)
        marketplace.add_lease(42, uuids, image=test_image, command=["sleep", "60"])
        agent.tick()
        assert [e["status"] for e in marketplace.events_for(42)] == ["starting", "running"]
    finally:
        client.close()


@pytest.mark.docker
def test_a_process_left_after_a_lease_is_reported_and_the_gpu_kept_out_until_it_exits(
        leaving_agent, marketplace, docker_client, docker_node, test_image):
    agent = leaving_agent
    marketplace.add_lease(31, [HELD], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert [e["status"] for e in marketplace.events_for(31)] == ["starting", "running"]

    del marketplace.leases[31]  # the marketplace ended it; pid 4242 stays behind
    agent.tick()
    assert _containers(docker_client, docker_node) == []
    # only the new process is evidence: the recorded pid 1002127 is the baseline
    evidence = ("pid 4242 /opt/conda/bin/python (compute, 1024 MiB) still holds the GPU after "
                "lease 31's workload was removed")
    assert f"GPU {HELD}: {evidence}; no lease starts on it until it is free" in agent.lines
    assert agent.fatal[HELD].rule == "process_left"

    # The next heartbeat carries the finding (the marketplace takes the GPU out of its asks)
    # and a lease that was already on its way to that GPU is failed, never started.
    marketplace.add_lease(32, [HELD, FREE], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert _findings(marketplace) == [{"uuid": HELD, "rule": "process_left",
                                       "severity": "fatal", "evidence": evidence}]
    assert [f["uuid"] for f in _findings(marketplace, "process_foreign")] == [HELD]
    [failed] = marketplace.events_for(32)
    assert failed["status"] == "failed"
    assert failed["cause"] == f"GPU {HELD}: process_left: {evidence}"
    assert _containers(docker_client, docker_node) == []

    # The leftover exits (the recorded process still runs): the GPU is leased again, and a
    # later lease leaves nothing behind (the replay happens once).
    agent.gpu_processes.set(HELD, [RECORDED])
    marketplace.add_lease(33, [HELD], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert f"GPU {HELD}: no process holds it any more; back in service" in agent.lines
    assert _findings(marketplace) == []
    assert [e["status"] for e in marketplace.events_for(33)] == ["starting", "running"]
    del marketplace.leases[33]
    agent.tick()
    assert agent.fatal == {}
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
    agent.gpu_processes.set(FREE, [LEFT])
    del marketplace.leases[35]
    agent.tick()
    assert agent.fatal[FREE].evidence.startswith(
        "pid 4242 /opt/conda/bin/python (compute, 1024 MiB) still holds the GPU")
