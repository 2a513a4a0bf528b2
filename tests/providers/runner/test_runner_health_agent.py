"""A fatal finding fails only the leases on that GPU: real Docker, the stand-in marketplace."""

from __future__ import annotations

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime
from tests.support.containers import inspected

from .runner_helpers import H100, ROOT, TOKEN, FakeMarketplace

pytestmark = pytest.mark.docker

GPU0 = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"  # bus 00000000:53:00.0 in the H100 dump
GPU1 = "GPU-9930d717-21dd-7692-054e-3d0a2bae76b5"  # bus 00000000:64:00.0
XID_LOG = ROOT / "data" / "dmesg-with-xid-119.log"


def running(docker_client, node: str) -> dict[str, str]:
    found = inspected(docker_client, label=f"gpumarket.node={node}")
    return {c.labels["gpumarket.lease"]: c.status for c in found}


@pytest.fixture
def parts(marketplace: FakeMarketplace, docker_client, docker_node, tmp_path):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    gpus = DumpGpus(H100)
    lines: list[str] = []
    agent = Agent(client, gpus, runtime, poll_interval=0.2, heartbeat_interval=0.0, grace_s=1,
                  log=lines.append)
    # The real XID 119 lines, moved from bus 9b (not in this dump) to GPU0's bus 53.
    log = tmp_path / "kern.log"
    log.write_text(XID_LOG.read_text().replace("PCI:0000:9b:00", "PCI:0000:53:00"))
    yield agent, gpus, lines, log
    client.close()


def test_fatal_xid_fails_only_the_lease_on_that_gpu(
    parts, marketplace, docker_client, docker_node, test_image
):
    agent, gpus, lines, log = parts
    marketplace.add_lease(31, [GPU0], image=test_image, command=["sleep", "60"])
    marketplace.add_lease(32, [GPU1], image=test_image, command=["sleep", "60"])
    agent.tick()
    assert running(docker_client, docker_node) == {"31": "running", "32": "running"}
    assert marketplace.heartbeats[-1]["findings"] == [  # the recording's real warnings
        {"uuid": "GPU-973565ff-45cf-12ea-4e91-33386720f7bb", "rule": "hw_power_brake",
         "severity": "warn",
         "evidence": "HW power brake active: the host's power supply slows the GPU"},
        {"uuid": "GPU-973565ff-45cf-12ea-4e91-33386720f7bb", "rule": "process_foreign",
         "severity": "warn",
         "evidence": "pid 1002127 /usr/bin/python (compute, 9212 MiB) already running when "
                     "the runner started: not a marketplace workload; a lease on this GPU "
                     "shares it"}]

    gpus.replay_xid(log)  # the kernel reports XID 119 on GPU0
    agent.tick()

    failed = marketplace.events_for(31)[-1]
    assert failed["status"] == "failed"
    assert failed["cause"].startswith(
        f"GPU {GPU0}: xid: XID 119 GSP_RPC_TIMEOUT (GSP RPC Timeout) at Sun Feb 23 16:24:18 "
        "2025, NVIDIA immediate action RESET_GPU")
    assert len(failed["cause"]) <= 300
    assert isinstance(failed["usage_seconds"], int)
    assert marketplace.leases[31]["status"] == "failed"
    # Only lease 31's container is gone; lease 32 on GPU1 keeps running, untouched.
    assert running(docker_client, docker_node) == {"32": "running"}
    assert marketplace.leases[32]["status"] == "running"
    assert [e["status"] for e in marketplace.events_for(32)] == ["starting", "running"]
    sent = [f for f in marketplace.heartbeats[-1]["findings"] if f["severity"] == "fatal"]
    assert {(f["uuid"], f["rule"]) for f in sent} == {(GPU0, "xid")}
    assert any(line.startswith(f"GPU {GPU0}: fatal: xid: XID 119") for line in lines)

    # A new lease on the failed GPU is failed at once and never started; GPU1 still takes one.
    marketplace.add_lease(33, [GPU0], image=test_image, command=["sleep", "60"])
    marketplace.add_lease(34, [GPU1, "GPU-973565ff-45cf-12ea-4e91-33386720f7bb"],
                          image=test_image, command=["sleep", "60"])
    agent.tick()
    [event] = marketplace.events_for(33)
    assert event["status"] == "failed"
    assert event["cause"].startswith(f"GPU {GPU0}: xid: XID 119")
    assert "usage_seconds" not in event
    assert running(docker_client, docker_node) == {"32": "running", "34": "running"}
    # The XID stays fatal on later heartbeats (GPU reset needed), still sent as a finding.
    agent.tick()
    assert any(f["uuid"] == GPU0 and f["severity"] == "fatal"
               for f in marketplace.heartbeats[-1]["findings"])


def test_replayed_fatal_reading_fails_only_the_lease_on_that_gpu(
    marketplace, docker_client, docker_node, test_image
):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    gpus = DumpGpus(H100, replay_health={GPU1: {"temperature_c": 95}})
    lines: list[str] = []
    agent = Agent(client, gpus, runtime, heartbeat_interval=0.0, grace_s=1, log=lines.append)
    marketplace.add_lease(41, [GPU1], image=test_image, command=["sleep", "60"])
    marketplace.add_lease(42, [GPU0], image=test_image, command=["sleep", "60"])
    agent.tick()
    client.close()
    [event] = marketplace.events_for(41)
    assert event == {"status": "failed", "cause": f"GPU {GPU1}: temperature: 95 °C at or "
                     "above the GPU's HW slowdown threshold 88 °C"}
    assert running(docker_client, docker_node) == {"42": "running"}
    assert marketplace.heartbeats[-1]["gpus"][1] == {
        "uuid": GPU1, "temperature_c": 95, "power_w": 68.88, "utilization_pct": 0,
        "ecc_uncorrectable": 0}
