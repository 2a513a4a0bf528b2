"""`stop_requested` in the runner's lease list (docs/RUNNER_PROTOCOL.md): parsed into
RunnerLease (absent or not `true`: False), and a listed lease that says true has its
container stopped and removed as for a lease no longer listed, without a report. Against
the stand-in marketplace and the real Docker Engine."""

from __future__ import annotations

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.lease import RunnerLease
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime
from tests.support.containers import inspected

from .runner_helpers import H100, TOKEN, lease_for

UUIDS = ["GPU-566e6f65-c38e-b12f-4824-6944218668b9"]


def test_stop_requested_is_parsed_strictly():
    wire = lease_for(31, "img:1", ["sleep", "9"])
    assert RunnerLease.parse(wire).stop_requested is False
    assert RunnerLease.parse({**wire, "stop_requested": True}).stop_requested is True
    assert RunnerLease.parse({**wire, "stop_requested": "yes"}).stop_requested is False


@pytest.mark.docker
def test_a_listed_lease_that_asks_to_stop_loses_its_container(marketplace, docker_client,
                                                              docker_node, test_image):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True)
    lines: list[str] = []
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=1,
                  log=lines.append)
    try:
        marketplace.add_lease(32, UUIDS, image=test_image, command=["sleep", "60"])
        agent.tick()
        label = f"gpumarket.node={docker_node}"
        assert len(inspected(docker_client, label=label)) == 1
        marketplace.leases[32]["stop_requested"] = True
        agent.tick()
        assert inspected(docker_client, label=label) == []
        assert [e["status"] for e in marketplace.events_for(32)] == ["starting", "running"]
        assert any("lease 32: no longer listed" in line for line in lines)
    finally:
        client.close()
